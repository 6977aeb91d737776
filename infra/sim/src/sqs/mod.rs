//! SQS, modelled: standard and FIFO queues as the project's code and Lambda's event-source
//! mapping see them, answering the SDK's JSON protocol (`X-Amz-Target: AmazonSQS.<operation>`).
//!
//! What is modelled: visibility timeouts and `ChangeMessageVisibility`; receive counts and the
//! first receive's time; redrive to the dead-letter queue on the receive after
//! `maxReceiveCount`; retention (counted from the first enqueue, which a standard queue's
//! dead-letter move keeps and a FIFO one resets); queue and message delays; batches of at most
//! ten; a standard queue's lack of order and its duplicate deliveries (a delivered message may
//! stay visible as a twin with the same `MessageId`); a FIFO queue's group order, its group
//! blocking while a message is in flight, and its five-minute deduplication. Receipt handles
//! are per receive: only the latest deletes.
//!
//! Why ~500 lines: sending, receiving (with the redrive and the duplicates), visibility and
//! deletion are one queue's rules, read together.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value as Json};

mod queue;
mod wire;

pub use queue::{Message, Queue};

/// An SQS error as the wire carries it.
#[derive(Debug, Clone)]
pub struct SqsError {
    /// The shape's name (`QueueDoesNotExist`).
    pub code: &'static str,
    /// Its message.
    pub message: String,
}

impl SqsError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The wire body.
    pub fn body(&self) -> Json {
        json!({"__type": format!("com.amazonaws.sqs#{}", self.code), "message": self.message})
    }

    /// The code of SQS's older query protocol, which the JSON protocol still sends in the
    /// `x-amzn-query-error` header and the SDK matches its error shapes on.
    pub fn query_code(&self) -> String {
        match self.code {
            "QueueDoesNotExist" => "AWS.SimpleQueueService.NonExistentQueue".into(),
            "QueueNameExists" => "QueueAlreadyExists".into(),
            "EmptyBatchRequest"
            | "BatchRequestTooLong"
            | "TooManyEntriesInBatchRequest"
            | "UnsupportedOperation"
            | "MessageNotInflight" => {
                format!("AWS.SimpleQueueService.{}", self.code)
            }
            other => other.into(),
        }
    }
}

/// The account's queues.
#[derive(Debug)]
pub struct Sqs {
    /// Queues by name.
    pub queues: BTreeMap<String, Queue>,
    /// Chooses which visible messages a standard queue delivers, and its duplicates.
    rng: fastrand::Rng,
    /// Chance that a standard queue delivers a message twice.
    pub duplicate_rate: f64,
    /// The messages delivered twice (by id): the twin keeps the receives counted so far, so one
    /// born on a last receive is moved by the redrive policy at its own next receive.
    pub twinned: std::collections::BTreeSet<String>,
    next_id: u64,
}

/// The account id of the model's ARNs and URLs.
pub const ACCOUNT: &str = "000000000000";

/// The URL of a queue.
pub fn url_of(name: &str) -> String {
    format!("https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/{name}")
}

/// The ARN of a queue.
pub fn arn_of(name: &str) -> String {
    format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{name}")
}

pub(crate) fn name_of_url(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

pub(crate) fn text<'a>(body: &'a Json, field: &str) -> Result<&'a str, SqsError> {
    body.get(field).and_then(Json::as_str).ok_or_else(|| {
        SqsError::new(
            "MissingParameter",
            format!("The request must contain the parameter {field}."),
        )
    })
}

