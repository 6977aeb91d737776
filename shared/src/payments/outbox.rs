//! The outbox and its relay (design.md, "Accepting payments").
//!
//! The payments API stores a payment with one conditional `PutItem` of its row, which carries
//! the queue's message too: the row is its own outbox entry, and the `INSERT` of it on the
//! payments table's DynamoDB stream is the outbox event. The relay sends each new row's message
//! to the payments queue with `SendMessageBatch` and writes nothing back. It delivers at least
//! once: a relay that crashes after sending and before its checkpoint sends again, and the
//! processor's idempotency record absorbs the copy (same `payment_id`, same payload).
//!
//! A row whose message SQS refuses for its content (`InvalidMessageContents`: a character
//! outside XML's, which the API refuses since issue 63, but a row written before may hold) can
//! never be sent: retried, it would hold back its shard and then be given up, its caller
//! holding a `202` and `GET` saying `pending` for the row's life. The relay sets it aside at
//! once instead: a dead-letter mark of the payment ([`MESSAGE_REFUSED`], the row's digest),
//! which `GET` and `payctl status` read as `failed` with the reason and `payctl outbox
//! republish` passes by. Nothing was sent, so nothing can be charged.

use aws_lambda_events::event::dynamodb::Event as DynamoEvent;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use aws_sdk_sqs::error::DisplayErrorContext as SqsError;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde::Deserialize;

use sqs_once::queue::{attrs, string_attr};
use tracing::{error, info};

/// Key prefix of a payment row in the payments table: `payment#<id>`.
pub const PAYMENT_PREFIX: &str = "payment#";
/// The `kind` attribute of a payment row: the stream filter selects new items with it.
pub const PAYMENT_KIND: &str = "payment";
/// SQS takes at most ten messages per `SendMessageBatch`.
const SQS_BATCH: usize = 10;
/// The dead-letter mark's code of a payment whose message the queue refused for its content
/// (never sent, never charged): `GET` reads it as `failed`.
pub const MESSAGE_REFUSED: &str = "message_refused";
/// SQS's code for a message body (or attribute) holding a character it does not take.
const INVALID_CONTENTS: &str = "InvalidMessageContents";

/// One payment's message, as its row carries it (the row's outbox fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct OutboxEntry {
    /// The payment (and idempotency key) the message is for: the row's `id`.
    #[serde(rename = "id")]
    pub payment_id: String,
    /// The message body, the queue's contract, canonical.
    pub message: String,
    /// Epoch ms of the payment's creation: the message's `first_sent_at`.
    pub created_at: i64,
    /// The payment's customer: the default FIFO message group.
    pub customer_id: String,
    /// The W3C `traceparent` of the request that accepted the payment (`None` when it was not
    /// traced): the relay's message continues that trace.
    #[serde(default)]
    pub traceparent: Option<String>,
    /// The row's digest of the request (`request_hash`): a mark the relay writes is this
    /// request's, so `GET` of this row reads it.
    #[serde(default)]
    pub request_hash: Option<String>,
    /// The row's TTL, epoch s (`expires_at`): a mark the relay writes lives as long.
    #[serde(default, rename = "expires_at")]
    pub expires_at_s: Option<i64>,
}

impl OutboxEntry {
    /// The row's outbox attributes (`message`, `created_at`, and `traceparent` when traced),
    /// beside its payment fields.
    pub fn attributes(&self) -> Vec<(String, aws_sdk_dynamodb::types::AttributeValue)> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let mut out = vec![
            (
                "message".to_owned(),
                AttributeValue::S(self.message.clone()),
            ),
            (
                "created_at".to_owned(),
                AttributeValue::N(self.created_at.to_string()),
            ),
        ];
        if let Some(tp) = &self.traceparent {
            out.push(("traceparent".to_owned(), AttributeValue::S(tp.clone())));
        }
        out
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
    /// Index of the first entry the queue did not accept: it and every entry after it must be
    /// relayed again (a stream batch checkpoints before it).
    pub first_failed: Option<usize>,
    /// Why entries failed, for the log.
    pub errors: Vec<String>,
    /// Payments set aside: the queue refused their message for its content ([`MESSAGE_REFUSED`]).
    pub set_aside: usize,
}

