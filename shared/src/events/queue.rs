//! Where verified events go: the provider-events queue, one event at a time (the receiver) or
//! a page at a time in `SendMessageBatch` calls (the catch-up).
//!
//! What SQS takes: a message of at most [`MAX_MESSAGE_BYTES`], counting its body and its
//! attribute (the event's type) as SQS counts them ([`message_bytes`]), and of the characters
//! XML allows (`#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF`): a JSON text
//! may hold U+FFFE and U+FFFF raw, so they are sent escaped ([`sqs_text`]), the same JSON. An
//! event the queue still refuses (larger than a message) is set aside to the events'
//! dead-letter queue with a code ([`EVENT_TOO_LARGE`], [`EVENT_REFUSED`]): the catch-up goes on
//! after it.

use std::borrow::Cow;

use async_trait::async_trait;

use crate::provider::event::ProviderEvent;

/// SQS's largest message (the queue's `MaximumMessageSize` at its default), body and
/// attributes together.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The attribute every queued event carries: its type.
pub const EVENT_TYPE_ATTRIBUTE: &str = "event_type";

/// The dead-letter code of an event larger than a queue message.
pub const EVENT_TOO_LARGE: &str = "event_too_large";

/// The dead-letter code of an event the queue refused for another reason of its own.
pub const EVENT_REFUSED: &str = "event_refused_by_queue";

/// The bytes SQS counts for an event of type `kind` with body `body`: the body, and the
/// attribute's name, data type and value.
pub fn message_bytes(kind: &str, body: &str) -> usize {
    body.len() + EVENT_TYPE_ATTRIBUTE.len() + "String".len() + kind.len()
}

/// The trace attributes an event's message carries (its delivery's trace), when the message
/// still fits with them: an event the route took at the limit goes without its trace rather
/// than be refused by the queue.
pub fn trace_attributes_within(
    kind: &str,
    body: &str,
    attributes: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let extra: usize = attributes
        .iter()
        .map(|(name, value)| name.len() + "String".len() + value.len())
        .sum();
    if message_bytes(kind, body) + extra <= MAX_MESSAGE_BYTES {
        attributes
    } else {
        Vec::new()
    }
}

