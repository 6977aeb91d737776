//! The queue port (dead-lettering, deleting, delaying a message) and its SQS adapter.
//!
//! Source queue URLs are looked up with `GetQueueUrl` from the record's `eventSourceARN` (and
//! cached), never built by hand, so the code works unchanged against AWS, LocalStack and moto.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use aws_sdk_sqs::Client;

/// A message on its way to the dead-letter queue: the original body unchanged and why.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The source message body, byte for byte.
    pub body: String,
    /// Why: the work's own codes (its parse refusals and rejected outcomes) and this crate's
    /// `idempotency_key_reused`, `request_expired`, `outcome_unknown`, `retries_exhausted`.
    pub error_code: String,
    /// Human-readable reason (no secrets, no personal data).
    pub error_message: String,
    /// The source message's id, for tracing it back.
    pub source_message_id: String,
    /// Epoch ms of the first send of the original message, carried along so that a redriven
    /// message keeps its age (design.md: the retry window must be bounded).
    pub first_sent_at_ms: Option<i64>,
    /// FIFO source: the message group, reused on a FIFO dead-letter queue.
    pub message_group_id: Option<String>,
    /// More `String` message attributes the work adds (e.g. a note that the body was
    /// redacted, see [`crate::Redaction`]).
    pub extra_attributes: Vec<(String, String)>,
}

/// SQS's largest message, body and attributes counted (a queue's `MaximumMessageSize` may be
/// less, or, since 2025, up to 1 MiB: [`SqsQueues`] reads its dead-letter queue's own).
pub const SQS_MAX_MESSAGE_BYTES: usize = 262_144;

impl DeadLetter {
    /// The bytes SQS counts of the letter: its body, and each attribute's name, data type
    /// (`String`) and value.
    pub fn size(&self) -> usize {
        let attribute = |name: &str, value: &str| name.len() + "String".len() + value.len();
        let first_sent = self
            .first_sent_at_ms
            .map_or(0, |t| attribute(attrs::FIRST_SENT_AT, &t.to_string()));
        self.body.len().max(1)
            + attribute(attrs::ERROR_CODE, &self.error_code)
            + attribute(attrs::ERROR_MESSAGE, &self.error_message)
            + attribute(attrs::SOURCE_MESSAGE_ID, &self.source_message_id)
            + first_sent
            + self
                .extra_attributes
                .iter()
                .map(|(n, v)| attribute(n, v))
                .sum::<usize>()
    }

    /// The letter as a dead-letter queue of `max` bytes takes it: its reason at most 1,000
    /// characters; in a FIFO queue (where each letter is a group of its own) its source group
    /// as the attribute [`attrs::SOURCE_GROUP`]; all of it within `max` ([`DeadLetter::fitted`],
    /// which counts every attribute: one added after the fitting could take a letter over SQS's
    /// limit, to be refused on every receive).
    pub fn for_queue(&self, fifo: bool, max: usize) -> Self {
        let mut extra_attributes = self.extra_attributes.clone();
        if let (true, Some(g)) = (fifo, &self.message_group_id) {
            extra_attributes.push((attrs::SOURCE_GROUP.to_owned(), g.clone()));
        }
        // A letter always fits its queue: past its size, SQS would refuse it, and the message
        // would cycle until SQS moved it unexplained.
        DeadLetter {
            error_message: self.error_message.chars().take(1_000).collect(),
            extra_attributes,
            ..self.clone()
        }
        .fitted(max)
    }

    /// The letter within `max` bytes: as it is when it fits; else its reason and ids kept and
    /// its body cut (at a character's boundary) to what fits, with the attribute
    /// [`attrs::BODY_TRIMMED`] giving the whole body's size in bytes. The original body came
    /// within its queue's limit; the letter's attributes are what can take it over.
    pub fn fitted(mut self, max: usize) -> Self {
        if self.size() <= max {
            return self;
        }
        let whole = self.body.len();
        self.extra_attributes
            .push((attrs::BODY_TRIMMED.to_owned(), whole.to_string()));
        let over = self.size().saturating_sub(max);
        let mut keep = whole.saturating_sub(over);
        while !self.body.is_char_boundary(keep) {
            keep -= 1;
        }
        self.body.truncate(keep);
        self
    }
}

/// Errors of the queue port: all retryable (the message stays on the source queue).
#[derive(Debug, thiserror::Error)]
#[error("queue operation failed: {0}")]
pub struct QueueError(pub String);

