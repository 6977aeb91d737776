//! Refunds asked while their payment still settles at the provider, on the real SDK and the
//! local stack: held (reserved, acknowledged, nothing sent), then made once the payment
//! succeeds (a failed debit's customer paying after all among them) or canceled with their
//! amount given back once it is canceled, whatever crashes between
//! the payment's settlement and the refund's send; the catch-up's sweep resumes what the inbox
//! did not, even in a run whose listing fails; a refund another attempt is deciding is left to
//! it and the event comes back for it; a refund whose cancel died is held again; a stale
//! decline never overturns a settling payment. The simulator's books are the ground truth.
//!
//! Why one file of this length: every test starts from the same held debit and reads the same
//! books (`held_debit`, `ledger`, `made`, `taken_up`, `nothing_dead_lettered`); these helpers
//! belong to this one story, not to the suite's shared ones.

use std::time::Duration;

use payctl::template::{EVENT_PROCESSOR, REFUND_PROCESSOR};
use payment_core::refunds::held::HeldRefunds;
use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
use payment_core::refunds::queue::SqsRefundQueue;
use proving::check::drain_dlq;
use sqs_once::IdempotencyStore;

use crate::events::{events, kinds, refund, refund_body, Events};
use crate::helpers::*;

/// The refunds the provider made for `rid` (amounts).
async fn made(t: &TestStack, rid: &str) -> Vec<i64> {
    t.ledger(rid)
        .await
        .refunds
        .get(rid)
        .map(|r| r.iter().map(|r| r.amount).collect())
        .unwrap_or_default()
}

/// The payment's ledger as the refunds see it.
async fn ledger(t: &TestStack, pid: &str) -> payment_core::refunds::ledger::RefundablePayment {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    DynamoRefundLedger::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    )
    .payment(pid)
    .await
    .expect("reading the payment's ledger")
    .expect("the payment's record")
}

/// Every dead-letter queue of the stack is empty.
async fn nothing_dead_lettered(t: &TestStack, e: &Events) {
    for url in [
        t.config.dead_letter_queue_url.clone(),
        t.stack
            .var_of(REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")
            .unwrap()
            .to_owned(),
        e.dlq_url.clone(),
    ] {
        let dead = drain_dlq(&t.sqs, &url).await.unwrap();
        assert!(dead.is_empty(), "dead letters in {url}: {dead:?}");
    }
}

/// A bank debit recorded `processing`, and refunds of it sent and held.
async fn held_debit(
    t: &TestStack,
    name: &str,
    method: &str,
    amount: i64,
    refunds: &[(String, i64)],
) -> String {
    let pid = t.pid(name);
    t.send(&payment(&pid, amount, method)).await;
    t.drain(1).await;
    let o = t.record(&pid).await.unwrap().outcome.unwrap();
    assert_eq!(o.status, "processing", "{pid}");
    let bodies: Vec<String> = refunds
        .iter()
        .map(|(rid, a)| refund_body(rid, &pid, Some(*a)))
        .collect();
    let s = refund(t, &bodies).await.summary;
    assert_eq!(s.done("held") as usize, refunds.len(), "{s:?}");
    assert!(s.dead_lettered.is_empty() && s.retried == 0, "{s:?}");
    let p = ledger(t, &pid).await;
    assert_eq!(p.refunded, refunds.iter().map(|(_, a)| a).sum::<i64>());
    assert_eq!(p.held.len(), refunds.len());
    for (rid, _) in refunds {
        assert!(made(t, rid).await.is_empty(), "nothing sent for {rid}");
    }
    // What GET /v1/payments/{id} and payctl status show of it.
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let view = payment_core::api::view::after_charge_of(
        &aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
        &pid,
    )
    .await
    .unwrap()
    .expect("the payment's refunds");
    assert!(
        view.refunds.iter().all(|r| r.state == "held"),
        "{:?}",
        view.refunds
    );
    pid
}

/// The refunds queue drained by the refund processor.
async fn drain_refunds(t: &TestStack) -> sqs_once::BatchSummary {
    refund(t, &[]).await.summary
}

/// The catch-up's sweep of the held refunds, as its scheduled run makes it.
async fn sweep(t: &TestStack, horizon: Duration) -> payment_core::refunds::held::HeldSweep {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    HeldRefunds::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
        std::sync::Arc::new(SqsRefundQueue::new(
            t.sqs.clone(),
            t.stack
                .var_of(EVENT_PROCESSOR, "REFUNDS_QUEUE_URL")
                .unwrap(),
        )),
        Duration::from_secs(365 * 86_400),
    )
    .sweep(
        horizon,
        tokio::time::Instant::now() + Duration::from_secs(60),
    )
    .await
    .expect("sweeping the held refunds")
}

