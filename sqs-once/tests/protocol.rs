//! Protocol tests of the batch runner with in-memory ports and a toy [`Work`] (a "job" with an
//! id and an amount, run against a scripted downstream): GIVEN a store state and a downstream
//! behaviour, WHEN a batch is handled, THEN the calls, records and batch response are what
//! someone who must not do a thing twice expects. Fast and deterministic; the same behaviours
//! run against the real SDK and emulator in the repository's `tests/integration`, with
//! payments.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;
use sqs_once::clock::Clock;
use sqs_once::memory::InMemoryStore;
use sqs_once::queue::{DeadLetter, QueueError, QueueOps};
use sqs_once::record::{
    ClaimRequest, ClaimResult, DeadLetterMark, IdempotencyRecord, IdempotencyStore, Outcome,
    RecordStatus, StoreError,
};
use sqs_once::runner::now_ms;
use sqs_once::{AttemptContext, BatchRunner, CallError, Rejection, Settings, Verdict, Work};

/// A parsed job: `{"id": "...", "amount": n}`.
#[derive(Debug, Clone)]
struct Job {
    id: String,
    amount: i64,
}

impl Job {
    fn parse(body: &str) -> Result<Job, Rejection> {
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
    fn fingerprint(&self) -> String {
        format!("{}:{}", self.id, self.amount)
    }
}

/// How a scripted call fails.
#[derive(Clone, Copy, Debug)]
enum FailureKind {
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
enum Behaviour {
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
struct Toy {
    behaviour: Mutex<HashMap<String, Behaviour>>,
    calls: Mutex<HashMap<String, u64>>,
    lookups: Mutex<HashMap<String, u64>>,
    /// Effects the downstream holds although the caller never heard of them (for lookups).
    found: Mutex<HashMap<String, String>>,
    /// Status of what a lookup finds (default `succeeded`).
    found_status: Mutex<Option<String>>,
    /// Lookups fail (the downstream's search is down).
    lookup_fails: Mutex<bool>,
    timeout: Duration,
    /// `None`: the downstream keeps keys as long as the records live.
    key_retention: Mutex<Option<Duration>>,
}

impl Toy {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            key_retention: Mutex::new(Some(Duration::from_secs(24 * 3600))),
            ..Default::default()
        }
    }
    fn set(&self, id: &str, b: Behaviour) {
        self.behaviour.lock().unwrap().insert(id.to_owned(), b);
    }
    fn calls(&self, id: &str) -> u64 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
    fn lookups(&self, id: &str) -> u64 {
        self.lookups.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

fn done(id: &str) -> Outcome {
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
    fn call_timeout(&self) -> Duration {
        self.timeout
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
    async fn lookup(&self, job: &Job) -> Result<Option<Outcome>, CallError> {
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

type Processor = BatchRunner<Toy>;

#[derive(Default)]
struct FakeQueues {
    dead: Mutex<Vec<DeadLetter>>,
    deleted: AtomicU64,
    /// (receipt handle, seconds) of every visibility change.
    visibility: Mutex<Vec<(String, i32)>>,
    /// The source queue's `maxReceiveCount` (`None`: no redrive policy).
    max_receives: Mutex<Option<u32>>,
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
}

struct World {
    clock: Arc<sqs_once::clock::TokioClock>,
    store: Arc<InMemoryStore>,
    provider: Arc<Toy>,
    queues: Arc<FakeQueues>,
    processor: Arc<Processor>,
}

fn world(settings: Settings, timeout: Duration) -> World {
    world_wrapped(settings, timeout, |s| s)
}

/// A world whose processor sees the in-memory store through `wrap` (a store that fails in a
/// scripted way); the world's `store` is the one underneath.
fn world_wrapped(
    settings: Settings,
    timeout: Duration,
    wrap: impl FnOnce(Arc<InMemoryStore>) -> Arc<dyn IdempotencyStore>,
) -> World {
    let store = Arc::new(InMemoryStore::new());
    let provider = Arc::new(Toy::new(timeout));
    let queues = Arc::new(FakeQueues::default());
    let clock = Arc::new(sqs_once::clock::TokioClock::new());
    let processor = Arc::new(
        Processor::new(
            provider.clone(),
            wrap(store.clone()),
            queues.clone(),
            settings,
        )
        .with_clock(clock.clone()),
    );
    World {
        clock,
        store,
        provider,
        queues,
        processor,
    }
}

fn fast() -> Settings {
    Settings {
        lease: Duration::from_secs(10),
        call_retry_delay: Duration::from_millis(1),
        // The tests that need it set the downstream's processing allowance themselves.
        processing_allowance: Duration::ZERO,
        ..Settings::default()
    }
}

fn body(id: &str, amount: i64) -> String {
    format!(r#"{{"id":"{id}","amount":{amount}}}"#)
}

fn msg(id: &str, body: &str, group: Option<&str>) -> SqsMessage {
    msg_at(
        id,
        body,
        group,
        sqs_once::clock::TokioClock::new().now_ms(),
        1,
    )
}

fn msg_at(
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
    m.event_source_arn = Some("arn:aws:sqs:us-east-1:000000000000:payments".into());
    m.attributes
        .insert("SentTimestamp".into(), sent_ms.to_string());
    m.attributes
        .insert("ApproximateReceiveCount".into(), receive_count.to_string());
    if let Some(g) = group {
        m.attributes.insert("MessageGroupId".into(), g.to_owned());
    }
    m
}

fn failures(r: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<String> {
    let mut v: Vec<String> = r
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_panic_in_one_message_fails_only_that_message() {
    let w = world(fast(), Duration::from_secs(1));
    w.provider.set("boom", Behaviour::Panic);
    let batch = vec![
        msg("m1", &body("ok1", 100), None),
        msg("m2", &body("boom", 100), None),
        msg("m3", &body("ok2", 100), None),
    ];
    let (response, summary) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert_eq!(failures(&response), vec!["m2"]);
    assert_eq!(summary.done("done"), 2);
    assert_eq!(w.provider.calls("ok1") + w.provider.calls("ok2"), 2);
}

#[tokio::test]
async fn a_duplicate_costs_one_store_call_and_no_provider_call() {
    let w = world(fast(), Duration::from_secs(1));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let before = w.store.calls();
    let (response, summary) = w
        .processor
        .handle_batch(vec![msg("m2", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(summary.duplicates, 1);
    assert_eq!(
        w.store.calls() - before,
        1,
        "one conditional write, no read"
    );
    assert_eq!(w.provider.calls("p1"), 1);
}

#[tokio::test]
async fn no_provider_call_is_sent_unless_the_lease_outlasts_the_client_timeout() {
    // Lease 3 s, client timeout 2 s, the provider asks to wait 1 s: a retry would land past
    // the lease, so only the first call is sent.
    let settings = Settings {
        lease: Duration::from_secs(3),
        call_attempts: 5,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    w.provider.set(
        "p1",
        Behaviour::Fail(FailureKind::RateLimited, Some(Duration::from_secs(1))),
    );
    let (response, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert_eq!(failures(&response), vec!["m1"]);
    assert_eq!(w.provider.calls("p1"), 1);
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(r.status, RecordStatus::Failed);
    assert!(!r.unknown_outcome, "a 429 proves nothing was executed");
}

#[tokio::test]
async fn a_lease_shorter_than_the_client_timeout_never_calls_the_provider() {
    let w = world(fast(), Duration::from_secs(5));
    // The invocation ends in 2 s, so the lease is capped at the deadline + 5 s = 7 s: with a
    // 10 s client timeout no call could finish inside it, so nothing is claimed or sent.
    let w2 = world(fast(), Duration::from_secs(10));
    let (r, _) = w2
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 2_000)
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert_eq!(w2.provider.calls("p1"), 0);
    assert!(
        w2.store.get("p1").await.unwrap().is_none(),
        "nothing claimed"
    );
    // With time enough the same message is charged.
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
}

#[tokio::test(start_paused = true)]
async fn ambiguous_failures_mark_the_outcome_unknown_and_takeover_inherits_it() {
    let w = world(fast(), Duration::from_secs(1));
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::Timeout, None));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    tokio::time::advance(Duration::from_secs(2)).await;
    // A later 429 proves nothing: the mark stays.
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome, r.attempts),
        (RecordStatus::Failed, true, 2)
    );
    // A definitive answer settles it.
    tokio::time::advance(Duration::from_secs(2)).await;
    w.provider.set("p1", Behaviour::Done);
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome),
        (RecordStatus::Completed, false)
    );
}

#[tokio::test]
async fn declines_are_recorded_once_and_never_retried() {
    let w = world(fast(), Duration::from_secs(1));
    w.provider.set("p1", Behaviour::Decline);
    let (r, s) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(s.done("declined"), 1);
    assert_eq!(w.provider.calls("p1"), 1);
    assert!(w.queues.dead.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_zombie_whose_lease_was_taken_over_cannot_complete() {
    let w = world(fast(), Duration::from_secs(1));
    let req = Job::parse(&body("p1", 100)).unwrap();
    let claim = |owner: &str, now: i64| ClaimRequest {
        key: req.id.clone(),
        payload_hash: req.fingerprint(),
        owner: owner.to_owned(),
        now_ms: now,
        lease_expires_at_ms: now + 1_000,
        expires_at_s: now / 1000 + 86_400,
    };
    let t0 = now_ms();
    w.store.claim(&claim("zombie", t0)).await.unwrap();
    // The zombie's lease ends; a new attempt takes over.
    w.store.claim(&claim("new", t0 + 2_000)).await.unwrap();
    let outcome = done("p1");
    assert!(matches!(
        w.store.complete(&req.id, "zombie", &outcome).await,
        Err(sqs_once::record::StoreError::LeaseLost)
    ));
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.lease_owner.as_deref()),
        (RecordStatus::InProgress, Some("new"))
    );
}

#[tokio::test]
async fn fifo_failure_blocks_the_rest_of_its_group_only() {
    let w = world(fast(), Duration::from_secs(1));
    w.provider
        .set("a1", Behaviour::Fail(FailureKind::ServerError, None));
    let batch = vec![
        msg("a1", &body("a1", 100), Some("A")),
        msg("b1", &body("b1", 100), Some("B")),
        msg("a2", &body("a2", 100), Some("A")),
        msg("a3", &body("a3", 100), Some("A")),
        msg("b2", &body("b2", 100), Some("B")),
    ];
    let (r, _) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert_eq!(failures(&r), vec!["a1", "a2", "a3"]);
    assert_eq!(
        w.provider.calls("a2") + w.provider.calls("a3"),
        0,
        "not processed after the failure"
    );
    assert_eq!(w.provider.calls("b1") + w.provider.calls("b2"), 2);
}

#[tokio::test]
async fn bad_input_is_dead_lettered_then_deleted_and_never_charged() {
    let w = world(fast(), Duration::from_secs(1));
    let batch = vec![msg("m1", "{nope", None), msg("m2", &body("p1", 0), None)];
    let (r, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(s.dead_lettered.get("invalid_json"), Some(&1));
    assert_eq!(s.dead_lettered.get("invalid_job"), Some(&1));
    assert_eq!(w.queues.deleted.load(Ordering::SeqCst), 2);
    let dead = w.queues.dead.lock().unwrap();
    assert_eq!(
        dead.iter()
            .find(|d| d.source_message_id == "m1")
            .unwrap()
            .body,
        "{nope"
    );
    assert_eq!(w.provider.calls("p1"), 0);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_extends_visibility_and_lease_together_on_one_schedule() {
    // Lease 30 s, visibility 9 s: one beat every 3 s. A 10 s charge gets beats at 3, 6, 9 s.
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(9),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(20));
    w.provider
        .set("slow", Behaviour::Slow(Duration::from_secs(10)));
    let start = w.clock.now_ms();
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("slow", 100), None)], start + 60_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.store.renewals(), 3);
    let vis = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(
        vis,
        vec![("rh-m1".to_owned(), 9); 3],
        "each beat extends the message by the visibility timeout"
    );
    assert_eq!(
        w.store.get("slow").await.unwrap().unwrap().status,
        RecordStatus::Completed
    );
}

#[tokio::test(start_paused = true)]
async fn work_shorter_than_the_first_beat_makes_no_heartbeat_call() {
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(9),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(20));
    w.provider
        .set("quick", Behaviour::Slow(Duration::from_millis(2_900)));
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("quick", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.store.renewals(), 0);
    assert!(w.queues.visibility.lock().unwrap().is_empty());
    // A new payment costs two store writes: the claim and the completion.
    assert_eq!(w.store.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_stops_extending_before_the_deadline() {
    // Beats every 1 s; the deadline is 4.5 s away: no beat is sent within a beat of it.
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(3),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.provider
        .set("slow", Behaviour::Slow(Duration::from_secs(60)));
    let start = w.clock.now_ms();
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("slow", 100), None)], start + 4_500)
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert_eq!(
        w.store.renewals(),
        3,
        "beats at 1, 2, 3 s; none at 4 s, a beat from the deadline"
    );
    let r = w.store.get("slow").await.unwrap().unwrap();
    assert!(
        r.lease_expires_at_ms <= start + 4_500 + 5_000,
        "never past the deadline plus the margin"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_stops_the_work_and_completes_nothing() {
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(3),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(20));
    w.provider
        .set("p1", Behaviour::Slow(Duration::from_secs(15)));
    let store = w.store.clone();
    let thief = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let mut r = store.get("p1").await.unwrap().unwrap();
        r.lease_owner = Some("someone-else".into());
        store.insert(r);
    });
    let t0 = tokio::time::Instant::now();
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    thief.await.unwrap();
    assert_eq!(failures(&r), vec!["m1"]);
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "stopped at the first beat after the loss, not after the 15 s call"
    );
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.lease_owner.as_deref()),
        (RecordStatus::InProgress, Some("someone-else"))
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_reports_unfinished_and_unstarted_messages_in_time() {
    let settings = Settings {
        max_concurrency: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    w.provider
        .set("slow", Behaviour::Slow(Duration::from_secs(60)));
    let t0 = tokio::time::Instant::now();
    let deadline = w.clock.now_ms() + 5_000;
    let batch = vec![
        msg("m1", &body("slow", 100), None),
        msg("m2", &body("next", 100), None),
    ];
    let (r, _) = w.processor.handle_batch(batch, deadline).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "answered before the deadline"
    );
    assert_eq!(failures(&r), vec!["m1", "m2"]);
    assert_eq!(w.provider.calls("next"), 0, "not started");
    assert!(w.store.get("next").await.unwrap().is_none());
    // The unfinished attempt's lease ends by the deadline plus the margin: the next delivery
    // after that takes it over instead of finding it blocked forever.
    let rec = w.store.get("slow").await.unwrap().unwrap();
    assert!(rec.lease_expires_at_ms <= deadline + 5_000);
    tokio::time::advance(Duration::from_secs(11)).await;
    w.provider.set("slow", Behaviour::Done);
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("slow", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.store.get("slow").await.unwrap().unwrap().attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn no_time_left_means_no_claim() {
    // The remaining time reads zero: nothing is claimed, so nothing can be left in progress.
    let w = world(fast(), Duration::from_secs(2));
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], w.clock.now_ms())
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert!(w.store.get("p1").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn redelivery_backoff_grows_with_the_receive_count() {
    let settings = Settings {
        redelivery_base_delay: Duration::from_secs(10),
        redelivery_max_delay: Duration::from_secs(300),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    // A 429 is refused before execution: no `not_before`, every delivery claims again.
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    for n in 1..=7u32 {
        let m = msg_at(
            &format!("m{n}"),
            &body("p1", 100),
            None,
            w.clock.now_ms(),
            n,
        );
        w.processor
            .handle_batch(vec![m], w.clock.now_ms() + 60_000)
            .await;
    }
    let vis = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(vis.len(), 7);
    for (i, (_, secs)) in vis.iter().enumerate() {
        let full = (10u64 << i).min(300) as i32;
        assert!(
            *secs >= full / 2 - 1 && *secs <= full,
            "receive {}: {secs} s not in [{}, {full}]",
            i + 1,
            full / 2
        );
    }
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempts), (RecordStatus::Failed, 7));
    assert!(rec.last_error.unwrap().contains("RateLimited"));
}

#[tokio::test(start_paused = true)]
async fn a_worker_paused_past_its_lease_does_not_send() {
    // The provider asks to retry after 4 s; by then the lease (5 s) has less than the client
    // timeout (2 s) left, so the retry is not sent although attempts remain.
    let settings = Settings {
        lease: Duration::from_secs(5),
        call_attempts: 5,
        visibility_timeout: Duration::from_secs(60),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    w.provider.set(
        "p1",
        Behaviour::Fail(FailureKind::RateLimited, Some(Duration::from_secs(4))),
    );
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert_eq!(
        w.provider.calls("p1"),
        1,
        "a retry would have landed after the lease"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_is_looked_up_before_the_provider_may_have_forgotten_the_key() {
    // Key retention 60 s, margin 10 s. The first attempt's answer is lost (the effect happened).
    let settings = Settings {
        key_retention_margin: Duration::from_secs(10),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    *w.provider.key_retention.lock().unwrap() = Some(Duration::from_secs(60));
    w.provider.set("p1", Behaviour::LostAnswer);
    let sent = w.clock.now_ms();
    w.processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 1)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(w.store.get("p1").await.unwrap().unwrap().unknown_outcome);
    // Soon after, the key is remembered: a blind retry with it is safe, no lookup.
    w.provider.set("p1", Behaviour::LostAnswer);
    tokio::time::advance(Duration::from_secs(5)).await;
    w.processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 2)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert_eq!(w.provider.lookups.lock().unwrap().get("p1"), None);
    // Past retention - margin - timeout, no blind call: the lookup finds the charge.
    tokio::time::advance(Duration::from_secs(45)).await;
    w.provider.set("p1", Behaviour::Done);
    let calls = w.provider.calls("p1");
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 3)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.provider.calls("p1"), calls, "no new charge");
    assert_eq!(w.provider.lookups.lock().unwrap().get("p1"), Some(&1));
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(rec.outcome.unwrap().text("receipt"), Some("r_p1"));
    assert!(!rec.unknown_outcome);
}

#[tokio::test]
async fn a_failed_attempt_cannot_touch_a_record_it_does_not_own() {
    let w = world(fast(), Duration::from_secs(1));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let req = Job::parse(&body("p1", 100)).unwrap();
    let note = sqs_once::record::FailureNote {
        error: "late zombie".into(),
        unknown_outcome: false,
        not_before_ms: None,
    };
    assert!(w
        .store
        .fail(&req.id, "zombie", now_ms(), &note)
        .await
        .is_err());
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        rec.status,
        RecordStatus::Completed,
        "the completed record is untouched"
    );
}

// ---- The exactly-once holes: receive budget, sticky mark, not_before, lost claim answers,
// ---- search lag, message age, every failure path's delay.

/// A store that fails in scripted ways around the in-memory one.
struct ScriptedStore {
    inner: Arc<InMemoryStore>,
    /// The next claim is applied but its answer is lost; the SDK's retry is then refused by
    /// the first write (what DynamoDB returns to a retried `UpdateItem`).
    lose_claim_answer: Mutex<bool>,
    /// Claims fail as if the table were unreachable.
    claims_fail: Mutex<bool>,
    /// Completions fail as if the table were unreachable.
    completes_fail: Mutex<bool>,
}

impl ScriptedStore {
    fn new(inner: Arc<InMemoryStore>) -> Self {
        Self {
            inner,
            lose_claim_answer: Mutex::new(false),
            claims_fail: Mutex::new(false),
            completes_fail: Mutex::new(false),
        }
    }
}

#[async_trait]
impl IdempotencyStore for ScriptedStore {
    async fn claim(&self, r: &ClaimRequest) -> Result<ClaimResult, StoreError> {
        if *self.claims_fail.lock().unwrap() {
            return Err(StoreError::Unavailable("table unreachable".into()));
        }
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
    async fn complete(&self, id: &str, owner: &str, outcome: &Outcome) -> Result<(), StoreError> {
        if *self.completes_fail.lock().unwrap() {
            return Err(StoreError::Unavailable("table unreachable".into()));
        }
        self.inner.complete(id, owner, outcome).await
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
    fn last_delay(&self) -> i32 {
        self.visibility
            .lock()
            .unwrap()
            .last()
            .expect("a delay was set")
            .1
    }
    fn dead(&self) -> Vec<DeadLetter> {
        self.dead.lock().unwrap().clone()
    }
}

/// One delivery of `pid`'s message with this receive count, first received at `first_ms`.
fn delivery(pid: &str, n: u32, first_ms: i64) -> SqsMessage {
    let mut m = msg_at(&format!("m-{pid}-{n}"), &body(pid, 100), None, first_ms, n);
    m.attributes.insert(
        "ApproximateFirstReceiveTimestamp".into(),
        first_ms.to_string(),
    );
    m
}

async fn deliver(w: &World, m: SqsMessage) -> (Vec<String>, sqs_once::BatchSummary) {
    let (r, s) = w
        .processor
        .handle_batch(vec![m], w.clock.now_ms() + 60_000)
        .await;
    (failures(&r), s)
}

fn record(pid: &str, status: RecordStatus, unknown: bool, now: i64) -> IdempotencyRecord {
    IdempotencyRecord {
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

#[tokio::test(start_paused = true)]
async fn on_its_last_receive_a_failing_payment_is_dead_lettered_with_a_reason_not_by_sqs() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    let first = w.clock.now_ms();
    for n in 1..=2 {
        let (failed, _) = deliver(&w, delivery("p1", n, first)).await;
        assert_eq!(failed.len(), 1, "receive {n} comes back");
        assert!(w.queues.dead().is_empty());
        tokio::time::advance(Duration::from_secs(w.queues.last_delay() as u64)).await;
    }
    let (failed, s) = deliver(&w, delivery("p1", 3, first)).await;
    assert!(
        failed.is_empty(),
        "the processor acknowledges what it dead-lettered"
    );
    assert_eq!(s.dead_lettered.get("retries_exhausted"), Some(&1));
    let dead = w.queues.dead();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "retries_exhausted");
    assert!(
        dead[0].error_message.contains("RateLimited") && dead[0].error_message.contains("3"),
        "{}",
        dead[0].error_message
    );
}

#[tokio::test(start_paused = true)]
async fn a_provider_outage_as_long_as_the_horizon_dead_letters_nothing() {
    let settings = Settings {
        retry_horizon: Duration::from_secs(3600),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(4);
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::ServerError, None));
    let first = w.clock.now_ms();
    let mut n = 1;
    loop {
        if w.clock.now_ms() - first >= 3_600_000 {
            w.provider.set("p1", Behaviour::Done);
        }
        let (failed, s) = deliver(&w, delivery("p1", n, first)).await;
        assert!(w.queues.dead().is_empty(), "dead-lettered on receive {n}");
        if failed.is_empty() {
            assert_eq!(s.done("done"), 1);
            break;
        }
        tokio::time::advance(Duration::from_secs(w.queues.last_delay() as u64)).await;
        n += 1;
    }
    assert!(n <= 4, "within maxReceiveCount");
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(r.status, RecordStatus::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_dead_workers_payment_is_taken_over_after_one_lease_without_burning_the_budget() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    // A worker claimed p1 with a 60 s lease, the provider charged, and the worker died.
    let mut held = record("p1", RecordStatus::InProgress, false, now);
    held.lease_expires_at_ms = now + 60_000;
    w.store.insert(held);
    w.provider
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "pi_p1".into());
    let (failed, _) = deliver(&w, delivery("p1", 1, now)).await;
    assert_eq!(failed.len(), 1);
    assert!(
        w.queues.last_delay() <= 5,
        "the first look comes back quickly"
    );
    tokio::time::advance(Duration::from_secs(w.queues.last_delay() as u64)).await;
    let (failed, _) = deliver(&w, delivery("p1", 2, now)).await;
    assert_eq!(failed.len(), 1);
    let wait = w.queues.last_delay();
    assert!(
        (55..=62).contains(&wait),
        "then waits for the lease's end: {wait} s"
    );
    tokio::time::advance(Duration::from_secs(wait as u64)).await;
    let (failed, s) = deliver(&w, delivery("p1", 3, now)).await;
    assert!(failed.is_empty());
    assert_eq!(s.done("done"), 1);
    assert!(w.queues.dead().is_empty());
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.attempts), (RecordStatus::Completed, 2));
}