/// The port over the source queue and the dead-letter queue.
#[async_trait]
pub trait QueueOps: Send + Sync {
    /// Sends a dead letter; returns only once the DLQ accepted it.
    async fn dead_letter(&self, letter: &DeadLetter) -> Result<(), QueueError>;
    /// Deletes a message from its source queue (after it was dead-lettered).
    async fn delete(&self, source_arn: &str, receipt_handle: &str) -> Result<(), QueueError>;
    /// Sets when a message comes back (seconds from now, at most 12 hours).
    async fn change_visibility(
        &self,
        source_arn: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), QueueError>;
    /// The source queue's `maxReceiveCount` from its redrive policy (`None`: the queue has no
    /// redrive policy, so SQS never moves its messages). An error means it cannot be told; the
    /// processor then uses `QUEUE_MAX_RECEIVE_COUNT`.
    async fn max_receive_count(&self, source_arn: &str) -> Result<Option<u32>, QueueError>;
    /// What the processor must know of the source queue to hand a message back: its
    /// `maxReceiveCount` and its `MessageRetentionPeriod`. The default knows no retention
    /// (only the receive budget then bounds the retries); [`SqsQueues`] reads both in one
    /// `GetQueueAttributes`, once per queue.
    async fn limits(&self, source_arn: &str) -> Result<QueueLimits, QueueError> {
        Ok(QueueLimits {
            max_receive_count: self.max_receive_count(source_arn).await?,
            retention: None,
        })
    }
    /// Sends a fresh copy of a message that was never attempted to its own source queue (a
    /// new receive budget; its age travels in `first_sent_at`); returns only once the queue
    /// accepted it. The default cannot, and the runner dead-letters the message instead.
    async fn requeue(&self, copy: &Requeue) -> Result<(), QueueError> {
        Err(QueueError(format!(
            "this queue port cannot requeue (message {})",
            copy.source_message_id
        )))
    }
}

/// A fresh copy of a message that was handed back on its last receive without ever being
/// attempted (a FIFO follower blocked behind a failure, a message not started before the
/// invocation deadline): sent again so that SQS does not move it, unexplained, once its
/// receive budget ends.
#[derive(Debug, Clone)]
pub struct Requeue {
    /// The source queue's ARN (the copy goes back to it).
    pub source_arn: String,
    /// The body, byte for byte.
    pub body: String,
    /// The source message's id.
    pub source_message_id: String,
    /// `String` message attributes of the copy: the original's, `first_sent_at` and the
    /// number of times the message was requeued.
    pub attributes: Vec<(String, String)>,
    /// FIFO: the message group (the copy joins the end of its group).
    pub message_group_id: Option<String>,
    /// FIFO: a deduplication id of its own, so the copy is not dropped as the original's
    /// duplicate.
    pub deduplication_id: Option<String>,
}

/// What a source queue allows a message that comes back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueLimits {
    /// `maxReceiveCount` of the redrive policy (`None`: no redrive policy).
    pub max_receive_count: Option<u32>,
    /// `MessageRetentionPeriod`: SQS deletes a message this long after it was sent to the
    /// queue (its `SentTimestamp`), in flight or not, with no dead letter (`None`: not known).
    pub retention: Option<Duration>,
}

/// Message attribute names on dead letters.
pub mod attrs {
    /// Why the message was dead-lettered.
    pub const ERROR_CODE: &str = "error_code";
    /// Human-readable reason.
    pub const ERROR_MESSAGE: &str = "error_message";
    /// Source message id.
    pub const SOURCE_MESSAGE_ID: &str = "source_message_id";
    /// Epoch ms of the original's first send, kept across redrives.
    pub const FIRST_SENT_AT: &str = "first_sent_at";
    /// How often a message was requeued without an attempt ([`super::Requeue`]).
    pub const REQUEUED: &str = "requeued";
    /// On a dead letter whose body was cut to fit the queue ([`super::DeadLetter::fitted`]):
    /// the whole body's size in bytes. Such a letter is read, never redriven.
    pub const BODY_TRIMMED: &str = "body_trimmed";
    /// On a letter in a FIFO dead-letter queue: the `MessageGroupId` it had in its source queue
    /// (in the dead-letter queue each letter is a group of its own), for a redrive to restore.
    pub const SOURCE_GROUP: &str = "source_group";
}

