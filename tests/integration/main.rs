//! Integration tests: the real processor, through the real AWS SDK, against a local AWS
//! endpoint and the provider simulator. Nothing is mocked. Each test provisions its own queue,
//! DLQ and table from `template.yaml` and uses its own payment ids, so tests run in parallel.
//!
//! The numbered tests are the acceptance list of the consumer's issue.
//!
//! Why flat (25 files): each file is one test module, named for what it proves; the name is the
//! filter (`cargo test --test integration events::`) and the docs cite tests by it.

mod api;
mod bounded_record;
mod card_data;
mod catch_up;
mod chaos;
mod cli_help;
mod connect;
mod contract;
mod dispute_race;
mod eventbridge;
mod events;
mod exactly_once;
mod failures;
mod function_process;
mod held_refunds;
mod helpers;
mod late_events;
mod operations;
mod operator;
mod operator_errors;
mod operator_health;
mod operator_safety;
mod operator_stop;
mod operator_views;
mod own_simulator;
mod pace;
mod preflight;
mod proxy;
mod refunds;
mod settled_by_the_provider;
mod timeline;
mod traces;
mod webhook_signature;

use std::time::Duration;

use helpers::*;
use sqs_once::runner::now_ms;

/// 1. A valid payment: one charge, record `COMPLETED` with the provider's id, message gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01_valid_payment_is_charged_once_and_recorded() {
    let t = TestStack::new("valid").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1999, "pm_card_visa")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let r = t.record(&pid).await.unwrap();
    let o = r.outcome.unwrap();
    assert_eq!(
        (o.number("amount"), o.text("currency")),
        (Some(1999), Some("usd"))
    );
    assert_eq!(r.attempts, 1);
    assert!(
        r.expires_at_s > now_ms() / 1000 + 18 * 86_400,
        "TTL outlives queue + DLQ retention"
    );
    assert_eq!(t.depth().await, 0, "message gone from the queue");
    assert!(t.dead_letters().await.is_empty());
}

/// 2. The same message delivered again: no second charge and no provider call; acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t02_redelivery_of_a_completed_payment_is_acknowledged_without_a_charge() {
    let t = TestStack::new("redeliver").await;
    let pid = t.pid("p1");
    let body = payment(&pid, 500, "pm_card_visa");
    t.send(&body).await;
    t.drain(1).await;
    t.send(&body).await;
    let records = t.receive_records(1).await;
    let response = t.invoke(records).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "the duplicate is acknowledged"
    );
    assert_eq!(
        t.calls(&pid).await,
        1,
        "the duplicate made no provider call"
    );
    assert_charged_once(&t, &pid).await;
    assert_eq!(t.record(&pid).await.unwrap().attempts, 1);
    assert_eq!(t.depth().await, 0);
    assert!(t.dead_letters().await.is_empty());
}

/// 3. Twenty copies of one payment, in one batch and across two concurrent runners: one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t03_twenty_copies_charge_once() {
    let t = TestStack::new("copies").await;
    // In one batch (Lambda batches can exceed SQS's 10 per receive with a batching window).
    let a = t.pid("one-batch");
    t.send_copies(&payment(&a, 700, "pm_card_visa"), 20).await;
    let records = t.receive_records(20).await;
    assert_eq!(records.len(), 20);
    let response = t.invoke(records).await;
    assert!(
        response.batch_item_failures.len() < 20,
        "one copy wins the claim"
    );
    t.drain(2).await; // the copies that met a live lease come back and are duplicates
    assert_charged_once(&t, &a).await;

    // Across two concurrent runners from the start.
    let b = t.pid("two-runners");
    t.send_copies(&payment(&b, 800, "pm_card_visa"), 20).await;
    let (r1, r2) = tokio::join!(t.drain(1), t.drain(1));
    assert!(r1.received + r2.received >= 20);
    assert_charged_once(&t, &b).await;
    assert_eq!(t.depth().await, 0);
    assert!(t.dead_letters().await.is_empty());
}

/// 4. The same payment id with another amount: never charged twice; in the DLQ with
///    `idempotency_key_reused`, body unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t04_key_reuse_with_another_amount_is_dead_lettered() {
    let t = TestStack::new("reuse").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1000, "pm_card_visa")).await;
    t.drain(1).await;
    let other = payment(&pid, 2000, "pm_card_visa");
    let mid = t.send(&other).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    assert_eq!(t.ledger(&pid).await.charges[&pid][0].amount, 1000);
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "idempotency_key_reused");
    assert_eq!(dead[0].source_message_id, mid);
    assert_eq!(dead[0].body, other, "the original body, unchanged");

    // Both payloads at once: whichever claims first is charged, the other is dead-lettered.
    let pid2 = t.pid("p2");
    let m1 = t.send(&payment(&pid2, 1000, "pm_card_visa")).await;
    let m2 = t.send(&payment(&pid2, 3000, "pm_card_visa")).await;
    t.drain(2).await;
    assert_eq!(t.charges(&pid2).await, 1);
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0].source_message_id == m1 || dead[0].source_message_id == m2);
    assert_eq!(dead[0].error_code, "idempotency_key_reused");
}

