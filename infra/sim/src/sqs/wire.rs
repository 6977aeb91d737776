//! SQS's JSON protocol (`X-Amz-Target: AmazonSQS.<operation>`), read and answered.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value as Json};

use super::{arn_of, name_of_url, text, url_of, Message, Sqs, SqsError};

impl Sqs {
    /// The wire form of a received message, as `ReceiveMessage` answers with every attribute.
    pub fn message_json(q_fifo: bool, m: &Message) -> Json {
        let mut attrs = json!({
            "ApproximateReceiveCount": m.receives.to_string(),
            "SentTimestamp": m.sent_ms.to_string(),
            "ApproximateFirstReceiveTimestamp": m.first_receive_ms.unwrap_or(m.sent_ms).to_string(),
            "SenderId": "AIDASIMULATOR",
        });
        if q_fifo {
            attrs["MessageGroupId"] = json!(m.group);
            // Content-based: SQS reports the body's SHA-256 (it never answers a null, which
            // the SDK refuses to parse: payctl's reading of a FIFO dead-letter queue failed on
            // the letters SQS had moved there).
            attrs["MessageDeduplicationId"] = json!(m.dedup.clone().unwrap_or_else(|| {
                use sha2::{Digest, Sha256};
                Sha256::digest(m.body.as_bytes())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            }));
            attrs["SequenceNumber"] = json!(format!("{:020}", m.sequence));
        }
        let mut out = json!({"MessageId": m.id, "ReceiptHandle": m.handle, "Body": m.body, "Attributes": attrs});
        if !m.attributes.is_empty() {
            out["MessageAttributes"] = Json::Object(m.attributes.clone());
        }
        out
    }