/// SQS through the official SDK.
#[derive(Debug)]
pub struct SqsQueues {
    /// SDK client, built once.
    client: Client,
    /// `DEAD_LETTER_QUEUE_URL`.
    dlq_url: String,
    /// eventSourceARN -> queue URL, looked up once per queue.
    urls: Mutex<HashMap<String, String>>,
    /// eventSourceARN -> `maxReceiveCount` and retention, read once per queue (only when a
    /// message must come back, so the hot path makes no call for it).
    limits: Mutex<HashMap<String, QueueLimits>>,
    /// The dead-letter queue's `MaximumMessageSize`, read at its first letter.
    dlq_max_bytes: Mutex<Option<usize>>,
}

/// A FIFO queue's `MessageGroupId` or `MessageDeduplicationId` for `text`: `text` itself when
/// SQS takes it (1 to 128 printable ASCII characters), else its SHA-256 in hex (64 characters,
/// stable: one payment keeps one group). Keys this toolkit takes may be longer than 128. A text
/// that looks like such a hash (64 lowercase hex digits) is hashed too, so that no id kept as it
/// is can equal another's hash (a payment named after another's hash would be dropped as its
/// copy).
pub fn fifo_id(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let like_a_hash = text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !text.is_empty()
        && text.len() <= 128
        && text.bytes().all(|b| b.is_ascii_graphic())
        && !like_a_hash
    {
        return text.to_owned();
    }
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A `String` message attribute (an error only for a value the SDK refuses to build).
pub fn string_attr(v: &str) -> Result<MessageAttributeValue, QueueError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .map_err(|e| QueueError(e.to_string()))
}

impl SqsQueues {
    /// Wraps a client and the DLQ URL.
    pub fn new(client: Client, dlq_url: impl Into<String>) -> Self {
        Self {
            client,
            dlq_url: dlq_url.into(),
            urls: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
            dlq_max_bytes: Mutex::new(None),
        }
    }

    /// The dead-letter queue's `MaximumMessageSize`, read once; SQS's 256 KiB when it cannot be
    /// read (a letter is then cut to fit any queue but a smaller one).
    async fn dlq_max_bytes(&self) -> usize {
        if let Some(n) = self.dlq_max_bytes.lock().ok().and_then(|m| *m) {
            return n;
        }
        let read = self
            .client
            .get_queue_attributes()
            .queue_url(&self.dlq_url)
            .attribute_names(QueueAttributeName::MaximumMessageSize)
            .send()
            .await
            .ok()
            .and_then(|out| {
                out.attributes()?
                    .get(&QueueAttributeName::MaximumMessageSize)?
                    .parse::<usize>()
                    .ok()
            });
        match read {
            Some(n) => {
                if let Ok(mut m) = self.dlq_max_bytes.lock() {
                    *m = Some(n);
                }
                n
            }
            None => SQS_MAX_MESSAGE_BYTES,
        }
    }

    /// Resolves a queue ARN (`arn:aws:sqs:<region>:<account>:<name>`) to its URL.
    pub async fn url_for_arn(&self, arn: &str) -> Result<String, QueueError> {
        if let Some(u) = self.urls.lock().ok().and_then(|m| m.get(arn).cloned()) {
            return Ok(u);
        }
        let parts: Vec<&str> = arn.split(':').collect();
        if parts.len() != 6 || parts[2] != "sqs" {
            return Err(QueueError(format!("not an SQS queue ARN: {arn}")));
        }
        let out = self
            .client
            .get_queue_url()
            .queue_name(parts[5])
            .queue_owner_aws_account_id(parts[4])
            .send()
            .await
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))?;
        let url = out
            .queue_url()
            .ok_or_else(|| QueueError(format!("no URL returned for {arn}")))?
            .to_owned();
        if let Ok(mut m) = self.urls.lock() {
            m.insert(arn.to_owned(), url.clone());
        }
        Ok(url)
    }
}