/// `payctl run --work events` over the stack's events queue as its own process, with
/// failpoints.
fn events_process(t: &TestStack, e: &Events, failpoints: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin("payctl"));
    cmd.args([
        "run",
        "--work",
        "events",
        "--queue-url",
        &t.stack.event_sources[EVENT_PROCESSOR].queue_url,
        "--dead-letter-queue-url",
        &e.dlq_url,
        "--until-empty",
        "--max-seconds",
        "60",
    ])
    .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
    .env("DEAD_LETTER_QUEUE_URL", &e.dlq_url)
    .env(
        "REFUNDS_QUEUE_URL",
        t.stack
            .var_of(EVENT_PROCESSOR, "REFUNDS_QUEUE_URL")
            .unwrap(),
    )
    .envs(fast_settings())
    .env("FAILPOINTS", failpoints)
    .kill_on_drop(true)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    cmd
}

/// Two refunds of a debit whose sum is its charge, held; the event processor killed after it
/// wrote the debit's success and before it sent the held refunds: the event comes back, the
/// processor that takes it finds the payment settled and sends them; each is made once, for
/// its amount, and the ledger equals the provider's books.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_refunds_are_made_once_after_a_crash_between_the_settlement_and_the_send() {
    let t = TestStack::new("held-crash").await;
    let e = events(&t).await;
    let (r1, r2) = (t.pid("r1"), t.pid("r2"));
    let pid = held_debit(
        &t,
        "debit",
        "pm_usBankAccount_success",
        1500,
        &[(r1.clone(), 1000), (r2.clone(), 500)],
    )
    .await;
    // Only the success is delivered: the crashed process's batch then holds exactly the event
    // that settles the payment, whatever order the queue gives the debit's other events in.
    let listed: Vec<_> = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await
        .into_iter()
        .filter(|(ev, _)| ev.kind == "payment_intent.succeeded")
        .collect();
    assert_eq!(listed.len(), 1, "one success for {pid}");
    e.deliver_all(&listed, 1).await;

    let out = events_process(&t, &e, "inbox_after_settle=return")
        .output()
        .await
        .expect("running payctl run --work events");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "killed at the failpoint: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let p = ledger(&t, &pid).await;
    assert_eq!(
        p.outcome.as_ref().map(|o| o.status.as_str()),
        Some("succeeded"),
        "the settlement was written before the crash"
    );
    assert_eq!(p.held.len(), 2, "and nothing was resumed");
    assert_eq!(drain_refunds(&t).await.done("refunded"), 0);

    // Restarted: the event comes back after its visibility timeout.
    let s = e.drain(&t).await.summary;
    assert_eq!(s.done("unchanged"), 1, "{s:?}");
    let s = drain_refunds(&t).await;
    assert_eq!(s.done("refunded"), 2, "{s:?}");
    assert_eq!(made(&t, &r1).await, [1000]);
    assert_eq!(made(&t, &r2).await, [500]);
    assert_eq!(ledger(&t, &pid).await.refunded, 1500);
    // Delivered again: nothing more is sent or made. The next sweep reads both refunds done
    // and removes their held entries (and the payment from the refund_held partition).
    e.deliver_all(&listed, 1).await;
    e.drain(&t).await;
    let swept = sweep(&t, Duration::from_secs(86_400)).await;
    assert_eq!(swept.resumed, 0, "{swept:?}");
    assert_eq!(drain_refunds(&t).await.done("refunded"), 0);
    assert_eq!(made(&t, &r1).await.len() + made(&t, &r2).await.len(), 2);
    let p = ledger(&t, &pid).await;
    assert_eq!((p.refunded, p.held.len()), (1500, 0));
    nothing_dead_lettered(&t, &e).await;
}

