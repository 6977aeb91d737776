//! The transactional outbox and its relay (design.md, "Accepting payments").
//!
//! The payments API writes a payment and its outbox entry in one `TransactWriteItems`; the
//! payments table's DynamoDB stream is the outbox feed. The relay sends each new entry to the
//! payments queue with `SendMessageBatch` and marks it published. It delivers at least once: a
//! relay that crashes after sending and before its checkpoint sends again, and the processor's
//! idempotency record absorbs the copy (same `payment_id`, same payload).

use std::collections::HashMap;

use aws_sdk_dynamodb::error::DisplayErrorContext as DdbError;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::error::DisplayErrorContext as SqsError;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde::Deserialize;
use tracing::{info, warn};

use sqs_once::queue::{attrs, string_attr};

/// Key prefix of a payment row in the payments table: `payment#<id>`.
pub const PAYMENT_PREFIX: &str = "payment#";
/// Key prefix of an outbox entry: `outbox#<id>`.
pub const OUTBOX_PREFIX: &str = "outbox#";
/// The `kind` attribute of an outbox entry: the stream filter selects new items with it.
pub const OUTBOX_KIND: &str = "outbox";
/// The `kind` attribute of a payment row.
pub const PAYMENT_KIND: &str = "payment";
/// SQS takes at most ten messages per `SendMessageBatch`.
const SQS_BATCH: usize = 10;

/// One payment's message, waiting in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OutboxEntry {
    /// The payment (and idempotency key) the message is for.
    pub payment_id: String,
    /// The message body, the queue's contract, canonical.
    pub message: String,
    /// Epoch ms of the payment's creation: the message's `first_sent_at`.
    pub created_at: i64,
    /// The payment's customer: the default FIFO message group.
    pub customer_id: String,
}

impl OutboxEntry {
    /// The item the API writes, with its TTL.
    pub fn to_item(&self, expires_at_s: i64) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (
                "pk".to_owned(),
                AttributeValue::S(format!("{OUTBOX_PREFIX}{}", self.payment_id)),
            ),
            ("kind".to_owned(), AttributeValue::S(OUTBOX_KIND.into())),
            (
                "payment_id".to_owned(),
                AttributeValue::S(self.payment_id.clone()),
            ),
            (
                "message".to_owned(),
                AttributeValue::S(self.message.clone()),
            ),
            (
                "created_at".to_owned(),
                AttributeValue::N(self.created_at.to_string()),
            ),
            (
                "customer_id".to_owned(),
                AttributeValue::S(self.customer_id.clone()),
            ),
            (
                "expires_at".to_owned(),
                AttributeValue::N(expires_at_s.to_string()),
            ),
        ])
    }
}

/// How a FIFO payments queue's `MessageGroupId` is chosen (`FIFO_GROUP_BY`). Messages of one
/// group are processed in order, one at a time; groups run in parallel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    /// `customer` (default): one customer's payments in the order they were accepted.
    Customer,
    /// `payment`: no ordering between payments, most parallelism.
    Payment,
}

impl GroupBy {
    /// Parses `FIFO_GROUP_BY`.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "" | "customer" => Some(GroupBy::Customer),
            "payment" => Some(GroupBy::Payment),
            _ => None,
        }
    }

    fn group_of(self, entry: &OutboxEntry) -> &str {
        match self {
            GroupBy::Customer => &entry.customer_id,
            GroupBy::Payment => &entry.payment_id,
        }
    }
}

/// What one relay pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RelayReport {
    /// Messages the queue accepted.
    pub sent: usize,
    /// Entries marked published.
    pub marked: usize,
    /// Index of the first entry the queue did not accept: it and every entry after it must be
    /// relayed again (a stream batch checkpoints before it).
    pub first_failed: Option<usize>,
    /// Why entries failed, for the log.
    pub errors: Vec<String>,
}

/// Sends outbox entries to the payments queue and marks them published.
#[derive(Debug, Clone)]
pub struct Relay {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    group_by: GroupBy,
    ddb: aws_sdk_dynamodb::Client,
    table: String,
}

impl Relay {
    /// A relay to `queue_url` (from the stack, never built by hand) for the payments table.
    pub fn new(
        sqs: aws_sdk_sqs::Client,
        queue_url: impl Into<String>,
        group_by: GroupBy,
        ddb: aws_sdk_dynamodb::Client,
        table: impl Into<String>,
    ) -> Self {
        Self {
            sqs,
            queue_url: queue_url.into(),
            group_by,
            ddb,
            table: table.into(),
        }
    }

