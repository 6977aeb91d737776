//! The toy world of the protocol tests: a [`Work`] (a "job" with an id and an amount) run
//! against a scripted downstream, in-memory store and queues, a paused clock.
//!
//! Why ~510 lines: the work, its scripted downstream, the fake queues and the scripted store
//! are one world that every protocol test file shares.
#![allow(dead_code, unused_imports)] // each test binary uses a part of it

pub use std::collections::HashMap;
pub use std::sync::atomic::{AtomicU64, Ordering};
pub use std::sync::{Arc, Mutex};
pub use std::time::Duration;

pub use async_trait::async_trait;
pub use aws_lambda_events::event::sqs::SqsMessage;
pub use sqs_once::clock::Clock;
pub use sqs_once::memory::InMemoryStore;
pub use sqs_once::queue::{DeadLetter, QueueError, QueueOps, Requeue};
pub use sqs_once::record::{
    ClaimRequest, ClaimResult, DeadLetterMark, IdempotencyRecord, IdempotencyStore, Outcome,
    RecordStatus, StoreError,
};
pub use sqs_once::runner::now_ms;
pub use sqs_once::{AttemptContext, BatchRunner, CallError, Rejection, Settings, Verdict, Work};

/// A parsed job: `{"id": "...", "amount": n}`.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub amount: i64,
}

impl Job {
    pub fn parse(body: &str) -> Result<Job, Rejection> {
        let v: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| Rejection::new("invalid_json", e.to_string()))?;
        match (v["id"].as_str(), v["amount"].as_i64()) {
            (Some(id), Some(amount)) if !id.is_empty() && amount > 0 => Ok(Job {
                id: id.to_owned(),
                amount,
            }),
            _ => Err(Rejection::new(
                "invalid_job",
                "a job needs an id and a positive amount",
            )),
        }
    }
    pub fn fingerprint(&self) -> String {
        format!("{}:{}", self.id, self.amount)
    }
}

/// How a scripted call fails.
#[derive(Clone, Copy, Debug)]
pub enum FailureKind {
    /// Refused before acting (`429`): proves nothing happened.
    RateLimited,
    /// No answer in time: may have happened.
    Timeout,
    /// A `5xx`: may have happened.
    ServerError,
    /// Another request with the key is in flight downstream: may happen.
    KeyInUse,
}

/// What the scripted downstream does for a job id.
#[derive(Clone)]
pub enum Behaviour {
    Done,
    /// Answers after this long (tokio time), then succeeds.
    Slow(Duration),
    /// The effect happens but the answer is lost (a timeout), every time.
    LostAnswer,
    /// A definitive "no" that is acknowledged (a business outcome).
    Decline,
    /// A failure of this kind, with a `Retry-After`.
    Fail(FailureKind, Option<Duration>),
    /// An error replayed for the key: retrying never changes it.
    Replayed500,
    Panic,
}

/// The toy work: its downstream is scripted per job id, and counts calls and lookups.
#[derive(Default)]
pub struct Toy {
    pub behaviour: Mutex<HashMap<String, Behaviour>>,
    pub calls: Mutex<HashMap<String, u64>>,
    pub lookups: Mutex<HashMap<String, u64>>,
    /// Effects the downstream holds although the caller never heard of them (for lookups).
    pub found: Mutex<HashMap<String, String>>,
    /// Status of what a lookup finds (default `succeeded`).
    pub found_status: Mutex<Option<String>>,
    /// Lookups fail (the downstream's search is down).
    pub lookup_fails: Mutex<bool>,
    /// The lookup is a consistent listing, not a search that may lag.
    pub consistent: std::sync::atomic::AtomicBool,
    pub timeout: Duration,
    /// `None`: the downstream keeps keys as long as the records live.
    pub key_retention: Mutex<Option<Duration>>,
    /// The downstream's client paces its requests with it (as a provider client does).
    pub pace: Mutex<Option<Arc<sqs_once::pace::Pace>>>,
    /// When each call was sent, in order.
    pub sent_at: Mutex<Vec<tokio::time::Instant>>,
    /// Each call reads first (a paced request that changes nothing), then writes.
    pub reads_first: std::sync::atomic::AtomicBool,
    /// The reads sent, by job id.
    pub reads: Mutex<HashMap<String, u64>>,
    /// With `reads_first`: the work says so ([`Work::requests_per_attempt`] two).
    pub declares_its_read: std::sync::atomic::AtomicBool,
}

