//! The consumer: claim, charge, complete for one message, and the batch around it.
//!
//! [`Processor::handle_batch`] is the whole Lambda handler minus the runtime: it takes the SQS
//! records and the invocation deadline and returns the `SqsBatchResponse` listing exactly the
//! messages that must come back. Each message runs in its own task, so a panic in one is a
//! batch item failure for that message only. Messages of one FIFO `MessageGroupId` run one
//! after another; after a failure the rest of the group is returned unprocessed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::Semaphore;
use tracing::{error, info, warn, Instrument};

use crate::clock::Clock;
use crate::domain::PaymentRequest;
use crate::idempotency::{
    decide_conflict, inherits_unknown_outcome, ClaimRequest, ClaimResult, ConflictDecision,
    DeadLetterMark, FailureNote, IdempotencyRecord, IdempotencyStore, Outcome, RecordStatus,
    StoreError,
};
use crate::provider::{FailureKind, PaymentProvider, ProviderError, ProviderResponse};
use crate::queue::{attrs, DeadLetter, QueueOps};
use crate::redelivery::{delay_for, BackoffPolicy, Budget, Redelivery};

/// Tunables of the protocol. Defaults suit the SAM template; tests shorten the times.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a claim holds the record before another attempt may take it over.
    pub lease: Duration,
    /// Record retention (`IDEMPOTENCY_TTL_SECONDS`): also the oldest message that is charged.
    pub record_ttl: Duration,
    /// Messages processed at once per batch (`MAX_CONCURRENCY`).
    pub max_concurrency: usize,
    /// Provider calls per delivery before the message is handed back to the queue.
    pub provider_attempts: usize,
    /// First delay between provider calls within one delivery.
    pub provider_retry_delay: Duration,
    /// Visibility delay after the first failed delivery; doubles per `ApproximateReceiveCount`.
    pub redelivery_base_delay: Duration,
    /// Cap of the redelivery delay.
    pub redelivery_max_delay: Duration,
    /// Leases end at most this long after the invocation deadline, so a timed-out attempt's
    /// record can be taken over by the next delivery.
    pub deadline_margin: Duration,
    /// The source queue's visibility timeout (`QUEUE_VISIBILITY_TIMEOUT_SECONDS`): what a
    /// heartbeat extends a message's visibility by, and a third of it is the beat.
    pub visibility_timeout: Duration,
    /// Unfinished messages are reported this long before the invocation deadline, so the
    /// response reaches Lambda in time.
    pub deadline_safety: Duration,
    /// How long the provider remembers an idempotency key (`PROVIDER_KEY_RETENTION_SECONDS`,
    /// Stripe: 24 hours).
    pub provider_key_retention: Duration,
    /// Slack subtracted from the key retention (`PROVIDER_KEY_RETENTION_MARGIN_SECONDS`): at
    /// least the longest attempt (lease + client timeout + processing allowance) plus clock
    /// skew; the configuration refuses less.
    pub key_retention_margin: Duration,
    /// How long the provider may still act on a call after the client gave up on it
    /// (`PROVIDER_PROCESSING_ALLOWANCE_SECONDS`). A call is sent only while the lease outlasts
    /// the client timeout plus this, and a `FAILED` record after an ambiguous call refuses
    /// claims until its last send plus both (`not_before`).
    pub provider_processing_allowance: Duration,
    /// How long the provider's search may lag behind its charges
    /// (`PROVIDER_SEARCH_LAG_SECONDS`): a lookup that finds nothing proves no charge only this
    /// long after the last call could have landed.
    pub search_lag: Duration,
    /// Transient failures this long never exhaust a message's receive budget
    /// (`RETRY_HORIZON_SECONDS`): the redelivery delays spread the receives left over it.
    pub retry_horizon: Duration,
    /// The source queue's `maxReceiveCount` when its redrive policy cannot be read
    /// (`QUEUE_MAX_RECEIVE_COUNT`); the queue's own policy wins when it can be.
    pub max_receive_count: Option<u32>,
}

impl Settings {
    /// One heartbeat schedule for the lease and the visibility: a third of the shorter.
    pub fn heartbeat_interval(&self) -> Duration {
        (self.lease.min(self.visibility_timeout) / 3).max(Duration::from_millis(100))
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            record_ttl: Duration::from_secs(DEFAULT_TTL_SECONDS),
            max_concurrency: 10,
            provider_attempts: 3,
            provider_retry_delay: Duration::from_millis(200),
            redelivery_base_delay: Duration::from_secs(10),
            redelivery_max_delay: Duration::from_secs(900),
            deadline_margin: Duration::from_secs(5),
            visibility_timeout: Duration::from_secs(390),
            deadline_safety: Duration::from_millis(500),
            provider_key_retention: Duration::from_secs(24 * 3600),
            key_retention_margin: Duration::from_secs(300),
            provider_processing_allowance: Duration::from_secs(5),
            search_lag: Duration::from_secs(60),
            retry_horizon: Duration::from_secs(3600),
            max_receive_count: None,
        }
    }
}

