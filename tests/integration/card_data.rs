//! No raw card data at rest or in logs: a payment whose body carries a card number in any
//! field (its description, a metadata key or value, its customer, its payment method, its
//! currency, a field's name) is refused by the API without echoing it, and dead-lettered by
//! the processor with the number masked (first six and last four digits) and flagged, its
//! reason quoting none of it; the number is in no table item, no DLQ body or attribute and no
//! log line of either process. An id that is a card number (a payment's, a refund's) is
//! refused before any record is keyed by it; a refund or a provider event carrying one leaves
//! it in no log line, dead letter, table item, exported span or `payctl` output either.

use std::process::Stdio;

use aws_sdk_sqs::types::MessageSystemAttributeName;

use crate::helpers::*;

const PAN: &str = "4000 0566 5566 5556";
const PAN_DIGITS: &str = "4000056655665556";

fn leaks(text: &str) -> bool {
    text.contains(PAN) || text.contains(PAN_DIGITS) || text.contains("0566 5566")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_number_is_kept_nowhere() {
    let t = TestStack::new("card").await;
    let pid = t.pid("p1");
    let body =
        payment(&pid, 100, PAN).replace(&format!("Order for {pid}"), &format!("card {PAN_DIGITS}"));
    assert!(body.contains(PAN) && body.contains(PAN_DIGITS));
    t.send(&body).await;
    // The number in each other field of a raw message: each refused, none kept.
    let fields = every_field_holding_the_number();
    for (n, (_, value)) in fields.iter().enumerate() {
        let mut message = value.clone();
        message["payment_id"] = t.pid(&format!("f{n}")).into();
        t.send(&message.to_string()).await;
    }
    // And as the payment's id: refused before any record is keyed by it.
    let mut keyed = fields[0].1.clone();
    keyed["payment_id"] = PAN_DIGITS.into();
    keyed["description"] = "an id that is a card number".into();
    t.send(&keyed.to_string()).await;

    // The processor as its own process, logging at debug level.
    let payctl = bin("payctl");
    let run = tokio::process::Command::new(&payctl)
        .args([
            "run",
            "--queue-url",
            t.queue_url(),
            "--until-empty",
            "--max-seconds",
            "60",
        ])
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .envs(fast_settings())
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("running payctl run");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        logs.contains("dead-lettered"),
        "the run processed the message: {logs}"
    );
    assert!(!leaks(&logs), "a log line holds the card number");

    // The dead letter: masked, flagged, with the reason.
    let received = t
        .sqs
        .receive_message()
        .queue_url(&t.config.dead_letter_queue_url)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .send()
        .await
        .expect("receiving the dead letter");
    let mut letters = received.messages().to_vec();
    while letters.len() < 2 + fields.len() {
        let more = t
            .sqs
            .receive_message()
            .queue_url(&t.config.dead_letter_queue_url)
            .message_attribute_names("All")
            .max_number_of_messages(10)
            .wait_time_seconds(2)
            .send()
            .await
            .expect("receiving the dead letters");
        if more.messages().is_empty() {
            break;
        }
        letters.extend(more.messages().iter().cloned());
    }
    assert_eq!(letters.len(), 2 + fields.len(), "a dead letter each");
    for l in &letters {
        let text = format!("{:?} {:?}", l.body(), l.message_attributes());
        assert!(!leaks(&text), "a dead letter holds the card number: {text}");
        let code = l
            .message_attributes()
            .and_then(|m| m.get("error_code"))
            .and_then(|v| v.string_value());
        assert_eq!(code, Some("invalid_payment"), "{text}");
    }
    let letter = letters
        .iter()
        .find(|l| l.body().is_some_and(|b| b.contains(&format!("\"{pid}\""))))
        .expect("the first payment's dead letter");
    let dead_body = letter.body().unwrap_or_default();
    assert!(
        !leaks(dead_body),
        "the DLQ body holds the card number: {dead_body}"
    );
    assert!(dead_body.contains("4000 05** **** 5556"), "{dead_body}");
    assert!(dead_body.contains("400005******5556"), "{dead_body}");
    let attr = |k: &str| {
        letter
            .message_attributes()
            .and_then(|m| m.get(k))
            .and_then(|v| v.string_value())
            .map(str::to_owned)
    };
    assert_eq!(attr("card_data_masked").as_deref(), Some("true"));
    assert_eq!(attr("error_code").as_deref(), Some("invalid_payment"));
    assert!(!leaks(&attr("error_message").unwrap_or_default()));

    // The API refuses it without echoing it, stores nothing, and logs nothing of it.
    let config = payment_core::edges::config::ApiConfig::from_lookup(|k| {
        t.stack
            .var_of("PaymentsApiFunction", k)
            .ok()
            .map(str::to_owned)
    })
    .expect("the API's configuration");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut api = tokio::process::Command::new(&payctl)
        .args(["api", "serve", "--address", &format!("127.0.0.1:{port}")])
        .env("PAYMENTS_TABLE", &config.payments_table)
        .env("IDEMPOTENCY_TABLE", &config.idempotency_table)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting payctl api serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the API did not listen"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let client = payctl::client::ApiClient::new(&format!("http://127.0.0.1:{port}"), &sdk).unwrap();
    let api_body = serde_json::json!({
        "amount": 100, "currency": "usd", "customer_id": "cus_card",
        "payment_method": PAN, "description": format!("card {PAN_DIGITS}"),
    })
    .to_string();
    let answer = client.create(&t.pid("api"), &api_body).await.unwrap();
    assert_eq!(answer.status, 400);
    assert!(!leaks(&answer.body), "{}", answer.body);
    for (n, (field, value)) in fields.iter().enumerate() {
        let answer = client
            .create(&t.pid(&format!("api{n}")), &value.to_string())
            .await
            .unwrap();
        assert_eq!(answer.status, 400, "{field}: {}", answer.body);
        assert!(!leaks(&answer.body), "{field}: {}", answer.body);
    }
    // A path holding it is not echoed either.
    let answer = client.get(PAN_DIGITS).await.unwrap();
    assert_eq!(answer.status, 404);
    assert!(!leaks(&answer.body), "{}", answer.body);
    api.start_kill().expect("stopping the API");
    let out = api.wait_with_output().await.expect("the API's output");
    let api_logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!leaks(&api_logs), "an API log line holds the card number");

    // No table item holds it.
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    for table in [&config.payments_table, &config.idempotency_table] {
        let items = ddb
            .scan()
            .table_name(table.as_str())
            .send()
            .await
            .expect("scanning");
        let text = format!("{:?}", items.items());
        assert!(!leaks(&text), "{table} holds the card number");
    }
}

