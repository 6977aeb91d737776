//! Crossing a change of the message contract, forwards and back, with messages in flight: the
//! producers write version 1, move to 2, and move back to 1 while messages of each are in the
//! queue, one of them claimed by a processor that crashed. Every payment is charged once, the
//! version-2 field reaches Stripe, a retry across the change is the same payment, and a
//! version this release does not read is dead-lettered as such before anything is claimed.

use serde_json::{json, Value};
use sqs_once::record::IdempotencyStore;
use sqs_once::runner::now_ms;

use crate::events::{refund, refund_body};
use crate::helpers::*;
use crate::own_simulator::stripe_call;

/// A payment body of contract 2 (with a statement suffix when given).
fn version_2(body: &str, suffix: Option<&str>) -> String {
    let mut v: Value = serde_json::from_str(body).unwrap();
    v["contract_version"] = json!(2);
    if let Some(s) = suffix {
        v["statement_descriptor_suffix"] = json!(s);
    }
    v.to_string()
}

/// The simulator's PaymentIntent of a payment.
async fn intent_of(pid: &str) -> Value {
    let query = format!("metadata['payment_id']:'{pid}'");
    let found = stripe_call(
        &required_env("PROVIDER_API_URL"),
        &required_env("PAYMENT_API_KEY"),
        reqwest::Method::GET,
        "/v1/payment_intents/search",
        &[("query", &query)],
        &[],
        "",
    )
    .await;
    found["data"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_change_forwards_and_back_with_messages_in_flight_charges_each_payment_once() {
    let t = TestStack::new("contract").await;
    let body = |p: &str| payment(&t.pid(p), 1999, "pm_card_visa");
    // Under contract 1.
    t.send(&body("a")).await;
    // A processor claimed c's version-2 message and crashed: its lease runs out in a second.
    let c2 = version_2(&body("c"), None);
    let req = payment_core::domain::PaymentRequest::parse(&c2).unwrap();
    let now = now_ms();
    t.store
        .claim(&sqs_once::record::ClaimRequest {
            traceparent: None,
            key: req.payment_id.as_str().to_owned(),
            payload_hash: req.payload_hash(),
            owner: "crashed-processor".into(),
            now_ms: now,
            lease_expires_at_ms: now + 1_000,
            expires_at_s: now / 1000 + 86_400,
        })
        .await
        .unwrap();
    // The producers move to contract 2.
    t.send(&version_2(&body("b"), None)).await;
    t.send(&version_2(&body("d"), Some("ORDER 42"))).await;
    t.send(&version_2(&body("e"), None)).await;
    // And back to 1: c's retry and e's come as version 1, the same payments.
    t.send(&body("c")).await;
    t.send(&body("e")).await;
    // A producer ahead of this release.
    let mut ahead: Value = serde_json::from_str(&body("f")).unwrap();
    ahead["contract_version"] = json!(3);
    ahead["capture_method"] = json!("manual");
    t.send(&ahead.to_string()).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    t.drain(2).await;

    for p in ["a", "b", "c", "d", "e"] {
        assert_charged_once(&t, &t.pid(p)).await;
    }
    assert_eq!(
        intent_of(&t.pid("d")).await["statement_descriptor_suffix"],
        "ORDER 42"
    );
    assert!(intent_of(&t.pid("b")).await["statement_descriptor_suffix"].is_null());
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].error_code, "contract_unsupported");
    assert!(
        t.record(&t.pid("f")).await.is_none(),
        "a later version is never claimed"
    );
    assert_eq!(t.charges(&t.pid("f")).await, 0);

    // Refunds: version 2 is read (it adds nothing), a later one is dead-lettered as such.
    let mut r2: Value =
        serde_json::from_str(&refund_body(&t.pid("r-a"), &t.pid("a"), Some(500))).unwrap();
    r2["contract_version"] = json!(2);
    let mut r3: Value =
        serde_json::from_str(&refund_body(&t.pid("r-b"), &t.pid("b"), Some(500))).unwrap();
    r3["contract_version"] = json!(3);
    refund(&t, &[r2.to_string(), r3.to_string()]).await;
    let ledger = t.sim.ledger().await.unwrap();
    assert_eq!(ledger.refunds.get(&t.pid("r-a")).map(Vec::len), Some(1));
    assert!(!ledger.refunds.contains_key(&t.pid("r-b")));
    let refunds_dlq = t
        .stack
        .var_of(payctl::template::REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")
        .unwrap()
        .to_owned();
    let dead = proving::check::drain_dlq(&t.sqs, &refunds_dlq)
        .await
        .unwrap();
    let codes: Vec<&str> = dead.iter().map(|d| d.error_code.as_str()).collect();
    assert_eq!(codes, ["contract_unsupported"]);
}
