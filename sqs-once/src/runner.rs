//! The batch runner: one SQS batch in, the messages that must come back out.
//!
//! [`BatchRunner::handle_batch`] is the whole Lambda handler minus the runtime: it takes the
//! SQS records and the invocation deadline and returns the `SqsBatchResponse` listing exactly
//! the messages that must come back. Each message runs in its own task, so a panic in one is a
//! batch item failure for that message only. Messages of one FIFO `MessageGroupId` run one
//! after another; after a failure the rest of the group is returned unprocessed. What happens
//! to one message (claim, execute, complete) is in `attempt.rs`.
//!
//! Why ~530 lines: the batch loop and its report to Lambda, with ~40 lines of unit tests; the
//! per-message work is in `attempt.rs` and `call.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use tokio::sync::Semaphore;
use tracing::{error, warn, Instrument};

use crate::clock::Clock;
pub use crate::metrics::BatchSummary;
use crate::queue::{attrs, QueueLimits, QueueOps, Requeue};
use crate::record::IdempotencyStore;
use crate::redelivery::{delay_for, BackoffPolicy, Budget, Redelivery};
use crate::settings::Settings;
use crate::work::Work;

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Executed (or its outcome found) by this delivery and acknowledged, under the label
    /// [`Work::verdict`] gave its outcome.
    Done(String),
    /// A duplicate of a completed key: acknowledged without executing.
    Duplicate,
    /// Sent to the DLQ with this code, then deleted from the source queue.
    DeadLettered(String),
    /// Must come back: reported as a batch item failure, hidden until `back_at_ms`.
    Retry {
        /// Why.
        reason: String,
        /// When the message becomes visible again, epoch ms (its redelivery delay, or the
        /// queue's visibility timeout when the delay could not be set).
        back_at_ms: i64,
    },
    /// Never attempted and on its last receive: sent again as a fresh copy and deleted
    /// (counted with the messages handed back; not a batch item failure).
    Requeued(String),
}

/// As logs and people read it: the label (`charged`), `duplicate`, `dead_lettered: CODE`,
/// `retry: REASON`, `requeued: REASON`.
impl std::fmt::Display for Disposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Disposition::Done(label) => f.write_str(label),
            Disposition::Duplicate => f.write_str("duplicate"),
            Disposition::DeadLettered(code) => write!(f, "dead_lettered: {code}"),
            Disposition::Retry { reason, .. } => write!(f, "retry: {reason}"),
            Disposition::Requeued(reason) => write!(f, "requeued: {reason}"),
        }
    }
}

/// The runner with its work and ports. Build once per process, share across invocations.
pub struct BatchRunner<W: Work> {
    /// What is done once per key.
    pub(crate) work: Arc<W>,
    /// Idempotency records.
    pub(crate) store: Arc<dyn IdempotencyStore>,
    /// Source queue and DLQ operations.
    pub(crate) queues: Arc<dyn QueueOps>,
    /// Protocol tunables.
    pub(crate) settings: Settings,
    /// Leases, deadlines and ages are read from it.
    pub(crate) clock: Arc<dyn Clock>,
    /// What [`BatchRunner::handle_event`] prints as EMF metrics (`None`: no metrics).
    pub(crate) metrics: Option<crate::metrics::MetricNames>,
    /// The downstream's request pace (`None`: unpaced).
    pub(crate) pace: Option<Arc<crate::pace::Pace>>,
    /// How long claims take, for the allowance between a booked slot and its call.
    pub(crate) claim_times: crate::claim_times::ClaimTimes,
}

