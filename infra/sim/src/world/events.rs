//! The provider's events reaching the system: the webhook delivers each event at least once,
//! late and out of order (a copy now and then hours later), into the provider-events queue as
//! the webhook route queues it; the inbox (the real `EventWork`, with the held refunds it
//! resumes) applies them as its function's environment builds it.

use std::sync::Arc;
use std::time::Duration;

use payment_core::events::inbox::{EventProcessor, EventWork};
use payment_core::events::settlement::DynamoSettlements;
use payment_core::refunds::held::HeldRefunds;
use payment_core::refunds::queue::SqsRefundQueue;
use sqs_once::SqsQueues;

use super::World;
use crate::provider::client::Client;
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
/// log-normal delay (median two seconds), one in twenty again up to three hours later.
pub(super) async fn deliver(w: Arc<World>, end_ms: i64) {
    let sqs = crate::wire::sqs_client(&w.sdk);
    let url = url_of(&w.events.queue);
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
                let (w2, sqs2, url2, body) =
                    (Arc::clone(&w), sqs.clone(), url.clone(), e.body.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    super::sender::send(&w2, &sqs2, &url2, &body).await;
                });
            }
        }
    }
}
