//! The scheduled catch-up as the template runs it: the event function invoked every
//! `EventsCatchUpMinutes` with `{"catch_up": true}` (an asynchronous invocation: Lambda tries a
//! failed one twice more, a minute and then two later; runs may overlap), built as its
//! environment builds it (its pace at the function's share, what it lists, its checkpoint in
//! the idempotency table, the sweep of the held refunds), each run within the function's
//! timeout and killed at a random moment as often as an invocation is.
//!
//! Checked after each invocation: the catch-up's lag (how far its checkpoint is behind the
//! provider's list) stays within [`LAG_INTERVALS`] intervals, but for an outage of the provider
//! or of AWS in that time. The mutations `catch_up_off` (no schedule) and
//! `catch_up_every_event_at_instance_share` (main before the events-at-pace work) put back
//! what it is for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use payment_core::events::catch_up::{Budget, ScheduledCatchUp};
use payment_core::events::checkpoint::Checkpoint;
use payment_core::events::queue::SqsEventQueue;
use payment_core::refunds::held::HeldRefunds;
use payment_core::refunds::queue::SqsRefundQueue;

use super::{World, EPOCH_MS};
use crate::provider::client::Client;
use crate::sqs::url_of;

/// The most intervals the catch-up may be behind the provider's list after a run, outside
/// outages (a run failing now and then, retried, and the next one listing what it missed).
pub const LAG_INTERVALS: i64 = 6;

/// What the runs have shown so far: through when the list was checked, the worst lag.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// The newest `checked_through` a run reported, epoch s.
    checked_through_s: Option<i64>,
    /// The longest lag after a run, s.
    pub(super) worst_lag_s: i64,
    /// Runs that reported, failed or were killed.
    pub(super) runs: (usize, usize, usize),
}

/// A catch-up as the event function's init builds it (a cold start each run).
fn instance(w: &World) -> ScheduledCatchUp {
    let cfg = &w.events.config;
    // Put back: every event listed, at one instance's share of the function's rate.
    let old = w.opts.mutation.as_deref() == Some("catch_up_every_event_at_instance_share");
    let rate = if old {
        cfg.provider_pace
    } else {
        cfg.catch_up_pace
    };
    let client = Client {
        provider: w.provider.clone(),
        pace: rate.map(|r| Arc::new(sqs_once::pace::Pace::new(r))),
    };
    let dynamodb = crate::wire::dynamodb_client(&w.sdk);
    let sqs = crate::wire::sqs_client(&w.sdk);
    let held = cfg.refunds_queue_url.as_ref().map(|url| {
        let queue = SqsRefundQueue::new(sqs.clone(), url);
        let held = HeldRefunds::new(
            dynamodb.clone(),
            &cfg.idempotency_table,
            Arc::new(queue),
            cfg.refund_window,
        )
        .with_clock(Arc::clone(&w.clock));
        (Arc::new(held), cfg.held_refund_horizon)
    });
    ScheduledCatchUp {
        lister: Arc::new(client),
        queue: Arc::new(
            SqsEventQueue::new(sqs, url_of(&w.events.queue))
                .with_dead_letters(cfg.dead_letter_queue_url.clone()),
        ),
        checkpoint: Checkpoint::new(dynamodb, &cfg.idempotency_table),
        lists: if old {
            payment_core::events::catch_up::Listed::All
        } else {
            cfg.catch_up_lists
        },
        held,
        clock: Arc::clone(&w.clock),
    }
}

/// The schedule: a run every `every` until `end_ms`, each on a task of its own.
pub(super) async fn schedule(w: Arc<World>, every: Duration, end_ms: i64) {
    if w.opts.mutation.as_deref() == Some("catch_up_off") {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        if !w.running(end_ms) {
            return;
        }
        tokio::spawn(invocation(Arc::clone(&w), every));
    }
}

/// One scheduled invocation, tried again twice when it fails (Lambda's asynchronous retries).
async fn invocation(w: Arc<World>, every: Duration) {
    for retry_in in [60, 120, 0] {
        if run_once(&w, every).await {
            return;
        }
        if retry_in == 0 {
            w.note("catch-up: failed three times; the next scheduled run goes on".into());
            return;
        }
        tokio::time::sleep(Duration::from_secs(retry_in)).await;
    }
}

/// One run within the function's timeout (or killed before it); whether it succeeded.
async fn run_once(w: &World, every: Duration) -> bool {
    let timeout = Duration::from_secs(w.events.timeout_s as u64);
    // The handler's budget: no page started in the last 15 s before the deadline.
    let budget = Budget {
        until: tokio::time::Instant::now() + timeout.saturating_sub(Duration::from_secs(15)),
        max_pages: usize::MAX,
    };
    let killed_at = (w.draw() < w.opts.crash_rate).then(|| timeout.mul_f64(w.draw()));
    let catch_up = instance(w);
    let outcome = tokio::time::timeout(killed_at.unwrap_or(timeout), catch_up.run(budget)).await;
    let now_s = w.clock.now_ms() / 1000;
    let ok = match outcome {
        Err(_) => {
            w.note(format!(
                "catch-up: {} after {:?}",
                if killed_at.is_some() {
                    "killed"
                } else {
                    "timed out"
                },
                killed_at.unwrap_or(timeout)
            ));
            w.catch_up.lock().expect("catch-up").runs.2 += 1;
            false
        }
        Ok(run) => match run.into_result() {
            Ok(report) => {
                w.note(format!(
                    "catch-up: {} pages, {} queued, finished {}, checked through {:?}",
                    report.pages, report.queued, report.finished, report.checked_through_s
                ));
                let mut p = w.catch_up.lock().expect("catch-up");
                p.runs.0 += 1;
                if let Some(t) = report.checked_through_s {
                    p.checked_through_s = Some(p.checked_through_s.map_or(t, |c| c.max(t)));
                }
                true
            }
            Err(e) => {
                w.note(format!("catch-up: failed: {e}"));
                w.catch_up.lock().expect("catch-up").runs.1 += 1;
                false
            }
        },
    };
    check_lag(w, now_s, every);
    ok
}

/// The catch-up's lag is bounded: at most [`LAG_INTERVALS`] intervals behind, unless the
/// provider, DynamoDB or SQS was down within that time.
fn check_lag(w: &World, now_s: i64, every: Duration) {
    let bound = LAG_INTERVALS * every.as_secs() as i64;
    let lag = {
        let mut p = w.catch_up.lock().expect("catch-up");
        let lag = now_s - p.checked_through_s.unwrap_or(EPOCH_MS / 1000);
        p.worst_lag_s = p.worst_lag_s.max(lag);
        lag
    };
    let recent_outage = [
        w.opts.provider_outage,
        w.opts.dynamo_outage,
        w.opts.sqs_outage,
    ]
    .into_iter()
    .flatten()
    .any(|o| {
        let w = super::outage_window(o);
        w.start / 1000 <= now_s && now_s - bound <= w.end / 1000
    });
    if lag > bound && !recent_outage {
        w.violated(
            "the catch-up's lag bounded",
            format!(
                "checked through {} s ago, more than {LAG_INTERVALS} intervals of {} s",
                lag,
                every.as_secs()
            ),
        );
    }
}

/// The runs' state, kept by the world.
pub(super) type Shared = Mutex<Progress>;