impl Sqs {
    /// No queues; `seed` fixes the order and duplicates of deliveries.
    pub fn new(seed: u64) -> Self {
        Self {
            queues: BTreeMap::new(),
            rng: fastrand::Rng::with_seed(seed),
            duplicate_rate: 0.0,
            twinned: std::collections::BTreeSet::new(),
            next_id: 1,
        }
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:012}", self.next_id)
    }

    fn queue_mut(&mut self, url: &str) -> Result<&mut Queue, SqsError> {
        self.queues.get_mut(name_of_url(url)).ok_or_else(|| {
            SqsError::new("QueueDoesNotExist", "The specified queue does not exist.")
        })
    }

    /// Creates a queue (or returns the existing one's URL when its attributes agree).
    pub fn create(
        &mut self,
        name: &str,
        attributes: BTreeMap<String, String>,
    ) -> Result<String, SqsError> {
        if let Some(q) = self.queues.get(name) {
            if attributes
                .iter()
                .any(|(k, v)| q.attributes.get(k) != Some(v))
            {
                return Err(SqsError::new("QueueNameExists", format!("A queue already exists with the same name and a different value for attribute(s) of {name}")));
            }
            return Ok(url_of(name));
        }
        if name.ends_with(".fifo")
            != (attributes.get("FifoQueue").map(String::as_str) == Some("true"))
        {
            return Err(SqsError::new("InvalidParameterValue", "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix."));
        }
        self.queues.insert(
            name.to_owned(),
            Queue {
                name: name.to_owned(),
                policy: Queue::read_redrive(&attributes),
                attributes,
                store: Default::default(),
                dedup_seen: BTreeMap::new(),
                dedup_order: Default::default(),
                arrivals: Default::default(),
                tags: BTreeMap::new(),
            },
        );
        Ok(url_of(name))
    }

    /// Enqueues a message; returns its id (a FIFO duplicate within five minutes is accepted and
    /// dropped, as SQS does).
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        url: &str,
        body: &str,
        attributes: Map<String, Json>,
        group: Option<String>,
        dedup: Option<String>,
        delay_s: Option<i64>,
        now_ms: i64,
    ) -> Result<String, SqsError> {
        // SQS counts the attributes too: each one's name, data type and value.
        let attributes_size: usize = attributes
            .iter()
            .map(|(name, v)| {
                name.len()
                    + v["DataType"].as_str().map_or(0, str::len)
                    + v["StringValue"].as_str().map_or(0, str::len)
            })
            .sum();
        if body.is_empty() || body.len() + attributes_size > 262_144 {
            return Err(SqsError::new(
                "InvalidParameterValue",
                "The message body must be between 1 byte and 256 KiB.",
            ));
        }
        // SQS takes only XML's characters, in a body and in a String attribute's value:
        // #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF.
        let refused = std::iter::once(body)
            .chain(
                attributes
                    .values()
                    .filter_map(|v| v["StringValue"].as_str()),
            )
            .flat_map(str::chars)
            .find(|c| !sqs_takes(*c));
        if let Some(c) = refused {
            return Err(SqsError::new(
                "InvalidMessageContents",
                format!(
                    "Invalid binary character '#x{:X}' was found in the message body, the set of allowed characters is available at https://www.w3.org/TR/REC-xml/#charsets",
                    c as u32
                ),
            ));
        }
        for (name, v) in [
            ("MessageGroupId", &group),
            ("MessageDeduplicationId", &dedup),
        ] {
            if let Some(v) = v {
                if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(SqsError::new(
                        "InvalidParameterValue",
                        format!("Value {v} for parameter {name} is invalid. Reason: it must be 1 to 128 characters of alphanumerics and punctuation."),
                    ));
                }
            }
        }
        let id = self.id("msg");
        let sequence = self.next_id;
        let q = self.queue_mut(url)?;
        // "When you set FifoQueue, you can't set DelaySeconds per message" (SendMessage): only
        // the queue's own delay applies.
        if q.fifo() && delay_s.is_some() {
            return Err(SqsError::new(
                "InvalidParameterValue",
                format!("Value {} for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid for this queue type.", delay_s.unwrap_or_default()),
            ));
        }
        if q.fifo() {
            let group = group.as_ref().ok_or_else(|| {
                SqsError::new(
                    "MissingParameter",
                    "The request must contain the parameter MessageGroupId.",
                )
            })?;
            let _ = group;
            let d = match (&dedup, q.attributes.get("ContentBasedDeduplication").map(String::as_str)) {
                (Some(d), _) => d.clone(),
                (None, Some("true")) => format!("content:{body}"),
                _ => return Err(SqsError::new("InvalidParameterValue", "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly")),
            };
            while let Some((at, seen)) = q.dedup_order.front() {
                if at + 300_000 > now_ms {
                    break;
                }
                if q.dedup_seen.get(seen) == Some(at) {
                    q.dedup_seen.remove(seen);
                }
                q.dedup_order.pop_front();
            }
            if q.dedup_seen.contains_key(&d) {
                return Ok(id);
            }
            q.dedup_order.push_back((now_ms, d.clone()));
            q.dedup_seen.insert(d, now_ms);
        } else if group.is_some() && dedup.is_some() {
            return Err(SqsError::new(
                "InvalidParameterValue",
                "The request includes a parameter that is not valid for this queue type.",
            ));
        }
        let delay = delay_s.unwrap_or_else(|| q.attr_i64("DelaySeconds", 0));
        q.store.push(
            Message {
                id: id.clone(),
                body: body.to_owned(),
                attributes,
                group,
                dedup,
                sequence,
                sent_ms: now_ms,
                visible_ms: now_ms + delay * 1000,
                receives: 0,
                first_receive_ms: None,
                received_ms: 0,
                handle: None,
            },
            now_ms,
        );
        // Every mapping waiting on this queue wakes (one thread: none can miss it between its
        // receive and its wait, as nothing else runs there).
        q.arrivals.notify_waiters();
        Ok(id)
    }

    /// What a long poll of the queue at `url` waits on: woken at each send to it.
    pub fn arrivals(&self, url: &str) -> std::sync::Arc<tokio::sync::Notify> {
        self.queues
            .get(name_of_url(url))
            .map(|q| std::sync::Arc::clone(&q.arrivals))
            .unwrap_or_default()
    }

    /// When the next message of a queue that is not visible now becomes visible (one in
    /// flight, or delayed), epoch ms: what a receive that found nothing waits for (a FIFO
    /// group's visible messages wait for its message in flight).
    pub fn next_visible(&self, url: &str, now_ms: i64) -> Option<i64> {
        self.queues
            .get(name_of_url(url))?
            .store
            .next_visible(now_ms)
    }

    /// Drops what is past its queue's retention.
    pub fn expire(&mut self, now_ms: i64) -> Vec<(String, Message)> {
        let mut gone = Vec::new();
        for q in self.queues.values_mut() {
            let keep = q.retention_s() * 1000;
            for slot in q.store.sent_by(now_ms - keep) {
                if let Some(m) = q.store.remove(slot) {
                    gone.push((q.name.clone(), m));
                }
            }
        }
        gone
    }

    /// Receives up to `max` messages as `ReceiveMessage` would, with visibility `visibility_s`
    /// (the queue's when `None`); messages past `maxReceiveCount` move to the dead-letter queue
    /// instead of being delivered.
    pub fn receive(
        &mut self,
        url: &str,
        max: usize,
        visibility_s: Option<i64>,
        now_ms: i64,
    ) -> Result<Vec<Message>, SqsError> {
        let max = max.clamp(1, 10);
        let dup_rate = self.duplicate_rate;
        let name = name_of_url(url).to_owned();
        let q = self.queues.get_mut(&name).ok_or_else(|| {
            SqsError::new("QueueDoesNotExist", "The specified queue does not exist.")
        })?;
        q.store.reveal(now_ms);
        let redrive = q.redrive();
        let visibility = visibility_s.unwrap_or_else(|| q.visibility_s());
        let fifo = q.fifo();
        let mut picked: Vec<u64> = Vec::new();
        if fifo {
            let mut blocked: Vec<&str> = q
                .messages()
                .filter(|m| m.visible_ms > now_ms && m.receives > 0)
                .filter_map(|m| m.group.as_deref())
                .collect();
            blocked.sort();
            for (slot, m) in &q.store.messages {
                crate::cost::visit(1);
                let g = m.group.as_deref().unwrap_or("");
                if blocked.binary_search(&g).is_ok() {
                    continue;
                }
                if m.visible_ms > now_ms {
                    // A message not visible yet holds its group's later ones back.
                    blocked.push(g);
                    blocked.sort();
                    continue;
                }
                if picked.len() < max {
                    picked.push(*slot);
                }
            }
        } else {
            // `max` of the visible ones at random (the first steps of a Fisher-Yates shuffle
            // over them in slot order; only the positions it swaps are kept).
            let n = q.store.visible_count();
            crate::cost::visit(max.min(n));
            let mut swapped: HashMap<usize, usize> = HashMap::new();
            let k = max.min(n);
            for i in 0..k {
                let j = self.rng.usize(i..n);
                let (at_i, at_j) = (
                    *swapped.get(&i).unwrap_or(&i),
                    *swapped.get(&j).unwrap_or(&j),
                );
                swapped.insert(i, at_j);
                swapped.insert(j, at_i);
            }
            picked = (0..k)
                .map(|i| q.store.visible_at(*swapped.get(&i).unwrap_or(&i)))
                .collect();
            picked.sort_unstable();
        }
        let mut out = Vec::new();
        let mut to_dlq = Vec::new();
        let mut twins = Vec::new();
        let mut handles = Vec::new();
        for _ in &picked {
            handles.push(self.id("rh"));
        }
        let q = self.queues.get_mut(&name).expect("found");
        for (n, &slot) in picked.iter().enumerate() {
            if let Some((_, max_receives)) = &redrive {
                if q.store.messages[&slot].receives >= *max_receives {
                    to_dlq.push(slot);
                    continue;
                }
            }
            let m = q
                .store
                .update(slot, now_ms, |m| {
                    m.receives += 1;
                    m.first_receive_ms.get_or_insert(now_ms);
                    m.received_ms = now_ms;
                    m.visible_ms = now_ms + visibility * 1000;
                    m.handle = Some(handles[n].clone());
                    m.clone()
                })
                .expect("picked");
            if !fifo && dup_rate > 0.0 && self.rng.f64() < dup_rate {
                self.twinned.insert(m.id.clone());
                let mut twin = m.clone();
                twin.visible_ms = now_ms;
                twin.handle = None;
                twins.push(twin);
            }
            out.push(m);
        }
        let moved: Vec<Message> = to_dlq
            .into_iter()
            .filter_map(|slot| q.store.remove(slot))
            .collect();
        for twin in twins {
            q.store.push(twin, now_ms);
        }
        if let Some((dlq, _)) = redrive {
            let dlq_fifo = dlq.ends_with(".fifo");
            if let Some(d) = self.queues.get_mut(&dlq) {
                for mut m in moved {
                    m.visible_ms = now_ms;
                    m.receives = 0;
                    m.handle = None;
                    m.first_receive_ms = None;
                    if dlq_fifo {
                        m.sent_ms = now_ms;
                    }
                    d.store.push(m, now_ms);
                }
            }
        }
        Ok(out)
    }

    /// Deletes by receipt handle: a handle of an earlier receive deletes nothing, and succeeds.
    pub fn delete(&mut self, url: &str, handle: &str) -> Result<(), SqsError> {
        let q = self.queue_mut(url)?;
        if !handle.starts_with("rh-") {
            return Err(SqsError::new(
                "ReceiptHandleIsInvalid",
                format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
            ));
        }
        if let Some(slot) = q.store.slot_of(handle) {
            q.store.remove(slot);
        }
        Ok(())
    }

    /// `ChangeMessageVisibility`: only a message in flight under this handle.
    pub fn change_visibility(
        &mut self,
        url: &str,
        handle: &str,
        seconds: i64,
        now_ms: i64,
    ) -> Result<(), SqsError> {
        if !(0..=43_200).contains(&seconds) {
            return Err(SqsError::new("InvalidParameterValue", format!("Value {seconds} for parameter VisibilityTimeout is invalid. Reason: Must be between 0 and 43200.")));
        }
        let q = self.queue_mut(url)?;
        let slot = q.store.slot_of(handle).ok_or_else(|| {
            SqsError::new(
                "ReceiptHandleIsInvalid",
                format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
            )
        })?;
        if q.store.messages[&slot].visible_ms <= now_ms {
            return Err(SqsError::new(
                "MessageNotInflight",
                "The message referred to isn't in flight.",
            ));
        }
        // A message's visibility reaches at most 12 hours past its receive, however often it is
        // extended ("If you try to extend the visibility timeout beyond 12 hours, your request
        // is rejected": ChangeMessageVisibility).
        let received = q.store.messages[&slot].received_ms;
        if now_ms + seconds * 1000 > received + 43_200_000 {
            return Err(SqsError::new("InvalidParameterValue", format!("Value {seconds} for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is beyond the limit [43200 seconds].")));
        }
        q.store
            .update(slot, now_ms, |m| m.visible_ms = now_ms + seconds * 1000);
        Ok(())
    }
}

/// Whether SQS takes a character in a message (XML 1.0's `Char`).
pub fn sqs_takes(c: char) -> bool {
    matches!(c as u32, 0x9 | 0xA | 0xD | 0x20..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10FFFF)
}