/// What a customer or an operator does to a payment's PaymentIntent at the provider, as Stripe
/// takes it (`POST /v1/payment_intents/{id}/{action}`): `confirm` (the customer pays again) or
/// `cancel` (it will never be paid); then its events, up to one of type `kind`, are delivered
/// and applied, and the refunds queue drained (its summary returned).
async fn at_provider(
    t: &TestStack,
    e: &Events,
    pid: &str,
    (action, form): (&str, &[(&str, &str)]),
    kind: &str,
) -> sqs_once::BatchSummary {
    let intent = t.record(pid).await.unwrap().outcome.unwrap();
    let intent = intent.text("provider_payment_id").unwrap().to_owned();
    let answer = reqwest::Client::new()
        .post(format!(
            "{}/v1/payment_intents/{intent}/{action}",
            t.config.payment_api_url
        ))
        .bearer_auth(required_env("PAYMENT_API_KEY"))
        .header("Stripe-Version", &t.config.stripe_api_version)
        .header("Idempotency-Key", format!("{action}-{pid}"))
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
    let listed = e
        .listed(&[pid.to_owned()], |l| kinds(l).contains(&kind))
        .await;
    e.deliver_all(&listed, 1).await;
    e.drain(t).await;
    drain_refunds(t).await
}

/// A debit that fails after the refund was held, applied: its PaymentIntent is back at
/// `requires_payment_method`, not ended.
async fn held_debit_that_failed(t: &TestStack, e: &Events, rid: &str) -> String {
    let pid = held_debit(
        t,
        "debit",
        "pm_usBankAccount_accountClosed",
        1500,
        &[(rid.to_owned(), 600)],
    )
    .await;
    let listed = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).contains(&"payment_intent.payment_failed")
        })
        .await;
    e.deliver_all(&listed, 2).await;
    let s = e.drain(t).await.summary;
    assert_eq!(s.done("applied"), 1, "{s:?}");
    let s = drain_refunds(t).await;
    assert_eq!(
        (s.done("canceled"), s.done("held")),
        (0, 0),
        "nothing resumed: {s:?}"
    );
    let p = ledger(t, &pid).await;
    assert_eq!(p.outcome.as_ref().unwrap().status, "declined");
    assert_eq!(
        (p.refunded, p.refunds.get(rid), p.held.contains_key(rid)),
        (600, Some(&600), true),
        "still held, its amount reserved"
    );
    let swept = sweep(t, Duration::from_secs(86_400)).await;
    assert_eq!((swept.resumed, swept.held), (0, 1), "{swept:?}");
    pid
}

/// A debit that fails after the refund was held is not the payment's end: its customer pays the
/// same PaymentIntent later (issue 65, bug 3: the refund was canceled on the decline and never
/// made). The refund stays held through the decline and is made once the payment succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_refund_outlives_its_debit_failing_and_is_made_when_the_customer_pays_after_all() {
    let t = TestStack::new("held-fail").await;
    let e = events(&t).await;
    let rid = t.pid("r1");
    let pid = held_debit_that_failed(&t, &e, &rid).await;
    let s = at_provider(
        &t,
        &e,
        &pid,
        ("confirm", &[("payment_method", "pm_card_visa")]),
        "payment_intent.succeeded",
    )
    .await;
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert_eq!(made(&t, &rid).await, [600]);
    let p = ledger(&t, &pid).await;
    assert_eq!(
        (p.outcome.as_ref().unwrap().status.as_str(), p.refunded),
        ("succeeded", 600)
    );
    nothing_dead_lettered(&t, &e).await;
}

