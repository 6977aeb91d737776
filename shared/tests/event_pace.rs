//! The events inbox under the provider's pace: a burst of dispute events through one instance
//! at the template's per-instance rate (0.4 requests a second), with a `429` and its
//! `Retry-After` in the middle, on a queue with `maxReceiveCount` 3. Waiting for the pace is
//! never an attempt: every dispute is applied, none is dead-lettered. On tokio's paused clock,
//! with a small event source around the runner (batches of ten, each message back when its
//! delay says).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;
use payment_core::events::inbox::{EventProcessor, EventWork, ProviderObjects};
use payment_core::events::settlement::{EventNote, PaymentState, RefundState, Settlements};
use payment_core::provider::event::{DisputeChange, PaymentChange, RefundChange};
use payment_core::provider::{FailureKind, ProviderError, RateLimit};
use sqs_once::clock::{Clock, TokioClock};
use sqs_once::memory::InMemoryStore;
use sqs_once::pace::Pace;
use sqs_once::queue::{DeadLetter, QueueError, QueueLimits, QueueOps, Requeue};
use sqs_once::record::{RecordStatus, StoreError};
use sqs_once::Settings;

const DISPUTES: usize = 40;

/// The payments' records, each with its disputes.
#[derive(Default)]
struct Records(Mutex<HashMap<String, PaymentState>>);

#[async_trait]
impl Settlements for Records {
    async fn payment(&self, pid: &str) -> Result<Option<PaymentState>, StoreError> {
        Ok(self.0.lock().unwrap().get(pid).cloned())
    }
    async fn refund(&self, _: &str) -> Result<Option<RefundState>, StoreError> {
        Ok(None)
    }
    async fn reservation(&self, _: &str, _: &str) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }
    async fn settle_payment(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: i64,
        _: &EventNote,
    ) -> Result<bool, StoreError> {
        unreachable!("only disputes here")
    }
    async fn settle_refund(
        &self,
        _: &str,
        _: Option<&str>,
        _: &str,
        _: &str,
        _: Option<i64>,
        _: i64,
        _: &EventNote,
    ) -> Result<bool, StoreError> {
        unreachable!("only disputes here")
    }
    async fn settle_refund_on_payment(
        &self,
        _: &str,
        _: &str,
        _: i64,
        _: i64,
        _: &EventNote,
    ) -> Result<bool, StoreError> {
        unreachable!("only disputes here")
    }
    async fn settle_dispute(
        &self,
        pid: &str,
        did: &str,
        from: Option<(&str, i64)>,
        to: &str,
        amount: i64,
        held_change: i64,
        _: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError> {
        let mut m = self.0.lock().unwrap();
        let p = m.get_mut(pid).expect("a payment of ours");
        let version = p.dispute_versions.get(did).copied().unwrap_or(0);
        if p.disputes.get(did).map(|(s, _)| (s.as_str(), version)) != from {
            return Ok(false);
        }
        p.disputes.insert(did.into(), (to.into(), amount));
        p.dispute_versions.insert(did.into(), version + 1);
        p.disputed += held_change;
        p.events.push(note.clone());
        Ok(true)
    }
}

/// The provider's objects behind the pace, as the real client paces them: each read waits for
/// its slot; the twentieth is refused with a `429` and `Retry-After: 60`, which stops the pace
/// for a minute.
struct Provider {
    pace: Arc<Pace>,
    reads: Mutex<u32>,
    refused: Mutex<u32>,
}

impl Provider {
    async fn read(&self) -> Result<(), ProviderError> {
        self.pace
            .acquire(Duration::from_secs(20))
            .await
            .map_err(|e| ProviderError::new(FailureKind::NotSent, e.to_string()))?;
        let mut reads = self.reads.lock().unwrap();
        *reads += 1;
        if *reads == 20 {
            *self.refused.lock().unwrap() += 1;
            self.pace.slowed(Some(Duration::from_secs(60)));
            return Err(ProviderError {
                retry_after: Some(Duration::from_secs(60)),
                rate_limit: Some(RateLimit::Account),
                ..ProviderError::new(FailureKind::RateLimited, "429 rate_limit")
            });
        }
        self.pace.succeeded();
        Ok(())
    }
}

