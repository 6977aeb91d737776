//! Listing only the undelivered events (`delivery_success=false`) holds what the webhook was
//! sent and did not take; an event the provider never sent (the endpoint disabled, or not
//! subscribed to its type) never failed a delivery, so only a listing of every event holds it.

use payment_core::events::catch_up::{scheduled, Checkpoint, Listed, Place, Position, OVERLAP_S};
use sqs_once::runner::now_ms;

use super::{budget, Counted, Provider};
use crate::helpers::*;

/// The runs kept up through an hour ago, listing the undelivered; the endpoint was disabled
/// fifty minutes ago, and the 1,500 events made since were never sent. The first run finds the
/// endpoint unfit and lists every event from where the list was checked through, stops at its
/// budget, and the next goes on listing every event although the endpoint is enabled again,
/// until it reaches the newest: all 1,500 are queued, and nothing from before the window.
/// Then the runs list only the undelivered again.
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
    // Two days of traffic the webhook took.
    provider.add(2_000, now - 2 * 86_400, now - 3_700);
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
    let before = provider.events.lock().unwrap().len();
    provider.add(1_500, now - 3_000, now - 60);
    let unsent: Vec<String> = provider.events.lock().unwrap()[before..]
        .iter()
        .map(|(e, _)| e.id.clone())
        .collect();
    *provider.unfit.lock().unwrap() =
        Some("we_1 (https://x/v1/provider-events) is disabled".into());
    let queue = Counted::default();

    let first = scheduled(
        (&provider, Listed::Undelivered),
        &queue,
        &checkpoint,
        now,
        budget(10),
    )
    .await
    .unwrap();
    assert!(!first.finished, "{first:?}");
    assert!(
        first.listed_all.as_deref().unwrap().contains("disabled"),
        "{first:?}"
    );
    assert_eq!(first.since_s, now - 3_600 - OVERLAP_S, "{first:?}");
    let at = checkpoint.read().await.unwrap();
    assert!(at.listing_all.is_some(), "{at:?}");

    // Enabled again: the listing of every event goes on until it reaches the newest.
    *provider.unfit.lock().unwrap() = None;
    let second = scheduled(
        (&provider, Listed::Undelivered),
        &queue,
        &checkpoint,
        now,
        budget(40),
    )
    .await
    .unwrap();
    assert!(second.finished, "{second:?}");
    assert!(second.listed_all.is_some(), "{second:?}");
    let copies = queue.copies.lock().unwrap().clone();
    let missing: Vec<&String> = unsent
        .iter()
        .filter(|id| !copies.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of the events never sent were not queued",
        missing.len()
    );
    let events = provider.events.lock().unwrap().clone();
    let too_old = events
        .iter()
        .filter(|(e, _)| e.created < now - 3_600 - OVERLAP_S && copies.contains_key(&e.id))
        .count();
    assert_eq!(
        too_old, 0,
        "the window starts where the list was checked through"
    );
    let at = checkpoint.read().await.unwrap();
    assert_eq!(at.listing_all, None, "{at:?}");
    assert_eq!(at.checked_through_s, Some(now));

    // Steady again: a later run lists only the undelivered.
    let before = provider.events.lock().unwrap().len();
    provider.add(300, now + 60, now + 3_000);
    let failed: Vec<String> = provider.events.lock().unwrap()[before..before + 2]
        .iter()
        .map(|(e, _)| e.id.clone())
        .collect();
    provider
        .undelivered
        .lock()
        .unwrap()
        .extend(failed.iter().cloned());
    let queued_before = queue.copies.lock().unwrap().len();
    let third = scheduled(
        (&provider, Listed::Undelivered),
        &queue,
        &checkpoint,
        now + 3_600,
        budget(40),
    )
    .await
    .unwrap();
    assert!(third.finished && third.listed_all.is_none(), "{third:?}");
    let copies = queue.copies.lock().unwrap();
    assert_eq!(copies.len(), queued_before + 2, "{third:?}");
    assert!(failed.iter().all(|id| copies.contains_key(id)));
}
