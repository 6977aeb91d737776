//! The payment as a `sqs_once::Work`: what the provider's answers become (labels, dead letters
//! with their codes), what a refused body keeps at rest, and what the logs never say. The
//! protocol itself (leases, fencing, unknown outcomes, redelivery) is tested once, generically,
//! in `sqs-once/tests/protocol.rs`.
//!
//! Why one file of ~530 lines: each test is one of the payment work's answers (a charge, a
//! decline, a refusal, a body refused now or before) with the provider stub it needs.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;
use common::Queues;
use payment_core::domain::PaymentRequest;
use payment_core::provider::{
    FailureKind, FoundPayment, PaymentProvider, PaymentQuery, ProviderError, ProviderResponse,
};
use payment_core::{PaymentOutcome, PaymentWork, Processor};
use sqs_once::memory::InMemoryStore;
use sqs_once::record::IdempotencyStore;
use sqs_once::runner::now_ms;
use sqs_once::{CallError, Settings, Work};

/// A provider that answers every payment the same way.
struct Answering(Result<ProviderResponse, ProviderError>);

#[async_trait]
impl PaymentProvider for Answering {
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
    async fn create_payment(&self, _: &PaymentRequest) -> Result<ProviderResponse, ProviderError> {
        self.0.clone()
    }
    async fn find_payments(&self, _: &PaymentQuery) -> Result<Vec<FoundPayment>, ProviderError> {
        Ok(Vec::new())
    }
}

/// A provider whose answers are all lost (timeouts) and whose lookups find what it holds,
/// remembering each lookup's query.
struct Forgetful {
    holds: Vec<FoundPayment>,
    queries: Mutex<Vec<PaymentQuery>>,
}

#[async_trait]
impl PaymentProvider for Forgetful {
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
    async fn create_payment(&self, _: &PaymentRequest) -> Result<ProviderResponse, ProviderError> {
        Err(ProviderError {
            replayed: true,
            ..ProviderError::new(FailureKind::ServerError, "replayed 500")
        })
    }
    async fn find_payments(&self, q: &PaymentQuery) -> Result<Vec<FoundPayment>, ProviderError> {
        self.queries.lock().unwrap().push(q.clone());
        Ok(self.holds.clone())
    }
}

fn settings() -> Settings {
    Settings {
        lease: Duration::from_secs(10),
        call_retry_delay: Duration::from_millis(1),
        processing_allowance: Duration::ZERO,
        ..Settings::default()
    }
}

fn processor(
    provider: Arc<dyn PaymentProvider>,
) -> (Arc<Processor>, Arc<InMemoryStore>, Arc<Queues>) {
    // A global subscriber beside the log test's thread-local one: with none, a callsite first
    // reached by another test thread is cached as never enabled.
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let store = Arc::new(InMemoryStore::new());
    let queues = Arc::new(Queues::default());
    let work = PaymentWork::new(provider, Duration::from_secs(86_400));
    let p = Processor::new(Arc::new(work), store.clone(), queues.clone(), settings());
    (Arc::new(p), store, queues)
}

fn body(pid: &str) -> String {
    format!(
        r#"{{"payment_id":"{pid}","amount":1999,"currency":"usd","customer_id":"cus_1","payment_method":"pm_card_visa"}}"#
    )
}

fn msg(id: &str, body: &str) -> SqsMessage {
    common::msg("payments", id, body)
}

#[tokio::test]
async fn a_charge_and_a_decline_are_counted_under_their_labels_with_the_provider_s_ids() {
    let (p, store, _) = processor(Arc::new(Answering(Ok(ProviderResponse::Charged {
        provider_payment_id: "pi_1".into(),
        status: "succeeded".into(),
        replayed: false,
    }))));
    let (_, s) = p
        .handle_batch(vec![msg("m1", &body("p1"))], now_ms() + 60_000)
        .await;
    assert_eq!(s.done("charged"), 1);
    let o = PaymentOutcome::from_outcome(&store.get("p1").await.unwrap().unwrap().outcome.unwrap());
    assert_eq!(
        (
            o.status.as_str(),
            o.provider_payment_id.as_deref(),
            o.amount,
            o.currency.as_str()
        ),
        ("succeeded", Some("pi_1"), 1999, "usd")
    );

    let (p, store, queues) = processor(Arc::new(Answering(Ok(ProviderResponse::Declined {
        provider_payment_id: Some("pi_2".into()),
        decline_code: Some("insufficient_funds".into()),
    }))));
    let (_, s) = p
        .handle_batch(vec![msg("m2", &body("p2"))], now_ms() + 60_000)
        .await;
    assert_eq!(s.done("declined"), 1);
    assert!(
        queues.0.lock().unwrap().is_empty(),
        "a decline is not dead-lettered"
    );
    let o = PaymentOutcome::from_outcome(&store.get("p2").await.unwrap().unwrap().outcome.unwrap());
    assert_eq!(o.decline_code.as_deref(), Some("insufficient_funds"));
}