/// The event's text as SQS takes it: U+FFFE and U+FFFF (valid in a JSON string, refused by
/// SQS) written as JSON escapes; every other character SQS takes as it is (JSON writes the
/// control characters it refuses escaped already).
pub fn sqs_text(body: &str) -> Cow<'_, str> {
    if !body.contains(['\u{fffe}', '\u{ffff}']) {
        return Cow::Borrowed(body);
    }
    let mut out = String::with_capacity(body.len() + 8);
    for c in body.chars() {
        match c {
            '\u{fffe}' => out.push_str("\\ufffe"),
            '\u{ffff}' => out.push_str("\\uffff"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Where verified events go.
#[async_trait]
pub trait EventQueue: Send + Sync {
    /// Sends the event's raw body; `Ok` once the queue holds it.
    async fn enqueue(&self, event: &ProviderEvent, body: &str) -> Result<(), String>;

    /// Sends every event; `Ok` once the queue holds them all (or holds them and has set aside
    /// those it refused, [`EventQueue::set_aside`]). The default sends them one at a time.
    async fn enqueue_batch(&self, events: &[(ProviderEvent, String)]) -> Result<(), String> {
        for (event, body) in events {
            self.enqueue(event, body).await?;
        }
        Ok(())
    }

    /// Puts an event the queue cannot take where an operator finds it, with `code` and `why`
    /// (the events' dead-letter queue); `Ok` once it is there. The default has nowhere to put
    /// it: the error names the event, and the catch-up stops before it.
    async fn set_aside(
        &self,
        event: &ProviderEvent,
        body: &str,
        code: &str,
        why: &str,
    ) -> Result<(), String> {
        let _ = body;
        Err(format!(
            "event {} ({}) cannot be queued ({code}: {why}), and no dead-letter queue is set to put it aside",
            event.id, event.kind
        ))
    }
}

/// What a dead letter holds of an event the queue refused: its id, type, time and size, and
/// the reason (the event itself did not fit, or was refused): enough to look it up at the
/// provider (`GET /v1/events/{id}`, the Dashboard's event page).
pub fn set_aside_body(event: &ProviderEvent, body: &str, why: &str) -> String {
    serde_json::json!({
        "set_aside": true,
        "id": event.id,
        "type": event.kind,
        "created": event.created,
        "bytes": body.len(),
        "reason": why,
    })
    .to_string()
}

/// SQS's limits on one `SendMessageBatch`: ten entries, 256 KiB in all.
const BATCH_ENTRIES: usize = 10;
const BATCH_BYTES: usize = MAX_MESSAGE_BYTES;

/// Splits events into batches SQS takes whole (an event larger than a batch goes alone, and
/// SQS names it if it is too large for any message).
fn batches(events: &[(ProviderEvent, String)]) -> Vec<&[(ProviderEvent, String)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (e, body)) in events.iter().enumerate() {
        // The body and its one attribute: name, value and data type all count.
        let size = message_bytes(&e.kind, body);
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

/// A FIFO queue's group and deduplication ids for `event` (`None` for a standard queue at
/// `url`): the PaymentIntent it concerns (a payment's events in order, the others beside), else
/// the event itself; and the event's id (a copy sent within SQS's five minutes is one), each as
/// SQS takes it ([`sqs_once::queue::fifo_id`]).
pub fn fifo_ids(url: &str, event: &ProviderEvent) -> (Option<String>, Option<String>) {
    if !url.ends_with(".fifo") {
        return (None, None);
    }
    let o = &event.object;
    let intent = match o["object"].as_str() {
        Some("payment_intent") => o["id"].as_str(),
        _ => o["payment_intent"].as_str(),
    };
    let group = sqs_once::queue::fifo_id(intent.filter(|i| !i.is_empty()).unwrap_or(&event.id));
    (Some(group), Some(sqs_once::queue::fifo_id(&event.id)))
}

/// The provider-events queue in SQS.
pub struct SqsEventQueue {
    client: aws_sdk_sqs::Client,
    url: String,
    /// The events' dead-letter queue, where an event the queue refuses is set aside.
    dead_letters: Option<String>,
}

impl SqsEventQueue {
    /// The queue at `url` (the template's `PROVIDER_EVENTS_QUEUE_URL`).
    pub fn new(client: aws_sdk_sqs::Client, url: String) -> Self {
        Self {
            client,
            url,
            dead_letters: None,
        }
    }

    /// Sets aside the events the queue refuses to the dead-letter queue at `url` (the event
    /// function's `DEAD_LETTER_QUEUE_URL`).
    pub fn with_dead_letters(mut self, url: String) -> Self {
        self.dead_letters = Some(url);
        self
    }
}

#[async_trait]
impl EventQueue for SqsEventQueue {
    async fn set_aside(
        &self,
        event: &ProviderEvent,
        body: &str,
        code: &str,
        why: &str,
    ) -> Result<(), String> {
        use sqs_once::queue::attrs;
        let Some(url) = &self.dead_letters else {
            return Err(format!(
                "event {} ({}) cannot be queued ({code}: {why}), and no dead-letter queue is set to put it aside",
                event.id, event.kind
            ));
        };
        let attribute = |v: &str| {
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
                .map_err(|e| e.to_string())
        };
        let message: String = why.chars().take(1_000).collect();
        let (group, dedup) = fifo_ids(url, event);
        self.client
            .send_message()
            .queue_url(url)
            .set_message_group_id(group)
            .set_message_deduplication_id(dedup)
            .message_body(set_aside_body(event, body, why))
            .message_attributes(attrs::ERROR_CODE, attribute(code)?)
            .message_attributes(attrs::ERROR_MESSAGE, attribute(&message)?)
            .message_attributes(EVENT_TYPE_ATTRIBUTE, attribute(&event.kind)?)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
        tracing::warn!(event_id = %event.id, event_type = %event.kind, error_code = code, reason = why, "event set aside to the dead-letter queue");
        Ok(())
    }

    async fn enqueue(&self, event: &ProviderEvent, body: &str) -> Result<(), String> {
        let attribute = |v: &str| {
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
                .map_err(|e| e.to_string())
        };
        let (group, dedup) = fifo_ids(&self.url, event);
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.url)
            .set_message_group_id(group)
            .set_message_deduplication_id(dedup)
            .message_body(sqs_text(body))
            .message_attributes(EVENT_TYPE_ATTRIBUTE, attribute(&event.kind)?);
        // The event's message continues the trace of the delivery that brought it.
        let traced = sqs_once::trace::create_attributes(&self.url, None, Some(&event.id));
        for (name, value) in trace_attributes_within(&event.kind, body, traced) {
            send = send.message_attributes(name, attribute(&value)?);
        }
        send.send()
            .await
            .map(|_| ())
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())
    }

    /// `SendMessageBatch` of ten at a time; the entries SQS did not take are sent again (a
    /// few times, then the error names them); an entry SQS refuses as the sender's fault is
    /// set aside ([`EventQueue::set_aside`]).
    async fn enqueue_batch(&self, events: &[(ProviderEvent, String)]) -> Result<(), String> {
        use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
        let events: Vec<(ProviderEvent, String)> = events
            .iter()
            .map(|(e, body)| (e.clone(), sqs_text(body).into_owned()))
            .collect();
        for batch in batches(&events) {
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
                    let (group, dedup) = fifo_ids(&self.url, event);
                    entries.push(
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .set_message_group_id(group)
                            .set_message_deduplication_id(dedup)
                            .message_body(body)
                            .message_attributes(EVENT_TYPE_ATTRIBUTE, attribute)
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
                let mut failed: Vec<usize> = Vec::new();
                for f in out.failed() {
                    let Some(i) = f.id().parse::<usize>().ok().filter(|i| *i < batch.len()) else {
                        return Err(format!(
                            "SQS answered for an entry it was not sent: {}",
                            f.id()
                        ));
                    };
                    if f.sender_fault() {
                        // Refused for what it is: sending it again changes nothing.
                        let (event, body) = &batch[i];
                        let why = format!(
                            "the provider-events queue refused it: {} {}",
                            f.code(),
                            f.message().unwrap_or_default()
                        );
                        self.set_aside(event, body, EVENT_REFUSED, &why).await?;
                    } else {
                        failed.push(i);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str) -> ProviderEvent {
        ProviderEvent {
            id: "evt_1".into(),
            kind: kind.into(),
            created: 1,
            object: serde_json::Value::Null,
        }
    }

    #[test]
    fn an_event_at_the_limit_goes_without_its_trace_rather_than_be_refused() {
        let trace = || {
            vec![(
                "traceparent".to_owned(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            )]
        };
        let kind = "charge.refund.updated";
        let room = MAX_MESSAGE_BYTES - message_bytes(kind, "");
        // 72 bytes of trace: kept while they fit, dropped past that.
        let fits = "x".repeat(room - 72);
        assert_eq!(trace_attributes_within(kind, &fits, trace()), trace());
        let over = "x".repeat(room - 71);
        assert!(trace_attributes_within(kind, &over, trace()).is_empty());
        // The route takes either (its size check counts the type attribute alone).
        assert!(message_bytes(kind, &over) <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn a_fifo_queue_groups_an_event_by_its_payment_intent_and_dedups_by_its_id() {
        let with = |object: serde_json::Value| ProviderEvent {
            id: "evt_9".into(),
            kind: "refund.updated".into(),
            created: 1,
            object,
        };
        let url = "https://sqs.eu-west-1.amazonaws.com/1/events.fifo";
        let intent = with(serde_json::json!({"object": "payment_intent", "id": "pi_1"}));
        let refund =
            with(serde_json::json!({"object": "refund", "id": "re_1", "payment_intent": "pi_1"}));
        let other = with(serde_json::json!({"object": "charge", "id": "ch_1"}));
        assert_eq!(
            fifo_ids(url, &intent),
            (Some("pi_1".into()), Some("evt_9".into()))
        );
        assert_eq!(fifo_ids(url, &refund).0, Some("pi_1".into()));
        assert_eq!(fifo_ids(url, &other).0, Some("evt_9".into()));
        assert_eq!(
            fifo_ids("https://sqs.eu-west-1.amazonaws.com/1/events", &refund),
            (None, None)
        );
    }

    #[test]
    fn characters_sqs_refuses_are_sent_as_the_same_json_escaped() {
        let raw = "{\"id\":\"evt_1\",\"d\":\"a\u{ffff}b\u{fffe}\u{1F600}\u{e9}\"}";
        let sent = sqs_text(raw);
        assert!(!sent.contains(['\u{fffe}', '\u{ffff}']), "{sent}");
        let a: serde_json::Value = serde_json::from_str(raw).unwrap();
        let b: serde_json::Value = serde_json::from_str(&sent).unwrap();
        assert_eq!(a, b, "the same JSON");
        assert!(matches!(sqs_text("{\"a\":\"\u{e9}\"}"), Cow::Borrowed(_)));
    }

    #[test]
    fn batches_count_what_sqs_counts_and_keep_ten_entries() {
        let e = event("payment_intent.succeeded");
        let attribute = message_bytes(&e.kind, "");
        assert_eq!(attribute, 40);
        // Two bodies that fill a batch but for their attributes: split in two.
        let half = "x".repeat(BATCH_BYTES / 2 - attribute / 2);
        let events = vec![(e.clone(), half.clone()), (e.clone(), half)];
        assert_eq!(batches(&events).len(), 2);
        let small: Vec<_> = (0..25).map(|_| (e.clone(), "{}".to_owned())).collect();
        let sizes: Vec<usize> = batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [10, 10, 5]);
    }
}
