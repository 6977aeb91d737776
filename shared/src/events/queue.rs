//! Where verified events go: the provider-events queue, one event at a time (the receiver) or
//! a page at a time in `SendMessageBatch` calls (the catch-up).

use async_trait::async_trait;

use crate::provider::event::ProviderEvent;

/// Where verified events go.
#[async_trait]
pub trait EventQueue: Send + Sync {
    /// Sends the event's raw body; `Ok` once the queue holds it.
    async fn enqueue(&self, event: &ProviderEvent, body: &str) -> Result<(), String>;

    /// Sends every event; `Ok` once the queue holds them all. The default sends them one at
    /// a time.
    async fn enqueue_batch(&self, events: &[(ProviderEvent, String)]) -> Result<(), String> {
        for (event, body) in events {
            self.enqueue(event, body).await?;
        }
        Ok(())
    }
}

/// SQS's limits on one `SendMessageBatch`: ten entries, 256 KiB in all.
const BATCH_ENTRIES: usize = 10;
const BATCH_BYTES: usize = 256 * 1024;

/// Splits events into batches SQS takes whole (an event larger than a batch goes alone, and
/// SQS names it if it is too large for any message).
fn batches(events: &[(ProviderEvent, String)]) -> Vec<&[(ProviderEvent, String)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (e, body)) in events.iter().enumerate() {
        // The body and its one attribute: name, value and data type all count.
        let size = body.len() + e.kind.len() + "event_type".len() + "String".len();
        if i > start && (i - start == BATCH_ENTRIES || bytes + size > BATCH_BYTES) {
            out.push(&events[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < events.len() {
        out.push(&events[start..]);
    }
    out
}

/// The provider-events queue in SQS.
pub struct SqsEventQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl SqsEventQueue {
    /// The queue at `url` (the template's `PROVIDER_EVENTS_QUEUE_URL`).
    pub fn new(client: aws_sdk_sqs::Client, url: String) -> Self {
        Self { client, url }
    }
}

#[async_trait]
impl EventQueue for SqsEventQueue {
    async fn enqueue(&self, event: &ProviderEvent, body: &str) -> Result<(), String> {
        let attribute = |v: &str| {
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
                .map_err(|e| e.to_string())
        };
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .message_attributes("event_type", attribute(&event.kind)?)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())
    }

    /// `SendMessageBatch` of ten at a time; the entries SQS did not take are sent again (a
    /// few times, then the error names them).
    async fn enqueue_batch(&self, events: &[(ProviderEvent, String)]) -> Result<(), String> {
        use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
        for batch in batches(events) {
            let mut left: Vec<usize> = (0..batch.len()).collect();
            for attempt in 0..4 {
                if left.is_empty() {
                    break;
                }
                if attempt > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
                }
                let mut entries = Vec::with_capacity(left.len());
                for &i in &left {
                    let (event, body) = &batch[i];
                    let attribute = MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(&event.kind)
                        .build()
                        .map_err(|e| e.to_string())?;
                    entries.push(
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(body)
                            .message_attributes("event_type", attribute)
                            .build()
                            .map_err(|e| e.to_string())?,
                    );
                }
                let out = self
                    .client
                    .send_message_batch()
                    .queue_url(&self.url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
                let failed: Vec<usize> = out
                    .failed()
                    .iter()
                    .filter_map(|f| f.id().parse().ok())
                    .collect();
                if let Some(f) = out.failed().iter().find(|f| f.sender_fault()) {
                    let event = f.id().parse::<usize>().ok().and_then(|i| batch.get(i));
                    return Err(format!(
                        "SQS refused event {}: {} {}",
                        event.map_or("?", |(e, _)| e.id.as_str()),
                        f.code(),
                        f.message().unwrap_or_default()
                    ));
                }
                left = failed;
            }
            if let Some(&i) = left.first() {
                return Err(format!(
                    "SQS did not take {} events (the first {}) after 4 tries",
                    left.len(),
                    batch[i].0.id
                ));
            }
        }
        Ok(())
    }
}
