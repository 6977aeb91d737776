//! The producer: payments arriving at random over the arrival days, some sent twice, some
//! under a reused id with another amount, some not payments at all.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::super::{Sent, World, EPOCH_MS};
use crate::provider::methods;
use crate::sqs::url_of;

/// The producer: payments arriving at random over the arrival days, some twice, some bad.
pub(in crate::world) async fn produce(w: Arc<World>) {
    let sqs = crate::wire::sqs_client(&w.sdk);
    let url = url_of(&w.queue);
    let span_ms = (w.opts.arrival_days * 86_400_000.0) as i64;
    let mut times: Vec<i64> = (0..w.opts.payments)
        .map(|_| (w.draw() * span_ms as f64) as i64)
        .collect();
    times.sort();
    // A later send: when, the order it was planned in, the API's key (or the queue), the body;
    // the earliest first.
    let mut later: BinaryHeap<Reverse<Later>> = BinaryHeap::new();
    let mut planned: u64 = 0;
    for (n, at) in times.into_iter().enumerate() {
        let wait = (EPOCH_MS + at - w.clock.now_ms()).max(0);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        if !w.running(i64::MAX) {
            return;
        }
        w.first_arrival_ms
            .lock()
            .expect("first")
            .get_or_insert(w.clock.now_ms());
        // Through the payments API (its key the payment's id), or straight to the queue.
        let via_api = (w.api.is_some() && w.draw() < w.opts.api_share).then(|| format!("p-{n:07}"));
        let roll = w.draw();
        let body = if roll < w.opts.bad_input_share {
            *w.bad.lock().expect("bad") += 1;
            if w.draw() < 0.5 {
                "{\"payment_id\": \"broken".to_owned()
            } else {
                api_body(
                    &via_api,
                    json!({"payment_id": format!("p-{n:07}"), "amount": -5, "currency": "usd", "customer_id": "cus_sim", "payment_method": methods::CARD}),
                )
            }
        } else {
            let m = w.draw();
            let method = if m < 0.85 {
                methods::CARD
            } else if m < 0.90 {
                methods::DECLINED
            } else if m < 0.93 {
                methods::NEEDS_CUSTOMER
            } else if m < 0.98 {
                methods::BANK_DEBIT
            } else {
                methods::BANK_DEBIT_FAILS
            };
            let id = format!("p-{n:07}");
            let amount = 100 + (w.draw() * 100_000.0) as i64;
            let mut message = json!({"payment_id": id, "amount": amount, "currency": "usd", "customer_id": format!("cus_{}", n % 997), "payment_method": method});
            // What the shopper typed or pasted, in the description and a metadata value.
            if w.opts.shopper_text_share > 0.0 && w.draw() < w.opts.shopper_text_share {
                let (description, why) = super::shopper::text(w.as_ref());
                let (note, why_note) = super::shopper::text(w.as_ref());
                message["description"] = description.into();
                message["metadata"] = json!({ "note": note });
                if let Some(why) = why.or(why_note) {
                    // No door may take it: refused at the API (400) or dead-lettered from the
                    // queue, never charged, never a 202 left pending.
                    *w.bad.lock().expect("bad") += 1;
                    w.refused
                        .lock()
                        .expect("refused")
                        .text
                        .insert(id.clone(), why);
                    let body = api_body(&via_api, message);
                    submit(&w, &sqs, &url, via_api.as_deref(), &body).await;
                    continue;
                }
            }
            let body = api_body(&via_api, message.clone());
            if w.draw() < w.opts.reused_key_share {
                let mut reused = message;
                reused["amount"] = (amount + 1).into();
                let other = api_body(&via_api, reused);
                planned += 1;
                later.push(Reverse((
                    w.clock.now_ms() + (w.draw() * 3_600_000.0) as i64,
                    planned,
                    via_api.clone(),
                    other,
                )));
            }
            if w.draw() < w.opts.duplicate_share {
                planned += 1;
                later.push(Reverse((
                    w.clock.now_ms() + (w.draw() * 7_200_000.0) as i64,
                    planned,
                    via_api.clone(),
                    body.clone(),
                )));
            }
            // Card charges, and bank debits (a refund asked while one settles is held).
            if matches!(
                method,
                methods::CARD | methods::BANK_DEBIT | methods::BANK_DEBIT_FAILS
            ) {
                super::super::refunds::maybe_refund(&w, n, &id, amount);
            }
            w.sent.lock().expect("sent").insert(id, Sent { method });
            body
        };
        if w.opts.parallel_clients {
            // A client of its own per payment: sent at its arrival, whatever the others wait for.
            let (w2, sqs2, url2) = (Arc::clone(&w), sqs.clone(), url.clone());
            tokio::spawn(async move { submit(&w2, &sqs2, &url2, via_api.as_deref(), &body).await });
        } else {
            submit(&w, &sqs, &url, via_api.as_deref(), &body).await;
        }
        // Those due go now, in the order they were planned.
        let mut due: Vec<Later> = Vec::new();
        while later
            .peek()
            .is_some_and(|Reverse(l)| l.0 <= w.clock.now_ms())
        {
            due.extend(later.pop().map(|Reverse(l)| l));
        }
        due.sort_by_key(|l| l.1);
        for (_, _, key, b) in due {
            let (w2, sqs2, url2) = (Arc::clone(&w), sqs.clone(), url.clone());
            tokio::spawn(async move { submit(&w2, &sqs2, &url2, key.as_deref(), &b).await });
        }
    }
    let mut later: Vec<(i64, Option<String>, String)> = later
        .into_iter()
        .map(|Reverse((at, _, key, body))| (at, key, body))
        .collect();
    later.sort();
    for (at, key, body) in later {
        let wait = (at - w.clock.now_ms()).max(0);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        if !w.running(i64::MAX) {
            return;
        }
        submit(&w, &sqs, &url, key.as_deref(), &body).await;
    }
}

/// A later send: when, the order it was planned in, the API's key (or the queue), the body.
type Later = (i64, u64, Option<String>, String);

/// A payment as its producer writes it: the queue's message (its JSON as SQS takes it), or,
/// for the API, the same without `payment_id` (the `Idempotency-Key` header is the id).
fn api_body(via_api: &Option<String>, mut message: serde_json::Value) -> String {
    if via_api.is_none() {
        return super::shopper::sqs_json(&message);
    }
    if let Some(o) = message.as_object_mut() {
        o.remove("payment_id");
    }
    message.to_string()
}

/// Sends one payment: `POST /v1/payments` under `key` until the API answers it, or a message
/// to the queue until SQS takes it.
async fn submit(
    w: &Arc<World>,
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
) {
    match key {
        Some(key) => {
            let status = super::api::post(w, key, body).await;
            if status == 202 {
                w.stats.lock().expect("stats").api_accepted += 1;
            }
            let refused = w.refused.lock().expect("refused").text.get(key).copied();
            if refused.is_some() && status == 202 {
                w.refused
                    .lock()
                    .expect("refused")
                    .accepted
                    .insert(key.to_owned());
            }
            if let Some(why) = refused.filter(|_| status != 400) {
                // A 202 here is a payment that can never be relayed, charged or refused again:
                // the caller holds an acceptance and GET says pending for the row's life.
                w.violated(
                    "text no door may take is refused at the API (400)",
                    format!("{key} with {why} in its text answered {status}"),
                );
            }
            w.note(format!("api: POST {key}: {status}"));
        }
        None => super::sender::send(w, sqs, url, body).await,
    }
}