#[tokio::test]
async fn a_fifo_message_blocked_on_its_last_receive_is_dead_lettered_with_the_reason() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(2);
    w.provider
        .set("a", Behaviour::Fail(FailureKind::RateLimited, None));
    let now = now_ms();
    let first = msg_at("m1", &body("a", 100), Some("g"), now, 1);
    let second = msg_at("m2", &body("b", 100), Some("g"), now, 2);
    let (r, _) = w
        .processor
        .handle_batch(vec![first, second], now + 60_000)
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    let dead = w.queues.dead();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "retries_exhausted");
    assert!(dead[0]
        .error_message
        .contains("earlier message of its FIFO group"));
    assert_eq!(w.provider.calls("b"), 0, "never processed out of order");
}

#[tokio::test]
async fn the_unknown_outcome_mark_is_sticky_in_the_store() {
    let store = InMemoryStore::new();
    let req = Job::parse(&body("p1", 100)).unwrap();
    let now = now_ms();
    store.insert(record("p1", RecordStatus::Failed, true, now - 10));
    let claim = ClaimRequest {
        key: req.id.clone(),
        payload_hash: req.fingerprint(),
        owner: "me".into(),
        now_ms: now,
        lease_expires_at_ms: now + 10_000,
        expires_at_s: now / 1000 + 86_400,
    };
    store.claim(&claim).await.unwrap();
    let note = sqs_once::record::FailureNote {
        error: "429".into(),
        unknown_outcome: false,
        not_before_ms: None,
    };
    store.fail(&req.id, "me", now, &note).await.unwrap();
    assert!(store.get("p1").await.unwrap().unwrap().unknown_outcome);
}