/// Epoch ms on this host's clock.
pub fn now_ms() -> i64 {
    crate::clock::SystemClock.now_ms()
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

impl<W: Work> BatchRunner<W> {
    /// Assembles the runner from its work and ports. Makes no call.
    pub fn new(
        work: Arc<W>,
        store: Arc<dyn IdempotencyStore>,
        queues: Arc<dyn QueueOps>,
        settings: Settings,
    ) -> Self {
        Self {
            work,
            store,
            queues,
            settings,
            clock: crate::clock::system(),
            metrics: None,
            pace: None,
            claim_times: Default::default(),
        }
    }

    /// Paces the work's downstream requests: a message whose work calls the downstream
    /// ([`Work::paces_first_call`]) is claimed only once a slot for its first request is booked,
    /// no later than the invocation allows; one whose slot would come too late is handed back
    /// unattempted (see [`crate::pace`]). Give the work's client the same pace, to call
    /// [`crate::pace::Pace::acquire`] before each request.
    pub fn with_pace(mut self, pace: Arc<crate::pace::Pace>) -> Self {
        self.pace = Some(pace);
        self
    }

    /// Prints the batch's metrics as EMF lines from [`BatchRunner::handle_event`].
    pub fn with_metrics(mut self, names: crate::metrics::MetricNames) -> Self {
        self.metrics = Some(names);
        self
    }

    /// Replaces the clock (tests drive time with tokio's paused clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The tunables in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The work.
    pub fn work(&self) -> &W {
        &self.work
    }

    /// Processes a batch and returns the messages that must come back, with the batch's
    /// counts. `deadline_ms` is the invocation deadline (epoch ms). Never fails as a whole;
    /// when a message that must come back has no `messageId`, [`BatchSummary::unreportable`]
    /// says so and the caller fails the invocation instead of reporting an empty id.
    pub async fn handle_batch(
        self: &Arc<Self>,
        records: Vec<SqsMessage>,
        deadline_ms: i64,
    ) -> (SqsBatchResponse, BatchSummary) {
        let batch = crate::trace::batch_span(&records);
        // Groups keep FIFO order; a standard queue's messages are each their own group.
        let mut groups: Vec<Vec<Arc<SqsMessage>>> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for r in records {
            let r = Arc::new(r);
            match r.attributes.get("MessageGroupId").cloned() {
                Some(g) => match index.get(&g) {
                    Some(&i) => groups[i].push(r),
                    None => {
                        index.insert(g, groups.len());
                        groups.push(vec![r]);
                    }
                },
                None => groups.push(vec![r]),
            }
        }
        let permits = Arc::new(Semaphore::new(self.settings.max_concurrency.max(1)));
        // Everything unfinished is reported this early, so the response beats the deadline.
        let cutoff = tokio::time::Instant::now()
            + Duration::from_millis(
                (deadline_ms - ms(self.settings.deadline_safety) - self.clock.now_ms()).max(0)
                    as u64,
            );
        let mut tasks = Vec::with_capacity(groups.len());
        for group in groups {
            let batch = batch.clone();
            let msgs: Vec<Arc<SqsMessage>> = group.clone();
            let this = Arc::clone(self);
            let permits = Arc::clone(&permits);
            let task = tokio::spawn(
                async move {
                    let mut out = Vec::with_capacity(group.len());
                    let mut blocked = false;
                    // Once one message of the group went to its end as a fresh copy, every later
                    // one goes after it, whatever its receive count: handed back in place, a
                    // follower received fewer times would come before the copy (m1, m3, m2').
                    let mut moved_to_end = false;
                    // The message that blocks the group only waited for the downstream's pace (its
                    // next slot, epoch ms): its followers wait with it, as it does, without a cap
                    // on their copies (waiting is bounded by the record retention, not receives).
                    let mut waiting: Option<i64> = None;
                    for msg in group {
                        if blocked {
                            let reason = "an earlier message of its FIFO group failed".to_owned();
                            let when = waiting.map_or(Redelivery::NotAttempted, Redelivery::Paced);
                            let d = if moved_to_end {
                                this.requeue_behind(&msg, reason, waiting.is_some()).await
                            } else {
                                this.give_back(&msg, reason, when).await
                            };
                            moved_to_end |= matches!(d, Disposition::Requeued(_));
                            out.push((d, Vec::new()));
                            continue;
                        }
                        let (d, latencies, paced) =
                            this.run_isolated(&msg, deadline_ms, cutoff, &permits).await;
                        // A requeued message goes to the end of its group: what follows it waits too,
                        // and goes there after it.
                        blocked = matches!(d, Disposition::Retry { .. } | Disposition::Requeued(_));
                        moved_to_end |= matches!(d, Disposition::Requeued(_));
                        waiting = paced.filter(|_| blocked);
                        out.push((d, latencies));
                    }
                    out
                }
                .instrument(batch),
            );
            tasks.push((msgs, task));
        }
        let mut response = SqsBatchResponse::default();
        let mut summary = BatchSummary::default();
        // Dropping the batch (an event-source mapping that gave up on it) stops its work.
        let _guards: Vec<AbortOnDrop> = tasks
            .iter()
            .map(|(_, t)| AbortOnDrop(t.abort_handle()))
            .collect();
        for (msgs, t) in tasks {
            // A group's task only ends without results if it panicked outside a message's own
            // task or the runtime cancelled it: nothing of the group is known to be finished,
            // so all of it comes back, through the same delay and receive budget as any
            // failure (a duplicate of what did finish is absorbed by its record).
            let results = match t.await {
                Ok(results) => results,
                Err(e) => {
                    error!(error = %e, "a message group's task ended without results; its messages will be redelivered");
                    let mut out = Vec::with_capacity(msgs.len());
                    for msg in &msgs {
                        let d = self
                            .give_back(
                                msg,
                                "the message group's task ended without results".into(),
                                Redelivery::Backoff,
                            )
                            .await;
                        out.push((d, Vec::new()));
                    }
                    out
                }
            };
            let ids = msgs.iter().map(|m| m.message_id.clone());
            for (id, (d, latencies)) in ids.zip(results) {
                summary.call_latencies_ms.extend(latencies);
                match d {
                    Disposition::Done(label) => *summary.done.entry(label).or_default() += 1,
                    Disposition::Duplicate => summary.duplicates += 1,
                    Disposition::DeadLettered(code) => {
                        *summary.dead_lettered.entry(code).or_default() += 1
                    }
                    Disposition::Requeued(_) => summary.retried += 1,
                    Disposition::Retry { back_at_ms, .. } => {
                        summary.retried += 1;
                        summary.returns_at_ms.push(back_at_ms);
                        match id.filter(|i| !i.is_empty()) {
                            Some(id) => response.add_failure(id),
                            None => summary.unreportable += 1,
                        }
                    }
                }
            }
        }
        (response, summary)
    }

    /// Runs one message in its own task so that a panic stays inside it; starts it only with
    /// time enough to execute, and stops it at the cutoff. Also says when the pace has its next
    /// slot if the message only waited for it.
    async fn run_isolated(
        self: &Arc<Self>,
        msg: &Arc<SqsMessage>,
        deadline_ms: i64,
        cutoff: tokio::time::Instant,
        permits: &Arc<Semaphore>,
    ) -> (Disposition, Vec<f64>, Option<i64>) {
        let not_started = || "not started: the invocation deadline is near".to_owned();
        let Ok(Ok(_permit)) =
            tokio::time::timeout_at(cutoff, permits.clone().acquire_owned()).await
        else {
            return (
                self.give_back(msg, not_started(), Redelivery::NotAttempted)
                    .await,
                Vec::new(),
                None,
            );
        };
        let needed = self.work.call_timeout() + self.settings.deadline_safety;
        if self.clock.now_ms() + ms(needed) >= deadline_ms {
            return (
                self.give_back(msg, not_started(), Redelivery::NotAttempted)
                    .await,
                Vec::new(),
                None,
            );
        }
        // The span carries the message's identity on every line logged inside it, and continues
        // its producer's trace.
        let span = crate::trace::message_span(msg, &tracing::Span::current());
        let this = Arc::clone(self);
        let task_msg = Arc::clone(msg);
        let mut task = tokio::spawn(
            async move {
                let latencies = Mutex::new(Vec::new());
                let (d, paced) = this.process_step(&task_msg, deadline_ms, &latencies).await;
                (d, latencies.into_inner().unwrap_or_default(), paced)
            }
            .instrument(span.clone()),
        );
        let _guard = AbortOnDrop(task.abort_handle());
        let (reason, when) = match tokio::time::timeout_at(cutoff, &mut task).await {
            Ok(Ok(done)) => return done,
            Err(_) => {
                // Stopped where it stood, as a timeout would: its lease ends by the deadline
                // plus the margin and the next delivery takes over.
                task.abort();
                let _g = span.enter();
                warn!("unfinished at the invocation deadline; the message will be redelivered");
                (
                    "unfinished at the invocation deadline".to_owned(),
                    Redelivery::At(deadline_ms + ms(self.settings.deadline_margin)),
                )
            }
            Ok(Err(e)) => {
                let _g = span.enter();
                error!(error = %e, "message handler panicked; the message will be redelivered");
                ("handler panicked".to_owned(), Redelivery::Backoff)
            }
        };
        (
            self.give_back(msg, reason, when).instrument(span).await,
            Vec::new(),
            None,
        )
    }

    /// Hands a message back to the queue with the delay `when` decides, or, on the last
    /// receive its budget allows, dead-letters it as `retries_exhausted` with the reason, so
    /// that SQS never moves a message without one.
    pub(crate) async fn give_back(
        &self,
        msg: &SqsMessage,
        reason: String,
        when: Redelivery,
    ) -> Disposition {
        let budget = self.budget_of(msg).await;
        let why = if budget.exhausted() {
            Some(format!(
                "gave up on delivery {} of at most {} (the queue's maxReceiveCount): {reason}",
                budget.receive_count,
                budget.max_receive_count.unwrap_or_default()
            ))
        } else if budget.out_of_retention(self.clock.now_ms()) {
            Some(format!(
                "gave up on delivery {}: the queue's retention deletes the message before another \
                 delivery could come back and finish (retention margin {} s): {reason}",
                budget.receive_count,
                self.settings.retention_margin.as_secs()
            ))
        } else {
            None
        };
        // Never attempted: with half its receives spent (so that a crash in the next
        // invocation, or a duplicate SQS delivers later, does not find it on its last receive,
        // which SQS would move without a reason), or at its queue's retention margin, it goes
        // back as a fresh copy (a new receive count and retention), not to the DLQ.
        let paced = matches!(when, Redelivery::Paced(_));
        let spent =
            budget.half_spent() && !crate::mutation::on("requeued_only_on_the_last_receive");
        if (when == Redelivery::NotAttempted || paced) && (spent || why.is_some()) {
            if let Some(d) = self.requeue(msg, &budget, &reason, paced).await {
                return d;
            }
        }
        if let Some(why) = why {
            let body = msg.body.clone().unwrap_or_default();
            let request = self.work.parse(&body).ok();
            return self
                .dead_letter(
                    msg,
                    &body,
                    "retries_exhausted",
                    &why,
                    request.as_ref(),
                    None,
                )
                .await;
        }
        let back_at_ms = self.hide(msg, &reason, when, &budget).await;
        Disposition::Retry { reason, back_at_ms }
    }

    /// A FIFO follower behind a message of its group that went to the group's end as a fresh
    /// copy: it follows it there, in order, whatever its own receive count. Handed back as any
    /// unattempted message when it cannot be copied (the queue port refused, or it was copied
    /// as often as the queue allows receives while the group did not only wait for the pace:
    /// `waited`).
    async fn requeue_behind(&self, msg: &SqsMessage, reason: String, waited: bool) -> Disposition {
        let budget = self.budget_of(msg).await;
        match self.requeue(msg, &budget, &reason, waited).await {
            Some(d) => d,
            None => self.give_back(msg, reason, Redelivery::NotAttempted).await,
        }
    }

    /// Sends a fresh copy of a message that was never attempted and is on its last receive,
    /// then deletes it: only attempts spend the budget. `None` when it cannot (no queue port
    /// support, requeued as often as the queue allows receives unless it only `waited` for the
    /// downstream's pace, the send failed): the caller dead-letters it then, with the reason.
    async fn requeue(
        &self,
        msg: &SqsMessage,
        budget: &Budget,
        reason: &str,
        waited: bool,
    ) -> Option<Disposition> {
        let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) else {
            return None;
        };
        let requeued: u32 = msg
            .message_attributes
            .get(attrs::REQUEUED)
            .and_then(|a| a.string_value.as_deref())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        // Never attempted in a whole budget of deliveries, that many times: something keeps
        // every invocation from reaching it (a batch larger than an invocation can finish).
        if !waited && requeued >= budget.max_receive_count.unwrap_or(0) {
            return None;
        }
        let mut attributes: Vec<(String, String)> = msg
            .message_attributes
            .iter()
            .filter(|(k, _)| k.as_str() != attrs::REQUEUED && k.as_str() != attrs::FIRST_SENT_AT)
            // The producer's `String` attributes (a copy sends them as `String`).
            .filter(|(_, v)| v.data_type.as_deref().unwrap_or("String") == "String")
            .filter_map(|(k, v)| Some((k.clone(), v.string_value.clone()?)))
            .collect();
        // The same eight each time (by name), not the map's order of the moment: SQS allows
        // 10 attributes, and two are ours.
        attributes.sort();
        attributes.truncate(8);
        if let Some(t) = first_sent_at_ms(msg) {
            attributes.push((attrs::FIRST_SENT_AT.to_owned(), t.to_string()));
        }
        attributes.push((attrs::REQUEUED.to_owned(), (requeued + 1).to_string()));
        let message_id = msg.message_id.clone().unwrap_or_default();
        let group = msg.attributes.get("MessageGroupId").cloned();
        let copy = Requeue {
            source_arn: arn.clone(),
            body: msg.body.clone().unwrap_or_default(),
            source_message_id: message_id.clone(),
            attributes,
            deduplication_id: group
                .as_ref()
                .map(|_| format!("{message_id}-requeued-{}", requeued + 1)),
            message_group_id: group,
        };
        if let Err(e) = self.queues.requeue(&copy).await {
            warn!(error = %e, "could not requeue a message that was never attempted");
            return None;
        }
        if let Err(e) = self.queues.delete(arn, rh).await {
            // Reported as a success, so the event source mapping deletes it instead; should
            // it come back anyway, its record absorbs the copy.
            warn!(error = %e, "could not delete the requeued message");
        }
        warn!(
            reason = %reason,
            requeued = requeued + 1,
            "never attempted on its last receive: requeued as a fresh copy"
        );
        Some(Disposition::Requeued(reason.to_owned()))
    }

    /// Keeps a message that comes back hidden for the delay `when` decides; returns when it
    /// becomes visible again, epoch ms.
    pub(crate) async fn hide(
        &self,
        msg: &SqsMessage,
        reason: &str,
        when: Redelivery,
        budget: &Budget,
    ) -> i64 {
        let now = self.clock.now_ms();
        let delay = delay_for(when, budget, &self.backoff_policy(), now);
        warn!(reason = %reason, delay_s = delay.as_secs(), "message will be redelivered");

        if let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) {
            // Whole seconds, rounded up: a message never comes back earlier than decided.
            let secs = delay.as_millis().div_ceil(1000).min(43_200) as i32;
            if let Err(e) = self.queues.change_visibility(arn, rh, secs).await {
                warn!(error = %e, "could not set the redelivery delay; the queue's visibility timeout applies");
                crate::trace::on_message(
                    "messaging.aws_sqs.redelivery_delay_s",
                    self.settings.visibility_timeout.as_secs() as i64,
                );
                return now + ms(self.settings.visibility_timeout);
            }
            // The delay in effect: whole seconds, rounded up, within SQS's 12 hours.
            crate::trace::on_message("messaging.aws_sqs.redelivery_delay_s", i64::from(secs));
            return now + i64::from(secs) * 1000;
        }
        crate::trace::on_message(
            "messaging.aws_sqs.redelivery_delay_s",
            delay.as_millis().div_ceil(1000) as i64,
        );
        now + ms(delay)
    }

    /// The delivery's receive budget: its receive count, its queue's `maxReceiveCount` (the
    /// redrive policy; `QUEUE_MAX_RECEIVE_COUNT` when it cannot be read) and the end of the
    /// queue's retention, read once per queue.
    pub(crate) async fn budget_of(&self, msg: &SqsMessage) -> Budget {
        let fallback = QueueLimits {
            max_receive_count: self.settings.max_receive_count,
            retention: None,
        };
        let limits = match msg.event_source_arn.as_deref() {
            Some(arn) => match self.queues.limits(arn).await {
                Ok(limits) => limits,
                Err(e) => {
                    warn!(error = %e, "could not read the queue's redrive policy and retention; using QUEUE_MAX_RECEIVE_COUNT");
                    fallback
                }
            },
            None => fallback,
        };
        Budget::of(msg, limits, self.settings.retention_margin)
    }

    fn backoff_policy(&self) -> BackoffPolicy {
        BackoffPolicy {
            base: self.settings.redelivery_base_delay,
            max: self.settings.redelivery_max_delay,
            horizon: self.settings.retry_horizon,
        }
    }
}