impl Toy {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            key_retention: Mutex::new(Some(Duration::from_secs(24 * 3600))),
            ..Default::default()
        }
    }
    pub fn set(&self, id: &str, b: Behaviour) {
        self.behaviour.lock().unwrap().insert(id.to_owned(), b);
    }
    pub fn calls(&self, id: &str) -> u64 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
    pub fn lookups(&self, id: &str) -> u64 {
        self.lookups.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

pub fn done(id: &str) -> Outcome {
    Outcome::new("succeeded").with_text("receipt", format!("r_{id}"))
}

#[async_trait]
impl Work for Toy {
    type Request = Job;
    fn parse(&self, body: &str) -> Result<Job, Rejection> {
        Job::parse(body)
    }
    fn key(&self, job: &Job) -> String {
        job.id.clone()
    }
    fn fingerprint(&self, job: &Job) -> String {
        job.fingerprint()
    }
    /// The toy's "earlier version" wrote `old-<fingerprint>`.
    fn same_request(&self, job: &Job, stored: &str) -> bool {
        stored == job.fingerprint() || stored == format!("old-{}", job.fingerprint())
    }
    fn call_timeout(&self) -> Duration {
        self.timeout
    }
    fn requests_per_attempt(&self, _: &Job) -> usize {
        let on = |f: &std::sync::atomic::AtomicBool| f.load(std::sync::atomic::Ordering::SeqCst);
        if on(&self.reads_first) && on(&self.declares_its_read) {
            2
        } else {
            1
        }
    }
    fn key_retention(&self) -> Option<Duration> {
        *self.key_retention.lock().unwrap()
    }
    fn verdict(&self, outcome: &Outcome) -> Verdict {
        match outcome.status.as_str() {
            "rejected" => Verdict::DeadLetter {
                code: "downstream_rejected".into(),
                reason: outcome.text("reason").unwrap_or("rejected").to_owned(),
            },
            "declined" => Verdict::Done("declined".into()),
            _ => Verdict::Done("done".into()),
        }
    }
    async fn execute(&self, job: &Job, _: &AttemptContext) -> Result<Outcome, CallError> {
        let pace = self.pace.lock().unwrap().clone();
        let not_sent = |e: sqs_once::pace::NoSlot| CallError {
            retry_now: false,
            ..CallError::transient(e.to_string())
        };
        if self.reads_first.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some(pace) = &pace {
                pace.acquire_read(Duration::ZERO).await.map_err(not_sent)?;
            }
            *self
                .reads
                .lock()
                .unwrap()
                .entry(job.id.clone())
                .or_default() += 1;
        }
        if let Some(pace) = pace {
            pace.acquire(Duration::ZERO).await.map_err(not_sent)?;
        }
        self.sent_at
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        let id = job.id.clone();
        *self.calls.lock().unwrap().entry(id.clone()).or_default() += 1;
        let b = self
            .behaviour
            .lock()
            .unwrap()
            .get(&id)
            .cloned()
            .unwrap_or(Behaviour::Done);
        match b {
            Behaviour::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(done(&id))
            }
            Behaviour::LostAnswer => {
                self.found
                    .lock()
                    .unwrap()
                    .insert(id.clone(), format!("r_{id}"));
                Err(CallError::ambiguous("timed out"))
            }
            Behaviour::Done => Ok(done(&id)),
            Behaviour::Decline => Ok(Outcome::new("declined").with_text("why", "no funds")),
            Behaviour::Fail(kind, retry_after) => Err(CallError {
                ambiguous: !matches!(kind, FailureKind::RateLimited),
                retry_after,
                ..CallError::transient(format!("{kind:?}"))
            }),
            Behaviour::Replayed500 => Err(CallError {
                replayed: true,
                retry_now: false,
                ..CallError::ambiguous("replayed 500")
            }),
            Behaviour::Panic => panic!("downstream adapter bug for {id}"),
        }
    }
    fn lookup_is_consistent(&self) -> bool {
        self.consistent.load(std::sync::atomic::Ordering::SeqCst)
    }
    async fn lookup(
        &self,
        job: &Job,
        _attempt: &AttemptContext,
    ) -> Result<Option<Outcome>, CallError> {
        *self
            .lookups
            .lock()
            .unwrap()
            .entry(job.id.clone())
            .or_default() += 1;
        if *self.lookup_fails.lock().unwrap() {
            return Err(CallError::ambiguous("search down"));
        }
        let status = self
            .found_status
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| "succeeded".into());
        let found = self.found.lock().unwrap();
        Ok(found
            .get(&job.id)
            .map(|r| Outcome::new(status.clone()).with_text("receipt", r.clone())))
    }
}

pub type Processor = BatchRunner<Toy>;