/// 5. A declined card: recorded as declined, not retried, not in the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t05_decline_is_recorded_not_retried_not_dead_lettered() {
    let t = TestStack::new("decline").await;
    let pid = t.pid("p1");
    t.send(&payment(
        &pid,
        1500,
        "pm_card_chargeDeclinedInsufficientFunds",
    ))
    .await;
    t.drain(1).await;
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.status.as_str(), "COMPLETED");
    let o = r.outcome.unwrap();
    assert_eq!(o.status, "declined");
    assert_eq!(o.text("decline_code"), Some("insufficient_funds"));
    assert_eq!(t.calls(&pid).await, 1, "a decline is never retried");
    assert_eq!(t.charges(&pid).await, 0);
    assert!(t.dead_letters().await.is_empty());
    assert_eq!(t.depth().await, 0);
}

/// 6. The provider commits then answers `500`; and commits then drops the connection: one
///    charge, `COMPLETED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t06_errors_after_the_charge_do_not_charge_twice() {
    let t = TestStack::new("after-commit").await;
    let a = t.pid("err500");
    let b = t.pid("dropped");
    t.fault(&a, "500_after_commit", Some(1), 0).await;
    t.fault(&b, "drop_after_commit", Some(1), 0).await;
    t.send(&payment(&a, 100, "pm_card_visa")).await;
    t.send(&payment(&b, 200, "pm_card_visa")).await;
    t.drain(1).await;
    for pid in [&a, &b] {
        assert_charged_once(&t, pid).await;
        assert!(t.calls(pid).await >= 2, "{pid}: retried with the same key");
    }
    assert!(t.dead_letters().await.is_empty());
}

/// 7. The provider fully down: the message comes back as a batch item failure; after
///    recovery, one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t07_provider_down_then_recovered() {
    let t = TestStack::new("down").await;
    let pid = t.pid("p1");
    t.fault(&pid, "down", None, 0).await;
    let mid = t.send(&payment(&pid, 4200, "pm_card_visa")).await;
    let records = t.receive_records(1).await;
    let response = t.invoke(records).await;
    let failed: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    assert_eq!(failed, vec![mid]);
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.status.as_str(), "FAILED");
    assert!(r.last_error.unwrap_or_default().contains("503"));
    assert_eq!(t.charges(&pid).await, 0);
    assert_eq!(t.depth().await, 1, "the message is still on the queue");

    t.sim.clear_faults_for(&pid).await.unwrap();
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    assert_eq!(t.record(&pid).await.unwrap().attempts, 2);
    assert!(t.dead_letters().await.is_empty());
}

/// 8. Each kind of malformed body: in the DLQ with its `error_code`, never charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t08_malformed_bodies_are_dead_lettered_with_their_code() {
    let t = TestStack::new("malformed").await;
    let prefix = t.pid("bad");
    let cases = proving::load::malformed_bodies(&prefix);
    let mut expected = std::collections::HashMap::new();
    for (body, code) in &cases {
        expected.insert(t.send(body).await, *code);
    }
    t.drain(1).await;
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), cases.len());
    for d in &dead {
        assert_eq!(
            Some(&d.error_code.as_str()),
            expected.get(&d.source_message_id),
            "{}",
            d.body.chars().take(80).collect::<String>()
        );
    }
    let ledger = t.sim.ledger().await.unwrap();
    assert!(
        ledger.calls.keys().all(|k| !k.starts_with(&prefix)),
        "never sent to the provider"
    );
    assert_eq!(t.depth().await, 0, "deleted from the source queue");
}

/// 9. A crash after the charge and before completion (the runner process is killed): after the
///    lease expires, the redelivered message completes with one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t09_crash_after_charge_completes_on_redelivery_with_one_charge() {
    let t = TestStack::new("crash").await;
    let pid = t.pid("p1");
    // The provider books the charge, then holds the answer: the runner dies meanwhile.
    t.fault(&pid, "delay_after_commit", Some(1), 30_000).await;
    t.send(&payment(&pid, 9900, "pm_card_visa")).await;

    let payctl = bin("payctl");
    assert!(
        payctl.exists(),
        "build payctl first (make test does): {}",
        payctl.display()
    );
    let mut child = tokio::process::Command::new(&payctl)
        .args([
            "run",
            "--queue-url",
            t.queue_url(),
            "--function-timeout",
            "30",
        ])
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .envs(fast_settings())
        .env("PAYMENT_API_TIMEOUT_SECONDS", "3")
        .env("LEASE_SECONDS", "6")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting payctl run");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while t.charges(&pid).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the runner never charged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().await.expect("killing the runner");
    let r = t.record(&pid).await.unwrap();
    assert_eq!(
        r.status.as_str(),
        "IN_PROGRESS",
        "the crash left the record in flight"
    );

    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.attempts, 2, "taken over once the lease expired");
    assert!(t.dead_letters().await.is_empty());
}

