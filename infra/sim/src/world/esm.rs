//! Lambda's event-source mapping for the processor: long polls, batches, invokes up to its
//! maximum concurrency on instances reused or cold, kills an invocation at its deadline or a
//! crash, deletes what the batch response does not report as failed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsMessage, SqsMessageAttribute};
use sqs_once::{BatchRunner, Work};

use super::checks::check_now;
use super::World;
use crate::sqs::{arn_of, url_of, Message};

/// The Lambda record of a received message, as the event-source mapping builds it.
fn record_of(m: &Message, queue: &str, fifo: bool) -> SqsMessage {
    let mut r = SqsMessage::default();
    r.message_id = Some(m.id.clone());
    r.receipt_handle = m.handle.clone();
    r.body = Some(m.body.clone());
    let attrs = crate::sqs::Sqs::message_json(fifo, m);
    r.attributes = attrs["Attributes"]
        .as_object()
        .map(|a| {
            a.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    r.message_attributes = m
        .attributes
        .iter()
        .map(|(k, v)| {
            let mut a = SqsMessageAttribute::default();
            a.string_value = v["StringValue"].as_str().map(str::to_owned);
            a.data_type = v["DataType"].as_str().map(str::to_owned);
            (k.clone(), a)
        })
        .collect();
    r.event_source_arn = Some(arn_of(queue));
    r.event_source = Some("aws:sqs".into());
    r.aws_region = Some("us-east-1".into());
    r
}

/// A function and the queue its event-source mapping reads, as the template declares them.
pub(super) struct Source<W: Work> {
    /// The source queue's name.
    pub queue: String,
    /// `BatchSize`.
    pub batch: usize,
    /// `MaximumBatchingWindowInSeconds`, ms.
    pub window_ms: i64,
    /// The function's timeout, s.
    pub timeout_s: i64,
    /// `MaximumConcurrency`.
    pub concurrency: usize,
    /// The function's init: a new instance (a cold start).
    pub init: Arc<dyn Fn() -> Arc<BatchRunner<W>> + Send + Sync>,
}

type Idle<W> = Arc<Mutex<Vec<Arc<BatchRunner<W>>>>>;

/// Lambda's event-source mapping for a function: polls, batches, invokes up to its maximum
/// concurrency, deletes what the response does not report as failed.
pub(super) async fn event_source<W: Work + 'static>(w: Arc<World>, s: Source<W>, end_ms: i64) {
    let s = Arc::new(s);
    let idle: Idle<W> = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(tokio::sync::Semaphore::new(s.concurrency.max(1)));
    let fifo = s.queue.ends_with(".fifo");
    let (queue, batch) = (s.queue.clone(), s.batch);
    loop {
        if !w.running(end_ms) {
            break;
        }
        let permit = Arc::clone(&running).acquire_owned().await.expect("open");
        let down = w.wire.aws.lock().expect("aws").sqs_down(w.clock.now_ms());
        if down {
            // SQS is down: the poller's receive fails, and it tries again a little later.
            drop(permit);
            tokio::time::sleep(Duration::from_secs(10)).await;
            continue;
        }
        let mut msgs = {
            let mut aws = w.wire.aws.lock().expect("aws");
            let now = w.clock.now_ms();
            aws.sqs
                .receive(&url_of(&queue), batch, None, now)
                .unwrap_or_default()
        };
        if !msgs.is_empty() {
            gather(&w, &queue, batch, s.window_ms, &mut msgs).await;
        }
        if msgs.is_empty() {
            drop(permit);
            // Long polling: the mapping asks again as soon as a message arrives or one in
            // flight becomes visible again (and at least every 20 s, as a long poll ends).
            let (arrivals, next) = {
                let aws = w.wire.aws.lock().expect("aws");
                (
                    aws.sqs.arrivals(&url_of(&queue)),
                    aws.sqs.next_visible(&url_of(&queue), w.clock.now_ms()),
                )
            };
            let now = w.clock.now_ms();
            let wait = next.map_or(20_000, |n| (n - now).clamp(1, 20_000));
            let _ =
                tokio::time::timeout(Duration::from_millis(wait as u64), arrivals.notified()).await;
            continue;
        }
        let records: Vec<SqsMessage> = msgs.iter().map(|m| record_of(m, &queue, fifo)).collect();
        {
            // Invocations at once: this one (its permit held) and those running.
            let busy = s.concurrency.max(1) - running.available_permits();
            let mut stats = w.stats.lock().expect("stats");
            let peak = stats.peak_concurrency.entry(s.queue.clone()).or_default();
            *peak = (*peak).max(busy);
        }
        let instance = idle.lock().expect("idle").pop();
        let (w2, idle2, s2) = (Arc::clone(&w), Arc::clone(&idle), Arc::clone(&s));
        tokio::spawn(async move {
            let _permit = permit;
            let (instance, cold) = match instance {
                Some(i) => (i, false),
                None => {
                    // A cold start: the init runs before the batch (~150 ms on arm64).
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    ((s2.init)(), true)
                }
            };
            invoke(&w2, &s2, instance, records, cold, &idle2).await;
        });
    }
}

/// The batching window: the mapping goes on receiving until the batch is full or the window
/// since its first receive has passed (or SQS fails it). What it received meanwhile is in
/// flight: its visibility runs from its receive, not from the invocation.
async fn gather(w: &World, queue: &str, batch: usize, window_ms: i64, msgs: &mut Vec<Message>) {
    let until = w.clock.now_ms() + window_ms;
    while msgs.len() < batch {
        let now = w.clock.now_ms();
        if now >= until {
            break;
        }
        let (arrivals, next) = {
            let aws = w.wire.aws.lock().expect("aws");
            (
                aws.sqs.arrivals(&url_of(queue)),
                aws.sqs.next_visible(&url_of(queue), now),
            )
        };
        let wait = next.map_or(until - now, |n| (n - now).clamp(1, until - now));
        let _ = tokio::time::timeout(Duration::from_millis(wait as u64), arrivals.notified()).await;
        let mut aws = w.wire.aws.lock().expect("aws");
        let now = w.clock.now_ms();
        if aws.sqs_down(now) {
            break;
        }
        let more = aws
            .sqs
            .receive(&url_of(queue), batch - msgs.len(), None, now)
            .unwrap_or_default();
        msgs.extend(more);
    }
}

/// One invocation: the runner's `handle_batch` until it answers, the deadline kills it, or a
/// crash does; then the mapping deletes what succeeded.
async fn invoke<W: Work + 'static>(
    w: &Arc<World>,
    s: &Source<W>,
    instance: Arc<BatchRunner<W>>,
    records: Vec<SqsMessage>,
    cold: bool,
    idle: &Idle<W>,
) {
    let timeout_s = s.timeout_s;
    {
        let mut s = w.stats.lock().expect("stats");
        s.invocations += 1;
        s.cold_starts += cold as u64;
    }
    let deadline_ms = w.clock.now_ms() + timeout_s * 1000;
    // A crash lands at a moment of the invocation's work: exponential with a mean of one
    // second (a batch's typical length), so that most land while it works, some late.
    let crash_at = (w.draw() < w.opts.crash_rate)
        .then(|| Duration::from_secs_f64((-(1.0 - w.draw()).ln()).min(timeout_s as f64)));
    let ids: Vec<(String, String)> = records
        .iter()
        .map(|r| {
            (
                r.message_id.clone().unwrap_or_default(),
                r.receipt_handle.clone().unwrap_or_default(),
            )
        })
        .collect();
    let run = {
        let instance = Arc::clone(&instance);
        tokio::spawn(async move { instance.handle_batch(records, deadline_ms).await })
    };
    let limit = crash_at.unwrap_or(Duration::from_secs(timeout_s as u64));
    let abort = run.abort_handle();
    let answered = tokio::time::timeout(limit, run).await;
    let response = match answered {
        Ok(Ok((response, _summary))) => response,
        _ => {
            // Killed (a crash, or the deadline): the process and everything it was doing are
            // gone; its messages come back when their visibility ends.
            abort.abort();
            w.stats.lock().expect("stats").killed += 1;
            w.crashed_on
                .lock()
                .expect("crashed")
                .extend(ids.iter().map(|(id, _)| id.clone()));
            w.note(format!(
                "{}: invocation of {} killed after {limit:?}",
                s.queue,
                ids.len()
            ));
            check_now(w);
            return;
        }
    };
    let mut failed: BTreeSet<String> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    // Lambda takes a batch's answer as a whole failure when an identifier is empty or names no
    // message of the batch: nothing is deleted, every message comes back.
    if failed
        .iter()
        .any(|f| f.is_empty() || !ids.iter().any(|(id, _)| id == f))
    {
        w.note(format!(
            "{}: an unknown itemIdentifier among {failed:?}: the whole batch failed",
            s.queue
        ));
        failed = ids.iter().map(|(id, _)| id.clone()).collect();
    }
    {
        let mut aws = w.wire.aws.lock().expect("aws");
        // SQS down: the mapping cannot delete what succeeded; it comes back when its
        // visibility ends, and its record absorbs it.
        if !aws.sqs_down(w.clock.now_ms()) {
            for (id, handle) in &ids {
                if !failed.contains(id) {
                    let _ = aws.sqs.delete(&url_of(&s.queue), handle);
                }
            }
        }
    }
    w.note(format!(
        "{}: invocation of {}: {} handed back",
        s.queue,
        ids.len(),
        failed.len()
    ));
    idle.lock().expect("idle").push(instance);
    check_now(w);
}
