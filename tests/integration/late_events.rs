//! The provider's late events against records that must still be there, or whose absence must
//! not make our money foreign: a refund that fails after its own record is gone is given back
//! on the payment's ledger; a dispute of another system's PaymentIntent whose metadata names
//! one of our payment ids lands nowhere.

use aws_sdk_dynamodb::types::AttributeValue;
use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
use sqs_once::runner::now_ms;

use crate::events::{events, kinds, refund, refund_body};
use crate::helpers::*;

const DAY_S: i64 = 86_400;

async fn ddb() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await)
}

/// The TTL (`expires_at`) of the idempotency table's item `pk`.
async fn ttl_of(t: &TestStack, pk: &str) -> Option<i64> {
    let out = ddb()
        .await
        .get_item()
        .table_name(&t.config.idempotency_table)
        .key("pk", AttributeValue::S(pk.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    out.item()
        .and_then(|i| i.get("expires_at")?.as_n().ok()?.parse().ok())
}

/// A refund fails weeks after `pending`. Its own record is gone (DynamoDB's TTL deleted it: a
/// record written before refund records were kept for the refund window). The event names our
/// payment (metadata) and the PaymentIntent its record holds: the payment's ledger gives the
/// amount back, once, and the money can be refunded again. Never acknowledged as foreign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_fails_after_its_record_is_gone_is_given_back_on_the_payment() {
    let t = TestStack::new("late-refund").await;
    let e = events(&t).await;
    let pid = t.pid("p");
    t.send(&payment(&pid, 1000, "pm_card_refundFail")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let r1 = format!("{pid}-r1");
    let stats = refund(&t, &[refund_body(&r1, &pid, Some(1000))]).await;
    assert_eq!(stats.summary.done("refunded"), 1);
    let ledger = DynamoRefundLedger::new(ddb().await, &t.config.idempotency_table);
    assert_eq!(ledger.payment(&pid).await.unwrap().unwrap().refunded, 1000);
    // Both records are kept for the refund window from the refund.
    let year = now_ms() / 1000 + 364 * DAY_S;
    for pk in [format!("refund#{r1}"), format!("payment#{pid}")] {
        let kept = ttl_of(&t, &pk).await.expect("a TTL");
        assert!(kept >= year, "{pk} kept until {kept}, want at least {year}");
    }

    ddb()
        .await
        .delete_item()
        .table_name(&t.config.idempotency_table)
        .key("pk", AttributeValue::S(format!("refund#{r1}")))
        .send()
        .await
        .unwrap();
    let listed = e
        .listed(std::slice::from_ref(&r1), |l| {
            kinds(l).contains(&"refund.failed")
        })
        .await;
    e.deliver_all(&listed, 2).await;
    let stats = e.drain(&t).await;
    assert_eq!(stats.summary.done("foreign"), 0, "{:?}", stats.summary);
    assert_eq!(stats.summary.done("applied"), 1, "{:?}", stats.summary);
    let p = ledger.payment(&pid).await.unwrap().unwrap();
    assert_eq!((p.refunded, p.refunds.len()), (0, 0), "given back once");
    let history = e.payment(&pid).await.events;
    assert!(
        history
            .iter()
            .any(|n| n.change.contains(&format!("refund {r1} -> failed"))),
        "{history:?}"
    );
    // Delivered again: nothing changes.
    e.deliver_all(&listed, 1).await;
    e.drain(&t).await;
    assert_eq!(ledger.payment(&pid).await.unwrap().unwrap().refunded, 0);

    // The amount can be refunded again.
    let stats = refund(&t, &[refund_body(&format!("{pid}-r2"), &pid, Some(1000))]).await;
    assert_eq!(stats.summary.done("refunded"), 1, "{:?}", stats.summary);
    assert_eq!(e.dead_letters(&t).await, 0);
}

/// Another system on the same Stripe account creates a PaymentIntent whose
/// `metadata[payment_id]` happens to be one of our payment ids, and it is disputed. The
/// dispute is not ours: our payment holds nothing for it and stays refundable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_of_another_system_s_intent_naming_our_payment_is_foreign() {
    let t = TestStack::new("late-dispute").await;
    let e = events(&t).await;
    let pid = t.pid("p");
    t.send(&payment(&pid, 700, "pm_card_visa")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;

    let answer = reqwest::Client::new()
        .post(format!("{}/v1/payment_intents", t.config.payment_api_url))
        .bearer_auth(required_env("PAYMENT_API_KEY"))
        .header("Stripe-Version", &t.config.stripe_api_version)
        .header("Idempotency-Key", format!("other-system-{pid}"))
        .form(&[
            ("amount", "700"),
            ("currency", "usd"),
            ("payment_method", "pm_card_createDispute"),
            ("customer", "cus_another_system"),
            ("confirm", "true"),
            ("off_session", "true"),
            ("metadata[payment_id]", pid.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
    let theirs: serde_json::Value = answer.json().await.unwrap();
    let intent = theirs["id"].as_str().unwrap().to_owned();
    let opened = e
        .listed(&[intent], |l| kinds(l).contains(&"charge.dispute.created"))
        .await;
    e.deliver_all(&opened, 1).await;
    let stats = e.drain(&t).await;
    assert_eq!(stats.summary.done("applied"), 0, "{:?}", stats.summary);
    assert!(stats.summary.done("foreign") >= 1, "{:?}", stats.summary);
    let p = e.payment(&pid).await;
    assert_eq!((p.disputed, p.disputes.len()), (0, 0), "{p:?}");
    let stats = refund(&t, &[refund_body(&format!("{pid}-r1"), &pid, None)]).await;
    assert_eq!(stats.summary.done("refunded"), 1, "{:?}", stats.summary);
}