/// A payment body (without its `payment_id`) holding the card number in one field each.
fn every_field_holding_the_number() -> Vec<(&'static str, serde_json::Value)> {
    let base = || {
        serde_json::json!({
            "amount": 100, "currency": "usd", "customer_id": "cus_card",
            "payment_method": "pm_card_visa",
        })
    };
    let with = |field: &'static str, value: serde_json::Value| {
        let mut b = base();
        b[field] = value;
        (field, b)
    };
    vec![
        with("description", format!("my card {PAN} exp 12/30").into()),
        with("metadata", serde_json::json!({ "note": PAN_DIGITS })),
        with("metadata", serde_json::json!({ PAN_DIGITS: "v" })),
        with("metadata", serde_json::json!({ PAN_DIGITS: "" })),
        with("customer_id", PAN_DIGITS.into()),
        with("payment_method", PAN.into()),
        with("currency", PAN_DIGITS.into()),
        with(PAN_DIGITS, 1.into()),
    ]
}

/// `payctl run --work <work>` over `queue` as the stack's function would run, logging at debug
/// level and exporting its spans to `receiver`: its logs.
async fn run_as(
    t: &TestStack,
    function: &str,
    work: &str,
    queue: &str,
    dlq: &str,
    receiver: &proving::otlp::OtlpReceiver,
) -> String {
    let run = tokio::process::Command::new(bin("payctl"))
        .args(["run", "--work", work, "--queue-url", queue])
        .args([
            "--dead-letter-queue-url",
            dlq,
            "--until-empty",
            "--max-seconds",
            "60",
        ])
        .envs(&t.stack.function_envs[function])
        .envs(fast_settings())
        .env("RUST_LOG", "debug")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("running payctl run");
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{logs}");
    logs
}