/// A held refund whose failed debit is then canceled at the provider (an operator's answer to
/// `HeldRefundsOverdue`): canceled with its reason, its amount given back, its entry removed;
/// nothing reaches the provider or a dead-letter queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_refund_is_canceled_and_its_amount_given_back_once_its_payment_is_canceled() {
    let t = TestStack::new("held-cancel").await;
    let e = events(&t).await;
    let rid = t.pid("r1");
    let pid = held_debit_that_failed(&t, &e, &rid).await;
    let s = at_provider(
        &t,
        &e,
        &pid,
        ("cancel", &[("cancellation_reason", "abandoned")]),
        "payment_intent.canceled",
    )
    .await;
    assert_eq!(s.done("canceled"), 1, "{s:?}");
    let p = ledger(&t, &pid).await;
    assert_eq!(p.outcome.as_ref().unwrap().status, "canceled");
    assert_eq!((p.refunded, p.refunds.len()), (0, 0));
    sweep(&t, Duration::from_secs(86_400)).await;
    assert!(
        ledger(&t, &pid).await.held.is_empty(),
        "done: its entry removed"
    );
    let o = refund_store(&t)
        .await
        .get(&rid)
        .await
        .unwrap()
        .unwrap()
        .outcome
        .unwrap();
    assert_eq!(
        (o.status.as_str(), o.text("code")),
        ("canceled", Some("payment_failed"))
    );
    assert!(made(&t, &rid).await.is_empty());
    nothing_dead_lettered(&t, &e).await;
}

/// A payment whose settlement an inbox without the refunds queue applied (an earlier release,
/// an operator's reconcile) still has its held refund made: the catch-up's sweep of the
/// `refund_held` partition resumes it. A payment still settling past the horizon is named
/// overdue, its refund left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_resumes_what_no_inbox_did_and_names_what_settles_too_long() {
    let t = TestStack::new("held-sweep").await;
    let mut e = events(&t).await;
    let mut config = proving::demo::event_config_for(&t.stack, &fast_settings()).unwrap();
    config.refunds_queue_url = None;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    e.processor = payment_core::edges::bootstrap::build_event_processor(&config, &sdk)
        .await
        .unwrap();
    let (settled_r, waiting_r) = (t.pid("settled-r"), t.pid("waiting-r"));
    let settled = held_debit(
        &t,
        "settled",
        "pm_usBankAccount_success",
        900,
        &[(settled_r.clone(), 900)],
    )
    .await;
    // Off-session, the card needs its customer: it settles whenever they come back.
    let waiting = t.pid("waiting");
    t.send(&payment(&waiting, 700, "pm_card_authenticationRequired"))
        .await;
    t.drain(1).await;
    let s = refund(&t, &[refund_body(&waiting_r, &waiting, None)]).await;
    assert_eq!(s.summary.done("held"), 1, "{:?}", s.summary);

    let listed = e
        .listed(std::slice::from_ref(&settled), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await;
    e.deliver_all(&listed, 1).await;
    assert_eq!(e.drain(&t).await.summary.done("applied"), 1);
    assert_eq!(
        drain_refunds(&t).await.done("refunded"),
        0,
        "no inbox sent it"
    );

    // The sparse index is read eventually consistently: the sweep may need a moment.
    let mut swept = sweep(&t, Duration::ZERO).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while swept.payments < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        swept = sweep(&t, Duration::ZERO).await;
    }
    assert_eq!(
        (swept.payments, swept.held, swept.resumed),
        (2, 2, 1),
        "{swept:?}"
    );
    assert_eq!(
        swept
            .overdue
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        [waiting.as_str()]
    );
    assert_eq!(drain_refunds(&t).await.done("refunded"), 1);
    assert_eq!(made(&t, &settled_r).await, [900]);
    assert!(made(&t, &waiting_r).await.is_empty());
    // The next sweep reads the refund done and takes its payment out of the partition; the
    // other stays, and a sweep within the horizon names nothing.
    let again = sweep(&t, Duration::from_secs(86_400)).await;
    assert_eq!(again.resumed, 0, "{again:?}");
    assert!(again.overdue.is_empty());
    let mut last = sweep(&t, Duration::from_secs(86_400)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while last.payments > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = sweep(&t, Duration::from_secs(86_400)).await;
    }
    assert_eq!((last.payments, last.held), (1, 1), "{last:?}");
    nothing_dead_lettered(&t, &e).await;
}

