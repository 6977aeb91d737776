//! Putting messages on a queue (`payctl send`, `send-refund`; the proving ground's loads).

use std::collections::HashMap;

use anyhow::{Context, Result};
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use futures::{stream, StreamExt, TryStreamExt};
use serde_json::json;

/// A valid payment body in usd.
pub fn payment_body(payment_id: &str, amount: i64, payment_method: &str) -> String {
    payment_body_in(payment_id, amount, "usd", payment_method)
}

/// A valid payment body: metadata with characters a form encoding must escape (`&`, `=`, `+`,
/// `%`, `#`, brackets in a value, non-ASCII), which must reach the provider unchanged.
pub fn payment_body_in(
    payment_id: &str,
    amount: i64,
    currency: &str,
    payment_method: &str,
) -> String {
    json!({
        "payment_id": payment_id, "amount": amount, "currency": currency,
        "customer_id": "cus_local", "payment_method": payment_method,
        "description": format!("Order for {payment_id}"),
        "metadata": {"order_id": payment_id, "note": "café & crème = 100% + ü [x] #1"}
    })
    .to_string()
}

/// Which batches of ten a send has had accepted so far.
#[derive(Debug, Default)]
pub struct Progress(std::sync::Mutex<std::collections::BTreeSet<usize>>);

impl Progress {
    fn accepted(&self, chunk: usize) {
        if let Ok(mut done) = self.0.lock() {
            done.insert(chunk);
        }
    }

    /// Of `total` bodies: how many the queue accepted, and the first one it has not (every
    /// body before it was accepted), if any.
    pub fn done(&self, total: usize) -> (usize, Option<usize>) {
        let done = self.0.lock().map(|d| d.clone()).unwrap_or_default();
        let sent = done
            .iter()
            .map(|c| (total - (c * 10).min(total)).min(10))
            .sum();
        let first_missing = (0..total.div_ceil(10)).find(|c| !done.contains(c));
        (sent, first_missing.map(|c| c * 10))
    }
}

/// A message's FIFO group and deduplication id, as the system's own senders give them. A
/// refund (it has a `refund_id`) goes in its payment's group, with a deduplication id of this
/// send's own, as a resumed held refund does (a refund sent again is not dropped as a copy;
/// its record absorbs copies). A payment goes in its customer's group and is deduplicated by
/// its `payment_id`, as the relay does at its default `FIFO_GROUP_BY=customer`. Anything else
/// (a body sent with `--no-validate`) goes in a group of its own.
pub fn fifo_ids(body: &str) -> (String, String) {
    use sqs_once::queue::fifo_id;
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    if v["refund_id"].is_string() {
        if let Ok(ids) = payment_core::refunds::queue::fifo_ids(body, &sqs_once::token::new()) {
            return ids;
        }
    }
    if let Some(payment_id) = v["payment_id"].as_str() {
        let group = v["customer_id"].as_str().unwrap_or(payment_id);
        return (fifo_id(group), fifo_id(payment_id));
    }
    let own = sqs_once::token::new();
    (own.clone(), own)
}

/// Sends bodies in batches of ten, eight batches at a time (one at a time to a FIFO queue, in
/// order); returns each message's id in order.
pub async fn send_all(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    bodies: &[String],
) -> Result<Vec<String>> {
    send_all_observed(sqs, queue_url, bodies, &Progress::default()).await
}

/// [`send_all`], marking in `progress` each batch the queue accepted (an interrupted send can
/// say what went).
pub async fn send_all_observed(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    bodies: &[String],
    progress: &Progress,
) -> Result<Vec<String>> {
    let chunks: Vec<(usize, &[String])> = bodies.chunks(10).enumerate().collect();
    let results: Vec<(usize, HashMap<String, String>)> = stream::iter(chunks)
        .map(|(ci, chunk)| async move {
            let fifo = queue_url.ends_with(".fifo");
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let mut entry = SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(b);
                    // When this process exports traces, each message starts its payment's
                    // trace (a `create` span); the processor continues it.
                    let traced = payment_core::telemetry::traces::on().then(|| {
                        let key = serde_json::from_str::<serde_json::Value>(b)
                            .ok()
                            .and_then(|v| {
                                ["refund_id", "payment_id"]
                                    .iter()
                                    .find_map(|k| v[*k].as_str().map(str::to_owned))
                            });
                        sqs_once::trace::create_attributes(queue_url, None, key.as_deref())
                    });
                    for (name, value) in traced.unwrap_or_default() {
                        entry = entry.message_attributes(
                            name,
                            aws_sdk_sqs::types::MessageAttributeValue::builder()
                                .data_type("String")
                                .string_value(value)
                                .build()?,
                        );
                    }
                    let entry = if fifo {
                        let (group, dedup) = fifo_ids(b);
                        entry
                            .message_group_id(group)
                            .message_deduplication_id(dedup)
                    } else {
                        entry
                    };
                    entry.build()
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = sqs
                .send_message_batch()
                .queue_url(queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .context("sending messages")?;
            if let Some(f) = out.failed().first() {
                anyhow::bail!(
                    "the queue refused message {}: {}",
                    f.id(),
                    f.message().unwrap_or_default()
                );
            }
            let ids = out
                .successful()
                .iter()
                .map(|s| (s.id().to_owned(), s.message_id().to_owned()))
                .collect();
            progress.accepted(ci);
            Ok::<_, anyhow::Error>((ci, ids))
        })
        // A FIFO queue takes each group's messages in the order they are sent: one batch at a
        // time, so that the file's order is the queue's.
        .buffer_unordered(if queue_url.ends_with(".fifo") { 1 } else { 8 })
        .try_collect()
        .await?;
    let mut ids = vec![String::new(); bodies.len()];
    for (ci, map) in results {
        for (i, mid) in map {
            let i: usize = i.parse()?;
            ids[ci * 10 + i] = mid;
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::{fifo_ids, payment_body};

    #[test]
    fn fifo_ids_follow_the_systems_own_senders_and_always_fit_sqs() {
        // A payment: its customer's group, deduplicated by its id (as the relay sends it).
        let p = payment_body("pay-1", 1000, "pm_card_visa");
        let v: serde_json::Value = serde_json::from_str(&p).unwrap();
        let (group, dedup) = fifo_ids(&p);
        assert_eq!(group, v["customer_id"].as_str().unwrap());
        assert_eq!(dedup, "pay-1");
        assert_eq!(fifo_ids(&p), (group, dedup));
        // A refund: its payment's group, each send a message of its own.
        let r = r#"{"refund_id":"r-1","payment_id":"pay-1","amount":5}"#;
        let (g1, d1) = fifo_ids(r);
        let (g2, d2) = fifo_ids(r);
        assert_eq!((g1.as_str(), g2.as_str()), ("pay-1", "pay-1"));
        assert_ne!(d1, d2);
        // Ids as long as the system takes (255) are hashed into what SQS takes (128).
        let long = "p".repeat(255);
        let (g, d) = fifo_ids(&payment_body(&long, 1000, "pm_card_visa"));
        assert!(g.len() <= 128 && d.len() <= 128 && d != long);
        // A body that is not one (sent to try the DLQ) still gets ids SQS takes.
        let (g, d) = fifo_ids("not json");
        assert!(!g.is_empty() && g.len() <= 128 && d.len() <= 128);
    }
}
