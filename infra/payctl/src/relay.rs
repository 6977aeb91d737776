//! The outbox relay on a local stream mapping (`payctl relay`, the proving ground, the tests):
//! the same [`Relay`] the `outbox-relay` Lambda runs, fed the records the template's filter
//! keeps (`INSERT` of `kind = payment`).

use std::sync::Arc;

use anyhow::Result;
use aws_sdk_dynamodbstreams::types::{AttributeValue, OperationType, Record};
use lambda_local::stream::{self, Handled, StreamHandler, StreamMapping};
use payment_core::payments::outbox::{OutboxEntry, Relay, PAYMENT_KIND};

/// The relay as a stream function.
struct OutboxRelay(Arc<Relay>);

/// The outbox entry a stream record carries (a new payment row), if the template's filter
/// keeps it.
fn entry_of(record: &Record) -> Option<OutboxEntry> {
    if record.event_name() != Some(&OperationType::Insert) {
        return None;
    }
    let image = record.dynamodb()?.new_image()?;
    let text = |k: &str| match image.get(k) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    };
    if text("kind").as_deref() != Some(PAYMENT_KIND) {
        return None;
    }
    let created_at = match image.get("created_at") {
        Some(AttributeValue::N(n)) => n.parse().ok()?,
        _ => return None,
    };
    Some(OutboxEntry {
        payment_id: text("id")?,
        message: text("message")?,
        created_at,
        customer_id: text("customer_id")?,
        traceparent: text("traceparent"),
        request_hash: text("request_hash"),
        expires_at_s: match image.get("expires_at") {
            Some(AttributeValue::N(n)) => n.parse().ok(),
            _ => None,
        },
    })
}

#[async_trait::async_trait]
impl StreamHandler for OutboxRelay {
    fn wants(&self, record: &Record) -> bool {
        entry_of(record).is_some()
    }

    async fn handle(&self, records: &[Record]) -> Handled {
        let entries: Vec<OutboxEntry> = records.iter().filter_map(entry_of).collect();
        let report = self.0.relay(&entries).await;
        Handled {
            done: report.sent,
            first_failed: report.first_failed,
            errors: report.errors,
        }
    }
}

/// Relays the outbox of the payments table `table` with `relay` until the mapping is dropped;
/// its `stats.handled` counts the entries the queue accepted.
pub async fn start(
    sdk: &aws_config::SdkConfig,
    table: &str,
    relay: Arc<Relay>,
) -> Result<StreamMapping> {
    stream::start(sdk, table, Arc::new(OutboxRelay(relay))).await
}

/// The outbox relay for a queue and a FIFO group rule (validated like the Lambda's
/// environment).
pub fn relay_for(queue_url: &str, group_by: &str, sdk: &aws_config::SdkConfig) -> Result<Relay> {
    let config = payment_core::edges::config::RelayConfig::from_lookup(|k| match k {
        "PAYMENTS_QUEUE_URL" => Some(queue_url.to_owned()),
        "FIFO_GROUP_BY" => Some(group_by.to_owned()),
        _ => None,
    })?;
    Ok(payment_core::edges::bootstrap::build_relay(&config, sdk))
}
