//! Operating the dead-letter queue: list what is there and why, and redrive it to the source
//! queue after a fix.
//!
//! A redrive leaves the codes that are never redriven ([`NEVER_REDRIVEN`]) in the DLQ unless
//! forced, and refuses an unknown code. It uses SQS's `StartMessageMoveTask` when the whole DLQ
//! moves (forced) and the endpoint has it; otherwise it moves messages one by one: send to the source queue, and delete from the DLQ only after the send
//! succeeded, so nothing is lost. A message may be moved twice if a run dies between the two
//! steps; that is safe, because the processor charges a payment once however often it arrives.
//!
//! Why ~510 lines: listing, showing and both ways of redriving read a dead letter the same
//! way (its code, first send, group and trace), and keep to one file with that reading.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, Message, MessageAttributeValue,
    MessageSystemAttributeName,
};
use sqs_once::queue::attrs;
use sqs_once::runner::now_ms;

/// A dead letter, as an operator sees it.
#[derive(Debug, Clone)]
pub struct DeadLetterInfo {
    /// The DLQ message id.
    pub message_id: String,
    /// `error_code`, or `None` when SQS moved it after `maxReceiveCount` deliveries.
    pub error_code: Option<String>,
    /// `error_message`.
    pub error_message: Option<String>,
    /// The payment id, when the body is JSON with one.
    pub payment_id: Option<String>,
    /// Times the message was received (from the source queue when SQS moved it).
    pub receive_count: u64,
    /// Time since the original was first sent.
    pub age: Duration,
    /// The body, unchanged (card numbers masked when `card_data_masked`).
    pub body: String,
    /// The source message's id (`source_message_id`), to trace it back.
    pub source_message_id: Option<String>,
    /// Epoch ms of the original's first send.
    pub first_sent_at_ms: Option<i64>,
    /// Every message attribute, as the processor wrote them.
    pub attributes: std::collections::BTreeMap<String, String>,
    /// SQS's own attributes of the dead letter (`SentTimestamp`, `ApproximateReceiveCount`, ...).
    pub system_attributes: std::collections::BTreeMap<String, String>,
}

impl DeadLetterInfo {
    /// One line for people: the message id, the code, whose it is, its age and the error
    /// message's first 100 characters (`dlq show` has it whole).
    pub fn line(&self) -> String {
        let whose = self
            .payment_id
            .clone()
            .or_else(|| body_field(&self.body, "refund_id"))
            .or_else(|| body_field(&self.body, "id"))
            .unwrap_or_else(|| "-".into());
        let message = self.error_message.clone().unwrap_or_default();
        let short: String = message.chars().take(100).collect();
        format!(
            "{}  {:<24} {:<28} {:>9} ago  {}{}",
            self.message_id,
            self.error_code.as_deref().unwrap_or("max_receives"),
            whose,
            crate::time::in_words(self.age.as_millis() as i64),
            short,
            if short.len() < message.len() {
                "…"
            } else {
                ""
            }
        )
    }

    /// Everything about the dead letter, for `dlq list` (one line each) and `dlq show`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "message_id": self.message_id,
            "error_code": self.error_code.clone().unwrap_or_else(|| "max_receives".into()),
            "error_message": self.error_message,
            "payment_id": self.payment_id,
            "source_message_id": self.source_message_id,
            "first_sent_at": self.first_sent_at_ms.map(crate::time::utc),
            "age_seconds": self.age.as_secs(),
            "receive_count": self.receive_count,
            "receive_count_means": "times SQS has handed out this dead letter, listings included (each list or show receives it once); a message SQS moved by itself also counts its deliveries from the source queue",
            "card_data_masked": self.attributes.get(payment_core::payments::charge::CARD_DATA_MASKED).is_some_and(|v| v == "true"),
            "attributes": self.attributes,
            "sqs_attributes": self.system_attributes,
            "body": self.body,
        })
    }
}

fn attr(m: &Message, k: &str) -> Option<String> {
    m.message_attributes()
        .and_then(|a| a.get(k))
        .and_then(|v| v.string_value())
        .map(str::to_owned)
}

fn sys_attr(m: &Message, k: MessageSystemAttributeName) -> Option<String> {
    m.attributes().and_then(|a| a.get(&k)).cloned()
}

fn first_sent(m: &Message) -> Option<i64> {
    attr(m, attrs::FIRST_SENT_AT)
        .and_then(|v| v.parse().ok())
        .or_else(|| {
            sys_attr(m, MessageSystemAttributeName::SentTimestamp).and_then(|v| v.parse().ok())
        })
}