/// A decline delivered after the payment moved on (the customer's first try failed, a debit
/// was confirmed after it) is read from the provider, not applied from its payload: the payment
/// is not declined, and the refund held meanwhile is made when it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_decline_never_declines_a_settling_payment_or_cancels_its_refund() {
    let t = TestStack::new("held-stale").await;
    let e = events(&t).await;
    let rid = t.pid("r1");
    let pid = held_debit(
        &t,
        "debit",
        "pm_usBankAccount_success",
        1200,
        &[(rid.clone(), 1200)],
    )
    .await;
    let listed = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await;
    // A payment_failed of the same PaymentIntent, older than everything after it.
    let (succeeded, body) = listed
        .iter()
        .find(|(ev, _)| ev.kind == "payment_intent.succeeded")
        .unwrap();
    let mut stale: serde_json::Value = serde_json::from_str(body).unwrap();
    stale["id"] = serde_json::json!(format!("{}_stale", succeeded.id));
    stale["type"] = serde_json::json!("payment_intent.payment_failed");
    stale["created"] = serde_json::json!(succeeded.created - 60);
    stale["data"]["object"]["status"] = serde_json::json!("requires_payment_method");
    stale["data"]["object"]["last_payment_error"] =
        serde_json::json!({"code": "card_declined", "decline_code": "generic_decline"});
    let stale = stale.to_string();
    let parsed = payment_core::provider::event::ProviderEvent::parse(&stale).unwrap();
    e.deliver_all(&[(parsed, stale)], 1).await;
    e.drain(&t).await;
    let p = ledger(&t, &pid).await;
    assert_ne!(
        p.outcome.as_ref().unwrap().status,
        "declined",
        "the stale decline was read from the provider"
    );
    e.deliver_all(&listed, 1).await;
    e.drain(&t).await;
    let s = drain_refunds(&t).await;
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert_eq!(made(&t, &rid).await, [1200]);
    assert_eq!(ledger(&t, &pid).await.outcome.unwrap().status, "succeeded");
    nothing_dead_lettered(&t, &e).await;
}

/// The refunds' records in the stack's table.
async fn refund_store(t: &TestStack) -> sqs_once::DynamoStore {
    payment_core::refunds::refund_store(
        aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await),
        &t.config.idempotency_table,
    )
}

/// Another attempt takes the held refund `rid` up as the refund processor would on a copy of
/// its message (its record reopened, then claimed with a lease ending at `lease_end_ms`): the
/// attempt's fencing token.
async fn taken_up(t: &TestStack, rid: &str, lease_end_ms: i64) -> String {
    let store = refund_store(t).await;
    let now = sqs_once::runner::now_ms();
    let record = store.get(rid).await.unwrap().expect("the refund's record");
    assert!(
        store
            .reopen(
                rid,
                "held",
                "taken up by the test",
                now,
                now / 1000 + 86_400
            )
            .await
            .unwrap(),
        "{record:?}"
    );
    let owner = format!("other-attempt-{}", uuid::Uuid::new_v4());
    let claimed = store
        .claim(&sqs_once::record::ClaimRequest {
            traceparent: None,
            key: rid.to_owned(),
            payload_hash: record.payload_hash,
            owner: owner.clone(),
            now_ms: now,
            lease_expires_at_ms: lease_end_ms,
            expires_at_s: now / 1000 + 86_400,
        })
        .await
        .unwrap();
    assert!(
        matches!(claimed, sqs_once::record::ClaimResult::Claimed { .. }),
        "{claimed:?}"
    );
    owner
}