    fn fifo(&self) -> bool {
        self.queue_url.ends_with(".fifo")
    }

    /// Relays entries in order. Stops at the first chunk the queue refuses as a whole; within
    /// a chunk the queue accepted in part, reports the first refused entry. Entries after a
    /// failure may have been sent already: sending them again is safe.
    pub async fn relay(&self, entries: &[OutboxEntry]) -> RelayReport {
        let mut report = RelayReport::default();
        for (chunk_no, chunk) in entries.chunks(SQS_BATCH).enumerate() {
            let base = chunk_no * SQS_BATCH;
            match self.send_chunk(chunk).await {
                Ok((sent, refused)) => {
                    report.sent += sent.len();
                    for (i, message_id) in &sent {
                        if self.mark_published(&chunk[*i], message_id).await {
                            report.marked += 1;
                        }
                    }
                    if let Some((i, why)) = refused.into_iter().min_by_key(|(i, _)| *i) {
                        report.first_failed = Some(base + i);
                        report.errors.push(why);
                        return report;
                    }
                }
                Err(why) => {
                    report.first_failed = Some(base);
                    report.errors.push(why);
                    return report;
                }
            }
        }
        report
    }

    /// One `SendMessageBatch`: the indices sent (with their message ids) and those refused.
    #[allow(clippy::type_complexity)]
    async fn send_chunk(
        &self,
        chunk: &[OutboxEntry],
    ) -> Result<(Vec<(usize, String)>, Vec<(usize, String)>), String> {
        let mut request = self.sqs.send_message_batch().queue_url(&self.queue_url);
        for (i, entry) in chunk.iter().enumerate() {
            let mut e = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(&entry.message)
                .message_attributes(
                    attrs::FIRST_SENT_AT,
                    string_attr(&entry.created_at.to_string()).map_err(|e| e.0)?,
                );
            if self.fifo() {
                e = e
                    .message_group_id(self.group_by.group_of(entry))
                    .message_deduplication_id(&entry.payment_id);
            }
            request = request.entries(e.build().map_err(|e| e.to_string())?);
        }
        let out = request.send().await.map_err(|e| {
            format!(
                "SendMessageBatch to {} failed: {}",
                self.queue_url,
                SqsError(&e)
            )
        })?;
        crate::failpoint!("relay_after_send");
        let index = |id: &str| id.parse::<usize>().ok().filter(|i| *i < chunk.len());
        let sent = out
            .successful()
            .iter()
            .filter_map(|s| index(s.id()).map(|i| (i, s.message_id().to_owned())))
            .collect();
        let refused = out
            .failed()
            .iter()
            .filter_map(|f| {
                index(f.id()).map(|i| {
                    (
                        i,
                        format!(
                            "payment {}: {} {}",
                            chunk[i].payment_id,
                            f.code(),
                            f.message().unwrap_or_default()
                        ),
                    )
                })
            })
            .collect();
        Ok((sent, refused))
    }

    /// Marks an entry published. Informational: a failure is logged, and at worst the entry is
    /// sent again by an operator's republish, which the processor absorbs.
    async fn mark_published(&self, entry: &OutboxEntry, message_id: &str) -> bool {
        let result = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .key(
                "pk",
                AttributeValue::S(format!("{OUTBOX_PREFIX}{}", entry.payment_id)),
            )
            .update_expression("SET published_at = :t, message_id = :m")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(
                ":t",
                AttributeValue::N(sqs_once::runner::now_ms().to_string()),
            )
            .expression_attribute_values(":m", AttributeValue::S(message_id.to_owned()))
            .send()
            .await;
        match result {
            Ok(_) => {
                info!(payment_id = %entry.payment_id, message_id, "outbox entry published");
                true
            }
            Err(e) => {
                warn!(payment_id = %entry.payment_id, error = %DdbError(&e), "sent, but could not mark the outbox entry published");
                false
            }
        }
    }
}

/// Reads an outbox entry from a stream record's new image (`None` for any other item).
pub fn entry_from_image(image: serde_dynamo::Item) -> Result<Option<OutboxEntry>, String> {
    let is_outbox =
        matches!(image.get("kind"), Some(serde_dynamo::AttributeValue::S(k)) if k == OUTBOX_KIND);
    if !is_outbox {
        return Ok(None);
    }
    serde_dynamo::from_item(image)
        .map(Some)
        .map_err(|e| format!("outbox entry unreadable: {e}"))
}
