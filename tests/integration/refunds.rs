//! Refunds on the real SDK and the local stack: the refund processor of `template.yaml`, its
//! queue and dead-letter queue, the payment's record in the idempotency table, the simulator's
//! refunds as the ground truth.

use std::collections::BTreeMap;
use std::sync::Arc;

use payctl::template::REFUND_PROCESSOR;
use payment_core::refunds::work::RefundProcessor;
use proving::check::drain_dlq;
use sqs_once::IdempotencyStore;

use crate::helpers::*;

/// The refund side of a test stack.
struct Refunds {
    processor: Arc<RefundProcessor>,
    queue_url: String,
    dlq_url: String,
}

async fn refunds(t: &TestStack) -> Refunds {
    refunds_with(t, fast_settings()).await
}

async fn refunds_with(t: &TestStack, settings: BTreeMap<String, String>) -> Refunds {
    let config = proving::demo::refund_config_for(&t.stack, &settings)
        .expect("the refund function's configuration");
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    Refunds {
        processor: payment_core::edges::bootstrap::build_refund_processor(&config, &sdk)
            .await
            .expect("building the refund processor"),
        queue_url: t.stack.event_sources[REFUND_PROCESSOR].queue_url.clone(),
        dlq_url: config.dead_letter_queue_url,
    }
}

fn refund(rid: &str, pid: &str, amount: Option<i64>) -> String {
    payment_core::refunds::work::RefundRequest {
        refund_id: rid.into(),
        payment_id: pid.into(),
        amount,
        reason: Some("requested_by_customer".into()),
        contract_version: None,
    }
    .to_message_body()
}

impl Refunds {
    async fn drain(&self, t: &TestStack, pollers: usize) -> lambda_local::esm::EsmStats {
        proving::demo::drain_source(
            self.processor.clone(),
            &t.sqs,
            &t.stack.event_sources[REFUND_PROCESSOR],
            pollers,
        )
        .await
        .expect("draining the refunds queue")
    }

    async fn dead_codes(&self, t: &TestStack) -> BTreeMap<String, usize> {
        let mut codes = BTreeMap::new();
        for d in drain_dlq(&t.sqs, &self.dlq_url).await.expect("refund DLQ") {
            *codes.entry(d.error_code.clone()).or_default() += 1;
        }
        codes
    }
}