#[tokio::test]
async fn a_card_that_needs_the_customer_is_recorded_as_requires_action_never_as_charged() {
    for answer in [
        ProviderResponse::NeedsAuthentication {
            provider_payment_id: Some("pi_3ds".into()),
        },
        ProviderResponse::Charged {
            provider_payment_id: "pi_3ds".into(),
            status: "requires_action".into(),
            replayed: false,
        },
    ] {
        let (p, store, queues) = processor(Arc::new(Answering(Ok(answer))));
        let (failed, s) = p
            .handle_batch(vec![msg("m1", &body("p1"))], now_ms() + 60_000)
            .await;
        assert!(failed.batch_item_failures.is_empty());
        assert_eq!((s.done("charged"), s.done("requires_action")), (0, 1));
        assert!(queues.0.lock().unwrap().is_empty());
        let o =
            PaymentOutcome::from_outcome(&store.get("p1").await.unwrap().unwrap().outcome.unwrap());
        assert_eq!(o.status, "requires_action");
        assert!(!o.is_charge());
        assert_eq!(o.provider_payment_id.as_deref(), Some("pi_3ds"));
        assert!(o.reason.unwrap().contains("on-session"));
    }
    let (p, _, _) = processor(Arc::new(Answering(Ok(ProviderResponse::Charged {
        provider_payment_id: "pi_ach".into(),
        status: "processing".into(),
        replayed: false,
    }))));
    let (_, s) = p
        .handle_batch(vec![msg("m2", &body("p2"))], now_ms() + 60_000)
        .await;
    assert_eq!((s.done("charged"), s.done("processing")), (0, 1));
}

#[tokio::test]
async fn a_lookup_lists_the_customer_s_intents_since_the_first_attempt() {
    let found = |status: &str, failure: Option<&str>| FoundPayment {
        provider_payment_id: "pi_2".into(),
        status: status.into(),
        payment_id: Some("p1".into()),
        amount: Some(1999),
        currency: Some("usd".into()),
        failure_code: failure.map(str::to_owned),
    };
    // What the intent found stands for: as it is when alive; a failed confirmation by its
    // last_payment_error (a card that needs the customer is not a decline).
    for (held, label, status) in [
        (found("processing", None), "processing", "processing"),
        (found("succeeded", None), "charged", "succeeded"),
        (
            found("requires_payment_method", Some("authentication_required")),
            "requires_action",
            "requires_action",
        ),
        (
            found("requires_payment_method", Some("insufficient_funds")),
            "declined",
            "declined",
        ),
    ] {
        let provider = Arc::new(Forgetful {
            holds: vec![held],
            queries: Mutex::new(Vec::new()),
        });
        let (p, store, _) = processor(provider.clone());
        let first = now_ms() - 5_000;
        // An earlier attempt's answer was lost: the record is marked unknown, and the provider
        // now replays a 500 for the key, so only the lookup can tell.
        store.insert(sqs_once::record::IdempotencyRecord {
            traceparent: None,
            key: "p1".into(),
            status: sqs_once::record::RecordStatus::Failed,
            payload_hash: PaymentRequest::parse(&body("p1")).unwrap().payload_hash(),
            lease_owner: None,
            lease_expires_at_ms: first,
            attempts: 1,
            outcome: None,
            expires_at_s: now_ms() / 1000 + 86_400,
            first_attempt_at_ms: first,
            unknown_outcome: true,
            last_error: None,
            completed_at_ms: None,
            not_before_ms: Some(first),
        });
        let (failed, s) = p
            .handle_batch(vec![msg("m1", &body("p1"))], now_ms() + 60_000)
            .await;
        assert!(failed.batch_item_failures.is_empty());
        assert_eq!(s.done(label), 1, "{status}");
        let o =
            PaymentOutcome::from_outcome(&store.get("p1").await.unwrap().unwrap().outcome.unwrap());
        assert_eq!(
            (o.status.as_str(), o.provider_payment_id.as_deref()),
            (status, Some("pi_2"))
        );
        let q = provider.queries.lock().unwrap()[0].clone();
        assert_eq!(q.customer.as_deref(), Some("cus_1"));
        assert_eq!(q.created_from_s, Some(first / 1000 - 60));
    }
}