/// Default record retention: the queue's 4 days + the DLQ's 14 days + 3 days of margin.
pub const DEFAULT_TTL_SECONDS: u64 = 21 * 24 * 3600;
/// Clock skew allowed between SQS's `SentTimestamp` and this host.
const CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Charged (or found charged) by this delivery: acknowledged.
    Charged,
    /// Declined by the provider: recorded and acknowledged.
    Declined,
    /// A duplicate of a completed payment: acknowledged without a provider call.
    Duplicate,
    /// Sent to the DLQ with this code, then deleted from the source queue.
    DeadLettered(String),
    /// Must come back: reported as a batch item failure.
    Retry(String),
}

/// Counts of one batch, for metrics and logs.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BatchSummary {
    /// Payments charged by this batch.
    pub charged: u32,
    /// Declines recorded.
    pub declined: u32,
    /// Duplicates suppressed.
    pub duplicates: u32,
    /// Messages dead-lettered, by code.
    pub dead_lettered: HashMap<String, u32>,
    /// Messages handed back to the queue.
    pub retried: u32,
    /// Messages that must come back but carry no `messageId` to report them by: the
    /// invocation must fail as a whole so that the batch comes back (never an empty id).
    pub unreportable: u32,
    /// Duration of every provider charge call, milliseconds.
    pub provider_latencies_ms: Vec<f64>,
}

impl BatchSummary {
    /// Adds another batch's counts to these.
    pub fn merge(&mut self, other: &BatchSummary) {
        self.charged += other.charged;
        self.declined += other.declined;
        self.duplicates += other.duplicates;
        self.retried += other.retried;
        self.unreportable += other.unreportable;
        for (k, v) in &other.dead_lettered {
            *self.dead_lettered.entry(k.clone()).or_default() += v;
        }
        self.provider_latencies_ms
            .extend_from_slice(&other.provider_latencies_ms);
    }
}

/// The processor with its ports. Build once per process, share across invocations.
pub struct Processor {
    /// Idempotency records.
    store: Arc<dyn IdempotencyStore>,
    /// The payment provider.
    provider: Arc<dyn PaymentProvider>,
    /// Source queue and DLQ operations.
    queues: Arc<dyn QueueOps>,
    /// Protocol tunables.
    settings: Settings,
    /// Leases, deadlines and ages are read from it.
    clock: Arc<dyn Clock>,
}

