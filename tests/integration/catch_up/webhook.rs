//! Listing only the undelivered events (`delivery_success=false`) holds what the webhook was
//! sent and did not take; an event the provider never sent (the endpoint disabled, or not
//! subscribed to its type) never failed a delivery, so only a listing of every event holds it.

use payment_core::events::catch_up::{scheduled, Checkpoint, Listed, Place, Position, OVERLAP_S};
use sqs_once::runner::now_ms;

use super::{budget, Counted, Provider};
use crate::helpers::*;

/// The runs kept up through an hour ago, listing the undelivered; the endpoint was disabled
/// fifty minutes ago, and the 1,500 events made since were never sent.
///
/// 1. The first run finds the endpoint unfit, keeps that in the checkpoint at once, and fails
///    on its first page (a provider `5xx`): the next runs still list every event.
/// 2. The runs list every event from where the list was checked through, each within its
///    budget, until one reaches the newest: all 1,500 queued, nothing from before the window.
///    The endpoint still disabled at that run's start, the checkpoint still says to list every
///    event.
/// 3. 300 more are made while it stays disabled; then it is enabled again (the runbook's fix).
///    The next run finds it fit and lists every event to the newest (the 300 among them); so
///    does the one after it, whose re-listing of the quarter of an hour before that run's last
///    event finds one the provider listed late; only then do they return to the undelivered.
/// 4. Steady again: a run lists only the undelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_never_sent_to_a_disabled_endpoint_are_found_by_listing_every_event() {
    let t = TestStack::new("catch-up-unfit").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = now_ms() / 1000;
    let provider = Provider::default();
    let queue = Counted::default();
    let run = |at: i64, pages: usize| {
        scheduled(
            (&provider, Listed::Undelivered),
            &queue,
            &checkpoint,
            at,
            budget(pages),
        )
    };
    let made = |n: usize, from: i64, to: i64| {
        let before = provider.events.lock().unwrap().len();
        provider.add(n, from, to);
        provider.events.lock().unwrap()[before..]
            .iter()
            .map(|(e, _)| e.id.clone())
            .collect::<Vec<String>>()
    };
    let unqueued = |ids: &[String]| {
        let copies = queue.copies.lock().unwrap();
        ids.iter().filter(|id| !copies.contains_key(*id)).count()
    };
    // Two days of traffic the webhook took.
    made(2_000, now - 2 * 86_400, now - 3_700);
    let old = provider.events.lock().unwrap()[0].0.clone();
    let kept_up = Position {
        last: Some(Place {
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
    // Made while the endpoint was disabled: never sent, so never undelivered either.
    let unsent = made(1_500, now - 3_000, now - 60);
    *provider.unfit.lock().unwrap() =
        Some("we_1 (https://x/v1/provider-events) is disabled".into());

    // 1. Found unfit, kept at once; the first page fails.
    provider
        .failing_pages
        .store(1, std::sync::atomic::Ordering::SeqCst);
    assert!(run(now, 10).await.is_err());
    let at = checkpoint.read().await.unwrap();
    assert!(at.listing_all.is_some(), "kept before any page: {at:?}");
    // The start it found is kept too, before the walk (whose first page failed): the newest
    // event before where the list was checked through, less the overlap.
    let start = provider
        .events
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(e, _)| e.created < now - 3_600 - OVERLAP_S)
        .map(|(e, _)| e.id.clone());
    assert_eq!(at.last.as_ref().map(|p| p.id.clone()), start, "{at:?}");
    assert!(!at.caught_up && at.from_s.is_none(), "{at:?}");
    assert_eq!(at.checked_through_s, Some(now - 3_600), "{at:?}");

    // 2. Every event from where the list was checked through, run after run.
    let second = run(now, 10).await.unwrap();
    assert!(
        !second.finished && second.listed_all.is_some(),
        "{second:?}"
    );
    let third = run(now, 40).await.unwrap();
    assert!(third.finished, "{third:?}");
    assert_eq!(unqueued(&unsent), 0, "every event never sent is queued");
    let events = provider.events.lock().unwrap().clone();
    let too_old = events
        .iter()
        .filter(|(e, _)| {
            e.created < now - 3_600 - OVERLAP_S && queue.copies.lock().unwrap().contains_key(&e.id)
        })
        .count();
    assert_eq!(
        too_old, 0,
        "the window starts where the list was checked through"
    );
    let at = checkpoint.read().await.unwrap();
    assert!(
        at.listing_all.is_some(),
        "still disabled when the run started: {at:?}"
    );
    assert_eq!(at.checked_through_s, Some(now));

    // 3. More made while disabled; then enabled again.
    let unsent_later = made(300, now + 60, now + 1_200);
    *provider.unfit.lock().unwrap() = None;
    let fourth = run(now + 3_600, 40).await.unwrap();
    assert!(fourth.finished && fourth.listed_all.is_some(), "{fourth:?}");
    assert_eq!(
        unqueued(&unsent_later),
        0,
        "made before the fix, found after it"
    );
    let at = checkpoint.read().await.unwrap();
    assert!(
        at.listing_all.as_deref().unwrap().starts_with("fit again"),
        "one more run lists every event: {at:?}"
    );
    // Made while it was disabled, listed by the provider only after that run passed its time:
    // the next run re-lists the quarter of an hour before its last event, every event.
    let late = made(1, now + 1_100, now + 1_100);
    let fifth = run(now + 3_650, 40).await.unwrap();
    assert!(fifth.finished && fifth.listed_all.is_some(), "{fifth:?}");
    assert_eq!(
        unqueued(&late),
        0,
        "listed late, found by the second fit run"
    );
    let at = checkpoint.read().await.unwrap();
    assert_eq!(at.listing_all, None, "{at:?}");

    // 4. Steady: only the undelivered.
    let later = made(300, now + 3_700, now + 6_000);
    let failed = later[..2].to_vec();
    provider
        .undelivered
        .lock()
        .unwrap()
        .extend(failed.iter().cloned());
    let queued_before = queue.copies.lock().unwrap().len();
    let sixth = run(now + 7_200, 40).await.unwrap();
    assert!(sixth.finished && sixth.listed_all.is_none(), "{sixth:?}");
    assert_eq!(
        queue.copies.lock().unwrap().len(),
        queued_before + 2,
        "{sixth:?}"
    );
    assert_eq!(unqueued(&failed), 0);
}