#[derive(Default)]
pub struct FakeQueues {
    pub dead: Mutex<Vec<DeadLetter>>,
    pub deleted: AtomicU64,
    /// (receipt handle, seconds) of every visibility change.
    pub visibility: Mutex<Vec<(String, i32)>>,
    /// The source queue's `maxReceiveCount` (`None`: no redrive policy).
    pub max_receives: Mutex<Option<u32>>,
    /// Fresh copies of messages requeued without an attempt.
    pub requeued: Mutex<Vec<Requeue>>,
    /// The source queue's `MessageRetentionPeriod` (`None`: not known).
    pub retention: Mutex<Option<Duration>>,
}

#[async_trait]
impl QueueOps for FakeQueues {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<(), QueueError> {
        self.dead.lock().unwrap().push(l.clone());
        Ok(())
    }
    async fn delete(&self, _: &str, _: &str) -> Result<(), QueueError> {
        self.deleted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn change_visibility(&self, _: &str, rh: &str, secs: i32) -> Result<(), QueueError> {
        self.visibility.lock().unwrap().push((rh.to_owned(), secs));
        Ok(())
    }
    async fn max_receive_count(&self, _: &str) -> Result<Option<u32>, QueueError> {
        Ok(*self.max_receives.lock().unwrap())
    }
    async fn limits(&self, _: &str) -> Result<sqs_once::queue::QueueLimits, QueueError> {
        Ok(sqs_once::queue::QueueLimits {
            max_receive_count: *self.max_receives.lock().unwrap(),
            retention: *self.retention.lock().unwrap(),
        })
    }
    async fn requeue(&self, copy: &Requeue) -> Result<(), QueueError> {
        self.requeued.lock().unwrap().push(copy.clone());
        Ok(())
    }
}

pub struct World {
    pub clock: Arc<sqs_once::clock::TokioClock>,
    pub store: Arc<InMemoryStore>,
    pub downstream: Arc<Toy>,
    pub queues: Arc<FakeQueues>,
    pub processor: Arc<Processor>,
}

pub fn world(settings: Settings, timeout: Duration) -> World {
    world_wrapped(settings, timeout, |s| s)
}

/// A world whose processor sees the in-memory store through `wrap` (a store that fails in a
/// scripted way); the world's `store` is the one underneath.
pub fn world_wrapped(
    settings: Settings,
    timeout: Duration,
    wrap: impl FnOnce(Arc<InMemoryStore>) -> Arc<dyn IdempotencyStore>,
) -> World {
    let store = Arc::new(InMemoryStore::new());
    let downstream = Arc::new(Toy::new(timeout));
    let queues = Arc::new(FakeQueues::default());
    let clock = Arc::new(sqs_once::clock::TokioClock::new());
    let processor = Arc::new(
        Processor::new(
            downstream.clone(),
            wrap(store.clone()),
            queues.clone(),
            settings,
        )
        .with_clock(clock.clone()),
    );
    World {
        clock,
        store,
        downstream,
        queues,
        processor,
    }
}

pub fn fast() -> Settings {
    Settings {
        lease: Duration::from_secs(10),
        call_retry_delay: Duration::from_millis(1),
        // The tests that need it set the downstream's processing allowance themselves.
        processing_allowance: Duration::ZERO,
        ..Settings::default()
    }
}

pub fn body(id: &str, amount: i64) -> String {
    format!(r#"{{"id":"{id}","amount":{amount}}}"#)
}

pub fn msg(id: &str, body: &str, group: Option<&str>) -> SqsMessage {
    msg_at(
        id,
        body,
        group,
        sqs_once::clock::TokioClock::new().now_ms(),
        1,
    )
}

pub fn msg_at(
    id: &str,
    body: &str,
    group: Option<&str>,
    sent_ms: i64,
    receive_count: u32,
) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.to_owned());
    m.receipt_handle = Some(format!("rh-{id}"));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some("arn:aws:sqs:us-east-1:000000000000:jobs".into());
    m.attributes
        .insert("SentTimestamp".into(), sent_ms.to_string());
    m.attributes
        .insert("ApproximateReceiveCount".into(), receive_count.to_string());
    if let Some(g) = group {
        m.attributes.insert("MessageGroupId".into(), g.to_owned());
    }
    m
}