#[tokio::test]
async fn a_rejected_payment_is_dead_lettered_with_the_provider_s_reason_every_time() {
    let (p, _, queues) = processor(Arc::new(Answering(Ok(ProviderResponse::Rejected {
        code: "amount_too_small".into(),
        message: "Amount must be at least 50 cents".into(),
    }))));
    let (_, s) = p
        .handle_batch(vec![msg("m1", &body("p1"))], now_ms() + 60_000)
        .await;
    assert_eq!(s.dead_lettered.get("provider_rejected"), Some(&1));
    // A duplicate of it (the first dead-lettering may have been lost) goes the same way.
    let (_, s) = p
        .handle_batch(vec![msg("m2", &body("p1"))], now_ms() + 60_000)
        .await;
    assert_eq!(s.dead_lettered.get("provider_rejected"), Some(&1));
    let dead = queues.0.lock().unwrap().clone();
    assert_eq!(dead.len(), 2);
    assert!(dead[1].error_message.contains("amount_too_small"));

    let (p, _, _) = processor(Arc::new(Answering(Ok(ProviderResponse::KeyReused {
        message: "Keys for idempotent requests can only be used with the same parameters".into(),
    }))));
    let (_, s) = p
        .handle_batch(vec![msg("m3", &body("p3"))], now_ms() + 60_000)
        .await;
    assert_eq!(s.dead_lettered.get("idempotency_key_reused"), Some(&1));
}

#[tokio::test]
async fn a_refused_body_is_dead_lettered_with_its_card_number_masked() {
    let (p, _, queues) = processor(Arc::new(Answering(Err(ProviderError::new(
        FailureKind::Timeout,
        "never called",
    )))));
    let bad = r#"{"payment_id":"p1","amount":-5,"card":"4242424242424242"}"#;
    let (_, s) = p
        .handle_batch(vec![msg("m1", bad)], now_ms() + 60_000)
        .await;
    assert_eq!(s.dead_lettered.get("invalid_payment"), Some(&1));
    let dead = queues.0.lock().unwrap();
    assert!(
        !dead[0].body.contains("4242424242424242"),
        "{}",
        dead[0].body
    );
    assert!(
        dead[0].body.contains("424242******4242"),
        "{}",
        dead[0].body
    );
    assert_eq!(
        dead[0].extra_attributes,
        vec![("card_data_masked".to_owned(), "true".to_owned())]
    );
}

#[test]
fn only_a_replayed_5xx_asks_for_a_lookup() {
    let replayed = |kind| ProviderError {
        replayed: true,
        ..ProviderError::new(kind, "x")
    };
    let e = CallError::from(replayed(FailureKind::ServerError));
    assert!(e.replayed && e.ambiguous && !e.retry_now);
    let e = CallError::from(replayed(FailureKind::KeyInUse));
    assert!(!e.replayed && e.ambiguous);
    let e = CallError::from(ProviderError::new(FailureKind::RateLimited, "429"));
    assert!(!e.ambiguous && e.retry_now);
    let e = CallError::from(ProviderError::new(FailureKind::Misconfigured, "401"));
    assert!(e.misconfigured && !e.retry_now && !e.ambiguous);
}

#[test]
fn the_payment_id_is_the_key_and_the_hash_its_fingerprint() {
    let work = PaymentWork::new(
        Arc::new(Answering(Err(ProviderError::new(FailureKind::Timeout, "")))),
        Duration::from_secs(86_400),
    );
    let a = work.parse(&body("p1")).unwrap();
    let b = work.parse(&body("p1").replace("1999", "2000")).unwrap();
    assert_eq!(work.key(&a), "p1");
    assert_ne!(work.fingerprint(&a), work.fingerprint(&b));
    assert_eq!(work.key_retention(), Some(Duration::from_secs(86_400)));
}

