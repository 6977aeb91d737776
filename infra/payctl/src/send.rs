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

/// Sends bodies in batches of ten, eight batches at a time; returns each message's id in order.
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
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(b)
                        .build()
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
        .buffer_unordered(8)
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
