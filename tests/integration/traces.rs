//! One payment, one trace (OpenTelemetry): accepted by the payments API inside a caller's
//! trace, relayed, claimed by a processor process that crashes, taken over by another, charged;
//! then refunded, and the refund's late failure delivered by the provider's event. Every piece
//! exports over OTLP/HTTP to a local receiver (the processes by the standard `OTEL_*`
//! variables, the in-process API, relay, refund and event processors through the same layer
//! the functions install), and the test reads the spans back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proving::otlp::{OtlpReceiver, ReceivedSpan};
use tracing_subscriber::layer::SubscriberExt;

use crate::events::{events, kinds, refund, refund_body};
use crate::helpers::*;

/// The in-process pieces' exporter: OTLP/HTTP to `receiver`, as a function's.
fn exporting_to(receiver: &OtlpReceiver) -> opentelemetry_sdk::trace::SdkTracerProvider {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", receiver.endpoint()))
        .build()
        .expect("the OTLP exporter");
    opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("in-process")
                .build(),
        )
        .build()
}

/// `payctl run` over the payments queue, exporting its spans to `receiver`.
fn runner(
    t: &TestStack,
    receiver: &OtlpReceiver,
    crash_after_claim: bool,
) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(bin("payctl"));
    c.args([
        "run",
        "--queue-url",
        t.queue_url(),
        "--function-timeout",
        "30",
    ])
    .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
    .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
    .envs(fast_settings())
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
    .env("OTEL_BSP_SCHEDULE_DELAY", "100")
    .kill_on_drop(true)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    if crash_after_claim {
        c.env("FAILPOINTS", "after_claim=return");
    } else {
        c.args(["--until-empty", "--max-seconds", "60"]);
    }
    c
}

fn one<'a>(
    spans: &'a [ReceivedSpan],
    what: &str,
    pick: impl Fn(&ReceivedSpan) -> bool,
) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| pick(s)).collect();
    assert_eq!(found.len(), 1, "one {what}: {found:#?}");
    found[0]
}

