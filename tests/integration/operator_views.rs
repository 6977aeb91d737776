//! What the operator's tools show of a payment, whichever way it came in.

use crate::helpers::{payment, TestStack};

/// A payment sent to the queue itself (not through the API) exists for the API too: `GET`
/// answers from the processor's record, marked as come by the queue, with its amount and
/// currency once charged and who sent it; a payment known nowhere is still `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_sent_to_the_queue_exists_for_the_api() {
    let t = TestStack::new("raw-get").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1234, "pm_card_visa")).await;
    t.drain(1).await;
    let (_server, client) = crate::api::served(&t).await;
    let answer = client.get(&pid).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let got = answer.json().unwrap();
    assert_eq!(got["status"], "succeeded", "{got}");
    assert_eq!(got["source"], "queue", "{got}");
    assert_eq!(got["amount"], 1234, "{got}");
    assert_eq!(got["currency"], "usd", "{got}");
    // Who sent it: SQS's `SenderId` of the message its record completed.
    assert!(
        got["sent_by"].as_str().is_some_and(|s| !s.is_empty()),
        "{got}"
    );
    assert_eq!(client.get(&t.pid("never")).await.unwrap().status, 404);
}

/// A payment's refunds show in `payctl status` (each refund's amount, state and provider id,
/// and the refunded total, in text and `--json`) and in `GET /v1/payments/{id}`, and a
/// refund's own id reads in `status` and `history` as a refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_show_in_status_and_history() {
    use crate::helpers::bin;
    let t = TestStack::new("refund-views").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 2000, "pm_card_visa")).await;
    t.drain(1).await;
    let config = proving::demo::refund_config_for(&t.stack, &crate::helpers::fast_settings())
        .expect("the refund function's configuration");
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let processor = payment_core::edges::bootstrap::build_refund_processor(&config, &sdk)
        .await
        .expect("building the refund processor");
    let source = &t.stack.event_sources[payctl::template::REFUND_PROCESSOR];
    let (r1, r2) = (t.pid("rf-1"), t.pid("rf-2"));
    let bodies: Vec<String> = [(&r1, 500), (&r2, 1000)]
        .iter()
        .map(|(rid, amount)| {
            payment_core::refunds::work::RefundRequest {
                refund_id: (*rid).clone(),
                payment_id: pid.clone(),
                amount: Some(*amount),
                reason: None,
                contract_version: None,
            }
            .to_message_body()
        })
        .collect();
    proving::load::send_all(&t.sqs, &source.queue_url, &bodies)
        .await
        .unwrap();
    proving::demo::drain_source(processor, &t.sqs, source, 1)
        .await
        .unwrap();
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
    let text = payctl(&["status", &pid]);
    assert!(
        text.contains("refunded         1500 in 2 refund(s)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{r1}  500  succeeded, provider re_")),
        "{text}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&payctl(&["status", &pid, "--json"])).unwrap();
    assert_eq!(doc["refunded_amount"], 1500, "{doc}");
    assert_eq!(doc["refunds"].as_array().map(Vec::len), Some(2), "{doc}");
    let refund = payctl(&["status", &r2]);
    assert!(
        refund.starts_with(&format!("refund {r2}: succeeded (1000 ")) && refund.contains(&pid),
        "{refund}"
    );
    // The API answers the same refunds.
    let (_server, client) = crate::api::served(&t).await;
    let got = client.get(&pid).await.unwrap().json().unwrap();
    assert_eq!(got["refunded_amount"], 1500, "{got}");
    assert_eq!(got["refunds"][0]["state"], "succeeded", "{got}");
    assert!(
        got["refunds"][1]["provider_refund_id"]
            .as_str()
            .is_some_and(|p| p.starts_with("re_")),
        "{got}"
    );
    // The payment's history names its refunds' events among its own.
    let payment_history = payctl(&["history", &pid]);
    assert!(
        payment_history.contains(&format!("refund {r1} (500): completed: succeeded")),
        "{payment_history}"
    );
    let history = payctl(&["history", &r2]);
    assert!(
        history
            .lines()
            .last()
            .unwrap_or_default()
            .ends_with("completed: succeeded"),
        "{history}"
    );
}

/// `payctl status` of a payment the API accepted and the processor has not seen says so: when
/// it was accepted and what it waits for, exit 0, as `payctl get` says `pending`. (It exited 1
/// with "no record and no dead letter".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_an_accepted_payment_not_yet_processed_says_what_it_waits_for() {
    let t = TestStack::new("op-accepted").await;
    let (_server, c) = crate::api::served(&t).await;
    let key = t.pid("p1");
    let body = r#"{"amount":2500,"currency":"usd","customer_id":"cus_acc","payment_method":"pm_card_visa"}"#;
    assert_eq!(c.create(&key, body).await.unwrap().status, 202);
    let status = |json: bool| {
        let mut cmd = std::process::Command::new(crate::helpers::bin("payctl"));
        cmd.args(["status", &key])
            .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
            .env("PAYMENTS_TABLE", t.stack.payments_table().unwrap());
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = status(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("{key}: accepted by the API at ")),
        "{text}"
    );
    assert!(
        text.contains("not processed yet: waiting for the outbox relay"),
        "{text}"
    );
    let out = status(true);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["state"], "accepted");
    assert_eq!(doc["amount"], 2500);
}
