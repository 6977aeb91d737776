//! Two events of one appealed dispute racing on the idempotency table (its real conditional
//! writes, ministack's DynamoDB): a copy of the dispute read before its second loss must not
//! be written after it. The provider's copy is held in a test double, so that the order is
//! the test's, not the scheduler's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use payment_core::events::inbox::{EventWork, ProviderObjects};
use payment_core::events::settlement::{DynamoSettlements, EventNote, Settlements};
use payment_core::provider::event::{DisputeChange, PaymentChange, ProviderEvent, RefundChange};
use payment_core::provider::ProviderError;
use sqs_once::runner::now_ms;
use sqs_once::{AttemptContext, Work};
use tokio::sync::Notify;

use crate::helpers::*;

const DISPUTE: &str = "dp_race";
const AMOUNT: i64 = 700;

/// The provider's dispute as it is now; the first read of it is held (after its copy is
/// taken) until the test lets it go.
struct Provider {
    payment_id: String,
    /// The disputed PaymentIntent, which the dispute names as Stripe's does.
    intent: String,
    status: Mutex<String>,
    reads: Mutex<u32>,
    read_taken: Notify,
    go_on: Notify,
}

#[async_trait]
impl ProviderObjects for Provider {
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(10)
    }
    async fn payment_intent(&self, id: &str) -> Result<PaymentChange, ProviderError> {
        Ok(PaymentChange {
            intent_id: id.into(),
            payment_id: Some(self.payment_id.clone()),
            status: "succeeded".into(),
            decline_code: None,
        })
    }
    async fn refund(&self, _: &str) -> Result<RefundChange, ProviderError> {
        unreachable!("only a dispute here")
    }
    async fn dispute(&self, id: &str) -> Result<DisputeChange, ProviderError> {
        let status = self.status.lock().unwrap().clone();
        let first = {
            let mut reads = self.reads.lock().unwrap();
            *reads += 1;
            *reads == 1
        };
        if first {
            self.read_taken.notify_one();
            self.go_on.notified().await;
        }
        Ok(DisputeChange {
            dispute_id: id.into(),
            intent_id: Some(self.intent.clone()),
            charge: Some("ch_race".into()),
            status,
            amount: AMOUNT,
        })
    }
    async fn charge_intent(&self, _: &str) -> Result<Option<String>, ProviderError> {
        unreachable!("the events name their PaymentIntent")
    }
}

fn dispute_event(id: &str, kind: &str, status: &str, intent: &str) -> ProviderEvent {
    ProviderEvent::parse(
        &serde_json::json!({
            "id": id,
            "object": "event",
            "type": kind,
            "created": now_ms() / 1000,
            "api_version": "2026-10-28.endive",
            "data": {"object": {
                "id": DISPUTE, "object": "dispute", "amount": AMOUNT, "currency": "usd",
                "status": status, "payment_intent": intent, "charge": "ch_race",
            }},
        })
        .to_string(),
    )
    .expect("a dispute event")
}

/// A dispute lost, appealed and lost again. The appeal's event reads the provider's copy
/// (`appeal_under_review`) and is held; the second loss happens, and its event finds the first
/// loss recorded; then the appeal's write comes. Before the per-dispute version, the second
/// loss's event changed nothing (its status was the record's) and the appeal's write, named
/// from `lost`, still held: the record ended `appeal_under_review` where the provider says
/// `lost`. Now the second loss's event reads the provider and writes the version up, and the
/// appeal's write finds the version moved, reads again, and the record stays `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_appeal_read_before_the_second_loss_is_not_written_after_it() {
    let t = TestStack::new("dispute-race").await;
    let pid = t.pid("p");
    t.send(&payment(&pid, AMOUNT, "pm_card_visa")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let intent = t.ledger(&pid).await.charges[&pid][0].id.clone();
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let settlements = Arc::new(DynamoSettlements::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    ));
    let keep = now_ms() / 1000 + 400 * 86_400;
    let note = |change: &str| EventNote {
        created: now_ms() / 1000,
        event_id: "evt_first_loss".into(),
        kind: "charge.dispute.closed".into(),
        change: change.into(),
        listed: true,
    };
    // The first loss, recorded as its event records it.
    assert!(settlements
        .settle_dispute(
            &pid,
            DISPUTE,
            None,
            "lost",
            AMOUNT,
            AMOUNT,
            keep,
            &note("lost")
        )
        .await
        .unwrap());

    let provider = Arc::new(Provider {
        payment_id: pid.clone(),
        intent: intent.clone(),
        status: Mutex::new("appeal_under_review".into()),
        reads: Mutex::new(0),
        read_taken: Notify::new(),
        go_on: Notify::new(),
    });
    let work = Arc::new(EventWork::new(
        settlements.clone(),
        provider.clone(),
        Duration::from_secs(365 * 86_400),
    ));
    let context = || {
        AttemptContext::new(
            "test",
            now_ms(),
            false,
            now_ms() + 60_000,
            now_ms() + 60_000,
        )
    };

    let appeal = dispute_event(
        "evt_appeal",
        "charge.dispute.updated",
        "appeal_under_review",
        &intent,
    );
    let held = {
        let work = work.clone();
        tokio::spawn(async move { work.execute(&appeal, &context()).await })
    };
    provider.read_taken.notified().await;

    // The appeal is lost: the provider's dispute is `lost` again, and its event is applied
    // while the appeal's copy waits.
    *provider.status.lock().unwrap() = "lost".into();
    let second = dispute_event("evt_second_loss", "charge.dispute.closed", "lost", &intent);
    let done = work
        .execute(&second, &context())
        .await
        .expect("the second loss's event");
    assert_eq!(done.status, "unchanged", "{done:?}");
    assert_eq!(
        *provider.reads.lock().unwrap(),
        2,
        "the second loss's event reads the provider"
    );

    provider.go_on.notify_one();
    let appealed = held.await.unwrap().expect("the appeal's event");
    assert_eq!(appealed.status, "unchanged", "{appealed:?}");

    let p = settlements.payment(&pid).await.unwrap().unwrap();
    assert_eq!(
        (p.disputes[DISPUTE].0.as_str(), p.disputed),
        ("lost", AMOUNT),
        "the record holds the dispute as the provider does: {p:?}"
    );
    assert_eq!(
        *provider.reads.lock().unwrap(),
        3,
        "the second loss's event reads the provider"
    );
    // Three writes: the first loss, the second loss's event, the appeal's read again.
    assert_eq!(p.dispute_versions[DISPUTE], 3, "{p:?}");
}