#[tokio::test(start_paused = true)]
async fn a_409_marks_the_outcome_unknown_and_a_retry_loop_of_409s_keeps_it() {
    let w = world(fast(), Duration::from_secs(1));
    w.provider
        .set("fresh", Behaviour::Fail(FailureKind::KeyInUse, None));
    deliver(&w, delivery("fresh", 1, w.clock.now_ms())).await;
    let r = w.store.get("fresh").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    assert_eq!(w.provider.calls("fresh"), 3, "retried inside the lease");
    // Taken over with the mark: three more 409s end with the mark still set.
    tokio::time::advance(Duration::from_secs(5)).await;
    deliver(&w, delivery("fresh", 2, w.clock.now_ms())).await;
    let r = w.store.get("fresh").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome, r.attempts),
        (RecordStatus::Failed, true, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn no_claim_before_the_last_ambiguous_call_could_have_landed() {
    let settings = Settings {
        processing_allowance: Duration::from_secs(3),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::Timeout, None));
    let sent = w.clock.now_ms();
    deliver(&w, delivery("p1", 1, sent)).await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    let nb = r
        .not_before_ms
        .expect("a not_before after an ambiguous call");
    assert!(
        nb >= sent + 4_000,
        "last send + 1 s timeout + 3 s allowance"
    );
    w.provider.set("p1", Behaviour::Done);
    tokio::time::advance(Duration::from_secs(2)).await;
    let (failed, _) = deliver(&w, delivery("p1", 2, sent)).await;
    assert_eq!(failed.len(), 1, "refused before not_before");
    assert_eq!(
        w.provider.calls("p1"),
        1,
        "no call while the first may still land"
    );
    assert_eq!(w.store.get("p1").await.unwrap().unwrap().attempts, 1);
    let wait = w.queues.last_delay();
    assert!(
        (2..=4).contains(&wait),
        "comes back at not_before: {wait} s"
    );
    tokio::time::advance(Duration::from_secs(wait as u64)).await;
    let (failed, s) = deliver(&w, delivery("p1", 3, sent)).await;
    assert!(failed.is_empty());
    assert_eq!(s.done("done"), 1);
}

