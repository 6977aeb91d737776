//! The scheduled catch-up over long backlogs, listing every event.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use payment_core::events::catch_up::{
    scheduled, Checkpoint, Listed, Position, FIRST_WINDOW_S, OVERLAP_S,
};
use payment_core::provider::event::ProviderEvent;
use sqs_once::runner::now_ms;

use super::{budget, Counted, Provider};
use crate::helpers::*;

/// 20,000 events missed over the last two days (a day's outage on a busy account, within the
/// first run's three-day window). Each run stops after 40 pages, as a run stops at its
/// function's budget: six runs get through, each going on from where the last one got, every
/// event queued once; then new events arrive and the next run queues those and re-lists only
/// the quarter of an hour before its last event. A run that read the checkpoint before
/// another moved it stops without moving it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_20_000_events_is_caught_up_by_runs_that_each_finish() {
    let t = TestStack::new("catch-up-backlog").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    // The account's older history: before the first run's window.
    provider.add(500, now - 20 * 86_400, now - FIRST_WINDOW_S - 60);
    let missed_from = provider.events.lock().unwrap().len();
    provider.add(20_000, now - 2 * 86_400, now - 60);
    let queue = Counted::default();

    let mut runs = Vec::new();
    loop {
        let report = scheduled(
            (&provider, Listed::All),
            &queue,
            &checkpoint,
            now,
            budget(40),
        )
        .await
        .unwrap();
        assert!(report.pages <= 40, "{report:?}");
        let done = report.finished;
        runs.push(report);
        assert!(runs.len() <= 10, "the backlog never drained: {runs:?}");
        if done {
            break;
        }
        // Each run that stopped left the checkpoint at its last event, not caught up.
        let at = checkpoint.read().await.unwrap();
        assert_eq!(at.last, runs.last().unwrap().last, "{at:?}");
        assert!(!at.caught_up);
    }
    let listed: usize = runs.iter().map(|r| r.queued).sum();
    let copies = queue.copies.lock().unwrap().clone();
    let missed: Vec<String> = provider.events.lock().unwrap()[missed_from..]
        .iter()
        .map(|(e, _)| e.id.clone())
        .collect();
    assert!(
        missed.iter().all(|id| copies.get(id) == Some(&1)),
        "every missed event queued exactly once"
    );
    assert_eq!(copies.len(), 20_000, "nothing from before the window");
    assert_eq!(listed, 20_000);
    // The first run spends one page finding where its window starts.
    assert_eq!(runs.len(), 6, "201 pages of 100 in runs of 40: {runs:?}");
    assert!(queue.batches.load(Ordering::SeqCst) <= 210);
    let at = checkpoint.read().await.unwrap();
    assert!(at.caught_up, "{at:?}");
    println!(
        "catch-up: 20000 events in {} runs of at most 40 pages, {} list calls, {} pages queued",
        runs.len(),
        provider.calls.load(Ordering::SeqCst),
        queue.batches.load(Ordering::SeqCst)
    );

    // The steady state: 30 new events; the next run queues them, and re-lists only what was
    // created in the quarter of an hour before its last event.
    provider.add(30, now + 60, now + 120);
    let before: HashMap<String, usize> = queue.copies.lock().unwrap().clone();
    let steady = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        now + 3600,
        budget(40),
    )
    .await
    .unwrap();
    assert!(steady.finished, "{steady:?}");
    let after = queue.copies.lock().unwrap().clone();
    assert_eq!(after.len(), 20_030);
    // The events queued again: created within the overlap before the last run's last event.
    let again: Vec<i64> = provider
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|(e, _)| before.get(&e.id).is_some_and(|b| after[&e.id] > *b))
        .map(|(e, _)| e.created)
        .collect();
    let last = at.last.clone().unwrap();
    assert!(
        !again.is_empty(),
        "the quarter of an hour before the last event is listed again"
    );
    assert!(
        again
            .iter()
            .all(|created| (last.created - OVERLAP_S..=last.created).contains(created)),
        "only the overlap is listed again"
    );
    assert!(
        again.len() <= 1000,
        "at most ten pages of it: {}",
        again.len()
    );
    assert!(
        steady.queued <= 30 + again.len() && steady.queued >= 30,
        "{steady:?}"
    );

    // The checkpoint's writes are conditional on the version read: a run holding an older
    // read cannot move it back.
    let read = checkpoint.read().await.unwrap();
    let moved = Position {
        version: read.version + 1,
        ..read.clone()
    };
    assert!(checkpoint.advance(&read, &moved).await.unwrap());
    assert!(!checkpoint
        .advance(&read, &Position::default())
        .await
        .unwrap());
    assert_eq!(checkpoint.read().await.unwrap(), moved);
}