/// A held refund whose payment failed, and whose cancel died after it gave the amount back
/// and before its record completed, while the provider took the customer's next try of the
/// payment (settling again): the refund is held again on the DynamoDB ledger, its entry kept
/// and its amount reserved again, nothing sent and nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_cancel_crashed_is_held_again_with_its_amount_reserved() {
    let t = TestStack::new("held-rehold").await;
    let e = events(&t).await;
    let rid = t.pid("r1");
    let pid = held_debit(
        &t,
        "debit",
        "pm_usBankAccount_success",
        1500,
        &[(rid.clone(), 600)],
    )
    .await;
    // The cancel: its attempt holds the refund (a lease already over by the next claim) and
    // gives its amount back; then it dies.
    let now = sqs_once::runner::now_ms();
    let owner = taken_up(&t, &rid, now).await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    DynamoRefundLedger::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    )
    .release(&pid, &rid, 600, &owner, now / 1000 + 86_400)
    .await
    .expect("the cancel's release");
    let p = ledger(&t, &pid).await;
    assert_eq!(
        (p.refunded, p.held.len()),
        (0, 1),
        "given back, the entry kept until the refund is done"
    );

    let s = refund(&t, &[refund_body(&rid, &pid, Some(600))])
        .await
        .summary;
    assert_eq!(s.done("held"), 1, "{s:?}");
    assert!(s.dead_lettered.is_empty() && s.retried == 0, "{s:?}");
    let p = ledger(&t, &pid).await;
    assert_eq!((p.refunded, p.held.len()), (600, 1), "reserved again");
    assert!(made(&t, &rid).await.is_empty());
    let record = refund_store(&t).await.get(&rid).await.unwrap().unwrap();
    assert_eq!(record.outcome.unwrap().status, "held");

    // It is made once when the debit settles.
    let listed = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await;
    e.deliver_all(&listed, 1).await;
    e.drain(&t).await;
    assert_eq!(drain_refunds(&t).await.done("refunded"), 1);
    assert_eq!(made(&t, &rid).await, [600]);
    assert_eq!(ledger(&t, &pid).await.refunded, 600);
    nothing_dead_lettered(&t, &e).await;
}

/// A held refund another attempt holds when its payment's success is applied (a copy of its
/// message, deciding it): the inbox sends nothing (a copy would race the attempt), and its
/// event comes back instead of completing; once the attempt is over, the event's next
/// delivery sends the refund, and it is made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_meets_a_held_refund_being_decided_comes_back_for_it() {
    let t = TestStack::new("held-busy").await;
    let e = events(&t).await;
    let rid = t.pid("r1");
    let pid = held_debit(
        &t,
        "debit",
        "pm_usBankAccount_success",
        1500,
        &[(rid.clone(), 700)],
    )
    .await;
    let owner = taken_up(&t, &rid, sqs_once::runner::now_ms() + 120_000).await;
    let listed: Vec<_> = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await
        .into_iter()
        .filter(|(ev, _)| ev.kind == "payment_intent.succeeded")
        .collect();
    assert_eq!(listed.len(), 1, "one success for {pid}");
    e.deliver_all(&listed, 1).await;
    let event_id = listed[0].0.id.clone();

    // The event's first attempt applies the success, meets the attempt and hands the event
    // back: its record is FAILED, the refund's still held by the other attempt. Then the
    // other attempt is over (handed back: a failure it recorded), while the events drain.
    let events_store = payment_core::events::event_store(
        aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await),
        &t.config.idempotency_table,
    );
    let watch = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let handed_back = loop {
            let r = events_store.get(&event_id).await.unwrap();
            if let Some(r) = r.filter(|r| r.status == sqs_once::record::RecordStatus::Failed) {
                break r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the event was never handed back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            handed_back
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("being decided by another attempt")),
            "{handed_back:?}"
        );
        assert_eq!(ledger(&t, &pid).await.outcome.unwrap().status, "succeeded");
        assert_eq!(refund(&t, &[]).await.received, 0, "nothing sent meanwhile");
        refund_store(&t)
            .await
            .fail(
                &rid,
                &owner,
                sqs_once::runner::now_ms(),
                &sqs_once::record::FailureNote {
                    error: "the test's attempt handed it back".into(),
                    unknown_outcome: false,
                    not_before_ms: None,
                },
            )
            .await
            .unwrap();
    };
    let (drained, ()) = tokio::join!(e.drain(&t), watch);
    let s = drained.summary;
    assert_eq!(s.done("unchanged") + s.done("applied"), 1, "{s:?}");
    assert!(s.retried >= 1, "{s:?}");
    let s = drain_refunds(&t).await;
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert_eq!(made(&t, &rid).await, [700]);
    assert_eq!(ledger(&t, &pid).await.refunded, 700);
    nothing_dead_lettered(&t, &e).await;
}

