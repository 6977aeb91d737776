//! The provider's events reaching the system: the webhook delivers each event at least once,
//! late and out of order (a copy now and then hours later), into the provider-events queue as
//! the webhook route queues it; with `ProviderEventsDelivery` `eventbridge` (or `both`) the
//! provider publishes each on the partner event source, and EventBridge's rule sends it on to
//! its target, the same queue, retrying while SQS refuses; the inbox (the real `EventWork`, with the held refunds it
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
    while w.running(end_ms) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let events = w.provider.books.lock().expect("books").take_events();
        for e in events {
            let first = Duration::from_secs_f64(2.0 * (1.2 * w.normal()).exp());
            let mut at = vec![first];
            if w.draw() < 0.05 {
                at.push(Duration::from_secs_f64(60.0 + w.draw() * 3.0 * 3600.0));
            }
            w.stats.lock().expect("stats").events += 1;
            // Drawn from the event's id, not the run's draws: the forger changes no other draw.
            let (forged, later) = id_draws(w.opts.seed, &e.id);
            if forged < w.opts.forged_event_share {
                let delay = Duration::from_secs_f64(1.0 + later * 600.0);
                let (w2, queue2, e2) = (Arc::clone(&w), Arc::clone(&queue), e.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    forge(&w2, &*queue2, &e2).await;
                });
            }
            for delay in at.into_iter().filter(|_| w.webhook && e.sent) {
                let (w2, queue2, e2) = (Arc::clone(&w), Arc::clone(&queue), e.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    delivery(&w2, &*queue2, &e2).await;
                });
            }
            if let Some(source) = &w.bridge {
                // EventBridge: within a second or so, and at least once (a copy now and then).
                let mut at = vec![Duration::from_secs_f64(0.3 * (0.8 * w.normal()).exp())];
                if w.draw() < 0.01 {
                    at.push(Duration::from_secs_f64(1.0 + w.draw() * 60.0));
                }
                for delay in at {
                    let (w2, e2, source) = (Arc::clone(&w), e.clone(), source.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        publish(&w2, &source, &e2).await;
                    });
                }
            }
        }
    }
}

/// Two draws in [0, 1) fixed by the seed and an event's id (FNV-1a, then a splitmix step).
fn id_draws(seed: u64, id: &str) -> (f64, f64) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let next = |x: u64| {
        let z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (next(h), next(h ^ 0x5555_5555_5555_5555));
    let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
    (unit(a), unit(b))
}

/// An insider's forgery of `e`: under a new id, its object at a final state (a PaymentIntent
/// `canceled`, a refund `failed`, a dispute `won`), sent straight to the events queue, where
/// no signature is asked for. Applied as it says, it would cancel a payment the provider
/// charged, give back a refund's amount for another, or release a chargeback's: each shows as a
/// ledger that is not the provider's books.
async fn forge(w: &World, queue: &dyn EventQueue, e: &Event) {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&e.body) else {
        return;
    };
    let (kind, status) = match v["data"]["object"]["object"].as_str() {
        Some("payment_intent") => ("payment_intent.canceled", "canceled"),
        Some("refund") => ("refund.failed", "failed"),
        Some("dispute") => ("charge.dispute.closed", "won"),
        _ => return,
    };
    let n = {
        let mut stats = w.stats.lock().expect("stats");
        stats.events_forged += 1;
        stats.events_forged
    };
    v["id"] = format!("evt_forged{n:08}").into();
    v["type"] = kind.into();
    v["data"]["object"]["status"] = status.into();
    let body = v.to_string();
    let Ok(event) = ProviderEvent::parse(&body) else {
        return;
    };
    // Refused by SQS (an outage) it is simply lost: the insider tries once.
    let _ = queue.enqueue(&event, &body).await;
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
        if !down && !w.route_admits() {
            // API Gateway's throttle: a `429`, which Stripe retries as any failed delivery.
            w.stats.lock().expect("stats").events_throttled += 1;
        } else if !down && queue.enqueue(&event, &e.body).await.is_ok() {
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

/// The provider's EventBridge destination: `e` published on the partner event source
/// `source`, in EventBridge's envelope; each target of a rule it matches is sent it, as
/// EventBridge sends: retried with backoff while SQS refuses it, for the target's
/// `MaximumEventAgeInSeconds` and `MaximumRetryAttempts`, then to the target's dead-letter
/// queue; an error that is not passing (a FIFO queue without `SqsParameters.MessageGroupId`)
/// goes to the dead-letter queue at once.
async fn publish(w: &World, source: &str, e: &Event) {
    let Ok(detail) = serde_json::from_str::<serde_json::Value>(&e.body) else {
        w.violated(
            "the provider's events parse",
            format!("{}: {}", e.id, e.body),
        );
        return;
    };
    let kind = detail["type"].as_str().unwrap_or_default().to_owned();
    let published_ms = w.clock.now_ms();
    let envelope = serde_json::json!({
        "version": "0",
        "id": format!("eb-{}", e.id),
        "detail-type": kind,
        "source": source,
        "account": crate::sqs::ACCOUNT,
        "time": payctl::time::utc(published_ms / 1000 * 1000).replace(".000Z", "Z"),
        "region": "us-east-1",
        "resources": [],
        "detail": detail,
    });
    let targets = w
        .wire
        .aws
        .lock()
        .expect("aws")
        .eventbridge
        .targets(source, &envelope);
    let envelope = envelope.to_string();
    for t in targets {
        let queue = t.arn.rsplit(':').next().unwrap_or_default().to_owned();
        let mut attempts = 0;
        let delivered = loop {
            let now = w.clock.now_ms();
            let sent = {
                let mut aws = w.wire.aws.lock().expect("aws");
                if aws.sqs_down(now) {
                    None
                } else {
                    Some(aws.sqs.send(
                        &url_of(&queue),
                        &envelope,
                        Default::default(),
                        t.group.clone(),
                        None,
                        None,
                        now,
                    ))
                }
            };
            match sent {
                Some(Ok(_)) => break true,
                Some(Err(err)) => {
                    w.note(format!("eventbridge: {} refused by {queue}: {err:?}", e.id));
                    break false;
                }
                None if attempts == 0 => {
                    w.note(format!("eventbridge: {} waits for SQS ({queue})", e.id));
                }
                None => {}
            }
            attempts += 1;
            let wait = Duration::from_secs(1u64 << attempts.min(9));
            let age_s = (w.clock.now_ms() - published_ms) / 1000 + wait.as_secs() as i64;
            if attempts > t.max_attempts || age_s > t.max_age_s {
                break false;
            }
            tokio::time::sleep(wait).await;
        };
        if delivered {
            w.stats.lock().expect("stats").events_bridged += 1;
            continue;
        }
        w.stats.lock().expect("stats").events_undelivered += 1;
        let Some(dlq) = t.dead_letter.as_deref() else {
            w.note(format!(
                "eventbridge: {} dropped (no dead-letter queue)",
                e.id
            ));
            continue;
        };
        let dlq = dlq.rsplit(':').next().unwrap_or_default();
        let mut aws = w.wire.aws.lock().expect("aws");
        let now = w.clock.now_ms();
        let kept = !aws.sqs_down(now)
            && aws
                .sqs
                .send(
                    &url_of(dlq),
                    &envelope,
                    Default::default(),
                    None,
                    None,
                    None,
                    now,
                )
                .is_ok();
        drop(aws);
        w.note(format!(
            "eventbridge: {} not delivered to {queue}; {}",
            e.id,
            if kept {
                "in its dead-letter queue"
            } else {
                "lost"
            }
        ));
    }
}