/// A new account: nothing of the inbox's types before the first run's window. The run walks
/// back to the window's oldest event and queues from it, oldest first; an empty account
/// queues nothing and leaves no checkpoint to go wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_on_a_new_account_starts_at_its_oldest_event() {
    let t = TestStack::new("catch-up-new").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    let queue = Counted::default();
    let empty = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        now,
        budget(10),
    )
    .await
    .unwrap();
    assert!(empty.finished && empty.queued == 0, "{empty:?}");
    // Nothing to go wrong: only that the list was checked through the run's time.
    assert_eq!(
        checkpoint.read().await.unwrap(),
        Position {
            version: 1,
            caught_up: true,
            checked_through_s: Some(now),
            ..Position::default()
        }
    );

    // A day of events after it.
    provider.add(250, now + 10, now + 86_400);
    let now = now + 86_400 + 10;
    let first = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        now,
        budget(10),
    )
    .await
    .unwrap();
    assert!(first.finished, "{first:?}");
    let copies = queue.copies.lock().unwrap().clone();
    assert_eq!(copies.len(), 250);
    assert!(copies.values().all(|c| *c == 1));
    assert_eq!(
        checkpoint.read().await.unwrap().last.map(|p| p.id),
        Some("evt_0000249".to_owned())
    );
}

/// The catch-up did not run for longer than the provider keeps events (a schedule disabled
/// for weeks): the next run starts from the oldest events the provider still lists, not from
/// the first run's three days, so nothing the provider can still give is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_older_than_the_provider_s_events_starts_from_the_oldest_listed() {
    let t = TestStack::new("catch-up-stale").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    provider.add(1, now - 40 * 86_400, now - 40 * 86_400);
    let old = provider.events.lock().unwrap()[0].0.clone();
    provider.add(600, now - 29 * 86_400, now - 60);
    let stale = Position {
        last: Some(payment_core::events::catch_up::Place {
            id: old.id.clone(),
            created: old.created,
        }),
        caught_up: true,
        version: 1,
        from_s: None,
        checked_through_s: None,
        listing_all: None,
    };
    assert!(checkpoint
        .advance(&Position::default(), &stale)
        .await
        .unwrap());
    let queue = Counted::default();
    let run = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        now,
        budget(100),
    )
    .await
    .unwrap();
    assert!(run.finished, "{run:?}");
    assert!(run.jumped, "the jump is reported (CatchUpJumped): {run:?}");
    assert!(
        run.emf_line(now * 1000).contains(r#""CatchUpJumped":1"#),
        "{}",
        run.emf_line(now * 1000)
    );
    assert_eq!(run.since_s, now - 30 * 86_400 + 300, "{run:?}");
    let copies = queue.copies.lock().unwrap().clone();
    assert_eq!(copies.len(), 600, "every event of the last 29 days");
    assert!(!copies.contains_key(&old.id));
}

/// A quarter of an hour busier than a run's whole budget before the last event: the run lists
/// what its budget allows of it again, and still walks at least one page forward, so every
/// run makes progress however busy the overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_overlap_never_stops_a_run_from_going_forward() {
    let t = TestStack::new("catch-up-busy").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    provider.add(1_500, now - 3_000, now - 2_400);
    let last = provider.events.lock().unwrap()[1_499].0.clone();
    provider.add(300, now - 600, now - 60);
    let at = Position {
        last: Some(payment_core::events::catch_up::Place {
            id: last.id.clone(),
            created: last.created,
        }),
        caught_up: true,
        version: 1,
        from_s: None,
        checked_through_s: None,
        listing_all: None,
    };
    assert!(checkpoint.advance(&Position::default(), &at).await.unwrap());
    let queue = Counted::default();
    let mut runs = 0;
    loop {
        let run = scheduled(
            (&provider, Listed::All),
            &queue,
            &checkpoint,
            now,
            budget(3),
        )
        .await
        .unwrap();
        runs += 1;
        let moved = checkpoint.read().await.unwrap().last.unwrap();
        assert!(moved.created >= last.created, "never backwards: {moved:?}");
        if run.finished {
            break;
        }
        assert!(runs < 10, "the runs made no progress: {run:?}");
    }
    let copies = queue.copies.lock().unwrap().clone();
    let after: Vec<String> = provider.events.lock().unwrap()[1_500..]
        .iter()
        .map(|(e, _)| e.id.clone())
        .collect();
    assert!(
        after.iter().all(|id| copies.contains_key(id)),
        "every new event queued"
    );
}