#[async_trait]
impl QueueOps for SqsQueues {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<(), QueueError> {
        let fifo = self.dlq_url.ends_with(".fifo");
        let l = &l.for_queue(fifo, self.dlq_max_bytes().await);
        let message = &l.error_message;
        let mut req = self
            .client
            .send_message()
            .queue_url(&self.dlq_url)
            .message_body(&l.body)
            .message_attributes(attrs::ERROR_CODE, string_attr(&l.error_code)?)
            .message_attributes(attrs::ERROR_MESSAGE, string_attr(message)?)
            .message_attributes(attrs::SOURCE_MESSAGE_ID, string_attr(&l.source_message_id)?);
        if let Some(t) = l.first_sent_at_ms {
            req = req.message_attributes(attrs::FIRST_SENT_AT, string_attr(&t.to_string())?);
        }
        for (name, value) in &l.extra_attributes {
            req = req.message_attributes(name, string_attr(value)?);
        }
        if fifo {
            // Letters are read and handled one by one, not in order: each is a group of its
            // own, so that a reader sees every one. (A FIFO receive returns nothing more of a
            // group while some of it is in flight: a producer's thousand bad payments of one
            // customer, one group, would show ten to `payctl dlq list`, and the rest would reach
            // the queue's retention unread.) Its source group went with it (`source_group`,
            // above), for a redrive.
            req = req
                .message_group_id(fifo_id(&l.source_message_id))
                .message_deduplication_id(&l.source_message_id);
        }
        // An SQS body must be non-empty; an empty body is still dead-lettered, visibly.
        if l.body.is_empty() {
            req = req.message_body("(empty body)");
        }
        req.send()
            .await
            .map(|_| ())
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))
    }

    async fn delete(&self, source_arn: &str, receipt_handle: &str) -> Result<(), QueueError> {
        let url = self.url_for_arn(source_arn).await?;
        self.client
            .delete_message()
            .queue_url(url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))
    }

    async fn change_visibility(
        &self,
        source_arn: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), QueueError> {
        let url = self.url_for_arn(source_arn).await?;
        self.client
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(seconds.clamp(0, 43_200))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))
    }

    async fn max_receive_count(&self, source_arn: &str) -> Result<Option<u32>, QueueError> {
        Ok(self.limits(source_arn).await?.max_receive_count)
    }

    async fn requeue(&self, copy: &Requeue) -> Result<(), QueueError> {
        let url = self.url_for_arn(&copy.source_arn).await?;
        let mut req = self
            .client
            .send_message()
            .queue_url(url)
            .message_body(&copy.body);
        for (name, value) in &copy.attributes {
            req = req.message_attributes(name, string_attr(value)?);
        }
        if let Some(g) = &copy.message_group_id {
            req = req.message_group_id(g);
        }
        if let Some(d) = &copy.deduplication_id {
            req = req.message_deduplication_id(d);
        }
        req.send()
            .await
            .map(|_| ())
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))
    }

    async fn limits(&self, source_arn: &str) -> Result<QueueLimits, QueueError> {
        if let Some(l) = self
            .limits
            .lock()
            .ok()
            .and_then(|m| m.get(source_arn).copied())
        {
            return Ok(l);
        }
        let url = self.url_for_arn(source_arn).await?;
        let (_, limits) = self.read_limits(&url).await?;
        if let Ok(mut m) = self.limits.lock() {
            m.insert(source_arn.to_owned(), limits);
        }
        Ok(limits)
    }
}

impl SqsQueues {
    /// Reads a queue's ARN and [`QueueLimits`] by its URL (one `GetQueueAttributes`) and keeps
    /// them for the messages of that queue: the init check of a processor that knows its
    /// source queue.
    pub async fn limits_of_url(&self, url: &str) -> Result<(String, QueueLimits), QueueError> {
        let (arn, limits) = self.read_limits(url).await?;
        let arn = arn.ok_or_else(|| QueueError(format!("{url} has no QueueArn attribute")))?;
        if let Ok(mut m) = self.urls.lock() {
            m.insert(arn.clone(), url.to_owned());
        }
        if let Ok(mut m) = self.limits.lock() {
            m.insert(arn.clone(), limits);
        }
        Ok((arn, limits))
    }

    async fn read_limits(&self, url: &str) -> Result<(Option<String>, QueueLimits), QueueError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .attribute_names(QueueAttributeName::MessageRetentionPeriod)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| QueueError(DisplayErrorContext(&e).to_string()))?;
        let attrs = out.attributes();
        let get = |k: QueueAttributeName| attrs.and_then(|a| a.get(&k)).cloned();
        let max_receive_count = match get(QueueAttributeName::RedrivePolicy) {
            None => None,
            Some(policy) => Some(parse_max_receive_count(&policy).ok_or_else(|| {
                QueueError(format!("unreadable RedrivePolicy on {url}: {policy}"))
            })?),
        };
        let retention = match get(QueueAttributeName::MessageRetentionPeriod) {
            None => None,
            Some(v) => Some(Duration::from_secs(v.trim().parse::<u64>().map_err(
                |_| QueueError(format!("unreadable MessageRetentionPeriod on {url}: {v}")),
            )?)),
        };
        Ok((
            get(QueueAttributeName::QueueArn),
            QueueLimits {
                max_receive_count,
                retention,
            },
        ))
    }
}