    /// Answers one request of the JSON protocol at `now_ms`.
    pub fn handle(&mut self, operation: &str, body: &Json, now_ms: i64) -> Result<Json, SqsError> {
        let attrs_of = |v: Option<&Json>| -> BTreeMap<String, String> {
            v.and_then(Json::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                        .collect()
                })
                .unwrap_or_default()
        };
        match operation {
            "CreateQueue" => {
                let url =
                    self.create(text(body, "QueueName")?, attrs_of(body.get("Attributes")))?;
                let tags = attrs_of(body.get("tags"));
                self.queue_mut(&url)?.tags.extend(tags);
                Ok(json!({"QueueUrl": url}))
            }
            "GetQueueUrl" => {
                let name = text(body, "QueueName")?;
                if self.queues.contains_key(name) {
                    Ok(json!({"QueueUrl": url_of(name)}))
                } else {
                    Err(SqsError::new(
                        "QueueDoesNotExist",
                        "The specified queue does not exist.",
                    ))
                }
            }
            "ListQueues" => {
                let prefix = body
                    .get("QueueNamePrefix")
                    .and_then(Json::as_str)
                    .unwrap_or("");
                Ok(
                    json!({"QueueUrls": self.queues.keys().filter(|n| n.starts_with(prefix)).map(|n| url_of(n)).collect::<Vec<_>>()}),
                )
            }
            "DeleteQueue" => {
                let name = name_of_url(text(body, "QueueUrl")?).to_owned();
                self.queues.remove(&name).ok_or_else(|| {
                    SqsError::new("QueueDoesNotExist", "The specified queue does not exist.")
                })?;
                Ok(json!({}))
            }
            "GetQueueAttributes" => {
                let url = text(body, "QueueUrl")?.to_owned();
                let now = now_ms;
                let q = self.queue_mut(&url)?;
                let mut all: BTreeMap<String, String> = q.attributes.clone();
                all.insert("QueueArn".into(), arn_of(&q.name));
                all.entry("VisibilityTimeout".into())
                    .or_insert_with(|| "30".into());
                all.entry("MessageRetentionPeriod".into())
                    .or_insert_with(|| "345600".into());
                all.entry("DelaySeconds".into())
                    .or_insert_with(|| "0".into());
                q.store.reveal(now);
                let visible = q.store.visible_count();
                let in_flight = q.store.in_flight(now);
                let delayed = q.len() - visible - in_flight;
                all.insert("ApproximateNumberOfMessages".into(), visible.to_string());
                all.insert(
                    "ApproximateNumberOfMessagesNotVisible".into(),
                    in_flight.to_string(),
                );
                all.insert(
                    "ApproximateNumberOfMessagesDelayed".into(),
                    delayed.to_string(),
                );
                let wanted: Vec<String> = body
                    .get("AttributeNames")
                    .and_then(Json::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let picked: Map<String, Json> = all
                    .into_iter()
                    .filter(|(k, _)| wanted.iter().any(|w| w == "All" || w == k))
                    .map(|(k, v)| (k, json!(v)))
                    .collect();
                Ok(json!({"Attributes": picked}))
            }
            "SetQueueAttributes" => {
                let q = self.queue_mut(text(body, "QueueUrl")?)?;
                q.set_attributes(attrs_of(body.get("Attributes")));
                Ok(json!({}))
            }
            "SendMessage" => {
                let id = self.send(
                    text(body, "QueueUrl")?,
                    text(body, "MessageBody")?,
                    body.get("MessageAttributes")
                        .and_then(Json::as_object)
                        .cloned()
                        .unwrap_or_default(),
                    body.get("MessageGroupId")
                        .and_then(Json::as_str)
                        .map(str::to_owned),
                    body.get("MessageDeduplicationId")
                        .and_then(Json::as_str)
                        .map(str::to_owned),
                    body.get("DelaySeconds").and_then(Json::as_i64),
                    now_ms,
                )?;
                Ok(json!({"MessageId": id}))
            }
            "SendMessageBatch" => {
                let url = text(body, "QueueUrl")?.to_owned();
                let entries = body
                    .get("Entries")
                    .and_then(Json::as_array)
                    .cloned()
                    .unwrap_or_default();
                if entries.is_empty() {
                    return Err(SqsError::new(
                        "EmptyBatchRequest",
                        "There should be at least one SendMessageBatchRequestEntry in the request.",
                    ));
                }
                if entries.len() > 10 {
                    return Err(SqsError::new(
                        "TooManyEntriesInBatchRequest",
                        "Maximum number of entries per request are 10.",
                    ));
                }
                let total: usize = entries
                    .iter()
                    .map(|e| e["MessageBody"].as_str().map_or(0, str::len))
                    .sum();
                if total > 262_144 {
                    return Err(SqsError::new(
                        "BatchRequestTooLong",
                        "Batch requests cannot be longer than 262144 bytes.",
                    ));
                }
                let mut ok = Vec::new();
                let mut failed = Vec::new();
                for e in entries {
                    let id = e["Id"].as_str().unwrap_or_default().to_owned();
                    match self.send(
                        &url,
                        e["MessageBody"].as_str().unwrap_or_default(),
                        e.get("MessageAttributes").and_then(Json::as_object).cloned().unwrap_or_default(),
                        e.get("MessageGroupId").and_then(Json::as_str).map(str::to_owned),
                        e.get("MessageDeduplicationId").and_then(Json::as_str).map(str::to_owned),
                        e.get("DelaySeconds").and_then(Json::as_i64),
                        now_ms,
                    ) {
                        Ok(mid) => ok.push(json!({"Id": id, "MessageId": mid})),
                        Err(err) => failed.push(json!({"Id": id, "SenderFault": true, "Code": err.code, "Message": err.message})),
                    }
                }
                Ok(json!({"Successful": ok, "Failed": failed}))
            }
            "ReceiveMessage" => {
                let url = text(body, "QueueUrl")?.to_owned();
                let max = body
                    .get("MaxNumberOfMessages")
                    .and_then(Json::as_u64)
                    .unwrap_or(1) as usize;
                let vis = body.get("VisibilityTimeout").and_then(Json::as_i64);
                let fifo = name_of_url(&url).ends_with(".fifo");
                let msgs = self.receive(&url, max, vis, now_ms)?;
                Ok(
                    json!({"Messages": msgs.iter().map(|m| Sqs::message_json(fifo, m)).collect::<Vec<_>>()}),
                )
            }
            "DeleteMessage" => {
                self.delete(text(body, "QueueUrl")?, text(body, "ReceiptHandle")?)?;
                Ok(json!({}))
            }
            "DeleteMessageBatch" => {
                let url = text(body, "QueueUrl")?.to_owned();
                let mut ok = Vec::new();
                let mut failed = Vec::new();
                for e in body
                    .get("Entries")
                    .and_then(Json::as_array)
                    .cloned()
                    .unwrap_or_default()
                {
                    let id = e["Id"].as_str().unwrap_or_default().to_owned();
                    match self.delete(&url, e["ReceiptHandle"].as_str().unwrap_or_default()) {
                        Ok(()) => ok.push(json!({"Id": id})),
                        Err(err) => failed.push(json!({"Id": id, "SenderFault": true, "Code": err.code, "Message": err.message})),
                    }
                }
                Ok(json!({"Successful": ok, "Failed": failed}))
            }
            "ChangeMessageVisibility" => {
                let seconds = body
                    .get("VisibilityTimeout")
                    .and_then(Json::as_i64)
                    .unwrap_or(0);
                self.change_visibility(
                    text(body, "QueueUrl")?,
                    text(body, "ReceiptHandle")?,
                    seconds,
                    now_ms,
                )?;
                Ok(json!({}))
            }
            "ListQueueTags" => {
                let q = self.queue_mut(text(body, "QueueUrl")?)?;
                Ok(json!({"Tags": q.tags}))
            }
            "TagQueue" => {
                let tags = attrs_of(body.get("Tags"));
                self.queue_mut(text(body, "QueueUrl")?)?.tags.extend(tags);
                Ok(json!({}))
            }
            "UntagQueue" => {
                let q = self.queue_mut(text(body, "QueueUrl")?)?;
                for k in body
                    .get("TagKeys")
                    .and_then(Json::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(k) = k.as_str() {
                        q.tags.remove(k);
                    }
                }
                Ok(json!({}))
            }
            "ChangeMessageVisibilityBatch" => {
                let url = text(body, "QueueUrl")?.to_owned();
                let entries = body
                    .get("Entries")
                    .and_then(Json::as_array)
                    .cloned()
                    .unwrap_or_default();
                if entries.is_empty() {
                    return Err(SqsError::new("EmptyBatchRequest", "There should be at least one ChangeMessageVisibilityBatchRequestEntry in the request."));
                }
                if entries.len() > 10 {
                    return Err(SqsError::new(
                        "TooManyEntriesInBatchRequest",
                        "Maximum number of entries per request are 10.",
                    ));
                }
                let mut ok = Vec::new();
                let mut failed = Vec::new();
                for e in entries {
                    let id = e["Id"].as_str().unwrap_or_default().to_owned();
                    let seconds = e
                        .get("VisibilityTimeout")
                        .and_then(Json::as_i64)
                        .unwrap_or(0);
                    match self.change_visibility(&url, e["ReceiptHandle"].as_str().unwrap_or_default(), seconds, now_ms) {
                        Ok(()) => ok.push(json!({"Id": id})),
                        Err(err) => failed.push(json!({"Id": id, "SenderFault": true, "Code": err.code, "Message": err.message})),
                    }
                }
                Ok(json!({"Successful": ok, "Failed": failed}))
            }
            "PurgeQueue" => {
                self.queue_mut(text(body, "QueueUrl")?)?.store.clear();
                Ok(json!({}))
            }
            other => Err(SqsError::new(
                "UnsupportedOperation",
                format!("the simulator does not model SQS's {other}"),
            )),
        }
    }
}