fn info(m: &Message) -> DeadLetterInfo {
    let body = m.body().unwrap_or_default().to_owned();
    DeadLetterInfo {
        message_id: m.message_id().unwrap_or_default().to_owned(),
        error_code: attr(m, attrs::ERROR_CODE),
        error_message: attr(m, attrs::ERROR_MESSAGE),
        payment_id: body_field(&body, "payment_id"),
        receive_count: sys_attr(m, MessageSystemAttributeName::ApproximateReceiveCount)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        age: Duration::from_millis(
            first_sent(m)
                .map(|t| (now_ms() - t).max(0) as u64)
                .unwrap_or(0),
        ),
        body,
        source_message_id: attr(m, attrs::SOURCE_MESSAGE_ID),
        first_sent_at_ms: first_sent(m),
        attributes: m
            .message_attributes()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| v.string_value().map(|s| (k.clone(), s.to_owned())))
            .collect(),
        system_attributes: m
            .attributes()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
            .collect(),
    }
}

/// Finds dead letters (each held a moment while looking, then released): the one whose message
/// id or `source_message_id` is `id`, else every one of the payment (or refund) `id` (its
/// copies, or a payment's refunds).
pub async fn show(
    sqs: &aws_sdk_sqs::Client,
    dlq_url: &str,
    id: &str,
) -> Result<Vec<DeadLetterInfo>> {
    let letters = list(sqs, dlq_url, usize::MAX).await?;
    if let Some(l) = letters
        .iter()
        .find(|l| l.message_id == id || l.source_message_id.as_deref() == Some(id))
    {
        return Ok(vec![l.clone()]);
    }
    let of_it: Vec<DeadLetterInfo> = letters
        .into_iter()
        .filter(|l| {
            l.payment_id.as_deref() == Some(id)
                || body_field(&l.body, "refund_id").as_deref() == Some(id)
        })
        .collect();
    if of_it.is_empty() {
        bail!("no dead letter with message id, source_message_id, payment_id or refund_id {id} in {dlq_url}");
    }
    Ok(of_it)
}

/// A text field of a JSON body.
fn body_field(body: &str, field: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()?
        .get(field)?
        .as_str()
        .map(str::to_owned)
}

async fn receive(sqs: &aws_sdk_sqs::Client, url: &str, hold: i32) -> Result<Vec<Message>> {
    Ok(sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .visibility_timeout(hold)
        .wait_time_seconds(1)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .context("receiving from the dead-letter queue")?
        .messages()
        .to_vec())
}

async fn release(sqs: &aws_sdk_sqs::Client, url: &str, held: &[(String, String)]) -> Result<()> {
    for chunk in held.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, (_, rh))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(rh)
                    .visibility_timeout(0)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        sqs.change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .context("releasing dead letters")?;
    }
    Ok(())
}

/// Lists up to `max` dead letters without removing them (they are held for a moment while
/// paging, then released).
pub async fn list(
    sqs: &aws_sdk_sqs::Client,
    dlq_url: &str,
    max: usize,
) -> Result<Vec<DeadLetterInfo>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut held = Vec::new();
    let mut empty = 0;
    while out.len() < max && empty < 2 {
        let batch = receive(sqs, dlq_url, 30).await?;
        if batch.is_empty() {
            empty += 1;
        }
        for m in batch {
            held.push((
                m.message_id().unwrap_or_default().to_owned(),
                m.receipt_handle().unwrap_or_default().to_owned(),
            ));
            if seen.insert(m.message_id().unwrap_or_default().to_owned()) && out.len() < max {
                out.push(info(&m));
            }
        }
    }
    release(sqs, dlq_url, &held).await?;
    Ok(out)
}

pub use crate::dead_letter_codes::{check_filter, never_redriven, KNOWN_CODES, NEVER_REDRIVEN};

/// The variables of the queues a dead-letter queue can belong to (as `payctl env` exports them).
const SOURCE_QUEUE_VARS: [&str; 3] = [
    "PAYMENTS_QUEUE_URL",
    "REFUNDS_QUEUE_URL",
    "PROVIDER_EVENTS_QUEUE_URL",
];

/// The ARN a queue's redrive policy sends its dead letters to, if it has one.
async fn dead_letter_target(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Result<Option<String>> {
    let policy = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!(lambda_local::faults::sdk_error_line(&e)))
        .with_context(|| format!("reading the redrive policy of {queue_url}"))?
        .attributes()
        .and_then(|a| {
            a.get(&aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy)
                .cloned()
        });
    Ok(policy
        .as_deref()
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
        .and_then(|p| p["deadLetterTargetArn"].as_str().map(str::to_owned)))
}