#[async_trait]
impl ProviderObjects for Provider {
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(20)
    }
    async fn payment_intent(&self, id: &str) -> Result<PaymentChange, ProviderError> {
        self.read().await?;
        Ok(PaymentChange {
            intent_id: id.into(),
            payment_id: Some(id.replace("pi_", "p")),
            status: "succeeded".into(),
            decline_code: None,
        })
    }
    async fn refund(&self, _: &str) -> Result<RefundChange, ProviderError> {
        unreachable!("only disputes here")
    }
    /// The dispute as the provider holds it: what the inbox applies, whatever the event said.
    async fn dispute(&self, id: &str) -> Result<DisputeChange, ProviderError> {
        self.read().await?;
        let i = id.trim_start_matches("dp_");
        Ok(DisputeChange {
            dispute_id: id.into(),
            intent_id: Some(format!("pi_{i}")),
            charge: Some(format!("ch_{i}")),
            status: "needs_response".into(),
            amount: 500,
        })
    }
    async fn charge_intent(&self, charge: &str) -> Result<Option<String>, ProviderError> {
        self.read().await?;
        Ok(Some(charge.replace("ch_", "pi_")))
    }
}

/// The events queue as the runner sees it, with what it did to each message.
#[derive(Default)]
struct Queue {
    dead: Mutex<Vec<DeadLetter>>,
    /// Receipt handle → seconds the message stays hidden.
    hidden: Mutex<HashMap<String, i32>>,
    deleted: Mutex<Vec<String>>,
    copies: Mutex<Vec<Requeue>>,
}

#[async_trait]
impl QueueOps for Queue {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<(), QueueError> {
        self.dead.lock().unwrap().push(l.clone());
        Ok(())
    }
    async fn delete(&self, _: &str, rh: &str) -> Result<(), QueueError> {
        self.deleted.lock().unwrap().push(rh.into());
        Ok(())
    }
    async fn change_visibility(&self, _: &str, rh: &str, secs: i32) -> Result<(), QueueError> {
        self.hidden.lock().unwrap().insert(rh.into(), secs);
        Ok(())
    }
    async fn max_receive_count(&self, _: &str) -> Result<Option<u32>, QueueError> {
        Ok(Some(3))
    }
    async fn limits(&self, _: &str) -> Result<QueueLimits, QueueError> {
        Ok(QueueLimits {
            max_receive_count: Some(3),
            retention: Some(Duration::from_secs(345_600)),
        })
    }
    async fn requeue(&self, copy: &Requeue) -> Result<(), QueueError> {
        self.copies.lock().unwrap().push(copy.clone());
        Ok(())
    }
}

/// One message on the queue.
struct Queued {
    id: String,
    body: String,
    sent_ms: i64,
    receives: u32,
    first_received_ms: Option<i64>,
    visible_at_ms: i64,
}

