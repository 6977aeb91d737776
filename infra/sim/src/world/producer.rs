//! The producer: payments arriving at random over the arrival days, some sent twice, some
//! under a reused id with another amount, some not payments at all.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{Sent, World, EPOCH_MS};
use crate::provider::methods;
use crate::sqs::url_of;

/// The producer: payments arriving at random over the arrival days, some twice, some bad.
pub(super) async fn produce(w: Arc<World>) {
    let sqs = crate::wire::sqs_client(&w.sdk);
    let url = url_of(&w.queue);
    let span_ms = (w.opts.arrival_days * 86_400_000.0) as i64;
    let mut times: Vec<i64> = (0..w.opts.payments)
        .map(|_| (w.draw() * span_ms as f64) as i64)
        .collect();
    times.sort();
    let mut later: Vec<(i64, String)> = Vec::new();
    for (n, at) in times.into_iter().enumerate() {
        let wait = (EPOCH_MS + at - w.clock.now_ms()).max(0);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        let roll = w.draw();
        let body = if roll < w.opts.bad_input_share {
            *w.bad.lock().expect("bad") += 1;
            if w.draw() < 0.5 {
                "{\"payment_id\": \"broken".to_owned()
            } else {
                json!({"payment_id": format!("p-{n:07}"), "amount": -5, "currency": "usd", "customer_id": "cus_sim", "payment_method": methods::CARD}).to_string()
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
            let body = json!({"payment_id": id, "amount": amount, "currency": "usd", "customer_id": format!("cus_{}", n % 997), "payment_method": method}).to_string();
            if w.draw() < w.opts.reused_key_share {
                let other = json!({"payment_id": id, "amount": amount + 1, "currency": "usd", "customer_id": format!("cus_{}", n % 997), "payment_method": method}).to_string();
                later.push((w.clock.now_ms() + (w.draw() * 3_600_000.0) as i64, other));
            }
            if w.draw() < w.opts.duplicate_share {
                later.push((
                    w.clock.now_ms() + (w.draw() * 7_200_000.0) as i64,
                    body.clone(),
                ));
            }
            // Card charges, and bank debits (a refund asked while one settles is held).
            if matches!(
                method,
                methods::CARD | methods::BANK_DEBIT | methods::BANK_DEBIT_FAILS
            ) {
                super::refunds::maybe_refund(&w, n, &id, amount);
            }
            w.sent.lock().expect("sent").insert(id, Sent { method });
            body
        };
        super::sender::send(&w, &sqs, &url, &body).await;
        later.retain(|(at, b)| {
            if *at <= w.clock.now_ms() {
                let (w2, sqs2, url2, b2) = (Arc::clone(&w), sqs.clone(), url.clone(), b.clone());
                tokio::spawn(async move { super::sender::send(&w2, &sqs2, &url2, &b2).await });
                false
            } else {
                true
            }
        });
    }
    later.sort();
    for (at, body) in later {
        let wait = (at - w.clock.now_ms()).max(0);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        super::sender::send(&w, &sqs, &url, &body).await;
    }
}