/// The refunded total on the payment's record.
async fn refunded_total(t: &TestStack, pid: &str) -> i64 {
    let ddb = aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await);
    let item = ddb
        .get_item()
        .table_name(&t.config.idempotency_table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("payment#{pid}")),
        )
        .consistent_read(true)
        .send()
        .await
        .expect("reading the payment's record");
    item.item()
        .and_then(|i| i.get("refunded_amount"))
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refunds_of_one_payment_never_exceed_its_charge() {
    let t = TestStack::new("refund-race").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1000, "pm_card_visa")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let r = refunds(&t).await;
    // Twelve refunds of 300 race for a charge of 1000, each sent twice.
    let mut bodies = Vec::new();
    for i in 0..12 {
        let body = refund(&format!("{pid}-r{i:02}"), &pid, Some(300));
        bodies.push(body.clone());
        bodies.push(body);
    }
    proving::load::send_all(&t.sqs, &r.queue_url, &bodies)
        .await
        .expect("sending refunds");
    let stats = r.drain(&t, 4).await;
    assert_eq!(stats.summary.done("refunded"), 3, "{:?}", stats.summary);
    assert_eq!(
        stats.summary.duplicates, 3,
        "the copies of the three refunds"
    );
    // Both copies of each refused refund are dead-lettered (the record holds the refusal).
    let codes = r.dead_codes(&t).await;
    assert_eq!(codes.get("refund_exceeds_charge"), Some(&18), "{codes:?}");
    // The provider's books: three refunds of 300, one per refund id, 900 in all.
    let mut booked = 0;
    for i in 0..12 {
        let rid = format!("{pid}-r{i:02}");
        let ledger = t.ledger(&rid).await;
        let n = ledger.refunds.get(&rid).map(Vec::len).unwrap_or(0);
        assert!(n <= 1, "{rid} refunded {n} times");
        booked += ledger
            .refunds
            .get(&rid)
            .into_iter()
            .flatten()
            .map(|r| r.amount)
            .sum::<i64>();
    }
    assert_eq!(booked, 900);
    assert_eq!(refunded_total(&t, &pid).await, 900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_charged_payment_is_refunded_and_the_rest_is_the_default() {
    let t = TestStack::new("refund-rules").await;
    let (paid, declined) = (t.pid("paid"), t.pid("declined"));
    t.send(&payment(&paid, 500, "pm_card_visa")).await;
    t.send(&payment(&declined, 500, "pm_card_chargeDeclined"))
        .await;
    t.drain(1).await;
    let r = refunds(&t).await;
    let sends = [
        refund(&format!("{paid}-part"), &paid, Some(120)),
        refund(&format!("{declined}-r"), &declined, None),
        refund("not json", &paid, None).replace('{', "["),
    ];
    proving::load::send_all(&t.sqs, &r.queue_url, &sends)
        .await
        .expect("sending refunds");
    r.drain(&t, 1).await;
    // Without an amount, what is left of the charge.
    proving::load::send_all(
        &t.sqs,
        &r.queue_url,
        &[refund(&format!("{paid}-rest"), &paid, None)],
    )
    .await
    .expect("sending the rest");
    let stats = r.drain(&t, 1).await;
    assert_eq!(stats.summary.done("refunded"), 1);
    let rest = t.ledger(&format!("{paid}-rest")).await;
    assert_eq!(rest.refunds[&format!("{paid}-rest")][0].amount, 380);
    assert_eq!(refunded_total(&t, &paid).await, 500);
    let codes = r.dead_codes(&t).await;
    assert_eq!(codes.get("payment_not_refundable"), Some(&1), "{codes:?}");
    assert_eq!(codes.get("invalid_json"), Some(&1), "{codes:?}");
    assert_eq!(
        t.ledger(&format!("{declined}-r")).await.refund_calls.len(),
        0
    );
}

/// On the real table: reservations and releases are fenced by the refund's own lease. An
/// attempt whose lease was taken over can neither reserve nor release; the owner can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_refund_attempt_can_neither_reserve_nor_release() {
    use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger, Reservation};
    use sqs_once::record::{ClaimRequest, IdempotencyStore, StoreError};

    let t = TestStack::new("refund-fence").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1000, "pm_card_visa")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let ledger = DynamoRefundLedger::new(ddb.clone(), &t.config.idempotency_table);
    let refunds = sqs_once::DynamoStore::new(
        ddb,
        t.config.idempotency_table.clone(),
        payment_core::refund_keys(),
    );
    let rid = format!("{pid}-r1");
    let now = sqs_once::runner::now_ms();
    let claim = |owner: &str, lease_ms: i64| ClaimRequest {
        traceparent: None,
        key: rid.clone(),
        payload_hash: "refund/v1:h".into(),
        owner: owner.to_owned(),
        now_ms: sqs_once::runner::now_ms(),
        lease_expires_at_ms: now + lease_ms,
        expires_at_s: now / 1000 + 3600,
    };
    // The zombie's lease has ended and the new owner took the refund over.
    refunds.claim(&claim("zombie", -1)).await.unwrap();
    refunds.claim(&claim("owner", 60_000)).await.unwrap();
    let seen = ledger.payment(&pid).await.unwrap().unwrap();
    let keep = seen.expires_at_s;
    assert!(matches!(
        ledger
            .reserve(&pid, &rid, 400, &seen, "zombie", keep, None)
            .await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(
        refunded_total(&t, &pid).await,
        0,
        "the zombie reserved nothing"
    );
    assert_eq!(
        ledger
            .reserve(&pid, &rid, 400, &seen, "owner", keep, None)
            .await
            .unwrap(),
        Reservation::Reserved
    );
    assert!(matches!(
        ledger.release(&pid, &rid, 400, "zombie", keep).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(
        refunded_total(&t, &pid).await,
        400,
        "the owner's reservation stands"
    );
    ledger
        .release(&pid, &rid, 400, "owner", keep)
        .await
        .unwrap();
    assert_eq!(refunded_total(&t, &pid).await, 0);
}

/// A refund of a payment known nowhere is dead-lettered `payment_unknown` at once, instead of
/// coming back until its retry horizon ends; the payments API's row of a payment accepted but
/// not yet charged is what makes a refund wait instead (read on the real table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_an_unknown_payment_is_dead_lettered_at_once() {
    use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
    let t = TestStack::new("refund-unknown").await;
    let r = refunds(&t).await;
    proving::load::send_all(
        &t.sqs,
        &r.queue_url,
        &[refund(&t.pid("rf-unknown"), &t.pid("never-sent"), None)],
    )
    .await
    .expect("sending the refund");
    let started = std::time::Instant::now();
    let stats = r.drain(&t, 1).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "dead-lettered at once, not after the retry horizon"
    );
    assert_eq!(stats.summary.retried, 0, "{:?}", stats.summary);
    assert_eq!(r.dead_codes(&t).await.get("payment_unknown"), Some(&1));

    let (_server, client) = crate::api::served(&t).await;
    let accepted = t.pid("accepted");
    let body =
        r#"{"amount":1999,"currency":"usd","customer_id":"cus_1","payment_method":"pm_card_visa"}"#;
    assert_eq!(client.create(&accepted, body).await.unwrap().status, 202);
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let ledger = DynamoRefundLedger::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    )
    .with_payments_table(Some(t.stack.payments_table().unwrap().to_owned()));
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let at = ledger.accepted_at(&accepted).await.unwrap();
    assert!(
        at.is_some_and(|s| (now_s - 600..=now_s + 600).contains(&s)),
        "the API's row is found with its creation time: {at:?}"
    );
    assert_eq!(
        ledger.accepted_at(&t.pid("never-sent")).await.unwrap(),
        None
    );
}