/// Aborts a spawned task when dropped, so work never outlives the batch that started it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Seconds to extend a message's visibility by, so that its total stays within SQS's 12 hours
/// from receipt; zero when nothing is left.
pub fn visibility_extension(visibility: Duration, held_for: Duration) -> Duration {
    const CAP: Duration = Duration::from_secs(12 * 3600);
    visibility.min(CAP.saturating_sub(held_for + Duration::from_secs(1)))
}

/// Epoch ms of the first send: the earlier of the `first_sent_at` attribute (a redriven dead
/// letter carries its original's) and SQS's `SentTimestamp`. A producer can make a message
/// look older, never younger than SQS saw it.
pub(crate) fn first_sent_at_ms(msg: &SqsMessage) -> Option<i64> {
    let carried = msg
        .message_attributes
        .get(attrs::FIRST_SENT_AT)
        .and_then(|a| a.string_value.as_deref())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let sent = msg
        .attributes
        .get("SentTimestamp")
        .and_then(|v| v.parse::<i64>().ok());
    match (carried, sent) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disposition_reads_as_words_not_as_rust() {
        assert_eq!(Disposition::Done("charged".into()).to_string(), "charged");
        assert_eq!(Disposition::Duplicate.to_string(), "duplicate");
        assert_eq!(
            Disposition::DeadLettered("invalid_json".into()).to_string(),
            "dead_lettered: invalid_json"
        );
        assert_eq!(
            Disposition::Retry {
                reason: "provider 503".into(),
                back_at_ms: 0
            }
            .to_string(),
            "retry: provider 503"
        );
    }

    #[test]
    fn visibility_extensions_stay_within_twelve_hours_of_receipt() {
        let v = Duration::from_secs(390);
        assert_eq!(visibility_extension(v, Duration::from_secs(60)), v);
        let held = Duration::from_secs(12 * 3600 - 100);
        assert_eq!(visibility_extension(v, held), Duration::from_secs(99));
        assert!(visibility_extension(v, Duration::from_secs(12 * 3600)).is_zero());
    }

    #[test]
    fn a_message_is_as_old_as_its_earliest_send() {
        let mut m = SqsMessage::default();
        m.attributes.insert("SentTimestamp".into(), "5000".into());
        assert_eq!(first_sent_at_ms(&m), Some(5000));
        let carried = |v: &str| {
            let mut a = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
            a.string_value = Some(v.into());
            a.data_type = Some("String".into());
            a
        };
        m.message_attributes
            .insert(attrs::FIRST_SENT_AT.into(), carried("1000"));
        assert_eq!(
            first_sent_at_ms(&m),
            Some(1000),
            "a redriven original is older"
        );
        m.message_attributes
            .insert(attrs::FIRST_SENT_AT.into(), carried("9000"));
        assert_eq!(
            first_sent_at_ms(&m),
            Some(5000),
            "a producer cannot make a message younger than SQS saw it"
        );
    }
}