/// `maxReceiveCount` of a `RedrivePolicy` attribute (JSON; some endpoints give it as a string).
pub fn parse_max_receive_count(policy: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(policy).ok()?;
    match v.get("maxReceiveCount")? {
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(body: String) -> DeadLetter {
        DeadLetter {
            body,
            error_code: "invalid_payment".into(),
            error_message: "description must be 0 to 1000 characters, got 250000".into(),
            source_message_id: "m-1".into(),
            first_sent_at_ms: Some(1_700_000_000_000),
            message_group_id: None,
            extra_attributes: vec![("card_data_masked".into(), "true".into())],
        }
    }

    #[test]
    fn a_fifo_letter_keeps_its_source_group_within_its_queue_s_limit() {
        // A body at the queue's limit, of a group of SQS's longest (128 characters): the
        // group's attribute is counted in the fitting, not added after it.
        let body = format!("{{\"d\":\"{}\"}}", "x".repeat(SQS_MAX_MESSAGE_BYTES - 8));
        let mut l = letter(body);
        l.message_group_id = Some("g".repeat(128));
        let fitted = l.for_queue(true, SQS_MAX_MESSAGE_BYTES);
        assert!(fitted.size() <= SQS_MAX_MESSAGE_BYTES, "{}", fitted.size());
        assert!(fitted
            .extra_attributes
            .iter()
            .any(|(n, v)| n == attrs::SOURCE_GROUP && v.len() == 128));
        // A standard queue's letter carries no such attribute (its group, if any, is SQS's).
        assert!(!l
            .for_queue(false, SQS_MAX_MESSAGE_BYTES)
            .extra_attributes
            .iter()
            .any(|(n, _)| n == attrs::SOURCE_GROUP));
    }

    #[test]
    fn a_dead_letter_always_fits_its_queue_keeping_its_reason_and_ids() {
        // A body at the queue's limit: its letter's attributes would take it over.
        let body = format!("{{\"d\":\"{}é\"}}", "x".repeat(SQS_MAX_MESSAGE_BYTES - 12));
        let whole = body.len();
        let l = letter(body).fitted(SQS_MAX_MESSAGE_BYTES);
        assert!(l.size() <= SQS_MAX_MESSAGE_BYTES, "{} bytes", l.size());
        assert_eq!(l.error_code, "invalid_payment");
        assert_eq!(l.source_message_id, "m-1");
        assert_eq!(l.first_sent_at_ms, Some(1_700_000_000_000));
        let trimmed = l
            .extra_attributes
            .iter()
            .find(|(n, _)| n == attrs::BODY_TRIMMED)
            .map(|(_, v)| v.clone());
        assert_eq!(trimmed, Some(whole.to_string()));
        assert!(l
            .extra_attributes
            .iter()
            .any(|(n, _)| n == "card_data_masked"));
        // A letter that fits is kept whole, unmarked; a smaller queue's limit is kept too.
        let small = letter("{}".into());
        assert_eq!(small.clone().fitted(SQS_MAX_MESSAGE_BYTES).body, "{}");
        assert_eq!(
            small
                .clone()
                .fitted(SQS_MAX_MESSAGE_BYTES)
                .extra_attributes
                .len(),
            1
        );
        let l = letter("é".repeat(2_000)).fitted(1_024);
        assert!(
            l.size() <= 1_024 && l.body.chars().all(|c| c == 'é'),
            "{}",
            l.size()
        );
    }

    #[test]
    fn a_fifo_id_is_the_text_when_sqs_takes_it_else_its_stable_hash() {
        assert_eq!(fifo_id("cus_1:a.b-c_d"), "cus_1:a.b-c_d");
        let long = "k".repeat(129);
        let id = fifo_id(&long);
        assert_eq!(id.len(), 64);
        assert_eq!(id, fifo_id(&long));
        assert_ne!(id, fifo_id(&"k".repeat(130)));
        assert_eq!(fifo_id(&"k".repeat(128)), "k".repeat(128));
        assert_eq!(fifo_id("").len(), 64);
        // An id named after another's hash is not that hash.
        assert_ne!(fifo_id(&id), id);
        assert_eq!(fifo_id(&id).len(), 64);
    }

    #[test]
    fn max_receive_count_as_a_number_or_a_string() {
        assert_eq!(
            parse_max_receive_count(
                r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d","maxReceiveCount":5}"#
            ),
            Some(5)
        );
        assert_eq!(
            parse_max_receive_count(r#"{"deadLetterTargetArn":"x","maxReceiveCount":"10"}"#),
            Some(10)
        );
        assert_eq!(parse_max_receive_count("not json"), None);
    }
}
