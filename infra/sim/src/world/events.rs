//! The provider's events reaching the system: the webhook delivers each event at least once,
//! late and out of order (a copy now and then hours later), into the provider-events queue as
//! the webhook route queues it; the inbox (the real `EventWork`, with the held refunds it
//! resumes) applies them as its function's environment builds it.

use std::sync::Arc;
use std::time::Duration;

use payment_core::events::inbox::{EventProcessor, EventWork};
use payment_core::events::queue::{EventQueue, SqsEventQueue};
use payment_core::events::settlement::DynamoSettlements;
use payment_core::provider::event::ProviderEvent;
use payment_core::refunds::held::HeldRefunds;
use payment_core::refunds::queue::SqsRefundQueue;
use sqs_once::SqsQueues;

use super::World;
use crate::provider::client::Client;
use crate::provider::events::Event;
use crate::sqs::url_of;

/// A fresh inbox instance (a cold start): the event processor's init, on the run's clients.
pub(super) fn instance(w: &World) -> Arc<EventProcessor> {
    let cfg = &w.events.config;
    let pace = payment_core::edges::bootstrap::pace_of(cfg);
    let client = Client {
        provider: w.provider.clone(),
        pace: pace.clone(),
    };
    let dynamodb = crate::wire::dynamodb_client(&w.sdk);
    let settlements = DynamoSettlements::new(dynamodb.clone(), &cfg.idempotency_table);
    let mut work = EventWork::new(Arc::new(settlements), Arc::new(client), cfg.refund_window)
        .with_clock(Arc::clone(&w.clock));
    if let Some(url) = &cfg.refunds_queue_url {
        let queue = SqsRefundQueue::new(crate::wire::sqs_client(&w.sdk), url);
        work = work.with_held_refunds(Arc::new(
            HeldRefunds::new(
                dynamodb.clone(),
                &cfg.idempotency_table,
                Arc::new(queue),
                cfg.refund_window,
            )
            .with_clock(Arc::clone(&w.clock)),
        ));
    }
    let store = payment_core::event_store(dynamodb, &cfg.idempotency_table)
        .with_clock(Arc::clone(&w.clock));
    let queues = SqsQueues::new(
        crate::wire::sqs_client(&w.sdk),
        cfg.dead_letter_queue_url.clone(),
    );
    let mut runner = EventProcessor::new(
        Arc::new(work),
        Arc::new(store),
        Arc::new(queues),
        cfg.settings.clone(),
    )
    .with_clock(Arc::clone(&w.clock));
    if let Some(p) = pace {
        runner = runner.with_pace(p);
    }
    Arc::new(runner)
}

/// The webhook: every few seconds, the provider's new events, each delivered after a
/// log-normal delay (median two seconds), one in twenty again up to three hours later. The
/// route queues what it is sent (the receiver's own queue) and answers `2xx` once the queue
/// holds it; a delivery that fails (the route down, SQS refusing) is retried as Stripe retries,
/// backing off for up to three days after the event, and then the event stays undelivered:
/// only the catch-up's listing finds it.
pub(super) async fn deliver(w: Arc<World>, end_ms: i64) {
    let queue = Arc::new(SqsEventQueue::new(
        crate::wire::sqs_client(&w.sdk),
        url_of(&w.events.queue),
    ));
    while w.clock.now_ms() < end_ms {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let events = w.provider.books.lock().expect("books").take_events();
        for e in events {
            let first = Duration::from_secs_f64(2.0 * (1.2 * w.normal()).exp());
            let mut at = vec![first];
            if w.draw() < 0.05 {
                at.push(Duration::from_secs_f64(60.0 + w.draw() * 3.0 * 3600.0));
            }
            w.stats.lock().expect("stats").events += 1;
            for delay in at {
                let (w2, queue2, e2) = (Arc::clone(&w), Arc::clone(&queue), e.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    delivery(&w2, &*queue2, &e2).await;
                });
            }
        }
    }
}

/// Stripe's retries of a failed delivery (after the first attempt), until three days after the
/// event: minutes, then hours apart.
const RETRIES_S: &[u64] = &[300, 1_800, 7_200, 18_000, 36_000, 43_200];

/// One delivery of `e` and, while it fails, its retries.
async fn delivery(w: &World, queue: &dyn EventQueue, e: &Event) {
    let Ok(event) = ProviderEvent::parse(&e.body) else {
        w.violated(
            "the provider's events parse",
            format!("{}: {}", e.id, e.body),
        );
        return;
    };
    let give_up_ms = w.clock.now_ms() + 3 * 86_400_000;
    let mut retries = RETRIES_S.iter().chain(std::iter::repeat(&43_200));
    loop {
        let now = w.clock.now_ms();
        let down = w
            .opts
            .webhook_outage
            .is_some_and(|o| super::outage_window(o).contains(&now));
        if !down && queue.enqueue(&event, &e.body).await.is_ok() {
            w.provider.books.lock().expect("books").delivered(&e.id);
            return;
        }
        let wait = Duration::from_secs(*retries.next().unwrap_or(&43_200));
        if w.clock.now_ms() + wait.as_millis() as i64 > give_up_ms {
            w.note(format!("webhook: {} not delivered in three days", e.id));
            w.stats.lock().expect("stats").events_undelivered += 1;
            return;
        }
        tokio::time::sleep(wait).await;
    }
}