/// Every message of a queue, bodies and attributes, as text (received and deleted).
async fn drained(t: &TestStack, queue: &str) -> (usize, String) {
    let letters = proving::check::drain_dlq(&t.sqs, queue).await.unwrap();
    (
        letters.len(),
        letters
            .iter()
            .map(|l| format!("{} {} {}", l.error_code, l.source_message_id, l.body))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_number_in_a_refund_or_a_provider_event_is_kept_nowhere() {
    use payctl::template::{EVENT_PROCESSOR, REFUND_PROCESSOR};
    let t = TestStack::new("card-after").await;
    let e = crate::events::events(&t).await;
    let receiver = proving::otlp::OtlpReceiver::start("127.0.0.1:0", None)
        .await
        .expect("the OTLP receiver");
    let pid = t.pid("p");
    t.send(&payment(&pid, 2000, "pm_card_visa")).await;
    t.drain(1).await;
    let intent = t.ledger(&pid).await.charges[&pid][0].id.clone();

    // Refunds holding the number in each field: its id, its payment's id, its reason, its
    // amount, a field's name.
    let refund_of = |fields: serde_json::Value| {
        let mut r = serde_json::json!({"refund_id": t.pid("r"), "payment_id": pid});
        for (k, v) in fields.as_object().unwrap() {
            r[k] = v.clone();
        }
        r.to_string()
    };
    let refunds = [
        refund_of(serde_json::json!({"refund_id": format!("r-{PAN_DIGITS}")})),
        refund_of(serde_json::json!({"payment_id": PAN_DIGITS})),
        refund_of(serde_json::json!({"refund_id": t.pid("r2"), "reason": format!("card {PAN}")})),
        refund_of(serde_json::json!({"refund_id": t.pid("r3"), "amount": PAN_DIGITS})),
        refund_of(serde_json::json!({"refund_id": t.pid("r4"), PAN_DIGITS: 1})),
    ];
    let refunds_queue = &t.stack.event_sources[REFUND_PROCESSOR].queue_url;
    let refunds_dlq = t
        .stack
        .var_of(REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")
        .unwrap()
        .to_owned();
    proving::load::send_all(&t.sqs, refunds_queue, &refunds)
        .await
        .unwrap();
    let mut logs = run_as(
        &t,
        REFUND_PROCESSOR,
        "refunds",
        refunds_queue,
        &refunds_dlq,
        &receiver,
    )
    .await;
    let (n, letters) = drained(&t, &refunds_dlq).await;
    assert_eq!(n, refunds.len(), "each refused: {letters}");
    assert!(
        !leaks(&letters),
        "a refund's dead letter holds the number: {letters}"
    );

    // Provider events about our payment holding it in their metadata, description and a
    // refund id, signed and delivered: each applied or set aside, none keeping it.
    let event = |id: &str, kind: &str, object: serde_json::Value| {
        serde_json::json!({"id": id, "object": "event", "type": kind, "created": 1,
                           "api_version": payment_core::stripe::DEFAULT_API_VERSION,
                           "data": {"object": object}})
        .to_string()
    };
    let bodies = [
        event(
            &format!("evt_card1_{}", t.name),
            "payment_intent.succeeded",
            serde_json::json!({"id": intent, "object": "payment_intent", "status": "succeeded",
                               "description": format!("card {PAN}"),
                               "metadata": {"payment_id": pid, "note": PAN_DIGITS}}),
        ),
        event(
            &format!("evt_card2_{}", t.name),
            "refund.failed",
            serde_json::json!({"id": "re_card", "object": "refund", "status": "failed",
                               "payment_intent": intent, "amount": 100,
                               "metadata": {"refund_id": format!("r-{PAN_DIGITS}"), "payment_id": pid}}),
        ),
        event(
            &format!("evt_card3_{}", t.name),
            "payment_intent.succeeded",
            serde_json::json!({"id": "pi_other", "object": "payment_intent", "status": "succeeded",
                               "metadata": {"payment_id": PAN_DIGITS}}),
        ),
    ];
    let listed: Vec<_> = bodies
        .iter()
        .map(|b| {
            (
                payment_core::provider::event::ProviderEvent::parse(b).unwrap(),
                b.clone(),
            )
        })
        .collect();
    e.deliver_all(&listed, 1).await;
    let events_queue = &t.stack.event_sources[EVENT_PROCESSOR].queue_url;
    logs += &run_as(
        &t,
        EVENT_PROCESSOR,
        "events",
        events_queue,
        &e.dlq_url,
        &receiver,
    )
    .await;
    let (_, letters) = drained(&t, &e.dlq_url).await;
    assert!(
        !leaks(&letters),
        "an event's dead letter holds the number: {letters}"
    );
    assert!(!leaks(&logs), "a log line holds the card number");

    // Nor any span exported, any table item, or payctl's word on the payment.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let spans = format!("{:?}", receiver.spans());
    assert!(spans.len() > 100, "spans were exported: {spans}");
    assert!(!leaks(&spans), "a span holds the card number");
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let items = ddb
        .scan()
        .table_name(&t.config.idempotency_table)
        .send()
        .await
        .expect("scanning");
    let text = format!("{:?}", items.items());
    assert!(text.contains(&pid), "the table was read");
    assert!(!leaks(&text), "the idempotency table holds the card number");
    for args in [vec!["status", pid.as_str()], vec!["history", pid.as_str()]] {
        let out = std::process::Command::new(bin("payctl"))
            .args(&args)
            .args(["--table", &t.config.idempotency_table])
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!leaks(&said), "payctl {args:?}: {said}");
    }
}