#[tokio::test]
async fn a_lost_claim_answer_whose_retry_meets_our_own_lease_is_claimed_with_an_unknown_outcome() {
    let w = world_wrapped(fast(), Duration::from_secs(1), |s| {
        let scripted = ScriptedStore::new(s);
        *scripted.lose_claim_answer.lock().unwrap() = true;
        Arc::new(scripted)
    });
    // The call fails before execution, so the record shows what the attempt believed.
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    let (failed, _) = deliver(&w, delivery("p1", 1, now_ms())).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(w.provider.calls("p1"), 3, "claimed: it called the provider");
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.attempts, r.unknown_outcome),
        (RecordStatus::Failed, 1, true),
        "the previous state is unknown, so the outcome is"
    );
}

#[tokio::test]
async fn a_lost_claim_answer_still_charges_once() {
    let w = world_wrapped(fast(), Duration::from_secs(1), |s| {
        let scripted = ScriptedStore::new(s);
        *scripted.lose_claim_answer.lock().unwrap() = true;
        Arc::new(scripted)
    });
    let (failed, s) = deliver(&w, delivery("p1", 1, now_ms())).await;
    assert!(failed.is_empty(), "not Busy on its own lease");
    assert_eq!((s.done("done"), w.provider.calls("p1")), (1, 1));
}