/// Sends the messages of new payment rows to the payments queue.
#[derive(Clone)]
pub struct Relay {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    group_by: GroupBy,
    /// Where a payment whose message the queue refuses is marked set aside (the idempotency
    /// table); without it such a row is retried as any other failure.
    marks: Option<(
        std::sync::Arc<dyn sqs_once::IdempotencyStore>,
        std::sync::Arc<dyn sqs_once::clock::Clock>,
    )>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("queue_url", &self.queue_url)
            .field("group_by", &self.group_by)
            .field("marks", &self.marks.is_some())
            .finish()
    }
}

impl Relay {
    /// A relay to `queue_url` (from the stack, never built by hand).
    pub fn new(sqs: aws_sdk_sqs::Client, queue_url: impl Into<String>, group_by: GroupBy) -> Self {
        Self {
            sqs,
            queue_url: queue_url.into(),
            group_by,
            marks: None,
        }
    }

    /// The relay, setting aside a payment whose message the queue refuses for its content by
    /// a dead-letter mark in `marks` (the processor's idempotency table), timed by `clock`.
    pub fn with_marks(
        mut self,
        marks: std::sync::Arc<dyn sqs_once::IdempotencyStore>,
        clock: std::sync::Arc<dyn sqs_once::clock::Clock>,
    ) -> Self {
        self.marks = Some((marks, clock));
        self
    }

