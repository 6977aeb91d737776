//! `payctl outbox pending | republish`: the payment rows the processor has never seen (the
//! relay's event source gave up on their batch and sent it to `RelayFailuresQueue`, or the
//! stream's 24 h retention passed while the relay was failing), found without a per-row mark:
//! a row with neither an idempotency record nor a dead-letter mark in the processor's table,
//! which the processor writes before anything else it does with a payment. They are sent again
//! with the relay's own code. Sending a row that was in fact delivered (it waits in the queue
//! behind a backlog) is safe: the processor's record absorbs the copy.

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use payment_core::api::table::DynamoPayments;
use payment_core::api::PaymentsStore;
use payment_core::payments::outbox::{OutboxEntry, Relay, RelayReport, PAYMENT_KIND};

/// Payment rows (with their outbox fields) created before `before_ms`, oldest first.
async fn rows_before(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    before_ms: i64,
) -> Result<Vec<OutboxEntry>> {
    let mut entries = Vec::new();
    let mut start = None;
    loop {
        let out = ddb
            .scan()
            .table_name(table)
            .filter_expression("kind = :p AND attribute_exists(message) AND created_at < :t")
            .expression_attribute_values(":p", AttributeValue::S(PAYMENT_KIND.into()))
            .expression_attribute_values(":t", AttributeValue::N(before_ms.to_string()))
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .with_context(|| format!("scanning the payments table {table}"))?;
        for item in out.items() {
            let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
            let created_at = item
                .get("created_at")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok());
            if let (Some(payment_id), Some(message), Some(created_at), Some(customer_id)) =
                (text("id"), text("message"), created_at, text("customer_id"))
            {
                entries.push(OutboxEntry {
                    payment_id,
                    message,
                    created_at,
                    customer_id,
                    traceparent: text("traceparent"),
                    request_hash: text("request_hash"),
                    expires_at_s: item
                        .get("expires_at")
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse().ok()),
                });
            }
        }
        match out.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => break,
        }
    }
    entries.sort_by_key(|e| e.created_at);
    Ok(entries)
}

/// Payment rows created before `before_ms` that the processor has never seen (no record, no
/// dead-letter mark in `records_table`), oldest first.
pub async fn unseen(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    records_table: &str,
    before_ms: i64,
) -> Result<Vec<OutboxEntry>> {
    use futures::{stream, StreamExt, TryStreamExt};
    let store = DynamoPayments::new(ddb.clone(), table, records_table);
    // One consistent read of each row's record and mark, sixteen rows at a time, in order.
    let seen: Vec<(OutboxEntry, bool)> = stream::iter(rows_before(ddb, table, before_ms).await?)
        .map(|entry| {
            let store = &store;
            async move {
                let (record, mark) =
                    store.progress(&entry.payment_id).await.with_context(|| {
                        format!(
                            "reading the processor's record of {} in {records_table}",
                            entry.payment_id
                        )
                    })?;
                Ok::<_, anyhow::Error>((entry, record.is_some() || mark.is_some()))
            }
        })
        .buffered(16)
        .try_collect()
        .await?;
    Ok(seen
        .into_iter()
        .filter_map(|(entry, seen)| (!seen).then_some(entry))
        .collect())
}

/// Sends the entries again.
pub async fn republish(relay: &Relay, entries: &[OutboxEntry]) -> RelayReport {
    relay.relay(entries).await
}