/// `payctl reconcile` settles a refund whose answer was lost: its record is `FAILED` and
/// marked unknown, the provider made the refund, and `--all-unknown` finds it and completes it
/// from the PaymentIntent's refunds, refunding nothing; by its id it then reads as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_settles_a_refund_whose_answer_was_lost() {
    let t = TestStack::new("refund-reconcile").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1000, "pm_card_visa")).await;
    t.drain(1).await;
    let r = refunds_with(&t, env(&[("PROVIDER_MAX_ATTEMPTS", "1")])).await;
    let rid = t.pid("rf-1");
    t.fault(&rid, "drop_after_commit", Some(1), 0).await;
    proving::load::send_all(&t.sqs, &r.queue_url, &[refund(&rid, &pid, Some(400))])
        .await
        .expect("sending the refund");
    let source = &t.stack.event_sources[REFUND_PROCESSOR];
    let records = t.receive_records_from(source, 1).await;
    r.processor
        .handle_batch(records, sqs_once::runner::now_ms() + 60_000)
        .await;
    let made = |l: proving::sim::Ledger| l.refunds.get(&rid).map(Vec::len).unwrap_or(0);
    assert_eq!(
        made(t.sim.ledger().await.unwrap()),
        1,
        "the provider made the refund; its answer was lost"
    );
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await; // past not_before
    let reconcile = |args: &[&str]| {
        std::process::Command::new(bin("payctl"))
            .arg("reconcile")
            .args(args)
            .args(["--table", &t.config.idempotency_table])
            .output()
            .unwrap()
    };
    // --all-unknown finds the refund among the unsettled records, and settles it.
    let all = reconcile(&["--all-unknown"]);
    let said = String::from_utf8_lossy(&all.stdout);
    assert_eq!(
        all.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&all.stderr)
    );
    assert!(
        said.contains(&format!("refund {rid}: settled from the provider")),
        "{said}"
    );
    // By its id, it is done.
    let again = reconcile(&[&rid]);
    let said = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(0), "{said}");
    assert!(said.contains("already COMPLETED (succeeded)"), "{said}");
    let status = std::process::Command::new(bin("payctl"))
        .args(["status", &rid, "--table", &t.config.idempotency_table])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.starts_with(&format!("refund {rid}: succeeded (400 ")),
        "{shown}"
    );
    assert_eq!(
        made(t.sim.ledger().await.unwrap()),
        1,
        "reconcile refunded nothing"
    );
}