/// A record left unknown long enough ago that the provider may have forgotten the key: every
/// call must be preceded by a lookup (retention 60 s, margin 10 s, first attempt 100 s ago).
fn forgotten_world() -> World {
    let settings = Settings {
        key_retention_margin: Duration::from_secs(10),
        search_lag: Duration::from_secs(30),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    *w.provider.key_retention.lock().unwrap() = Some(Duration::from_secs(60));
    let now = w.clock.now_ms();
    let mut r = record("p1", RecordStatus::Failed, true, now - 100_000);
    r.not_before_ms = Some(now - 90_000);
    w.store.insert(r);
    w
}

#[tokio::test(start_paused = true)]
async fn lookup_finds_the_charge_and_records_it_without_a_call() {
    let w = forgotten_world();
    w.provider
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "pi_found".into());
    let (failed, s) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert!(failed.is_empty());
    assert_eq!(
        (
            s.done("done"),
            w.provider.calls("p1"),
            w.provider.lookups("p1")
        ),
        (1, 0, 1)
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(r.outcome.unwrap().text("receipt"), Some("pi_found"));
}

#[tokio::test(start_paused = true)]
async fn lookup_finds_a_declined_effect_and_records_the_decline() {
    let w = forgotten_world();
    w.provider
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "pi_declined".into());
    *w.provider.found_status.lock().unwrap() = Some("declined".into());
    let (failed, s) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert!(failed.is_empty());
    assert_eq!((s.done("declined"), w.provider.calls("p1")), (1, 0));
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.outcome.unwrap().status.as_str()),
        (RecordStatus::Completed, "declined")
    );
}