#[tokio::test(flavor = "current_thread")]
async fn one_payment_is_one_trace_from_the_api_through_a_crash_to_a_late_refund_event() {
    let receiver = OtlpReceiver::start("127.0.0.1:0", None).await.unwrap();
    let provider = exporting_to(&receiver);
    // This test's thread only: the layer the functions install, exporting to the receiver.
    let _traced = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(payment_core::telemetry::traces::layer_for(&provider)),
    );
    // The other tests of this binary run beside on threads of their own without a subscriber:
    // a span's callsite first met there while this thread's subscriber was being registered
    // may keep the interest computed without it (tracing's cache). Computed again before each
    // in-process step, so that this thread records every span, as a function's process, whose
    // subscriber is set before any span, does.
    let recorded = tracing::callsite::rebuild_interest_cache;
    recorded();
    let t = TestStack::new("traces").await;
    let pid = t.pid("p1");
    let customer = "cus_traced_person_1";

    // The caller's trace, as a client with its own tracing sends it.
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace}-{caller_span}-01");
    let api = payment_core::edges::bootstrap::build_api(
        &crate::api::api_config(&t),
        aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await),
    );
    let body = format!(
        r#"{{"amount":2500,"currency":"usd","customer_id":"{customer}","payment_method":"pm_card_refundFail"}}"#
    );
    let headers: HashMap<&str, String> = HashMap::from([
        ("idempotency-key", pid.clone()),
        ("traceparent", traceparent),
    ]);
    recorded();
    let answer = api
        .handle(
            "POST",
            "/v1/payments",
            |h| headers.get(h.to_ascii_lowercase().as_str()).cloned(),
            body.as_bytes(),
        )
        .await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    let mapping = crate::api::relay(&t).await;
    crate::api::relayed(&mapping, 1).await;
    mapping.stop().await.expect("stopping the relay");

    // A processor process claims the payment and dies before calling the provider.
    let crashed = runner(&t, &receiver, true)
        .status()
        .await
        .expect("running payctl");
    assert!(!crashed.success(), "the runner aborted at after_claim");
    let r = t.record(&pid).await.expect("the crashed claim's record");
    assert_eq!(r.status.as_str(), "IN_PROGRESS");
    let kept = r.traceparent.clone().expect("the claim kept its trace");
    assert_eq!(sqs_once::trace::trace_id_of(&kept), Some(trace.as_str()));
    // Another takes it over once the lease ends, and charges once.
    let took_over = runner(&t, &receiver, false).status().await.unwrap();
    assert!(took_over.success(), "the second runner drained the queue");
    assert_charged_once(&t, &pid).await;
    assert_eq!(t.record(&pid).await.unwrap().attempts, 2);

    // payctl status names the trace.
    let status = tokio::process::Command::new(bin("payctl"))
        .args(["status", &pid])
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        printed.contains(&format!("trace id         {trace}")),
        "{printed}"
    );

    // A refund, whose failure the provider reports later by an event.
    let rid = t.pid("r1");
    recorded();
    let stats = refund(&t, &[refund_body(&rid, &pid, Some(1000))]).await;
    assert_eq!(stats.summary.done("refunded"), 1);
    let e = events(&t).await;
    recorded();
    let listed = e
        .listed(std::slice::from_ref(&rid), |l| {
            kinds(l).contains(&"refund.failed")
        })
        .await;
    e.deliver_all(&listed, 1).await;
    let applied = e.drain(&t).await;
    assert!(applied.summary.done("applied") >= 1);

    // Every span is in: the processes' left with them; this thread's now.
    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .unwrap()
        .expect("the in-process spans exported");
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = receiver.spans();
        let linked = spans
            .iter()
            .filter(|s| s.links.iter().any(|(t, _)| *t == trace))
            .count();
        if linked >= 3 || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let payment: Vec<ReceivedSpan> = spans
        .iter()
        .filter(|s| s.trace_id == trace)
        .cloned()
        .collect();
    let queue = t.queue_url().rsplit('/').next().unwrap().to_owned();

    // The API continued the caller's trace, and the relay's message the API's.
    let request = one(&payment, "API request", |s| s.name == "POST /v1/payments");
    assert_eq!(
        (request.kind, request.parent_span_id.as_str()),
        ("server", caller_span)
    );
    assert_eq!(
        request.attr("idempotency.outcome").as_deref(),
        Some("created")
    );
    assert_eq!(
        request.attr("http.response.status_code").as_deref(),
        Some("202")
    );
    let create = one(&payment, "relay's create span", |s| {
        s.name == format!("create {queue}")
    });
    assert_eq!(
        (create.kind, &create.parent_span_id),
        ("producer", &request.span_id)
    );
    assert_eq!(create.attr("idempotency.key"), Some(pid.clone()));
    // The crashed process exported nothing of its claim. The next deliveries continue the
    // message: one may meet the crashed claim's live lease and come back after its delay; the
    // takeover follows.
    let deliveries: Vec<&ReceivedSpan> = payment
        .iter()
        .filter(|s| s.name == format!("process {queue}"))
        .collect();
    for d in &deliveries {
        assert_eq!((d.kind, &d.parent_span_id), ("consumer", &create.span_id));
        assert_eq!(d.service, "payctl");
        assert_eq!(d.attr("messaging.system").as_deref(), Some("aws_sqs"));
        if d.attr("idempotency.outcome").as_deref() == Some("in_progress_elsewhere") {
            assert!(
                d.attr("messaging.aws_sqs.redelivery_delay_s").is_some(),
                "{d:#?}"
            );
        }
    }
    let message = one(&payment, "takeover", |s| {
        s.attr("idempotency.outcome").as_deref() == Some("taken_over")
    });
    assert_eq!(
        message.attr("idempotency.unknown_outcome").as_deref(),
        Some("true")
    );
    assert!(message
        .attr("messaging.aws_sqs.receive_count")
        .is_some_and(|n| n != "1"));
    // Its batch's span (the invocation's trace) links the message's producer.
    let batch = spans
        .iter()
        .find(|s| message.links.iter().any(|(_, id)| *id == s.span_id))
        .expect("the message links its batch's span");
    assert_eq!(
        batch.attr("messaging.batch.message_count").as_deref(),
        Some("1")
    );
    assert!(batch
        .links
        .contains(&(trace.clone(), create.span_id.clone())));
    // Under the message: the claim, the call attempt (the unknown outcome is settled by the
    // provider's replay of the key: the key is recent, no lookup), the charge, the completion.
    let under_message = |s: &ReceivedSpan| {
        let mut parent = s.parent_span_id.clone();
        while let Some(p) = payment.iter().find(|p| p.span_id == parent) {
            if p.span_id == message.span_id {
                return true;
            }
            parent = p.parent_span_id.clone();
        }
        false
    };
    for name in ["claim", "execute", "complete"] {
        assert!(
            payment.iter().any(|s| s.name == name && under_message(s)),
            "a {name} span under the message: {payment:#?}"
        );
    }
    let charge = one(&payment, "charge", |s| s.name == "POST /v1/payment_intents");
    assert!(under_message(charge));
    assert_eq!(charge.kind, "client");
    assert_eq!(
        charge.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(charge.attr("idempotency.key"), Some(pid.clone()));
    assert_eq!(charge.attr("sqs_once.attempt").as_deref(), Some("1"));
    assert!(charge
        .attr("stripe.request_id")
        .is_some_and(|r| r.starts_with("req_")));
    assert_eq!(
        charge.attr("url.template").as_deref(),
        Some("/v1/payment_intents")
    );

    // The refund's work and the late event's work link to the payment's trace.
    let linking: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.trace_id != trace && s.links.iter().any(|(t, _)| *t == trace))
        .collect();
    let refund_queue = t.stack.event_sources[payctl::template::REFUND_PROCESSOR]
        .queue_url
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let in_trace_of = |s: &ReceivedSpan, name: &str| {
        spans
            .iter()
            .any(|p| p.trace_id == s.trace_id && p.name == name)
    };
    assert!(
        linking
            .iter()
            .any(|s| in_trace_of(s, &format!("process {refund_queue}"))),
        "the refund links the payment: {linking:#?}\nthe in-process spans: {:#?}",
        spans
            .iter()
            .filter(|s| s.service == "in-process")
            .map(|s| (&s.trace_id, &s.name, &s.links))
            .collect::<Vec<_>>()
    );
    let event_links: Vec<&&ReceivedSpan> = linking
        .iter()
        .filter(|s| in_trace_of(s, "POST /v1/provider-events"))
        .collect();
    assert!(
        !event_links.is_empty(),
        "the late event links the payment: {linking:#?}"
    );
    // The event's message continued the delivery that brought it.
    let delivery = spans
        .iter()
        .find(|s| s.trace_id == event_links[0].trace_id && s.name == "POST /v1/provider-events")
        .unwrap();
    assert_eq!(delivery.kind, "server");

    // Nothing sensitive left in a span: no key, no secret, no card, no customer.
    let exported = serde_json::to_string(&spans).unwrap();
    // (A card's digits, not any "4242": trace and span ids are random hex.)
    for secret in [
        "sk_test",
        "sk_live",
        "whsec_",
        "pm_card",
        customer,
        "4242424242424242",
        "4242 4242",
    ] {
        assert!(!exported.contains(secret), "{secret} in an exported span");
    }
}