/// A scheduled run whose listing fails (the provider key revoked: every list answers `401`)
/// still sweeps the held refunds: the one whose payment settled is sent and made, and the
/// run reports the listing's failure (the function's errors alarm).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_listing_fails_still_makes_the_held_refunds() {
    use payment_core::events::catch_up::Budget;
    let t = TestStack::new("held-nolist").await;
    let mut e = events(&t).await;
    let mut config = proving::demo::event_config_for(&t.stack, &fast_settings()).unwrap();
    config.refunds_queue_url = None;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    e.processor = payment_core::edges::bootstrap::build_event_processor(&config, &sdk)
        .await
        .unwrap();
    let rid = t.pid("r1");
    let pid = held_debit(
        &t,
        "debit",
        "pm_usBankAccount_success",
        800,
        &[(rid.clone(), 800)],
    )
    .await;
    let listed = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await;
    e.deliver_all(&listed, 1).await;
    e.drain(&t).await;
    assert_eq!(refund(&t, &[]).await.received, 0, "no inbox sent it");

    let mut config = proving::demo::event_config_for(&t.stack, &fast_settings()).unwrap();
    config.api_key = payment_core::edges::config::ApiKeySource::Plain("sk_test_revoked".into());
    let catch_up = payment_core::edges::bootstrap::build_catch_up(&config, &sdk)
        .await
        .unwrap()
        .expect("the event function's catch-up");
    // The sparse index is read eventually consistently: a run may need a moment to see it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let run = loop {
        let budget =
            Budget::before_deadline(sqs_once::runner::now_ms() + 60_000, Duration::from_secs(15));
        let run = catch_up.run(budget).await;
        let swept = run.held.as_ref().and_then(|h| h.as_ref().ok());
        if swept.is_some_and(|h| h.payments > 0) || std::time::Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let listing = run.listing.as_ref().expect_err("the listing fails");
    assert!(
        listing.contains("401") || listing.contains("Invalid API Key"),
        "{listing}"
    );
    let swept = run.held.as_ref().unwrap().as_ref().unwrap().clone();
    assert_eq!((swept.payments, swept.resumed), (1, 1), "{swept:?}");
    assert!(swept.failed.is_empty(), "{swept:?}");
    assert_eq!(
        run.emf_lines(0).len(),
        1,
        "the sweep's line, not the listing's"
    );
    assert!(
        run.into_result().is_err(),
        "the run reports the listing's failure"
    );

    let s = drain_refunds(&t).await;
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert_eq!(made(&t, &rid).await, [800]);
    nothing_dead_lettered(&t, &e).await;
}