/// An event larger than a queue message (with its type attribute, as SQS counts it), and
/// one the parser cannot read, among the events a run walks: the first is set aside to the
/// dead-letter queue with `event_too_large`, the second is queued as it came (the inbox
/// dead-letters it `invalid_event` with the parser's reason), and the walk and the checkpoint
/// go on past both. (Before, either failed its whole page on every run: the checkpoint never
/// moved again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_event_is_set_aside_and_the_catch_up_moves_past_it() {
    let t = TestStack::new("catch-up-bad").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    provider.add(150, now - 3_000, now - 2_000);
    // A body of exactly the largest message: with its attribute, too large.
    let head = format!(
        r#"{{"id":"evt_0000150","object":"event","type":"payment_intent.succeeded","created":{},"data":{{"object":{{"id":"pi_big","object":"payment_intent","status":"succeeded","metadata":{{}},"description":""#,
        now - 1_900
    );
    let tail = r#""}}}"#;
    let big = format!(
        "{head}{}{tail}",
        "x".repeat(payment_core::events::queue::MAX_MESSAGE_BYTES - head.len() - tail.len())
    );
    // An event the parser refuses (its data is not an object), kept in its place.
    let odd = format!(
        r#"{{"id":"evt_0000151","object":"event","type":"payment_intent.succeeded","created":{},"data":"gone"}}"#,
        now - 1_800
    );
    {
        let mut events = provider.events.lock().unwrap();
        events.push((ProviderEvent::parse(&big).unwrap(), big));
        events.push((
            ProviderEvent {
                id: "evt_0000151".into(),
                kind: "payment_intent.succeeded".into(),
                created: now - 1_800,
                object: serde_json::Value::Null,
            },
            odd.clone(),
        ));
    }
    assert!(ProviderEvent::parse(&odd).is_err());
    provider.add(150, now - 1_700, now - 60);
    let first = provider.events.lock().unwrap()[0].0.clone();
    let at = Position {
        last: Some(payment_core::events::catch_up::Place {
            id: first.id.clone(),
            created: first.created,
        }),
        caught_up: false,
        version: 1,
        from_s: None,
        checked_through_s: None,
        listing_all: None,
    };
    assert!(checkpoint.advance(&Position::default(), &at).await.unwrap());
    let queue = Counted::default();
    let run = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        now,
        budget(100),
    )
    .await
    .unwrap();
    assert!(run.finished, "{run:?}");
    assert_eq!(run.set_aside, 1, "{run:?}");
    assert_eq!(
        queue.set_aside.lock().unwrap().as_slice(),
        [("evt_0000150".to_owned(), "event_too_large".to_owned())]
    );
    let copies = queue.copies.lock().unwrap().clone();
    assert_eq!(
        copies.get("evt_0000151"),
        Some(&1),
        "queued for the inbox to refuse"
    );
    assert!(!copies.contains_key("evt_0000150"));
    assert_eq!(
        copies.len(),
        300,
        "149 before, 150 after, and the unreadable one"
    );
    let place = checkpoint.read().await.unwrap();
    assert!(place.caught_up, "{place:?}");
    assert_eq!(place.last.map(|p| p.id), Some("evt_0000301".to_owned()));
}

/// Listing only the undelivered events, the last one queued may be older than the provider
/// keeps events while every run keeps up: the run starts from when the list was last checked
/// through (less the overlap), reports no jump, and records its own time; a run that stops at
/// its budget reports how far behind it ended (`CatchUpLagMinutes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_measured_from_when_the_list_was_checked_through_not_from_the_last_event() {
    let t = TestStack::new("catch-up-lag").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    // The last undelivered event, 40 days ago; the runs checked the list through an hour ago.
    provider.add(1, now - 40 * 86_400, now - 40 * 86_400);
    let old = provider.events.lock().unwrap()[0].0.clone();
    let kept_up = Position {
        last: Some(payment_core::events::catch_up::Place {
            id: old.id.clone(),
            created: old.created,
        }),
        caught_up: true,
        version: 1,
        from_s: None,
        checked_through_s: Some(now - 3_600),
        listing_all: None,
    };
    assert!(checkpoint
        .advance(&Position::default(), &kept_up)
        .await
        .unwrap());
    provider.add(250, now - 1_800, now - 60);
    let queue = Counted::default();
    let run = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        now,
        budget(100),
    )
    .await
    .unwrap();
    assert!(run.finished && !run.jumped, "{run:?}");
    assert_eq!(run.since_s, now - 3_600 - OVERLAP_S, "{run:?}");
    assert_eq!(queue.copies.lock().unwrap().len(), 250);
    assert!(run
        .emf_line(now * 1000)
        .contains(r#""CatchUpLagMinutes":0"#));
    let at = checkpoint.read().await.unwrap();
    assert_eq!(at.checked_through_s, Some(now), "{at:?}");
    assert_eq!(at.lag_s(now + 600), Some(600));

    // A backlog larger than a run: it stops after two pages and says how far behind it is.
    provider.add(1_000, now + 60, now + 1_060);
    let later = now + 7_200;
    let run = scheduled(
        (&provider, Listed::All),
        &queue,
        &checkpoint,
        later,
        budget(2),
    )
    .await
    .unwrap();
    assert!(!run.finished, "{run:?}");
    let through = checkpoint.read().await.unwrap().checked_through_s.unwrap();
    assert!(through < now + 1_060 && through > now, "{through}");
    let line = run.emf_line(later * 1000);
    let lag_min = (later - through) / 60;
    assert!(
        line.contains(&format!(r#""CatchUpLagMinutes":{lag_min}"#)),
        "{line}"
    );
}