    /// Marks the payment of `entry` set aside: its message can never be sent as it is. `Ok`
    /// once the mark is written (over any mark of the key's, as the processor's marks are; a
    /// `GET` reads only the mark of its row's digest).
    async fn set_aside(&self, entry: &OutboxEntry, why: &str) -> Result<(), String> {
        let Some((marks, clock)) = &self.marks else {
            return Err("no idempotency table to mark it in (IDEMPOTENCY_TABLE)".to_owned());
        };
        let Some(hash) = &entry.request_hash else {
            return Err("the row has no request_hash to mark it by".to_owned());
        };
        let now = clock.now_ms();
        let mark = sqs_once::record::DeadLetterMark {
            key: entry.payment_id.clone(),
            payload_hash: hash.clone(),
            error_code: MESSAGE_REFUSED.to_owned(),
            error_message: format!(
                "the payments queue refused the payment's message ({why}): it holds a character the queue cannot carry; it was never sent and never charged: send the payment again, under a new key, without it"
            ),
            at_ms: now,
            // As long as the row it answers for (43 days past its creation when not known).
            expires_at_s: entry
                .expires_at_s
                .unwrap_or(entry.created_at / 1000 + 43 * 86_400),
        };
        marks
            .mark_dead_lettered(&mark)
            .await
            .map_err(|e| format!("could not mark it set aside: {e}"))
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
                    report.sent += sent;
                    let mut failed: Option<(usize, String)> = None;
                    for (i, code, why) in refused {
                        // What the queue refuses for its content is set aside, not retried.
                        if code == INVALID_CONTENTS {
                            match self.set_aside(&chunk[i], &code).await {
                                Ok(()) => {
                                    tracing::error!(payment_id = %chunk[i].payment_id, error_code = MESSAGE_REFUSED, reason = %why, "payment set aside: the queue refused its message");
                                    report.set_aside += 1;
                                    continue;
                                }
                                Err(e) => report.errors.push(format!("{why}; {e}")),
                            }
                        }
                        if failed.as_ref().is_none_or(|(f, _)| i < *f) {
                            failed = Some((i, why));
                        }
                    }
                    if let Some((i, why)) = failed {
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

    /// One `SendMessageBatch`: how many were sent, and the indices refused with SQS's code
    /// and why.
    async fn send_chunk(
        &self,
        chunk: &[OutboxEntry],
    ) -> Result<(usize, Vec<(usize, String, String)>), String> {
        let mut request = self.sqs.send_message_batch().queue_url(&self.queue_url);
        for (i, entry) in chunk.iter().enumerate() {
            let mut e = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(&entry.message)
                .message_attributes(
                    attrs::FIRST_SENT_AT,
                    string_attr(&entry.created_at.to_string()).map_err(|e| e.0)?,
                );
            // The message continues the trace of the request that accepted the payment.
            for (name, value) in sqs_once::trace::create_attributes(
                &self.queue_url,
                entry.traceparent.as_deref(),
                Some(&entry.payment_id),
            ) {
                e = e.message_attributes(name, string_attr(&value).map_err(|e| e.0)?);
            }
            if self.fifo() {
                e = e
                    .message_group_id(sqs_once::queue::fifo_id(self.group_by.group_of(entry)))
                    .message_deduplication_id(sqs_once::queue::fifo_id(&entry.payment_id));
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
            .filter(|s| index(s.id()).is_some())
            .count();
        let refused = out
            .failed()
            .iter()
            .filter_map(|f| {
                index(f.id()).map(|i| {
                    (
                        i,
                        f.code().to_owned(),
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
}

/// The outbox-relay function's work on one stream batch of the payments table (the records its
/// mapping's filter kept: `INSERT`s of payment rows): relays their entries in order and answers
/// with the first record that must come again (`ReportBatchItemFailures`), the one the queue
/// refused, or an unreadable row; the mapping retries it and what follows it, then sends the
/// batch to its on-failure destination. Anything that is not a payment row is skipped.
pub async fn relay_stream_batch(relay: &Relay, event: DynamoEvent) -> DynamoDbEventResponse {
    let mut entries = Vec::new();
    let mut sequences = Vec::new();
    let mut unreadable = None;
    for record in event.records {
        let sequence = record.change.sequence_number.clone().unwrap_or_default();
        match entry_from_image(record.change.new_image) {
            Ok(Some(entry)) => {
                entries.push(entry);
                sequences.push(sequence);
            }
            Ok(None) => {}
            Err(e) => {
                // Relay what comes before it; it and what follows are retried, then sent to the
                // mapping's on-failure destination.
                error!(sequence, error = %e, "unreadable payment row");
                unreadable = Some(sequence);
                break;
            }
        }
    }
    let report = relay.relay(&entries).await;
    info!(
        sent = report.sent,
        "relayed {} payment messages",
        entries.len()
    );
    for e in &report.errors {
        error!(error = %e, "relay failed");
    }
    let failed = report
        .first_failed
        .and_then(|i| sequences.get(i).cloned())
        .or(unreadable);
    let mut response = DynamoDbEventResponse::default();
    if let Some(sequence) = failed {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(sequence);
        response.batch_item_failures.push(failure);
    }
    response
}

/// Reads the outbox entry of a payment row from a stream record's new image (`None` for any
/// other item).
pub fn entry_from_image(image: serde_dynamo::Item) -> Result<Option<OutboxEntry>, String> {
    let is_payment =
        matches!(image.get("kind"), Some(serde_dynamo::AttributeValue::S(k)) if k == PAYMENT_KIND);
    if !is_payment {
        return Ok(None);
    }
    serde_dynamo::from_item(image)
        .map(Some)
        .map_err(|e| format!("payment row without its outbox fields: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::api::table::payment_to_item;
    use crate::api::StoredPayment;
    use serde_dynamo::AttributeValue as A;

    fn image(item: HashMap<String, aws_sdk_dynamodb::types::AttributeValue>) -> serde_dynamo::Item {
        item.into_iter()
            .map(|(k, v)| {
                let v = match v {
                    aws_sdk_dynamodb::types::AttributeValue::S(s) => A::S(s),
                    aws_sdk_dynamodb::types::AttributeValue::N(n) => A::N(n),
                    other => panic!("unexpected {other:?}"),
                };
                (k, v)
            })
            .collect::<HashMap<_, _>>()
            .into()
    }

    #[test]
    fn a_new_payment_row_is_its_own_outbox_entry_and_nothing_else_is() {
        let entry = OutboxEntry {
            payment_id: "order-1".into(),
            message: r#"{"payment_id":"order-1"}"#.into(),
            created_at: 1_700_000_000_123,
            customer_id: "cus_1".into(),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            request_hash: Some("h".into()),
            expires_at_s: Some(1),
        };
        let payment = StoredPayment {
            id: "order-1".into(),
            amount: 100,
            currency: "usd".into(),
            customer_id: "cus_1".into(),
            created: 1_700_000_000,
            request_hash: "h".into(),
            response_status: 202,
            response_body: "{}".into(),
            expires_at_s: 1,
            created_by: None,
        };
        let mut row = payment_to_item(&payment);
        row.extend(entry.attributes());
        assert_eq!(entry_from_image(image(row.clone())), Ok(Some(entry)));
        // A row written without its outbox fields cannot be relayed: an error, not a skip.
        let bare = image(payment_to_item(&payment));
        assert!(entry_from_image(bare).is_err());
        // Any other item (a dead-letter mark, a checkpoint) is not the relay's.
        let mut other = row;
        other.insert(
            "kind".into(),
            aws_sdk_dynamodb::types::AttributeValue::S("checkpoint".into()),
        );
        assert_eq!(entry_from_image(image(other)), Ok(None));
    }
}