/// The queue whose redrive policy names the dead-letter queue `dlq_url`: the only place its
/// messages can be processed (a refund sent to the payments queue would be refused as an
/// invalid payment and never redriven again: lost). A `given` queue is checked against its own
/// redrive policy; without one, SQS is asked (`ListDeadLetterSourceQueues`) and exactly one
/// source must answer; where the endpoint cannot answer that, the queues of this shell's
/// environment (`SOURCE_QUEUE_VARS`) whose redrive policy names the DLQ are the sources.
pub async fn home_queue(
    sqs: &aws_sdk_sqs::Client,
    dlq_url: &str,
    given: Option<&str>,
) -> Result<String> {
    let dlq_arn = lambda_local::esm::queue_arn(sqs, dlq_url).await?;
    if let Some(queue_url) = given {
        return match dead_letter_target(sqs, queue_url).await? {
            Some(t) if t == dlq_arn => Ok(queue_url.to_owned()),
            Some(t) => anyhow::bail!(
                "{queue_url} does not dead-letter to {dlq_url} (its redrive policy names {t}): its processor would refuse these messages, and they would be lost; pass the queue whose redrive policy names this DLQ (the refunds' DLQ goes back to REFUNDS_QUEUE_URL), or leave --queue-url out"
            ),
            None => anyhow::bail!(
                "{queue_url} has no redrive policy, so {dlq_url} is not its dead-letter queue: pass the queue whose redrive policy names this DLQ, or leave --queue-url out"
            ),
        };
    }
    let sources = match sqs
        .list_dead_letter_source_queues()
        .queue_url(dlq_url)
        .send()
        .await
    {
        Ok(out) => out.queue_urls().to_vec(),
        Err(e) => {
            // An endpoint without ListDeadLetterSourceQueues (ministack): the stack's queues
            // this shell knows, each checked against its redrive policy.
            let mut homes = Vec::new();
            for var in SOURCE_QUEUE_VARS {
                if let Ok(url) = std::env::var(var) {
                    if dead_letter_target(sqs, &url).await?.as_deref() == Some(dlq_arn.as_str()) {
                        homes.push(url);
                    }
                }
            }
            if homes.is_empty() {
                anyhow::bail!(
                    "this endpoint cannot say which queue dead-letters to {dlq_url} (ListDeadLetterSourceQueues: {}), and none of {} names it in its redrive policy: pass --queue-url, which is checked against its redrive policy",
                    lambda_local::faults::sdk_error_line(&e),
                    SOURCE_QUEUE_VARS.join(", ")
                );
            }
            homes
        }
    };
    match sources.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!("no queue dead-letters to {dlq_url}: nothing to redrive to"),
        many => anyhow::bail!(
            "several queues dead-letter to {dlq_url} ({}): pass --queue-url to choose",
            many.join(", ")
        ),
    }
}

/// What to redrive.
#[derive(Debug, Clone)]
pub struct RedriveOptions {
    /// The dead-letter queue.
    pub dlq_url: String,
    /// Where the messages go back to: a queue whose redrive policy names the DLQ
    /// ([`home_queue`] finds or checks it).
    pub queue_url: String,
    /// Only dead letters with this `error_code` (`max_receives` for those SQS moved).
    pub error_code: Option<String>,
    /// At most this many.
    pub max: Option<usize>,
    /// Move the codes that are never redriven too ([`NEVER_REDRIVEN`]).
    pub force: bool,
}

/// How a redrive went.
#[derive(Debug, Clone)]
pub struct RedriveReport {
    /// Messages moved back.
    pub moved: u64,
    /// `StartMessageMoveTask` or `manual`.
    pub method: &'static str,
    /// Messages left in the DLQ because their code is never redriven, by code.
    pub kept: std::collections::BTreeMap<String, u64>,
}