pub fn failures(r: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<String> {
    let mut v: Vec<String> = r
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    v.sort();
    v
}

/// A store that fails in scripted ways around the in-memory one.
pub struct ScriptedStore {
    pub inner: Arc<InMemoryStore>,
    /// The next claim is applied but its answer is lost; the SDK's retry is then refused by
    /// the first write (what DynamoDB returns to a retried `UpdateItem`).
    pub lose_claim_answer: Mutex<bool>,
    /// Claims fail as if the table were unreachable.
    pub claims_fail: Mutex<bool>,
    /// Completions fail as if the table were unreachable.
    pub completes_fail: Mutex<bool>,
    /// Claims take this long (tokio time): a throttled table whose SDK retries.
    pub claim_delay: Mutex<Duration>,
}

impl ScriptedStore {
    pub fn new(inner: Arc<InMemoryStore>) -> Self {
        Self {
            inner,
            lose_claim_answer: Mutex::new(false),
            claims_fail: Mutex::new(false),
            completes_fail: Mutex::new(false),
            claim_delay: Mutex::new(Duration::ZERO),
        }
    }
}

#[async_trait]
impl IdempotencyStore for ScriptedStore {
    async fn claim(&self, r: &ClaimRequest) -> Result<ClaimResult, StoreError> {
        if *self.claims_fail.lock().unwrap() {
            return Err(StoreError::Unavailable("table unreachable".into()));
        }
        let delay = *self.claim_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let first = self.inner.claim(r).await?;
        if std::mem::take(&mut *self.lose_claim_answer.lock().unwrap()) {
            // The retry of the same write meets the record the first one wrote.
            return match self.inner.claim(r).await? {
                ClaimResult::Conflict(rec) => Ok(ClaimResult::Conflict(rec)),
                other => panic!("the retried claim should have been refused: {other:?}"),
            };
        }
        Ok(first)
    }
    async fn complete(
        &self,
        id: &str,
        owner: &str,
        outcome: &Outcome,
        keep: Option<i64>,
    ) -> Result<(), StoreError> {
        if *self.completes_fail.lock().unwrap() {
            return Err(StoreError::Unavailable("table unreachable".into()));
        }
        self.inner.complete(id, owner, outcome, keep).await
    }
    async fn fail(
        &self,
        id: &str,
        owner: &str,
        now_ms: i64,
        note: &sqs_once::record::FailureNote,
    ) -> Result<(), StoreError> {
        self.inner.fail(id, owner, now_ms, note).await
    }
    async fn renew_lease(&self, id: &str, owner: &str, until_ms: i64) -> Result<(), StoreError> {
        self.inner.renew_lease(id, owner, until_ms).await
    }
    async fn get(&self, id: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.inner.get(id).await
    }

    async fn mark_dead_lettered(&self, mark: &DeadLetterMark) -> Result<(), StoreError> {
        self.inner.mark_dead_lettered(mark).await
    }
}

impl FakeQueues {
    pub fn last_delay(&self) -> i32 {
        self.visibility
            .lock()
            .unwrap()
            .last()
            .expect("a delay was set")
            .1
    }
    pub fn dead(&self) -> Vec<DeadLetter> {
        self.dead.lock().unwrap().clone()
    }
}

/// One delivery of `pid`'s message with this receive count, first received at `first_ms`.
pub fn delivery(pid: &str, n: u32, first_ms: i64) -> SqsMessage {
    let mut m = msg_at(&format!("m-{pid}-{n}"), &body(pid, 100), None, first_ms, n);
    m.attributes.insert(
        "ApproximateFirstReceiveTimestamp".into(),
        first_ms.to_string(),
    );
    m
}

pub async fn deliver(w: &World, m: SqsMessage) -> (Vec<String>, sqs_once::BatchSummary) {
    let (r, s) = w
        .processor
        .handle_batch(vec![m], w.clock.now_ms() + 60_000)
        .await;
    (failures(&r), s)
}

pub fn record(pid: &str, status: RecordStatus, unknown: bool, now: i64) -> IdempotencyRecord {
    IdempotencyRecord {
        traceparent: None,
        key: pid.into(),
        status,
        payload_hash: Job::parse(&body(pid, 100)).unwrap().fingerprint(),
        lease_owner: Some("earlier".into()),
        lease_expires_at_ms: now,
        attempts: 1,
        outcome: None,
        expires_at_s: now / 1000 + 86_400,
        first_attempt_at_ms: now,
        unknown_outcome: unknown,
        last_error: None,
        completed_at_ms: None,
        not_before_ms: None,
    }
}

/// A record left unknown long enough ago that the downstream may have forgotten the key: every
/// call must be preceded by a lookup (retention 60 s, margin 10 s, first attempt 100 s ago).
pub fn forgotten_world() -> World {
    let settings = Settings {
        key_retention_margin: Duration::from_secs(10),
        search_lag: Duration::from_secs(30),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    *w.downstream.key_retention.lock().unwrap() = Some(Duration::from_secs(60));
    let now = w.clock.now_ms();
    let mut r = record("p1", RecordStatus::Failed, true, now - 100_000);
    r.not_before_ms = Some(now - 90_000);
    w.store.insert(r);
    w
}
