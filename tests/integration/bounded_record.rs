//! A payment's record stays within DynamoDB's 400 KB an item whatever its refunds and events:
//! on the real SDK and ministack's DynamoDB (which refuses a larger item, as DynamoDB does),
//! 500 refunds of one charge under the longest ids taken, each failing later and given back
//! (an entry each, an event each), and a dispute settled after them.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;
use payctl::template::REFUND_PROCESSOR;
use proving::check::drain_dlq;

use crate::events::{events, kinds, refund, refund_body};
use crate::helpers::*;

/// An attribute value's size as DynamoDB counts it (its "Item sizes" rules: strings by their
/// UTF-8 bytes, numbers by about a byte for two digits plus one, maps and lists three bytes
/// plus a byte an element beside the elements' names and values).
fn size_of(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| k.len() + size_of(v) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| size_of(v) + 1).sum::<usize>(),
        AttributeValue::Ss(l) => l.iter().map(String::len).sum(),
        other => format!("{other:?}").len(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_refunds_of_one_charge_leave_a_record_that_still_settles_a_dispute() {
    let t = TestStack::new("rf-bounded").await;
    let e = events(&t).await;
    let pid = t.pid("p");
    // Its refunds are created `pending` and fail later: each gives its amount back, so every
    // one of them could be made again, and each leaves an entry and an event on the record.
    t.send(&payment(&pid, 100_000, "pm_card_refundFail")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let intent = t.ledger(&pid).await.charges[&pid][0].id.clone();
    let rid = |i: usize| {
        let head = format!("{pid}-r{i:03}-");
        format!("{head}{}", "x".repeat(255 - head.len()))
    };
    let bodies: Vec<String> = (0..500)
        .map(|i| refund_body(&rid(i), &pid, Some(100)))
        .collect();
    refund(&t, &bodies).await;
    let dlq = t
        .stack
        .var_of(REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")
        .unwrap();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for d in drain_dlq(&t.sqs, dlq).await.unwrap() {
        *codes.entry(d.error_code).or_default() += 1;
    }
    assert_eq!(
        codes,
        BTreeMap::from([("refund_limit_reached".to_owned(), 300)]),
        "the first 200 made, the rest refused with a code that says why"
    );
    let made = e.payment(&pid).await;
    assert_eq!(
        (made.refunds.len(), made.refunds.values().sum::<i64>()),
        (200, 20_000)
    );

    // The provider fails each pending refund: 200 events, each giving its amount back.
    let listed = e
        .listed(std::slice::from_ref(&pid), |l| {
            kinds(l).iter().filter(|k| **k == "refund.failed").count() == 200
        })
        .await;
    let failed: Vec<_> = listed
        .into_iter()
        .filter(|(ev, _)| ev.kind == "refund.failed")
        .collect();
    e.deliver_all(&failed, 1).await;
    let stats = e.drain(&t).await;
    assert_eq!(stats.summary.done("applied"), 200, "{:?}", stats.summary);
    let p = e.payment(&pid).await;
    assert_eq!((p.released.len(), p.refunds.len()), (200, 0));

    // Every amount is back, and still no 201st refund: the record keeps what it holds.
    let again = refund(
        &t,
        &[refund_body(&format!("{pid}-one-more"), &pid, Some(100))],
    )
    .await;
    assert_eq!(again.summary.done("refunded"), 0, "{:?}", again.summary);
    let codes: Vec<String> = drain_dlq(&t.sqs, dlq)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.error_code)
        .collect();
    assert_eq!(codes, ["refund_limit_reached"]);

    // A dispute after all of it is still applied to the payment's record.
    let dispute = t.sim.open_dispute(&intent).await.unwrap();
    let opened = e
        .listed(std::slice::from_ref(&intent), |l| {
            kinds(l).contains(&"charge.dispute.created")
        })
        .await;
    let opened: Vec<_> = opened
        .into_iter()
        .filter(|(ev, _)| ev.kind.starts_with("charge.dispute."))
        .collect();
    e.deliver_all(&opened, 1).await;
    let stats = e.drain(&t).await;
    assert!(stats.summary.done("applied") >= 1, "{:?}", stats.summary);
    assert_eq!(e.dead_letters(&t).await, 0);
    let p = e.payment(&pid).await;
    assert_eq!(
        p.disputes.get(&dispute).map(|(s, _)| s.as_str()),
        Some("needs_response")
    );
    assert_eq!(p.disputed, 100_000);
    // The first hundred events are listed, the rest counted; GET says both.
    assert_eq!((p.events.len(), p.events_unlisted), (100, 101));
    let (_server, client) = crate::api::served(&t).await;
    let got = client.get(&pid).await.unwrap().json().unwrap();
    assert_eq!(
        got["events"].as_array().map(Vec::len),
        Some(100),
        "{}",
        got["events_not_listed"]
    );
    assert_eq!(got["events_not_listed"], 101);
    let payctl = |args: &[&str]| {
        let out = std::process::Command::new(bin("payctl"))
            .args(args)
            .args(["--table", &t.config.idempotency_table])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status: serde_json::Value =
        serde_json::from_str(&payctl(&["status", &pid, "--json"])).unwrap();
    assert_eq!(status["events_not_listed"], 101);
    let history = payctl(&["history", &pid]);
    assert!(
        history.contains("and 101 provider events applied after these"),
        "{history}"
    );

    let item = aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await)
        .get_item()
        .table_name(&t.config.idempotency_table)
        .key("pk", AttributeValue::S(format!("payment#{pid}")))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let size: usize = item.iter().map(|(k, v)| k.len() + size_of(v)).sum();
    eprintln!("the payment's record after 500 refunds, 201 events and a dispute: {size} bytes");
    assert!(size < 200_000, "{size} bytes");
}