/// A refund whose answer was lost, and which the provider then fails (after `pending`): a
/// redrive could not settle it within the provider's key retention (its call replays the first
/// answer, `pending`), so reconcile does: it finds the refund failed in the PaymentIntent's
/// refunds, records `refund_failed` and gives the reservation back in one transaction, says so,
/// and the amount can be refunded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_gives_back_a_refund_the_provider_failed_after_its_answer_was_lost() {
    let t = TestStack::new("refund-reconcile-failed").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1000, "pm_card_refundFail")).await;
    t.drain(1).await;
    let r = refunds_with(&t, env(&[("PROVIDER_MAX_ATTEMPTS", "1")])).await;
    let rid = t.pid("rf-1");
    t.fault(&rid, "drop_after_commit", Some(1), 0).await;
    proving::load::send_all(&t.sqs, &r.queue_url, &[refund(&rid, &pid, Some(600))])
        .await
        .expect("sending the refund");
    let source = &t.stack.event_sources[REFUND_PROCESSOR];
    let records = t.receive_records_from(source, 1).await;
    r.processor
        .handle_batch(records, sqs_once::runner::now_ms() + 60_000)
        .await;
    assert_eq!(refunded_total(&t, &pid).await, 600, "reserved, answer lost");
    // The provider fails the refund later.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let books = t.sim.ledger().await.unwrap();
        if books
            .refunds
            .get(&rid)
            .and_then(|r| r.first())
            .is_some_and(|r| r.status == "failed")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the provider never failed the refund"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await; // past not_before
    let out = std::process::Command::new(bin("payctl"))
        .args(["reconcile", &rid, "--table", &t.config.idempotency_table])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("settled as refund_failed, 600 given back to the payment"),
        "{said}"
    );
    assert_eq!(refunded_total(&t, &pid).await, 0, "given back");
    let ddb = aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await);
    let store = payment_core::refund_store(ddb.clone(), &t.config.idempotency_table);
    let record = store.get(&rid).await.unwrap().expect("the refund's record");
    assert_eq!(record.status.as_str(), "COMPLETED");
    let item = ddb
        .get_item()
        .table_name(&t.config.idempotency_table)
        .key(store.layout().attribute.clone(), store.record_key(&rid))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(
        item.item().unwrap().get(sqs_once::dynamo::OPEN).is_none(),
        "settled: off the OpenRecords index payctl health reads"
    );
    assert_eq!(
        record.outcome.as_ref().and_then(|o| o.text("code")),
        Some("refund_failed")
    );
    // The amount can be refunded again, under a new refund id.
    let r2 = t.pid("rf-2");
    proving::load::send_all(&t.sqs, &r.queue_url, &[refund(&r2, &pid, Some(1000))])
        .await
        .unwrap();
    let stats = r.drain(&t, 1).await;
    assert_eq!(stats.summary.done("refunded"), 1, "{:?}", stats.summary);
    assert_eq!(refunded_total(&t, &pid).await, 1000);
}