/// Moves dead letters back to the source queue. Refuses a queue that does not dead-letter to
/// the DLQ ([`home_queue`]): its processor could not process them.
pub async fn redrive(sqs: &aws_sdk_sqs::Client, opts: &RedriveOptions) -> Result<RedriveReport> {
    check_filter(opts.error_code.as_deref(), opts.force)?;
    home_queue(sqs, &opts.dlq_url, Some(&opts.queue_url)).await?;
    // The move task moves everything: only when nothing is to stay behind. Never from a FIFO
    // dead-letter queue: a move keeps each message's group, and there each letter is a group of
    // its own; one by one, each goes back in the group it came from (`source_group`).
    if opts.error_code.is_none()
        && opts.max.is_none()
        && opts.force
        && !opts.dlq_url.ends_with(".fifo")
    {
        let (source, destination) = (
            lambda_local::esm::queue_arn(sqs, &opts.dlq_url).await?,
            lambda_local::esm::queue_arn(sqs, &opts.queue_url).await?,
        );
        match sqs
            .start_message_move_task()
            .source_arn(&source)
            .destination_arn(&destination)
            .send()
            .await
        {
            Ok(task) => {
                let handle = task.task_handle().unwrap_or_default().to_owned();
                for _ in 0..600 {
                    let tasks = sqs
                        .list_message_move_tasks()
                        .source_arn(&source)
                        .send()
                        .await?;
                    if let Some(t) = tasks.results().iter().find(|t| {
                        t.task_handle() == Some(handle.as_str()) || tasks.results().len() == 1
                    }) {
                        match t.status() {
                            Some("COMPLETED") => {
                                return Ok(RedriveReport {
                                    moved: t.approximate_number_of_messages_moved() as u64,
                                    method: "StartMessageMoveTask",
                                    kept: Default::default(),
                                })
                            }
                            Some("FAILED") | Some("CANCELLED") => anyhow::bail!(
                                "the message move task ended {:?}: {:?}",
                                t.status(),
                                t.failure_reason()
                            ),
                            _ => {}
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                anyhow::bail!("the message move task did not finish in 5 minutes");
            }
            Err(e) => {
                tracing::info!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "StartMessageMoveTask unavailable here; moving messages one by one");
            }
        }
    }
    let fifo = opts.queue_url.ends_with(".fifo");
    let mut moved = 0u64;
    let mut kept: std::collections::BTreeMap<String, u64> = Default::default();
    let mut skipped = Vec::new();
    let mut empty = 0;
    while empty < 2 && opts.max.is_none_or(|m| (moved as usize) < m) {
        let batch = receive(sqs, &opts.dlq_url, 60).await?;
        if batch.is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        for m in batch {
            let i = info(&m);
            let code = i
                .error_code
                .clone()
                .unwrap_or_else(|| "max_receives".to_owned());
            // A letter whose body was cut to fit is read, never redriven (not even forced):
            // it is no longer the message it was.
            let trimmed = attr(&m, attrs::BODY_TRIMMED).is_some();
            let held_back = trimmed || (!opts.force && never_redriven(&code).is_some());
            let wanted = opts.error_code.as_ref().is_none_or(|c| *c == code)
                && opts.max.is_none_or(|mx| (moved as usize) < mx)
                && !held_back;
            let rh = m.receipt_handle().unwrap_or_default().to_owned();
            if !wanted {
                // Kept: what this redrive would have moved but for its code (a code it was
                // not asked to move is not "kept", merely left).
                let asked = opts.error_code.as_ref().is_none_or(|c| *c == code);
                if held_back && asked && !skipped.iter().any(|(id, _)| *id == i.message_id) {
                    *kept.entry(code).or_default() += 1;
                }
                skipped.push((i.message_id.clone(), rh));
                continue;
            }
            let mut send = sqs
                .send_message()
                .queue_url(&opts.queue_url)
                .message_body(&i.body);
            // Its first send's time, and the payment's trace, which goes on with it.
            let traced = [sqs_once::trace::TRACEPARENT, sqs_once::trace::TRACESTATE];
            let copied = first_sent(&m)
                .map(|t| (attrs::FIRST_SENT_AT, t.to_string()))
                .into_iter()
                .chain(
                    traced
                        .into_iter()
                        .filter_map(|n| attr(&m, n).map(|v| (n, v))),
                );
            for (name, value) in copied {
                send = send.message_attributes(
                    name,
                    MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(value)
                        .build()?,
                );
            }
            if fifo {
                // The group it had in its source queue: kept by the processor's letter (each of
                // which is a group of its own here), or the one SQS moved it with.
                let group = attr(&m, attrs::SOURCE_GROUP)
                    .or_else(|| sys_attr(&m, MessageSystemAttributeName::MessageGroupId))
                    .or(i.payment_id.as_deref().map(sqs_once::queue::fifo_id))
                    .unwrap_or_else(|| "redrive".to_owned());
                send = send
                    .message_group_id(group)
                    .message_deduplication_id(&i.message_id);
            }
            send.send()
                .await
                .context("sending a dead letter back to the source queue")?;
            sqs.delete_message()
                .queue_url(&opts.dlq_url)
                .receipt_handle(&rh)
                .send()
                .await
                .context("deleting a redriven dead letter")?;
            moved += 1;
        }
    }
    release(sqs, &opts.dlq_url, &skipped).await?;
    Ok(RedriveReport {
        moved,
        method: "manual",
        kept,
    })
}
