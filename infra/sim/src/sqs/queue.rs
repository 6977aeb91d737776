//! One queue and its messages: attributes as set, the redrive policy read from them.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

/// One message in a queue.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its id (kept by a dead-letter move, shared by a duplicate delivery's twin).
    pub id: String,
    /// Its body.
    pub body: String,
    /// Message attributes, in the wire's form (`{"DataType": .., "StringValue": ..}`).
    pub attributes: Map<String, Json>,
    /// FIFO group.
    pub group: Option<String>,
    /// FIFO deduplication id.
    pub dedup: Option<String>,
    /// Order of sending (FIFO sequence number).
    pub sequence: u64,
    /// When it was first enqueued (retention counts from here), ms.
    pub sent_ms: i64,
    /// Not receivable before this, ms.
    pub visible_ms: i64,
    /// Times received.
    pub receives: u32,
    /// First receive, ms.
    pub first_receive_ms: Option<i64>,
    /// The latest receive's handle.
    pub handle: Option<String>,
}

/// A queue.
#[derive(Debug, Clone)]
pub struct Queue {
    /// Its name (`.fifo` for a FIFO queue).
    pub name: String,
    /// Its attributes as set (`VisibilityTimeout`, `RedrivePolicy`, ...): set them with
    /// [`Queue::set_attributes`], which reads the redrive policy again.
    pub(super) attributes: BTreeMap<String, String>,
    /// The redrive policy as read from the attributes (every receive needs it).
    pub(super) policy: Option<(String, u32)>,
    /// Its messages, in sending order.
    pub messages: Vec<Message>,
    /// FIFO deduplication ids seen, with when, ms.
    pub(super) dedup_seen: BTreeMap<String, i64>,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
}

impl Message {
    /// A `String` message attribute's value (`error_code`, ...).
    pub fn string_attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name)?["StringValue"].as_str()
    }
}

impl Queue {
    pub(super) fn attr_i64(&self, name: &str, default: i64) -> i64 {
        self.attributes
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// True for a FIFO queue.
    pub fn fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }

    /// The visibility timeout, s.
    pub fn visibility_s(&self) -> i64 {
        self.attr_i64("VisibilityTimeout", 30)
    }

    /// The retention, s.
    pub fn retention_s(&self) -> i64 {
        self.attr_i64("MessageRetentionPeriod", 345_600)
    }

    /// Its attributes as set.
    pub fn attributes(&self) -> &BTreeMap<String, String> {
        &self.attributes
    }

    /// Sets attributes (`CreateQueue`, `SetQueueAttributes`).
    pub fn set_attributes(&mut self, attributes: impl IntoIterator<Item = (String, String)>) {
        self.attributes.extend(attributes);
        self.policy = Self::read_redrive(&self.attributes);
    }

    /// The redrive policy: the dead-letter queue's name and `maxReceiveCount`.
    pub fn redrive(&self) -> Option<(String, u32)> {
        self.policy.clone()
    }

    pub(super) fn read_redrive(attributes: &BTreeMap<String, String>) -> Option<(String, u32)> {
        let p: Json = serde_json::from_str(attributes.get("RedrivePolicy")?).ok()?;
        let arn = p["deadLetterTargetArn"].as_str()?;
        let max = match &p["maxReceiveCount"] {
            Json::String(s) => s.parse().ok()?,
            v => v.as_u64()? as u32,
        };
        Some((arn.rsplit(':').next()?.to_owned(), max))
    }
}
