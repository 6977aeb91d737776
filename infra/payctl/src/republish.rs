//! `payctl outbox pending | republish`: the outbox entries the relay has not marked published
//! (its event source gave up on a batch and sent it to `RelayFailuresQueue`, or the stream's
//! 24 h retention passed while the relay was failing), found by scanning the payments table,
//! and sent again with the relay's own code. Sending an entry that was in fact delivered is
//! safe: the processor's record absorbs the copy.

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use payment_core::outbox::{OutboxEntry, Relay, RelayReport, OUTBOX_KIND};

/// Unpublished outbox entries created before `before_ms`, oldest first.
pub async fn unpublished(
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
            .filter_expression(
                "kind = :o AND attribute_not_exists(published_at) AND created_at < :t",
            )
            .expression_attribute_values(":o", AttributeValue::S(OUTBOX_KIND.into()))
            .expression_attribute_values(":t", AttributeValue::N(before_ms.to_string()))
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .with_context(|| {
                format!("scanning the payments table {table} for unpublished outbox entries")
            })?;
        for item in out.items() {
            let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
            let created_at = item
                .get("created_at")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok());
            if let (Some(payment_id), Some(message), Some(created_at), Some(customer_id)) = (
                text("payment_id"),
                text("message"),
                created_at,
                text("customer_id"),
            ) {
                entries.push(OutboxEntry {
                    payment_id,
                    message,
                    created_at,
                    customer_id,
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

/// Sends the entries again and marks them published.
pub async fn republish(relay: &Relay, entries: &[OutboxEntry]) -> RelayReport {
    relay.relay(entries).await
}
