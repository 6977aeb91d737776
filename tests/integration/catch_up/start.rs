//! A run keeps where its window starts before it walks: one whose first page fails (or whose
//! pace had no slot left for it) leaves the next run to go on from there, without listing back
//! again.

use std::sync::atomic::Ordering;

use payment_core::events::catch_up::{scheduled, Checkpoint, Listed, Place, FIRST_WINDOW_S};
use sqs_once::runner::now_ms;

use super::{budget, Counted, Provider};
use crate::helpers::*;

/// Two first runs whose walk's first page fails (a provider's `500`): a new account's, which
/// walks back ten pages to the window's oldest event, and one with history before the window,
/// which finds the newest event before it in one page. Each keeps that start; the next run
/// lists nothing backwards, walks forward from it, and queues every event of the window once
/// (on main before this, the second run listed back again: at a pace of a few requests a run,
/// no run would have moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_keeps_the_start_it_found_though_its_walk_failed() {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let now = now_ms() / 1000;
    for history in [false, true] {
        // A table of its own for each: the checkpoint is one item of it.
        let t = TestStack::new(if history {
            "catch-up-start-history"
        } else {
            "catch-up-start-new"
        })
        .await;
        let checkpoint = Checkpoint::new(
            aws_sdk_dynamodb::Client::new(&sdk),
            &t.config.idempotency_table,
        );
        let provider = Provider::default();
        if history {
            provider.add(300, now - 20 * 86_400, now - FIRST_WINDOW_S - 60);
        }
        let window_from = provider.events.lock().unwrap().len();
        provider.add(1_000, now - 2 * 86_400, now - 60);
        let oldest = provider.events.lock().unwrap()[window_from].0.clone();
        let queue = Counted::default();
        provider.failing_pages.store(1, Ordering::SeqCst);
        let failed = scheduled(
            (&provider, Listed::All),
            &queue,
            &checkpoint,
            now,
            budget(40),
        )
        .await;
        assert!(failed.is_err(), "{failed:?}");
        let backs = provider.backs.load(Ordering::SeqCst);
        // One page back to the newest event before the window; a new account's walk back
        // through the window's 1,000 events to its oldest takes ten more.
        assert_eq!(backs, if history { 1 } else { 11 }, "history {history}");
        let kept = checkpoint.read().await.unwrap();
        let start = if history {
            let e = &provider.events.lock().unwrap()[window_from - 1].0;
            Place {
                id: e.id.clone(),
                created: e.created,
            }
        } else {
            Place {
                id: oldest.id.clone(),
                created: oldest.created,
            }
        };
        assert_eq!(kept.last, Some(start.clone()), "history {history}");
        assert!(!kept.caught_up);
        let through = if history {
            now - FIRST_WINDOW_S - 1
        } else {
            start.created
        };
        assert_eq!(kept.checked_through_s, Some(through), "history {history}");

        let next = scheduled(
            (&provider, Listed::All),
            &queue,
            &checkpoint,
            now + 3600,
            budget(40),
        )
        .await
        .unwrap();
        assert!(next.finished, "{next:?}");
        assert_eq!(
            provider.backs.load(Ordering::SeqCst),
            backs,
            "the next run listed back again (history {history}): {next:?}"
        );
        let copies = queue.copies.lock().unwrap().clone();
        assert_eq!(copies.len(), 1_000, "the window's events, nothing before");
        assert!(
            copies.values().all(|c| *c == 1),
            "each queued once (history {history})"
        );
        assert!(copies.contains_key(&oldest.id));
        assert!(checkpoint.read().await.unwrap().caught_up);
    }
}