/// A writer that keeps what the log subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn every_log_line_of_a_message_names_it_and_never_the_api_key() {
    let captured = Captured::default();
    let sink = captured.clone();
    // The functions' own log layer, beside a trace layer: its spans of claims and provider
    // requests must not take the message's place on a line (at TRACE, the HTTP client's own
    // lines inside a provider request are logged too).
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry()
        .with(payment_core::telemetry::json_log_layer(
            move || sink.clone(),
            tracing_subscriber::filter::LevelFilter::TRACE,
            false,
        ))
        .with(tracing_opentelemetry::layer());
    let _guard = tracing::subscriber::set_default(subscriber);
    // The real Stripe client, with a key, against an address where nothing listens.
    let provider = Arc::new(
        payment_core::stripe::StripeClient::new(
            "http://127.0.0.1:9",
            secrecy::SecretString::from("sk_live_must_never_be_logged"),
            payment_core::stripe::DEFAULT_API_VERSION,
            Duration::from_secs(1),
        )
        .unwrap(),
    );
    let (p, _, _) = processor(provider);
    let (r, _) = p
        .handle_batch(vec![msg("m-log", &body("p-log"))], now_ms() + 60_000)
        .await;
    assert_eq!(r.batch_item_failures.len(), 1);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "the failed calls were logged");
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        // The TLS verifier loads the system's CA roots once a process, lazily, at DEBUG: in
        // whichever test of this binary comes first, and in production once per cold start
        // (below the functions' INFO). It is the process's line, not a message's.
        if v["fields"]["log.target"]
            .as_str()
            .is_some_and(|t| t.starts_with("rustls_platform_verifier"))
            && v["level"] == "DEBUG"
        {
            continue;
        }
        assert_eq!(v["span"]["message_id"], "m-log", "{line}");
        assert_eq!(v["span"]["key"], "p-log", "{line}");
    }
    assert!(!text.contains("sk_live_must_never_be_logged"));
}

/// A charge's record holds its refund ledger: it is kept for the refund window from the
/// charge, not the record retention from the claim; so is every payment whose PaymentIntent
/// the provider can still change (a bank debit `processing`, an off-session payment waiting
/// for its customer, a decline the customer may confirm again on-session), whose late event
/// must find it; a payment refused before any PaymentIntent keeps the record retention.
#[tokio::test]
async fn a_charged_payment_s_record_lives_as_long_as_refunds_are_accepted() {
    let day = 86_400i64;
    for (response, kept_days) in [
        (
            ProviderResponse::Charged {
                provider_payment_id: "pi_1".into(),
                status: "succeeded".into(),
                replayed: false,
            },
            365,
        ),
        (
            ProviderResponse::Charged {
                provider_payment_id: "pi_3".into(),
                status: "processing".into(),
                replayed: false,
            },
            365,
        ),
        (
            ProviderResponse::NeedsAuthentication {
                provider_payment_id: Some("pi_4".into()),
            },
            365,
        ),
        (
            ProviderResponse::Declined {
                provider_payment_id: Some("pi_2".into()),
                decline_code: Some("insufficient_funds".into()),
            },
            365,
        ),
        (
            ProviderResponse::Rejected {
                code: "parameter_invalid_integer".into(),
                message: "Invalid integer".into(),
            },
            settings().record_ttl.as_secs() as i64 / day,
        ),
    ] {
        let (p, store, _) = processor(Arc::new(Answering(Ok(response))));
        let before = now_ms() / 1000;
        p.handle_batch(vec![msg("m1", &body("p1"))], now_ms() + 60_000)
            .await;
        let expires = store.get("p1").await.unwrap().unwrap().expires_at_s;
        let kept = (expires - before) as f64 / day as f64;
        assert!(
            (kept - kept_days as f64).abs() < 0.01,
            "kept {kept:.3} days, want {kept_days}"
        );
    }
}

/// A provider that charges every payment, counting the charges it was asked for, and whose
/// lookups find what it holds.
#[derive(Default)]
struct Holding {
    charges: Mutex<usize>,
    holds: Vec<FoundPayment>,
}