fn dispute_event(i: usize, created: i64) -> String {
    // Half the disputes name their PaymentIntent (two reads: the intent's payment, then the
    // dispute), half only their charge (three).
    let object = if i.is_multiple_of(2) {
        serde_json::json!({"id": format!("dp_{i}"), "object": "dispute",
            "status": "needs_response", "amount": 500, "payment_intent": format!("pi_{i}"),
            "charge": format!("ch_{i}")})
    } else {
        serde_json::json!({"id": format!("dp_{i}"), "object": "dispute",
            "status": "needs_response", "amount": 500, "charge": format!("ch_{i}")})
    };
    serde_json::json!({"id": format!("evt_{i}"), "object": "event",
        "type": "charge.dispute.created", "created": created, "data": {"object": object}})
    .to_string()
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_disputes_at_the_pace_is_applied_whole_and_nothing_is_dead_lettered() {
    let clock = Arc::new(TokioClock::new());
    let pace = Arc::new(Pace::new(0.4));
    let provider = Arc::new(Provider {
        pace: pace.clone(),
        reads: Mutex::new(0),
        refused: Mutex::new(0),
    });
    let records = Arc::new(Records::default());
    for i in 0..DISPUTES {
        records.0.lock().unwrap().insert(
            format!("p{i}"),
            PaymentState {
                traceparent: None,
                record_status: RecordStatus::Completed,
                status: Some("succeeded".into()),
                provider_payment_id: Some(format!("pi_{i}")),
                disputes: BTreeMap::new(),
                dispute_versions: BTreeMap::new(),
                disputed: 0,
                expires_at_s: clock.now_ms() / 1000 + 86_400,
                events: Vec::new(),
                events_unlisted: 0,
                refunds: BTreeMap::new(),
                released: BTreeMap::new(),
                held: BTreeMap::new(),
            },
        );
    }
    let work = Arc::new(
        EventWork::new(
            records.clone(),
            provider.clone(),
            Duration::from_secs(365 * 86_400),
        )
        .with_clock(clock.clone()),
    );
    let queue = Arc::new(Queue::default());
    // The event function's settings in the template: lease 50 s, timeout 60 s, ten at once,
    // maxReceiveCount 3, a retry horizon of an hour.
    let settings = Settings {
        lease: Duration::from_secs(50),
        max_concurrency: 10,
        max_receive_count: Some(3),
        ..Settings::default()
    };
    let runner = Arc::new(
        EventProcessor::new(
            work,
            Arc::new(InMemoryStore::new()),
            queue.clone(),
            settings,
        )
        .with_clock(clock.clone())
        .with_pace(pace),
    );

    let now = clock.now_ms();
    let mut queued: Vec<Queued> = (0..DISPUTES)
        .map(|i| Queued {
            id: format!("m{i}"),
            body: dispute_event(i, now / 1000),
            sent_ms: now,
            receives: 0,
            first_received_ms: None,
            visible_at_ms: now,
        })
        .collect();
    let mut invocations = 0;
    while !queued.is_empty() {
        invocations += 1;
        assert!(invocations < 500, "the burst never drained");
        let now = clock.now_ms();
        let next = queued.iter().map(|q| q.visible_at_ms).min().unwrap();
        if next > now {
            tokio::time::advance(Duration::from_millis((next - now) as u64)).await;
            continue;
        }
        // One instance: a batch of up to ten visible messages, in queue order.
        let mut batch = Vec::new();
        let mut in_batch = std::collections::HashSet::new();
        for q in queued
            .iter_mut()
            .filter(|q| q.visible_at_ms <= now)
            .take(10)
        {
            q.receives += 1;
            in_batch.insert(q.id.clone());
            let first = *q.first_received_ms.get_or_insert(now);
            let rh = format!("{}#{}", q.id, q.receives);
            let mut m = SqsMessage::default();
            m.message_id = Some(q.id.clone());
            m.receipt_handle = Some(rh);
            m.body = Some(q.body.clone());
            m.event_source_arn = Some("arn:aws:sqs:us-east-1:000000000000:events".into());
            m.attributes
                .insert("SentTimestamp".into(), q.sent_ms.to_string());
            m.attributes
                .insert("ApproximateReceiveCount".into(), q.receives.to_string());
            m.attributes
                .insert("ApproximateFirstReceiveTimestamp".into(), first.to_string());
            batch.push(m);
        }
        let (response, _) = runner.handle_batch(batch, now + 60_000).await;
        let failed: Vec<String> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone())
            .collect();
        let deleted = std::mem::take(&mut *queue.deleted.lock().unwrap());
        let hidden = std::mem::take(&mut *queue.hidden.lock().unwrap());
        let after = clock.now_ms();
        queued.retain_mut(|q| {
            if !in_batch.contains(&q.id) {
                return true;
            }
            let rh = format!("{}#{}", q.id, q.receives);
            if deleted.contains(&rh) {
                return false;
            }
            if failed.contains(&q.id) {
                q.visible_at_ms = after + 1000 * i64::from(hidden.get(&rh).copied().unwrap_or(390));
                return true;
            }
            // Acknowledged: the event source deletes it.
            false
        });
        for copy in std::mem::take(&mut *queue.copies.lock().unwrap()) {
            queued.push(Queued {
                id: format!("{}'", copy.source_message_id),
                body: copy.body,
                sent_ms: after,
                receives: 0,
                first_received_ms: None,
                visible_at_ms: after,
            });
        }
        assert!(
            queue.dead.lock().unwrap().is_empty(),
            "dead-lettered: {:?}",
            queue
                .dead
                .lock()
                .unwrap()
                .iter()
                .map(|d| (&d.error_code, &d.error_message))
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(*provider.refused.lock().unwrap(), 1, "the 429 came");
    let records = records.0.lock().unwrap();
    for i in 0..DISPUTES {
        let p = &records[&format!("p{i}")];
        assert_eq!(
            p.disputes.get(&format!("dp_{i}")),
            Some(&("needs_response".to_owned(), 500)),
            "dispute {i}"
        );
        assert_eq!(p.disputed, 500, "held once: p{i}");
    }
    // At 0.4 requests a second, 100 reads take 250 s, and the 429 stops the pace a minute.
    let took = (clock.now_ms() - now) / 1000;
    assert!(took >= 250, "{took} s: faster than the pace allows");
}