/// Epoch ms on this host's clock.
pub fn now_ms() -> i64 {
    crate::clock::SystemClock.now_ms()
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

pub use crate::redelivery::redelivery_delay;

/// Where the message stands after the claim.
enum Claimed {
    /// We hold the lease.
    Owner(Attempt),
    /// No charge to do: the disposition is known.
    Done(Disposition),
}

/// The end of one message's work before the batch reports it.
enum Step {
    /// Finished: acknowledged or dead-lettered.
    Done(Disposition),
    /// Must come back, for this reason, not before the delay [`Redelivery`] decides.
    Again(String, Redelivery),
}

impl Processor {
    /// Assembles the processor from its ports.
    pub fn new(
        store: Arc<dyn IdempotencyStore>,
        provider: Arc<dyn PaymentProvider>,
        queues: Arc<dyn QueueOps>,
        settings: Settings,
    ) -> Self {
        Self {
            store,
            provider,
            queues,
            settings,
            clock: crate::clock::system(),
        }
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

    /// Processes a batch and returns the messages that must come back. `deadline_ms` is the
    /// invocation deadline (epoch ms). Never fails as a whole; when a message that must come
    /// back has no `messageId`, [`BatchSummary::unreportable`] says so and the caller fails the
    /// invocation instead of reporting an empty id.
    pub async fn handle_batch(
        self: &Arc<Self>,
        records: Vec<SqsMessage>,
        deadline_ms: i64,
    ) -> (SqsBatchResponse, BatchSummary) {
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
            let ids: Vec<Option<String>> = group.iter().map(|m| m.message_id.clone()).collect();
            let this = Arc::clone(self);
            let permits = Arc::clone(&permits);
            let task = tokio::spawn(async move {
                let mut out = Vec::with_capacity(group.len());
                let mut blocked = false;
                for msg in group {
                    if blocked {
                        let d = this
                            .give_back(
                                &msg,
                                "an earlier message of its FIFO group failed".into(),
                                Redelivery::Soon,
                            )
                            .await;
                        out.push((d, Vec::new()));
                        continue;
                    }
                    let (d, latencies) =
                        this.run_isolated(&msg, deadline_ms, cutoff, &permits).await;
                    blocked = matches!(d, Disposition::Retry(_));
                    out.push((d, latencies));
                }
                out
            });
            tasks.push((ids, task));
        }
        let mut response = SqsBatchResponse::default();
        let mut summary = BatchSummary::default();
        // Dropping the batch (an event-source mapping that gave up on it) stops its work.
        let _guards: Vec<AbortOnDrop> = tasks
            .iter()
            .map(|(_, t)| AbortOnDrop(t.abort_handle()))
            .collect();
        for (ids, t) in tasks {
            // A group's task only ends without results if the runtime cancelled it: nothing
            // of the group is known to be finished, so all of it comes back.
            let results = t.await.unwrap_or_else(|e| {
                error!(error = %e, "a message group's task ended without results; its messages will be redelivered");
                ids.iter()
                    .map(|_| (Disposition::Retry("the group's task was cancelled".into()), Vec::new()))
                    .collect()
            });
            for (id, (d, latencies)) in ids.into_iter().zip(results) {
                summary.provider_latencies_ms.extend(latencies);
                match d {
                    Disposition::Charged => summary.charged += 1,
                    Disposition::Declined => summary.declined += 1,
                    Disposition::Duplicate => summary.duplicates += 1,
                    Disposition::DeadLettered(code) => {
                        *summary.dead_lettered.entry(code).or_default() += 1
                    }
                    Disposition::Retry(_) => {
                        summary.retried += 1;
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
    /// time enough to charge, and stops it at the cutoff.
    async fn run_isolated(
        self: &Arc<Self>,
        msg: &Arc<SqsMessage>,
        deadline_ms: i64,
        cutoff: tokio::time::Instant,
        permits: &Arc<Semaphore>,
    ) -> (Disposition, Vec<f64>) {
        let not_started = || "not started: the invocation deadline is near".to_owned();
        let Ok(Ok(_permit)) =
            tokio::time::timeout_at(cutoff, permits.clone().acquire_owned()).await
        else {
            return (
                self.give_back(msg, not_started(), Redelivery::Soon).await,
                Vec::new(),
            );
        };
        let needed = self.provider.request_timeout() + self.settings.deadline_safety;
        if self.clock.now_ms() + ms(needed) >= deadline_ms {
            return (
                self.give_back(msg, not_started(), Redelivery::Soon).await,
                Vec::new(),
            );
        }
        let message_id = msg.message_id.clone().unwrap_or_default();
        // The span carries the message's identity on every line logged inside it. At the
        // highest level, so it is enabled whatever RUST_LOG lets through: a warning logged
        // with RUST_LOG=warn still names its message_id and payment_id.
        let span = tracing::error_span!(
            "message",
            message_id = %message_id,
            payment_id = tracing::field::Empty
        );
        let this = Arc::clone(self);
        let task_msg = Arc::clone(msg);
        let mut task = tokio::spawn(
            async move {
                let latencies = Mutex::new(Vec::new());
                let d = this.process(&task_msg, deadline_ms, &latencies).await;
                (d, latencies.into_inner().unwrap_or_default())
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
        )
    }

    /// Processes one message; one that must come back is handed back with its delay.
    pub async fn process(
        &self,
        msg: &SqsMessage,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Disposition {
        match self.decide(msg, deadline_ms, latencies).await {
            Step::Done(d) => {
                info!(disposition = ?d, "message done");
                d
            }
            Step::Again(reason, when) => self.give_back(msg, reason, when).await,
        }
    }

    /// Hands a message back to the queue with the delay `when` decides, or, on the last
    /// receive its budget allows, dead-letters it as `retries_exhausted` with the reason, so
    /// that SQS never moves a message without one.
    async fn give_back(&self, msg: &SqsMessage, reason: String, when: Redelivery) -> Disposition {
        let budget = self.budget_of(msg).await;
        if budget.exhausted() {
            let why = format!(
                "gave up on delivery {} of at most {} (the queue's maxReceiveCount): {reason}",
                budget.receive_count,
                budget.max_receive_count.unwrap_or_default()
            );
            let body = msg.body.clone().unwrap_or_default();
            let payment = PaymentRequest::parse(&body).ok();
            return self
                .dead_letter(msg, &body, "retries_exhausted", &why, payment.as_ref())
                .await;
        }
        self.hide(msg, &reason, when, &budget).await;
        Disposition::Retry(reason)
    }

    /// Keeps a message that comes back hidden for the delay `when` decides.
    async fn hide(&self, msg: &SqsMessage, reason: &str, when: Redelivery, budget: &Budget) {
        let delay = delay_for(when, budget, &self.backoff_policy(), self.clock.now_ms());
        warn!(reason = %reason, delay_s = delay.as_secs(), "message will be redelivered");
        if let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) {
            // Whole seconds, rounded up: a message never comes back earlier than decided.
            let secs = delay.as_millis().div_ceil(1000).min(43_200) as i32;
            if let Err(e) = self.queues.change_visibility(arn, rh, secs).await {
                warn!(error = %e, "could not set the redelivery delay; the queue's visibility timeout applies");
            }
        }
    }

    /// The delivery's receive budget: its receive count and its queue's `maxReceiveCount` (the
    /// redrive policy, read once per queue; `QUEUE_MAX_RECEIVE_COUNT` when it cannot be read).
    async fn budget_of(&self, msg: &SqsMessage) -> Budget {
        let max_receive_count = match msg.event_source_arn.as_deref() {
            Some(arn) => match self.queues.max_receive_count(arn).await {
                Ok(max) => max,
                Err(e) => {
                    warn!(error = %e, "could not read the queue's redrive policy; using QUEUE_MAX_RECEIVE_COUNT");
                    self.settings.max_receive_count
                }
            },
            None => self.settings.max_receive_count,
        };
        Budget::of(msg, max_receive_count)
    }

    fn backoff_policy(&self) -> BackoffPolicy {
        BackoffPolicy {
            base: self.settings.redelivery_base_delay,
            max: self.settings.redelivery_max_delay,
            horizon: self.settings.retry_horizon,
        }
    }

    async fn decide(
        &self,
        msg: &SqsMessage,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Step {
        let body = msg.body.clone().unwrap_or_default();
        let request = match PaymentRequest::parse(&body) {
            Ok(r) => r,
            Err(e) => {
                return Step::Done(
                    self.dead_letter(msg, &body, e.code(), &e.to_string(), None)
                        .await,
                )
            }
        };
        tracing::Span::current().record("payment_id", request.payment_id.as_str());
        let now = self.clock.now_ms();
        if let Some(sent) = first_sent_at_ms(msg) {
            if now - sent > ms(self.settings.record_ttl) - CLOCK_SKEW_MS {
                let why = self.expired_reason(&request, now - sent).await;
                return Step::Done(
                    self.dead_letter(msg, &body, "request_expired", &why, Some(&request))
                        .await,
                );
            }
        }

        let attempt = match self.claim(msg, &body, &request, now, deadline_ms).await {
            Ok(Claimed::Owner(attempt)) => attempt,
            Ok(Claimed::Done(d)) => return Step::Done(d),
            Err(again) => return again,
        };
        crate::failpoint!("after_claim");

        // The charge and the heartbeat run together; a lost lease stops the charge.
        let charged = tokio::select! {
            r = self.charge(&request, &attempt, deadline_ms, latencies) => r,
            lost = self.heartbeat(msg, &request, &attempt, deadline_ms) => Err(lost),
        };
        match charged {
            Ok(response) => {
                crate::failpoint!("after_charge");
                let (outcome, dlq) = outcome_of(&request, &response);
                match self
                    .store
                    .complete(&request.payment_id, &attempt.owner, &outcome)
                    .await
                {
                    Ok(()) => {}
                    Err(StoreError::LeaseLost) => {
                        return Step::Again(
                            "lease lost before completion; another attempt owns the payment".into(),
                            Redelivery::Soon,
                        )
                    }
                    Err(e) => {
                        // The lease is still ours until it ends; the next delivery takes the
                        // record over as an unknown outcome and gets the provider's replay.
                        return Step::Again(
                            format!("completing the record failed: {e}"),
                            Redelivery::Backoff,
                        );
                    }
                }
                crate::failpoint!("after_complete");
                Step::Done(match dlq {
                    Some((code, why)) => {
                        self.dead_letter(msg, &body, code, &why, Some(&request))
                            .await
                    }
                    None if outcome.is_declined() => Disposition::Declined,
                    None => Disposition::Charged,
                })
            }
            Err(ChargeFailure::LeaseLost) => Step::Again(
                "lease lost while working; another attempt owns the payment".into(),
                Redelivery::Soon,
            ),
            Err(ChargeFailure::Transient {
                message,
                unknown,
                not_before,
                retry_at,
            }) => {
                self.record_failure(&request, &attempt, &message, unknown, not_before)
                    .await;
                let when = match (retry_at, not_before) {
                    (Some(t), _) => Redelivery::At(t),
                    (None, Some(t)) => Redelivery::BackoffAfter(t),
                    (None, None) => Redelivery::Backoff,
                };
                Step::Again(message, when)
            }
            Err(ChargeFailure::OutcomeUnknown {
                message,
                not_before,
            }) => {
                self.record_failure(&request, &attempt, &message, true, not_before)
                    .await;
                Step::Done(
                    self.dead_letter(msg, &body, "outcome_unknown", &message, Some(&request))
                        .await,
                )
            }
        }
    }

    /// The `request_expired` reason: how old the message is, and whether the payment has a
    /// record (then it says what the record holds: a charge may exist).
    async fn expired_reason(&self, request: &PaymentRequest, age_ms: i64) -> String {
        let head = format!(
            "first sent {} s ago, longer than the record retention of {} s: this message is not processed",
            age_ms / 1000,
            self.settings.record_ttl.as_secs()
        );
        match self.store.get(request.payment_id.as_str()).await {
            Ok(Some(r)) => format!(
                "{head}; the payment has a record (status {}{}): see `payctl status {}`",
                r.status.as_str(),
                r.outcome
                    .as_ref()
                    .map(|o| format!(", outcome {}", o.status))
                    .unwrap_or_default(),
                request.payment_id
            ),
            Ok(None) => format!(
                "{head}; no record exists for this payment id (a record older than the retention has expired)"
            ),
            Err(e) => format!("{head}; whether a record exists could not be read: {e}"),
        }
    }

    async fn record_failure(
        &self,
        request: &PaymentRequest,
        attempt: &Attempt,
        error: &str,
        unknown: bool,
        not_before: Option<i64>,
    ) {
        let note = FailureNote {
            error: error.to_owned(),
            unknown_outcome: unknown,
            not_before_ms: not_before,
        };
        if let Err(se) = self
            .store
            .fail(
                &request.payment_id,
                &attempt.owner,
                self.clock.now_ms(),
                &note,
            )
            .await
        {
            warn!(error = %se, "could not record the failure; the lease will expire instead");
        }
    }

    /// The time a call needs inside the lease: the client timeout plus the provider's
    /// processing allowance, so that no call can land after the lease ended.
    fn call_window_ms(&self) -> i64 {
        ms(self.provider.request_timeout() + self.settings.provider_processing_allowance)
    }

    /// Claims the record; returns the lease, the disposition the conflict decides, or when
    /// the message must come back.
    async fn claim(
        &self,
        msg: &SqsMessage,
        body: &str,
        request: &PaymentRequest,
        now: i64,
        deadline_ms: i64,
    ) -> Result<Claimed, Step> {
        let lease_end_ms = self.lease_end(now, deadline_ms);
        if lease_end_ms - now <= self.call_window_ms() {
            return Err(Step::Again(
                "too little time left in this invocation to charge".into(),
                Redelivery::Soon,
            ));
        }
        let hash = request.payload_hash();
        let owner = uuid::Uuid::new_v4().to_string();
        let claim = ClaimRequest {
            payment_id: request.payment_id.clone(),
            payload_hash: hash.clone(),
            owner: owner.clone(),
            now_ms: now,
            lease_expires_at_ms: lease_end_ms,
            expires_at_s: (now + ms(self.settings.record_ttl)) / 1000,
        };
        let attempt = |unknown: bool, first: Option<i64>, landing: Option<i64>| Attempt {
            owner: owner.clone(),
            lease_end_ms: AtomicI64::new(lease_end_ms),
            unknown,
            first_attempt_at_ms: first.filter(|t| *t > 0).unwrap_or(now),
            landing_ms: landing,
        };
        match self.store.claim(&claim).await {
            Ok(ClaimResult::Claimed { previous }) => {
                let unknown = inherits_unknown_outcome(previous.as_ref());
                if let Some(p) = &previous {
                    info!(
                        previous_status = p.status.as_str(),
                        attempts = p.attempts + 1,
                        unknown_outcome = unknown,
                        "took over the record"
                    );
                }
                Ok(Claimed::Owner(attempt(
                    unknown,
                    previous.as_ref().map(|p| p.first_attempt_at_ms),
                    previous.as_ref().and_then(last_landing),
                )))
            }
            Ok(ClaimResult::Conflict(existing)) => {
                match decide_conflict(&existing, &hash, &owner, now) {
                    ConflictDecision::OwnClaim => {
                        // Our first write was applied and its answer lost; what it replaced is
                        // unknown, so an earlier attempt may have charged: until now, calls of
                        // an expired lease could still be landing.
                        warn!("the claim's answer was lost and its retry refused by our own lease: claimed, outcome unknown");
                        Ok(Claimed::Owner(attempt(
                            true,
                            Some(existing.first_attempt_at_ms),
                            Some(existing.not_before_ms.unwrap_or(now).max(now)),
                        )))
                    }
                    ConflictDecision::Duplicate(outcome) => {
                        // A duplicate of a payment the provider rejected must still end in the
                        // DLQ: the first copy's dead-lettering may not have happened.
                        if outcome.is_rejected() {
                            let (code, why) = rejection_code(&outcome);
                            Ok(Claimed::Done(
                                self.dead_letter(msg, body, code, &why, Some(request)).await,
                            ))
                        } else {
                            Ok(Claimed::Done(Disposition::Duplicate))
                        }
                    }
                    ConflictDecision::KeyReused => {
                        let why = format!(
                            "payment_id {} was already used for a different payment (status {}); this one is never charged",
                            request.payment_id,
                            existing.status.as_str()
                        );
                        Ok(Claimed::Done(
                            // No mark: the payment_id names another payment.
                            self.dead_letter(msg, body, "idempotency_key_reused", &why, None)
                                .await,
                        ))
                    }
                    ConflictDecision::Busy {
                        lease_expires_at_ms,
                    } => Err(Step::Again(
                        "another attempt holds the lease".into(),
                        Redelivery::Busy(lease_expires_at_ms),
                    )),
                    ConflictDecision::NotYet { not_before_ms } => Err(Step::Again(
                        "an earlier call may still land at the provider (not_before)".into(),
                        Redelivery::At(not_before_ms),
                    )),
                    ConflictDecision::Retry => Err(Step::Again(
                        "record changed during the claim".into(),
                        Redelivery::Soon,
                    )),
                }
            }
            Err(e) => Err(Step::Again(
                format!("claim failed: {e}"),
                Redelivery::Backoff,
            )),
        }
    }
    /// Where a lease taken or renewed at `now` ends: never past the deadline plus the margin,
    /// so a timed-out attempt's record can be taken over by the next delivery.
    fn lease_end(&self, now: i64, deadline_ms: i64) -> i64 {
        (now + ms(self.settings.lease)).min(deadline_ms + ms(self.settings.deadline_margin))
    }

    /// Extends the message's visibility and the record's lease together, on one schedule,
    /// until the work ends (this future is dropped) or the lease is lost (it returns). Stops
    /// extending before the deadline and within SQS's 12-hour cap; work shorter than the first
    /// interval makes no call.
    async fn heartbeat(
        &self,
        msg: &SqsMessage,
        request: &PaymentRequest,
        attempt: &Attempt,
        deadline_ms: i64,
    ) -> ChargeFailure {
        let interval = self.settings.heartbeat_interval();
        let started = self.clock.now_ms();
        loop {
            tokio::time::sleep(interval).await;
            crate::failpoint!("in_heartbeat");
            let now = self.clock.now_ms();
            let visibility = visibility_extension(
                self.settings.visibility_timeout,
                Duration::from_millis((now - started).max(0) as u64),
            );
            if now + ms(interval) >= deadline_ms || visibility.is_zero() {
                // No more extensions: the lease runs out at the deadline (plus the margin)
                // and the message comes back when its visibility ends.
                return std::future::pending().await;
            }
            let lease_end = self.lease_end(now, deadline_ms);
            match self
                .store
                .renew_lease(&request.payment_id, &attempt.owner, lease_end)
                .await
            {
                Ok(()) => attempt.lease_end_ms.store(lease_end, Ordering::SeqCst),
                Err(StoreError::LeaseLost) => {
                    warn!("lease renewal refused: another attempt owns the record; stopping");
                    return ChargeFailure::LeaseLost;
                }
                Err(e) => {
                    warn!(error = %e, "lease renewal failed; will try again at the next beat");
                    continue;
                }
            }
            if let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) {
                let secs = visibility.as_secs() as i32;
                if let Err(e) = self.queues.change_visibility(arn, rh, secs).await {
                    warn!(error = %e, "could not extend the message's visibility");
                }
            }
        }
    }

    /// Calls the provider with retries, each call only while the lease outlasts the client
    /// timeout plus the processing allowance, so no call of this attempt can land after its
    /// lease ended. An unknown outcome is settled by a lookup before any call that could land
    /// after the provider forgot the key, and whenever the provider replays a `5xx` for it.
    async fn charge(
        &self,
        request: &PaymentRequest,
        attempt: &Attempt,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Result<ProviderResponse, ChargeFailure> {
        let timed = |started: tokio::time::Instant| {
            if let Ok(mut l) = latencies.lock() {
                l.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        };
        let window = self.call_window_ms();
        // A call must also end before the invocation's answer is due: a call cut off at the
        // deadline would leave the outcome unknown for nothing.
        let cutoff_ms = deadline_ms - ms(self.settings.deadline_safety);
        let limit = || attempt.lease_end().min(cutoff_ms);
        let forget_at = attempt.first_attempt_at_ms + ms(self.settings.provider_key_retention)
            - ms(self.settings.key_retention_margin);
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.settings.provider_retry_delay)
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build();
        // `mark`: what the record will say (sticky: only a completion clears it).
        // `must_look`: a blind call could charge twice once the key may be forgotten; a
        // lookup that proves no charge lifts it until the next ambiguous answer.
        // `landing`: the latest time a call whose answer was not definitive may still land.
        let mut mark = attempt.unknown;
        let mut must_look = attempt.unknown;
        let mut landing = attempt.landing_ms;
        let mut last: Option<ProviderError> = None;
        let transient = |message: String, mark: bool, landing: Option<i64>, retry_at| {
            ChargeFailure::Transient {
                message,
                unknown: mark,
                not_before: landing,
                retry_at,
            }
        };
        for n in 0..self.settings.provider_attempts.max(1) {
            if n > 0 {
                let Some(prev) = &last else { break };
                if !prev.retry_now() {
                    break;
                }
                let pause = delays
                    .next()
                    .unwrap_or_default()
                    .max(prev.retry_after.unwrap_or_default());
                if self.clock.now_ms() + ms(pause) + window >= limit() {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            if must_look && self.clock.now_ms() + window >= forget_at {
                // The provider may have forgotten the key by the time this call lands: a
                // blind call could charge a second time. Look first.
                match self.settle(request, landing).await {
                    Lookup::Found(found) => return Ok(found),
                    Lookup::Nothing => {
                        info!("lookup proved no payment for the unknown outcome; charging");
                        must_look = false;
                    }
                    Lookup::TooSoon(at) => return Err(transient(
                        "the provider's search may not show a recent call yet; looking again later"
                            .into(),
                        true,
                        landing,
                        Some(at),
                    )),
                    Lookup::Failed(e) => return Err(transient(e, true, landing, None)),
                }
            }
            let sent = self.clock.now_ms();
            if limit() - sent <= window {
                break;
            }
            let call_started = tokio::time::Instant::now();
            let answer = self.provider.create_payment(request).await;
            timed(call_started);
            match answer {
                Ok(r) => return Ok(r),
                Err(e) => {
                    if e.is_ambiguous() {
                        mark = true;
                        if !e.replayed {
                            // This call may have been executed, or still be, until then.
                            must_look = true;
                            landing = Some(landing.unwrap_or(0).max(sent + window));
                        }
                    }
                    if e.kind == FailureKind::Misconfigured {
                        error!(error = %e, "payment provider refused the processor's credentials or URL: fix the configuration");
                    } else {
                        warn!(error = %e, attempt = n + 1, "provider call failed");
                    }
                    if e.replayed && e.kind == FailureKind::ServerError {
                        // Retrying the key replays the same error: only a lookup can tell.
                        return match self.settle(request, landing).await {
                            Lookup::Found(found) => Ok(found),
                            Lookup::Nothing => Err(ChargeFailure::OutcomeUnknown {
                                message: format!(
                                    "the provider replays an error for payment_id {} ({e}) and its search, made {} s or more after the last call could land, shows no payment for it; nothing is charged automatically: run `payctl reconcile {}` to settle the record from the provider",
                                    request.payment_id,
                                    self.settings.search_lag.as_secs(),
                                    request.payment_id
                                ),
                                not_before: landing,
                            }),
                            Lookup::TooSoon(at) => Err(transient(
                                format!("the provider replays an error ({e}); its search may not show a recent call yet, looking again later"),
                                true,
                                landing,
                                Some(at),
                            )),
                            Lookup::Failed(msg) => Err(transient(msg, true, landing, None)),
                        };
                    }
                    last = Some(e);
                }
            }
        }
        Err(transient(
            last.map(|e| e.to_string())
                .unwrap_or_else(|| "lease too short to call the provider".into()),
            mark,
            landing,
            None,
        ))
    }

    /// Looks the payment up at the provider. What it finds settles the outcome; finding
    /// nothing proves no charge only once the search has had [`Settings::search_lag`] to catch
    /// up with the last call that could have landed (`landing`).
    async fn settle(&self, request: &PaymentRequest, landing: Option<i64>) -> Lookup {
        let found = match self.provider.find_payments(&request.payment_id).await {
            Ok(found) => found,
            Err(e) => return Lookup::Failed(format!("lookup of an unknown outcome failed: {e}")),
        };
        let charges: Vec<_> = found.iter().filter(|f| f.is_charge()).collect();
        if charges.len() > 1 {
            error!(
                count = charges.len(),
                "the provider holds more than one charge for this payment id"
            );
        }
        if let Some(c) = charges.first() {
            info!(provider_payment_id = %c.provider_payment_id, "lookup settled the unknown outcome: charged");
            return Lookup::Found(ProviderResponse::Charged {
                provider_payment_id: c.provider_payment_id.clone(),
                status: c.status.clone(),
                replayed: true,
            });
        }
        if let Some(d) = found.first() {
            info!(provider_payment_id = %d.provider_payment_id, status = %d.status, "lookup settled the unknown outcome: not charged");
            return Lookup::Found(ProviderResponse::Declined {
                provider_payment_id: Some(d.provider_payment_id.clone()),
                decline_code: None,
            });
        }
        let proof_at = landing.map_or(i64::MIN, |t| t + ms(self.settings.search_lag));
        if self.clock.now_ms() < proof_at {
            info!(
                look_again_in_s = (proof_at - self.clock.now_ms()) / 1000,
                "lookup found nothing, but a recent call may not be searchable yet"
            );
            return Lookup::TooSoon(proof_at);
        }
        Lookup::Nothing
    }

    /// Sends the message to the DLQ, then deletes it from the source queue, in that order.
    /// Sends the message to the DLQ with its reason, marks the payment dead-lettered when the
    /// message is one (`payment`: a valid request that its payment_id does not name another
    /// payment for), and deletes it from the source queue.
    async fn dead_letter(
        &self,
        msg: &SqsMessage,
        body: &str,
        code: &str,
        why: &str,
        payment: Option<&PaymentRequest>,
    ) -> Disposition {
        // A body that can never be processed keeps no card number at rest (14 days in the DLQ).
        let masked = match code {
            "invalid_json" | "invalid_payment" => crate::domain::mask_card_numbers(body),
            _ => None,
        };
        let letter = DeadLetter {
            card_data_masked: masked.is_some(),
            body: masked.unwrap_or_else(|| body.to_owned()),
            error_code: code.to_owned(),
            error_message: why.to_owned(),
            source_message_id: msg.message_id.clone().unwrap_or_default(),
            first_sent_at_ms: first_sent_at_ms(msg),
            message_group_id: msg.attributes.get("MessageGroupId").cloned(),
        };
        if let Err(e) = self.queues.dead_letter(&letter).await {
            // Nothing is lost: the message stays on the source queue and comes back.
            let reason = format!("dead-lettering failed: {e}");
            let budget = self.budget_of(msg).await;
            self.hide(msg, &reason, Redelivery::Backoff, &budget).await;
            return Disposition::Retry(reason);
        }
        warn!(error_code = code, reason = why, "message dead-lettered");
        if let Some(request) = payment {
            let now = self.clock.now_ms();
            let mark = DeadLetterMark {
                payment_id: request.payment_id.clone(),
                payload_hash: request.payload_hash(),
                error_code: code.to_owned(),
                error_message: why.chars().take(1_000).collect(),
                at_ms: now,
                expires_at_s: (now + ms(self.settings.record_ttl)) / 1000,
            };
            if let Err(e) = self.store.mark_dead_lettered(&mark).await {
                // The dead letter holds everything; only the payment's status says less.
                warn!(error = %e, "could not mark the payment dead-lettered");
            }
        }
        if let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) {
            if let Err(e) = self.queues.delete(arn, rh).await {
                // Reported as a success, so the event source mapping deletes it instead.
                warn!(error = %e, "could not delete the dead-lettered message");
            }
        }
        Disposition::DeadLettered(code.to_owned())
    }
}

/// The latest time a call of the attempt that left `previous` may still land at the provider:
/// its `not_before`, or the end of an `IN_PROGRESS` lease (calls are sent only while the lease
/// outlasts the client timeout plus the processing allowance).
fn last_landing(previous: &IdempotencyRecord) -> Option<i64> {
    let lease =
        (previous.status == RecordStatus::InProgress).then_some(previous.lease_expires_at_ms);
    match (previous.not_before_ms, lease) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// What a lookup at the provider established.
enum Lookup {
    /// The provider holds this for the payment: the record takes it as the outcome.
    Found(ProviderResponse),
    /// Nothing, and the search has caught up with every call that could have landed: no charge.
    Nothing,
    /// Nothing yet, but the search may lag behind a recent call: look again at this epoch ms.
    TooSoon(i64),
    /// The lookup failed (transient).
    Failed(String),
}

/// Aborts a spawned task when dropped, so work never outlives the batch that started it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why an attempt ended without a definitive answer.
#[derive(Debug)]
enum ChargeFailure {
    /// Retry on a later delivery; `unknown` when the provider may have executed a call.
    Transient {
        /// The last error.
        message: String,
        /// The record's unknown-outcome mark (sticky: set by any ambiguous answer or inherited).
        unknown: bool,
        /// The record's `not_before`: the latest time a call may still land at the provider.
        not_before: Option<i64>,
        /// The next delivery comes no earlier than this (a lookup that must wait for the
        /// provider's search to catch up); `None`: the transient backoff.
        retry_at: Option<i64>,
    },
    /// No lookup can settle it: `payctl reconcile` or a person does (dead-lettered as
    /// `outcome_unknown`).
    OutcomeUnknown {
        /// Why, for the dead letter.
        message: String,
        /// The record's `not_before`.
        not_before: Option<i64>,
    },
    /// Another attempt took the record over: stop, complete nothing.
    LeaseLost,
}

/// One attempt's hold on the record.
#[derive(Debug)]
struct Attempt {
    /// The fencing token.
    owner: String,
    /// Where the lease ends now (the heartbeat moves it).
    lease_end_ms: AtomicI64,
    /// The record taken over left the outcome unknown.
    unknown: bool,
    /// First claim of the payment: the provider remembers the key at least until this plus
    /// its key retention.
    first_attempt_at_ms: i64,
    /// The latest time a call of an earlier attempt may still land at the provider (its
    /// `not_before`, or the end of the expired lease taken over).
    landing_ms: Option<i64>,
}

impl Attempt {
    fn lease_end(&self) -> i64 {
        self.lease_end_ms.load(Ordering::SeqCst)
    }
}

/// Seconds to extend a message's visibility by, so that its total stays within SQS's 12 hours
/// from receipt; zero when nothing is left.
pub fn visibility_extension(visibility: Duration, held_for: Duration) -> Duration {
    const CAP: Duration = Duration::from_secs(12 * 3600);
    visibility.min(CAP.saturating_sub(held_for + Duration::from_secs(1)))
}

/// The record's outcome for a definitive answer, and the DLQ code where the message must go.
pub fn outcome_of(
    request: &PaymentRequest,
    response: &ProviderResponse,
) -> (Outcome, Option<(&'static str, String)>) {
    let base = |status: &str| Outcome {
        status: status.to_owned(),
        provider_payment_id: None,
        decline_code: None,
        amount: request.money.amount,
        currency: request.money.currency.clone(),
        reason: None,
    };
    match response {
        ProviderResponse::Charged {
            provider_payment_id,
            status,
            ..
        } => (
            Outcome {
                provider_payment_id: Some(provider_payment_id.clone()),
                ..base(status)
            },
            None,
        ),
        ProviderResponse::Declined {
            provider_payment_id,
            decline_code,
        } => (
            Outcome {
                provider_payment_id: provider_payment_id.clone(),
                decline_code: decline_code.clone(),
                ..base("declined")
            },
            None,
        ),
        ProviderResponse::Rejected { code, message } => {
            let o = Outcome {
                reason: Some(format!("{code}: {message}")),
                ..base("rejected")
            };
            let (c, why) = rejection_code(&o);
            (o, Some((c, why)))
        }
        ProviderResponse::KeyReused { message } => {
            let o = Outcome {
                reason: Some(format!("{IDEMPOTENCY_ERROR}: {message}")),
                ..base("rejected")
            };
            let (c, why) = rejection_code(&o);
            (o, Some((c, why)))
        }
    }
}

const IDEMPOTENCY_ERROR: &str = "idempotency_error";

/// The DLQ code and reason of a `rejected` outcome.
pub fn rejection_code(o: &Outcome) -> (&'static str, String) {
    let reason = o
        .reason
        .clone()
        .unwrap_or_else(|| "rejected by the provider".into());
    if reason.starts_with(IDEMPOTENCY_ERROR) {
        (
            "idempotency_key_reused",
            format!("the provider holds this payment_id for other parameters: {reason}"),
        )
    } else {
        ("provider_rejected", reason)
    }
}

/// Epoch ms of the first send: the earlier of the `first_sent_at` attribute (a redriven dead
/// letter carries its original's) and SQS's `SentTimestamp`. A producer can make a message
/// look older, never younger than SQS saw it.
fn first_sent_at_ms(msg: &SqsMessage) -> Option<i64> {
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