#[tokio::test(start_paused = true)]
async fn lookup_finds_nothing_long_after_the_last_call_then_charges_once() {
    let w = forgotten_world();
    let (failed, s) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert!(failed.is_empty());
    assert_eq!(
        (
            s.done("done"),
            w.provider.calls("p1"),
            w.provider.lookups("p1")
        ),
        (1, 1, 1)
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome),
        (RecordStatus::Completed, false)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_lookup_leaves_the_mark_and_calls_nothing() {
    let w = forgotten_world();
    *w.provider.lookup_fails.lock().unwrap() = true;
    let (failed, _) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(w.provider.calls("p1"), 0);
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    assert!(w.queues.last_delay() > 0, "comes back after a backoff");
}

#[tokio::test(start_paused = true)]
async fn nothing_found_after_a_replayed_500_is_looked_up_again_after_the_search_lag() {
    let settings = Settings {
        search_lag: Duration::from_secs(60),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.provider.set("p1", Behaviour::Replayed500);
    let now = w.clock.now_ms();
    // The first call's 500 came moments ago; the provider now replays it for the key.
    let mut r = record("p1", RecordStatus::Failed, true, now - 2_000);
    r.not_before_ms = Some(now - 1_000);
    w.store.insert(r);
    let (failed, _) = deliver(&w, delivery("p1", 1, now)).await;
    assert_eq!(
        failed.len(),
        1,
        "an empty search right after the call is no proof"
    );
    assert!(w.queues.dead().is_empty());
    let wait = w.queues.last_delay();
    assert!(
        (58..=61).contains(&wait),
        "looks again after the lag: {wait} s"
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    tokio::time::advance(Duration::from_secs(wait as u64)).await;
    let (failed, s) = deliver(&w, delivery("p1", 2, now)).await;
    assert!(failed.is_empty());
    assert_eq!(s.dead_lettered.get("outcome_unknown"), Some(&1));
    assert_eq!(w.provider.lookups("p1"), 2);
    let dead = w.queues.dead();
    assert!(
        dead[0].error_message.contains("settle the record of p1"),
        "{}",
        dead[0].error_message
    );
    assert!(!dead[0].error_message.contains("new key"));
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
}

#[tokio::test]
async fn an_expired_message_says_that_its_payment_has_a_record() {
    let settings = Settings {
        record_ttl: Duration::from_secs(3600),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    let now = now_ms();
    let mut r = record("p1", RecordStatus::Completed, false, now - 7_200_000);
    r.outcome = Some(done("p1"));
    w.store.insert(r);
    // SentTimestamp is two hours old; a first_sent_at attribute claiming "now" cannot make it
    // younger.
    let mut m = msg_at("m1", &body("p1", 100), None, now - 7_200_000, 1);
    let mut young = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
    young.string_value = Some(now.to_string());
    young.data_type = Some("String".into());
    m.message_attributes.insert("first_sent_at".into(), young);
    let (r, s) = w.processor.handle_batch(vec![m], now + 60_000).await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(s.dead_lettered.get("request_expired"), Some(&1));
    let why = &w.queues.dead()[0].error_message;
    assert!(why.contains("has a record (status COMPLETED"), "{why}");
    assert!(!why.contains("never charged"), "{why}");
    assert_eq!(w.provider.calls("p1"), 0);
}

#[tokio::test]
async fn a_message_without_an_id_that_must_come_back_fails_the_invocation_not_an_empty_id() {
    let w = world(fast(), Duration::from_secs(1));
    w.provider
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    let mut m = msg("m1", &body("p1", 100), None);
    m.message_id = None;
    let (r, s) = w.processor.handle_batch(vec![m], now_ms() + 60_000).await;
    assert!(r
        .batch_item_failures
        .iter()
        .all(|f| !f.item_identifier.is_empty()));
    assert_eq!(s.unreportable, 1);
}

#[tokio::test]
async fn every_failure_path_sets_a_redelivery_delay() {
    // A claim that fails: backoff.
    let scripted = Arc::new(Mutex::new(None::<Arc<ScriptedStore>>));
    let keep = scripted.clone();
    let w = world_wrapped(fast(), Duration::from_secs(1), move |s| {
        let st = Arc::new(ScriptedStore::new(s));
        *keep.lock().unwrap() = Some(st.clone());
        st
    });
    let st = scripted.lock().unwrap().clone().unwrap();
    *st.claims_fail.lock().unwrap() = true;
    deliver(&w, delivery("p1", 1, now_ms())).await;
    assert_eq!(
        w.queues.visibility.lock().unwrap().len(),
        1,
        "claim failure"
    );
    *st.claims_fail.lock().unwrap() = false;
    // A completion that fails: backoff.
    *st.completes_fail.lock().unwrap() = true;
    let (failed, _) = deliver(&w, delivery("p2", 1, now_ms())).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(
        w.queues.visibility.lock().unwrap().len(),
        2,
        "completion failure"
    );
    *st.completes_fail.lock().unwrap() = false;
    // A lease lost before completion: a few seconds.
    w.provider
        .set("p3", Behaviour::Slow(Duration::from_millis(300)));
    let worker = {
        let w2 = w.processor.clone();
        tokio::spawn(async move {
            w2.handle_batch(vec![delivery("p3", 1, now_ms())], now_ms() + 60_000)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut taken = w.store.get("p3").await.unwrap().unwrap();
    taken.lease_owner = Some("another".into());
    w.store.insert(taken);
    let (r, _) = worker.await.unwrap();
    assert_eq!(failures(&r).len(), 1);
    let vis = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(vis.len(), 3, "lost lease");
    assert!(
        (1..=3).contains(&vis[2].1),
        "a lost race looks again in seconds: {:?}",
        vis[2]
    );
}