#[async_trait]
impl PaymentProvider for Holding {
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
    async fn create_payment(&self, _: &PaymentRequest) -> Result<ProviderResponse, ProviderError> {
        *self.charges.lock().unwrap() += 1;
        Ok(ProviderResponse::Charged {
            provider_payment_id: "pi_now".into(),
            status: "succeeded".into(),
            replayed: false,
        })
    }
    async fn find_payments(&self, q: &PaymentQuery) -> Result<Vec<FoundPayment>, ProviderError> {
        Ok(self
            .holds
            .iter()
            .filter(|f| f.payment_id.as_deref() == Some(q.payment_id.as_str()))
            .cloned()
            .collect())
    }
}

/// A body an earlier release accepted and this one refuses: a control character in its
/// description and a card number in a metadata value.
fn refused_now(pid: &str) -> String {
    format!(
        r#"{{"payment_id":"{pid}","amount":1999,"currency":"usd","customer_id":"cus_1","payment_method":"pm_card_visa","description":"bell \u0007","metadata":{{"note":"4242 4242 4242 4242"}}}}"#
    )
}

/// The record an attempt leaves when it dies after its claim (its lease now over).
async fn claimed_and_died(store: &InMemoryStore, pid: &str) {
    let before = PaymentRequest::parse_as_before(&refused_now(pid)).unwrap();
    assert!(before.refused_now.is_some());
    let now = now_ms();
    let claimed = store
        .claim(&sqs_once::record::ClaimRequest {
            key: pid.into(),
            payload_hash: before.payload_hash(),
            owner: "a-process-that-died".into(),
            now_ms: now - 60_000,
            lease_expires_at_ms: now - 30_000,
            expires_at_s: now / 1000 + 86_400,
            traceparent: None,
        })
        .await
        .unwrap();
    assert!(matches!(
        claimed,
        sqs_once::record::ClaimResult::Claimed { .. }
    ));
}

fn status_of(record: Option<sqs_once::record::IdempotencyRecord>) -> String {
    PaymentOutcome::from_outcome(record.expect("a record").outcome.as_ref().unwrap()).status
}

#[tokio::test]
async fn a_body_refused_now_is_never_sent_and_what_an_earlier_release_charged_is_found() {
    let provider = Arc::new(Holding {
        holds: vec![FoundPayment {
            provider_payment_id: "pi_before".into(),
            status: "succeeded".into(),
            payment_id: Some("p-charged-before".into()),
            amount: Some(1999),
            currency: Some("usd".into()),
            failure_code: None,
        }],
        ..Holding::default()
    });
    let (p, store, queues) = processor(provider.clone());
    // Never claimed: refused on its first attempt, with a record GET reads as failed and a
    // dead letter without the card number.
    let (_, s) = p
        .handle_batch(vec![msg("m1", &refused_now("p-new"))], now_ms() + 60_000)
        .await;
    assert_eq!(s.dead_lettered.get("invalid_payment"), Some(&1));
    assert_eq!(status_of(store.get("p-new").await.unwrap()), "rejected");
    {
        let dead = queues.0.lock().unwrap();
        assert!(
            !dead[0].body.contains("4242 4242 4242 4242"),
            "{}",
            dead[0].body
        );
        assert!(
            !dead[0].error_message.contains("4242"),
            "{}",
            dead[0].error_message
        );
    }
    // Claimed by an earlier release that charged it and died before completing: finished
    // from what the provider holds, never refused and left.
    claimed_and_died(&store, "p-charged-before").await;
    // Claimed by a process (this release's, or an earlier one's before its call) that died
    // before sending anything: refused, never sent now.
    claimed_and_died(&store, "p-cut-off").await;
    let (_, s) = p
        .handle_batch(
            vec![
                msg("m2", &refused_now("p-charged-before")),
                msg("m3", &refused_now("p-cut-off")),
            ],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.dead_lettered.get("invalid_payment"), Some(&1), "{s:?}");
    assert_eq!(
        status_of(store.get("p-charged-before").await.unwrap()),
        "succeeded"
    );
    assert_eq!(status_of(store.get("p-cut-off").await.unwrap()), "rejected");
    assert_eq!(
        *provider.charges.lock().unwrap(),
        0,
        "a refused body is never sent"
    );
}