/// 10. A batch mixing all of these: the batch response lists exactly the retryable messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_mixed_batch_reports_exactly_the_retryable_messages() {
    let t = TestStack::new("mixed").await;
    let done = t.pid("done");
    t.send(&payment(&done, 100, "pm_card_visa")).await;
    t.drain(1).await;

    let down = t.pid("down");
    t.fault(&down, "down", None, 0).await;
    let busy = t.pid("busy");
    // Another worker holds a live lease on `busy`.
    let busy_body = payment(&busy, 300, "pm_card_visa");
    t.hold_lease_elsewhere(&busy_body).await;

    let ok = t.pid("ok");
    let declined = t.pid("declined");
    let mut ids = std::collections::HashMap::new();
    ids.insert("ok", t.send(&payment(&ok, 100, "pm_card_visa")).await);
    ids.insert(
        "duplicate",
        t.send(&payment(&done, 100, "pm_card_visa")).await,
    );
    ids.insert("reuse", t.send(&payment(&done, 999, "pm_card_visa")).await);
    ids.insert(
        "declined",
        t.send(&payment(&declined, 100, "pm_card_chargeDeclined"))
            .await,
    );
    ids.insert("malformed", t.send("{oops").await);
    ids.insert("down", t.send(&payment(&down, 100, "pm_card_visa")).await);
    ids.insert("busy", t.send(&busy_body).await);

    let records = t.receive_records(7).await;
    assert_eq!(records.len(), 7);
    let response = t.invoke(records).await;
    let mut failed: Vec<String> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    failed.sort();
    let mut expected = vec![ids["down"].clone(), ids["busy"].clone()];
    expected.sort();
    assert_eq!(failed, expected);

    assert_charged_once(&t, &ok).await;
    assert_charged_once(&t, &done).await;
    assert_eq!(
        t.record(&declined).await.unwrap().outcome.unwrap().status,
        "declined"
    );
    let mut codes: Vec<(String, String)> = t
        .dead_letters()
        .await
        .into_iter()
        .map(|d| (d.source_message_id, d.error_code))
        .collect();
    codes.sort();
    let mut want = vec![
        (ids["reuse"].clone(), "idempotency_key_reused".to_owned()),
        (ids["malformed"].clone(), "invalid_json".to_owned()),
    ];
    want.sort();
    assert_eq!(codes, want);
    assert_eq!(t.charges(&down).await + t.charges(&busy).await, 0);
    t.sim.clear_faults_for(&down).await.unwrap();
}

/// Provider rejections (other `400`s) are recorded and dead-lettered with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_rejection_is_recorded_and_dead_lettered() {
    let t = TestStack::new("rejected").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 100, "pm_card_invalid")).await;
    t.drain(1).await;
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.status.as_str(), "COMPLETED");
    assert_eq!(r.outcome.unwrap().status, "rejected");
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "provider_rejected");
    assert_eq!(t.calls(&pid).await, 1);
}

/// A message first sent longer ago than the record retention is never charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_request_is_never_charged() {
    let mut env = fast_settings();
    env.insert("IDEMPOTENCY_TTL_SECONDS".into(), "3600".into());
    let t = TestStack::with_env("expired", env).await;
    let pid = t.pid("p1");
    let body = payment(&pid, 100, "pm_card_visa");
    // A hand-redriven dead letter keeps its original first-send time.
    let two_hours_ago = (now_ms() - 2 * 3600 * 1000).to_string();
    t.sqs
        .send_message()
        .queue_url(t.queue_url())
        .message_body(&body)
        .message_attributes(
            "first_sent_at",
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(two_hours_ago)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    t.drain(1).await;
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "request_expired");
    assert_eq!(t.calls(&pid).await, 0);
    assert!(t.record(&pid).await.is_none());
}

/// Wrong credentials are a configuration problem: retried, never dead-lettered or recorded as
/// the payment's fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_api_key_is_retryable_and_never_leaks() {
    let mut env = fast_settings();
    env.insert("PAYMENT_API_KEY".into(), "sk_test_wrong_key_value".into());
    let t = TestStack::with_env("badkey", env).await;
    let pid = t.pid("p1");
    let mid = t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let response = t.invoke(t.receive_records(1).await).await;
    assert_eq!(response.batch_item_failures.len(), 1);
    assert_eq!(response.batch_item_failures[0].item_identifier, mid);
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.status.as_str(), "FAILED");
    let err = r.last_error.unwrap_or_default();
    assert!(err.contains("401"), "{err}");
    assert!(!err.contains("sk_test_wrong_key_value"));
    assert!(t.dead_letters().await.is_empty());
}
