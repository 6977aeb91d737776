//! Refunds as a `sqs_once::Work`: never beyond the charge, whatever runs at once; only charged
//! payments; a refused refund gives its amount back; one provider refund per refund id.
//!
//! Why ~1,200 lines: every scenario runs in the one `World` (the in-memory ledger behind a yield,
//! the provider, the processor), and reads as one story of what a refund meets.

use std::collections::BTreeMap;
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;
use common::Queues;
use payment_core::provider::{
    FoundRefund, ProviderError, RefundCall, RefundProvider, RefundResponse,
};
use payment_core::refunds::ledger::{InMemoryRefundLedger, RefundLedger, RefundablePayment};
use payment_core::refunds::work::{RefundProcessor, RefundWork};
use payment_core::PaymentOutcome;
use sqs_once::clock::Clock;
use sqs_once::memory::InMemoryStore;
use sqs_once::record::RecordStatus;
use sqs_once::runner::now_ms;
use sqs_once::IdempotencyStore;
use sqs_once::Settings;

/// A provider that refunds what it is asked, after a pause (so refunds overlap), or refuses.
#[derive(Default)]
struct Provider {
    calls: Mutex<Vec<RefundCall>>,
    refuse: Mutex<Option<String>>,
    /// What a lookup of the charge's refunds finds.
    found: Mutex<Vec<FoundRefund>>,
    /// The PaymentIntent's status now (none: the answer names none).
    now: Mutex<Option<String>>,
    /// The lookup's answers are lost (the client times out) while set.
    find_times_out: Mutex<bool>,
    /// A refund's answer is lost after the provider made it, while set.
    create_answer_lost: Mutex<bool>,
    /// The PaymentIntents the provider's search finds for any payment id.
    intents: Mutex<Vec<String>>,
}

#[async_trait]
impl RefundProvider for Provider {
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
    async fn create_refund(&self, call: &RefundCall) -> Result<RefundResponse, ProviderError> {
        self.calls.lock().unwrap().push(call.clone());
        tokio::time::sleep(Duration::from_millis(5)).await;
        if *self.create_answer_lost.lock().unwrap() {
            return Err(ProviderError::new(
                payment_core::provider::FailureKind::Timeout,
                "the refund's answer was lost",
            ));
        }
        Ok(match self.refuse.lock().unwrap().clone() {
            Some(code) if code == "idempotency_error" => RefundResponse::KeyReused {
                message: "Keys for idempotent requests can only be used for the same endpoint they were first used for".into(),
            },
            Some(code) => RefundResponse::Rejected {
                code,
                message: "refused".into(),
            },
            None => RefundResponse::Refunded {
                provider_refund_id: format!("re_{}", call.refund_id),
                status: "succeeded".into(),
            },
        })
    }
    async fn payment_status(&self, _: &str) -> Result<Option<String>, ProviderError> {
        Ok(self.now.lock().unwrap().clone())
    }
    async fn payment_intents_of(&self, _: &str) -> Result<Vec<String>, ProviderError> {
        Ok(self.intents.lock().unwrap().clone())
    }
    async fn find_refunds(&self, _: &str) -> Result<Vec<FoundRefund>, ProviderError> {
        if *self.find_times_out.lock().unwrap() {
            return Err(ProviderError::new(
                payment_core::provider::FailureKind::Timeout,
                "the lookup's answer was lost",
            ));
        }
        Ok(self.found.lock().unwrap().clone())
    }
}

/// The in-memory ledger behind a yield before each operation, so that concurrent refunds all
/// read the payment before any of them reserves (the race a conditional write must win).
struct Yielding(Arc<InMemoryRefundLedger>);

#[async_trait]
impl RefundLedger for Yielding {
    async fn payment(
        &self,
        pid: &str,
    ) -> Result<Option<RefundablePayment>, sqs_once::record::StoreError> {
        tokio::task::yield_now().await;
        self.0.payment(pid).await
    }
    async fn accepted_at(&self, pid: &str) -> Result<Option<i64>, sqs_once::record::StoreError> {
        self.0.accepted_at(pid).await
    }
    async fn reserve(
        &self,
        pid: &str,
        rid: &str,
        amount: i64,
        seen: &RefundablePayment,
        owner: &str,
        keep: i64,
        hold: Option<&str>,
    ) -> Result<payment_core::refunds::ledger::Reservation, sqs_once::record::StoreError> {
        tokio::task::yield_now().await;
        self.0
            .reserve(pid, rid, amount, seen, owner, keep, hold)
            .await
    }
    async fn release(
        &self,
        pid: &str,
        rid: &str,
        amount: i64,
        owner: &str,
        keep: i64,
    ) -> Result<(), sqs_once::record::StoreError> {
        tokio::task::yield_now().await;
        self.0.release(pid, rid, amount, owner, keep).await
    }
    async fn keep_reserved(
        &self,
        pid: &str,
        rid: &str,
        amount: i64,
        owner: &str,
        keep: i64,
    ) -> Result<bool, sqs_once::record::StoreError> {
        tokio::task::yield_now().await;
        self.0.keep_reserved(pid, rid, amount, owner, keep).await
    }
    async fn reserved_by(&self, rid: &str) -> Result<bool, sqs_once::record::StoreError> {
        tokio::task::yield_now().await;
        self.0.reserved_by(rid).await
    }
}

struct World {
    ledger: Arc<InMemoryRefundLedger>,
    provider: Arc<Provider>,
    queues: Arc<Queues>,
    processor: Arc<RefundProcessor>,
    store: Arc<InMemoryStore>,
}

fn world() -> World {
    world_on(sqs_once::clock::system())
}

/// The world with the work and the runner on `clock`.
fn world_on(clock: Arc<dyn Clock>) -> World {
    let ledger = Arc::new(InMemoryRefundLedger::default());
    let provider = Arc::new(Provider::default());
    let queues = Arc::new(Queues::default());
    let work = RefundWork::new(
        provider.clone(),
        Arc::new(Yielding(ledger.clone())),
        Duration::from_secs(86_400),
    )
    .with_refund_window(Duration::from_secs(365 * 86_400))
    .with_clock(clock.clone());
    let settings = Settings {
        lease: Duration::from_secs(10),
        call_retry_delay: Duration::from_millis(1),
        processing_allowance: Duration::ZERO,
        ..Settings::default()
    };
    let store = Arc::new(InMemoryStore::new());
    let processor = Arc::new(
        RefundProcessor::new(Arc::new(work), store.clone(), queues.clone(), settings)
            .with_clock(clock),
    );
    World {
        ledger,
        provider,
        queues,
        processor,
        store,
    }
}

fn charged(w: &World, pid: &str, status: RecordStatus, outcome: &str, amount: i64) {
    charged_in(w, pid, status, outcome, amount, "usd");
}

fn charged_in(
    w: &World,
    pid: &str,
    status: RecordStatus,
    outcome: &str,
    amount: i64,
    currency: &str,
) {
    w.ledger.insert(
        pid,
        RefundablePayment {
            traceparent: None,
            status,
            outcome: Some(PaymentOutcome {
                status: outcome.into(),
                provider_payment_id: Some(format!("pi_{pid}")),
                decline_code: None,
                amount,
                currency: currency.into(),
                reason: None,
            }),
            refunded: 0,
            refunds: BTreeMap::new(),
            has_refunds: false,
            disputed: 0,
            expires_at_s: 0,
            held: BTreeMap::new(),
            has_held: false,
            refunds_made: 0,
            counts_refunds: false,
        },
    );
}

fn msg(id: &str, body: &str) -> SqsMessage {
    common::msg("refunds", id, body)
}

fn refund(rid: &str, pid: &str, amount: Option<i64>) -> String {
    match amount {
        Some(a) => format!(r#"{{"refund_id":"{rid}","payment_id":"{pid}","amount":{a}}}"#),
        None => format!(r#"{{"refund_id":"{rid}","payment_id":"{pid}"}}"#),
    }
}

#[tokio::test]
async fn concurrent_refunds_never_add_up_to_more_than_the_charge() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    let batch: Vec<_> = (0..10)
        .map(|i| msg(&format!("m{i}"), &refund(&format!("r{i}"), "p1", Some(30))))
        .collect();
    let (response, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(s.done("refunded"), 3, "{s:?}");
    assert_eq!(s.dead_lettered.get("refund_exceeds_charge"), Some(&7));
    let calls = w.provider.calls.lock().unwrap().clone();
    assert_eq!(calls.iter().map(|c| c.amount).sum::<i64>(), 90);
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!((p.refunded, p.refunds.len()), (90, 3));
    let dead = w.queues.0.lock().unwrap().clone();
    assert!(
        dead[0].error_message.contains("90 of 100"),
        "{}",
        dead[0].error_message
    );
}

#[tokio::test]
async fn without_an_amount_the_rest_is_refunded_once_and_a_duplicate_calls_nothing() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "p1", Some(40)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.done("refunded"), 1);
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m2", &refund("r2", "p1", None))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.done("refunded"), 1);
    assert_eq!(w.provider.calls.lock().unwrap()[1].amount, 60, "the rest");
    // The same refund again is a duplicate; a third refund finds nothing left.
    let (_, s) = w
        .processor
        .handle_batch(
            vec![
                msg("m3", &refund("r2", "p1", None)),
                msg("m4", &refund("r3", "p1", None)),
            ],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.duplicates, 1);
    assert_eq!(s.dead_lettered.get("refund_exceeds_charge"), Some(&1));
    assert_eq!(w.provider.calls.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_payment_takes_as_many_refunds_as_its_record_keeps_and_no_more() {
    use payment_core::refunds::ledger::{MAX_HELD_REFUNDS, MAX_REFUNDS_PER_PAYMENT};
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 1_000_000);
    let made = MAX_REFUNDS_PER_PAYMENT as usize;
    let batch: Vec<_> = (0..made + 5)
        .map(|i| msg(&format!("m{i}"), &refund(&format!("r{i}"), "p1", Some(1))))
        .collect();
    let (_, s) = w.processor.handle_batch(batch, now_ms() + 600_000).await;
    assert_eq!(s.done("refunded"), made as u32, "{s:?}");
    assert_eq!(
        s.dead_lettered.get("refund_limit_reached"),
        Some(&5),
        "{s:?}"
    );
    assert_eq!(w.provider.calls.lock().unwrap().len(), made);
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!(
        (p.refunds.len(), p.refunds_made),
        (made, MAX_REFUNDS_PER_PAYMENT)
    );
    let dead = w.queues.0.lock().unwrap().clone();
    assert!(
        dead[0].error_message.contains("by hand"),
        "{}",
        dead[0].error_message
    );

    // While a payment settles, it holds a few refunds' messages, and refuses the next.
    charged(&w, "debit", RecordStatus::Completed, "processing", 500);
    let batch: Vec<_> = (0..MAX_HELD_REFUNDS + 2)
        .map(|i| {
            msg(
                &format!("h{i}"),
                &refund(&format!("held{i}"), "debit", Some(10)),
            )
        })
        .collect();
    let (_, s) = w.processor.handle_batch(batch, now_ms() + 600_000).await;
    assert_eq!(s.done("held"), MAX_HELD_REFUNDS as u32, "{s:?}");
    assert_eq!(
        s.dead_lettered.get("refund_limit_reached"),
        Some(&2),
        "{s:?}"
    );
    let debit = w.ledger.payment("debit").await.unwrap().unwrap();
    assert_eq!(debit.held.len(), MAX_HELD_REFUNDS);
    let dead = w.queues.0.lock().unwrap().clone();
    assert!(
        dead.last()
            .unwrap()
            .error_message
            .contains("once the payment has settled"),
        "{}",
        dead.last().unwrap().error_message
    );
}

#[tokio::test]
async fn only_a_charged_payment_is_refunded_and_one_still_charging_comes_back() {
    let w = world();
    charged(&w, "declined", RecordStatus::Completed, "declined", 100);
    charged(&w, "charging", RecordStatus::InProgress, "succeeded", 100);
    w.ledger.accept("accepted", now_ms() / 1000);
    let batch = vec![
        msg("m1", &refund("r1", "declined", None)),
        msg("m2", &refund("r2", "charging", None)),
        msg("m3", &refund("r3", "accepted", None)),
        msg("m4", &refund("r4", "unknown-payment", None)),
    ];
    let (response, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert_eq!(s.dead_lettered.get("payment_not_refundable"), Some(&1));
    let mut back: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    back.sort();
    assert_eq!(
        back,
        vec!["m2", "m3"],
        "a payment being charged, or accepted by the API and on its way, is waited for"
    );
    // A payment known nowhere is not waited for: dead-lettered at once, with the reason.
    assert_eq!(s.dead_lettered.get("payment_unknown"), Some(&1), "{s:?}");
    let dead = w.queues.0.lock().unwrap().clone();
    let unknown = dead
        .iter()
        .find(|d| d.error_code == "payment_unknown")
        .expect("its dead letter");
    assert!(
        unknown.error_message.contains("new refund_id"),
        "{}",
        unknown.error_message
    );
    assert!(w.provider.calls.lock().unwrap().is_empty());
}

/// A payment the API accepted longer ago than its message may wait for a first claim (the
/// record retention, 21 days by default, and a day for its send) and that has no record has
/// had its record expire: the refund window passed. Its refund is refused at once, saying so,
/// not waited for until its retries are spent (a page for waiting, and a redrive that waits
/// again); one accepted a day less long ago is still waited for (issue 65).
#[tokio::test]
async fn a_refund_of_a_payment_whose_record_expired_is_refused_at_once_not_waited_for() {
    let w = world();
    let day = 86_400;
    w.ledger.accept("expired", now_ms() / 1000 - 23 * day);
    w.ledger.accept("slow", now_ms() / 1000 - 21 * day);
    let batch = vec![
        msg("m1", &refund("r1", "expired", None)),
        msg("m2", &refund("r2", "slow", None)),
    ];
    let (response, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    let back: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(
        back,
        vec!["m2"],
        "only the one still on its way is waited for"
    );
    assert_eq!(s.dead_lettered.get("payment_unknown"), Some(&1), "{s:?}");
    let dead = w.queues.0.lock().unwrap().clone();
    assert!(
        dead[0].error_message.contains("its record expired"),
        "{}",
        dead[0].error_message
    );
    assert!(w.provider.calls.lock().unwrap().is_empty());
}

/// The payment settles at the provider as `status` (its event applied to the record) and what
/// resumes held refunds does its part in memory: each held record reopened, each held message
/// sent again (the DynamoDB `reopen` and the sweep are tested on the emulator).
async fn settle_and_resume(w: &World, pid: &str, status: &str) -> Vec<SqsMessage> {
    let mut p = w.ledger.payment(pid).await.unwrap().unwrap();
    if let Some(o) = p.outcome.as_mut() {
        o.status = status.into();
    }
    let held = p.held.clone();
    w.ledger.insert(pid, p);
    let mut again = Vec::new();
    for (rid, body) in held {
        let mut r = w.store.get(&rid).await.unwrap().unwrap();
        assert_eq!(
            (r.status, r.outcome.as_ref().map(|o| o.status.as_str())),
            (RecordStatus::Completed, Some("held"))
        );
        r.status = RecordStatus::Failed;
        r.outcome = None;
        w.store.insert(r);
        again.push(msg(&format!("again-{rid}"), &body));
    }
    again
}

/// A refund of a payment the provider still settles (a bank debit `processing` for days, an
/// off-session payment `requires_action` until the customer authenticates) is held: its amount
/// reserved, its message kept on the payment, the message acknowledged, nothing sent. Once the
/// payment succeeds the held message refunds it, once; once it fails instead, the refund is
/// canceled and its amount given back. A refund of a payment that ended without a charge is
/// refused at once.
#[tokio::test]
async fn a_refund_of_a_payment_still_settling_is_held_and_made_once_it_succeeds() {
    let w = world();
    charged(&w, "debit", RecordStatus::Completed, "processing", 500);
    charged(&w, "auth", RecordStatus::Completed, "requires_action", 700);
    charged(&w, "canceled", RecordStatus::Completed, "canceled", 700);
    let batch = vec![
        msg("m1", &refund("r1", "debit", Some(200))),
        msg("m2", &refund("r2", "auth", None)),
        msg("m3", &refund("r3", "canceled", None)),
    ];
    let (response, s) = w
        .processor
        .handle_batch(batch.clone(), now_ms() + 60_000)
        .await;
    assert!(
        response.batch_item_failures.is_empty(),
        "acknowledged: {s:?}"
    );
    assert_eq!(s.done("held"), 2, "{s:?}");
    assert_eq!(s.dead_lettered.get("payment_not_refundable"), Some(&1));
    assert!(w.provider.calls.lock().unwrap().is_empty());
    let debit = w.ledger.payment("debit").await.unwrap().unwrap();
    assert_eq!((debit.refunded, debit.refunds.get("r1")), (200, Some(&200)));
    assert_eq!(
        debit.held.get("r1"),
        Some(&refund("r1", "debit", Some(200)))
    );
    let auth = w.ledger.payment("auth").await.unwrap().unwrap();
    assert_eq!(
        auth.refunds.get("r2"),
        Some(&700),
        "the rest, fixed when held"
    );
    // A duplicate while held is absorbed: nothing sent, nothing reserved twice.
    let (_, s) = w
        .processor
        .handle_batch(batch[..1].to_vec(), now_ms() + 60_000)
        .await;
    assert_eq!(s.duplicates, 1, "{s:?}");
    assert_eq!(
        w.ledger.payment("debit").await.unwrap().unwrap().refunded,
        200
    );

    // The debit succeeds: its held refund is made, once, for the amount held.
    let again = settle_and_resume(&w, "debit", "succeeded").await;
    let (response, s) = w
        .processor
        .handle_batch(again.clone(), now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    let calls = w.provider.calls.lock().unwrap().clone();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.refund_id.as_str(), c.amount))
            .collect::<Vec<_>>(),
        [("r1", 200)]
    );
    let debit = w.ledger.payment("debit").await.unwrap().unwrap();
    assert!(
        debit.held.contains_key("r1"),
        "the held entry stays until what resumes held refunds reads the refund done"
    );
    assert_eq!(debit.refunds.get("r1"), Some(&200));
    // Sent again (a second resume, the original message's late copy): absorbed.
    let (_, s) = w.processor.handle_batch(again, now_ms() + 60_000).await;
    assert_eq!(s.duplicates, 1, "{s:?}");
    assert_eq!(w.provider.calls.lock().unwrap().len(), 1);

    // The customer never authenticates and the PaymentIntent is canceled: the refund is
    // canceled, its amount given back.
    let again = settle_and_resume(&w, "auth", "canceled").await;
    let (response, s) = w.processor.handle_batch(again, now_ms() + 60_000).await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("canceled"), 1, "{s:?}");
    assert_eq!(
        w.provider.calls.lock().unwrap().len(),
        1,
        "nothing sent for it"
    );
    let auth = w.ledger.payment("auth").await.unwrap().unwrap();
    assert_eq!((auth.refunded, auth.refunds.len()), (0, 0));
    let r2 = w.store.get("r2").await.unwrap().unwrap();
    let o = r2.outcome.unwrap();
    assert_eq!(
        (o.status.as_str(), o.text("code")),
        ("canceled", Some("payment_failed"))
    );
    assert!(
        o.text("reason").unwrap().contains("ended canceled"),
        "{o:?}"
    );
}

/// A debit that fails is not the end of its payment: the PaymentIntent is back at
/// `requires_payment_method`, and its customer may pay it days later with another method. A
/// refund held before the decline stays held, its amount reserved (issue 65, bug 3: it was
/// canceled, and never made when the customer paid after all); made once the payment
/// succeeds. Canceled only when the PaymentIntent is.
#[tokio::test]
async fn a_held_refund_outlives_a_decline_and_is_made_when_the_customer_pays_after_all() {
    let w = world();
    charged(&w, "debit", RecordStatus::Completed, "processing", 500);
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "debit", Some(300)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.done("held"), 1, "{s:?}");
    // The debit fails; whatever resumes held refunds sent it again (a resume before this
    // rule, or one that raced the decline): it is held once more, nothing given back.
    let again = settle_and_resume(&w, "debit", "declined").await;
    *w.provider.now.lock().unwrap() = Some("declined".into());
    let (response, s) = w
        .processor
        .handle_batch(again.clone(), now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("held"), 1, "{s:?}");
    let debit = w.ledger.payment("debit").await.unwrap().unwrap();
    assert_eq!(
        (
            debit.refunded,
            debit.refunds.get("r1"),
            debit.held.contains_key("r1")
        ),
        (300, Some(&300), true),
        "still reserved and held"
    );
    let o = w.store.get("r1").await.unwrap().unwrap().outcome.unwrap();
    assert!(
        o.text("reason")
            .unwrap()
            .contains("declined at the provider and may still be paid"),
        "{o:?}"
    );
    // A refund that comes after the decline was never promised: refused on what the
    // provider holds.
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m2", &refund("r2", "debit", Some(100)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(
        s.dead_lettered.get("payment_not_refundable"),
        Some(&1),
        "{s:?}"
    );
    // The customer pays the same PaymentIntent: the held refund is made, once.
    let again = settle_and_resume(&w, "debit", "succeeded").await;
    let (_, s) = w.processor.handle_batch(again, now_ms() + 60_000).await;
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    let calls = w.provider.calls.lock().unwrap().clone();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.refund_id.as_str(), c.amount))
            .collect::<Vec<_>>(),
        [("r1", 300)]
    );
}

/// A payment recorded declined whose customer confirmed it again (the provider has it
/// `processing`, its event not applied here yet): the refund is not refused on the stale
/// record, it waits; once the record says `processing`, it is held. Declined at the provider
/// too: refused at once.
#[tokio::test]
async fn a_refund_of_a_payment_declined_only_in_its_record_waits_for_the_record() {
    let w = world();
    charged(&w, "again", RecordStatus::Completed, "declined", 500);
    *w.provider.now.lock().unwrap() = Some("processing".into());
    let (response, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "again", None))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(response.batch_item_failures.len(), 1, "handed back: {s:?}");
    assert!(s.dead_lettered.is_empty(), "{s:?}");
    let waiting = w.store.get("r1").await.unwrap().unwrap();
    assert!(
        waiting
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("recorded declined and is processing at the provider")),
        "{:?}",
        waiting.last_error
    );
    // The event arrives: the record says processing, and the refund is held.
    charged(&w, "again", RecordStatus::Completed, "processing", 500);
    let mut r = w.store.get("r1").await.unwrap().unwrap();
    r.not_before_ms = None;
    w.store.insert(r);
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "again", None))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.done("held"), 1, "{s:?}");
    // Declined at the provider too: refused at once.
    charged(&w, "gone", RecordStatus::Completed, "declined", 500);
    *w.provider.now.lock().unwrap() = Some("declined".into());
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m2", &refund("r2", "gone", None))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(
        s.dead_lettered.get("payment_not_refundable"),
        Some(&1),
        "{s:?}"
    );
    assert!(w.provider.calls.lock().unwrap().is_empty());
}

/// Two held refunds whose sum is the charge both hold; a third is refused at once, as it would
/// be on a charged payment; once the debit succeeds both are made, and nothing more.
#[tokio::test]
async fn held_refunds_never_add_up_to_more_than_the_charge() {
    let w = world();
    charged(&w, "debit", RecordStatus::Completed, "processing", 500);
    let batch = vec![
        msg("m1", &refund("r1", "debit", Some(300))),
        msg("m2", &refund("r2", "debit", Some(200))),
        msg("m3", &refund("r3", "debit", Some(1))),
    ];
    let (_, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert_eq!(s.done("held"), 2, "{s:?}");
    assert_eq!(s.dead_lettered.get("refund_exceeds_charge"), Some(&1));
    let again = settle_and_resume(&w, "debit", "succeeded").await;
    assert_eq!(again.len(), 2);
    let (_, s) = w.processor.handle_batch(again, now_ms() + 60_000).await;
    assert_eq!(s.done("refunded"), 2, "{s:?}");
    let calls = w.provider.calls.lock().unwrap().clone();
    assert_eq!(calls.iter().map(|c| c.amount).sum::<i64>(), 500);
    let p = w.ledger.payment("debit").await.unwrap().unwrap();
    assert_eq!(p.refunded, 500);
}

/// A refund's record, and the payment's record it reserved on, are kept for the refund window
/// from the refund: the provider can fail the refund weeks later.
#[tokio::test]
async fn a_refund_keeps_its_record_and_its_payment_s_ledger_for_the_refund_window() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "p1", Some(40)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    let year = now_ms() / 1000 + 364 * 86_400;
    let record = w.store.get("r1").await.unwrap().unwrap();
    assert!(
        record.expires_at_s >= year,
        "the refund's record is kept for the refund window, not the record retention: {}",
        record.expires_at_s
    );
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert!(p.expires_at_s >= year, "{}", p.expires_at_s);
}

#[tokio::test]
async fn a_refund_the_provider_refuses_gives_its_amount_back() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    *w.provider.refuse.lock().unwrap() = Some("charge_disputed".into());
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "p1", Some(70)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.dead_lettered.get("provider_rejected"), Some(&1));
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!((p.refunded, p.refunds.len()), (0, 0));
    // So a later refund of the whole charge still fits.
    *w.provider.refuse.lock().unwrap() = None;
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m2", &refund("r2", "p1", None))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.done("refunded"), 1);
    assert_eq!(w.provider.calls.lock().unwrap()[1].amount, 100);
}

#[tokio::test]
async fn a_refund_whose_key_the_provider_refuses_gives_its_amount_back_with_the_provider_s_words() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    *w.provider.refuse.lock().unwrap() = Some("idempotency_error".into());
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "p1", Some(70)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.dead_lettered.get("idempotency_key_reused"), Some(&1));
    let dead = w.queues.dead();
    assert!(
        dead[0].error_message.contains("refund:r1")
            && dead[0].error_message.contains("same endpoint"),
        "{}",
        dead[0].error_message
    );
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!(
        (p.refunded, p.refunds.len()),
        (0, 0),
        "nothing was refunded: the ledger says so"
    );
}

#[tokio::test]
async fn a_three_decimal_refund_off_stripe_s_grid_is_refused_before_any_reservation() {
    let w = world();
    charged_in(
        &w,
        "p1",
        RecordStatus::Completed,
        "succeeded",
        10_000,
        "kwd",
    );
    let (_, s) = w
        .processor
        .handle_batch(
            vec![msg("m1", &refund("r1", "p1", Some(1_005)))],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.dead_lettered.get("invalid_refund"), Some(&1));
    assert!(w.queues.dead()[0].error_message.contains("must end in 0"));
    assert!(w.provider.calls.lock().unwrap().is_empty());
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!(p.refunded, 0);
}

#[tokio::test]
async fn a_refund_reserved_before_the_currency_rule_goes_on_and_a_new_one_is_refused() {
    // UGX is charged in whole units since issue 63: a refund of 2.50 UGX reserved by an earlier
    // release (held while its payment settled) must be made or refused by the provider, never
    // refused here with its 250 reserved for good.
    let w = world();
    charged_in(
        &w,
        "p1",
        RecordStatus::Completed,
        "succeeded",
        10_000,
        "ugx",
    );
    let mut p = w.ledger.payment("p1").await.unwrap().unwrap();
    p.refunds.insert("r-before".into(), 250);
    p.refunded = 250;
    p.has_refunds = true;
    w.ledger.insert("p1", p);
    let (_, s) = w
        .processor
        .handle_batch(
            vec![
                msg("m1", &refund("r-before", "p1", Some(250))),
                msg("m2", &refund("r-new", "p1", Some(250))),
            ],
            now_ms() + 60_000,
        )
        .await;
    assert_eq!(s.dead_lettered.get("invalid_refund"), Some(&1), "{s:?}");
    assert!(w.queues.dead()[0].error_message.contains("multiple of 100"));
    assert_eq!(
        w.provider.calls.lock().unwrap().len(),
        1,
        "the reserved one, made"
    );
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!(p.refunded, 250);
}

#[test]
fn refund_messages_are_validated_naming_the_field() {
    use payment_core::refunds::work::RefundRequest;
    let code = |b: &str| RefundRequest::parse(b).unwrap_err().code;
    assert_eq!(code("{nope"), "invalid_json");
    assert_eq!(code(r#"{"refund_id":"r1"}"#), "invalid_refund");
    let e = RefundRequest::parse(r#"{"refund_id":"r 1","payment_id":"p1"}"#).unwrap_err();
    assert!(e.message.contains("refund_id"), "{}", e.message);
    let e = RefundRequest::parse(r#"{"refund_id":"r1","payment_id":"p1","amount":0}"#).unwrap_err();
    assert!(e.message.contains("amount"), "{}", e.message);
    let e = RefundRequest::parse(r#"{"refund_id":"r1","payment_id":"p1","reason":"bored"}"#)
        .unwrap_err();
    assert!(e.message.contains("reason"), "{}", e.message);
    let e = RefundRequest::parse(r#"{"refund_id":"r1","payment_id":"p1","card":"x"}"#).unwrap_err();
    assert!(e.message.contains("card"), "{}", e.message);
    let a = RefundRequest::parse(r#"{"payment_id":"p1","refund_id":"r1","amount":5}"#).unwrap();
    let b = RefundRequest::parse(r#"{"refund_id":"r1","payment_id":"p1","amount":6}"#).unwrap();
    assert_ne!(a.fingerprint(), b.fingerprint());
}

/// A refund whose attempt died after the provider created it `failed` (a crash before the
/// release), taken over after the provider forgot the key: the lookup finds it failed, gives the reservation back and records
/// the refusal; nothing is refunded, and the amount can be refunded again.
#[tokio::test]
async fn a_refund_found_failed_by_the_lookup_gives_its_reservation_back() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    let seen = w.ledger.payment("p1").await.unwrap().unwrap();
    w.ledger
        .reserve("p1", "r1", 40, &seen, "dead", 0, None)
        .await
        .unwrap();
    let now = now_ms();
    w.store.insert(sqs_once::record::IdempotencyRecord {
        traceparent: None,
        key: "r1".into(),
        status: RecordStatus::InProgress,
        payload_hash: payment_core::refunds::work::RefundRequest::parse(&refund(
            "r1",
            "p1",
            Some(40),
        ))
        .unwrap()
        .fingerprint(),
        lease_owner: Some("dead".into()),
        lease_expires_at_ms: now - 60_000,
        attempts: 1,
        outcome: None,
        expires_at_s: now / 1000 + 3600,
        // Longer ago than the provider remembers keys: the takeover looks the refund up.
        first_attempt_at_ms: now - 2 * 86_400_000,
        unknown_outcome: false,
        last_error: None,
        completed_at_ms: None,
        not_before_ms: None,
    });
    w.provider.found.lock().unwrap().push(FoundRefund {
        provider_refund_id: "re_1".into(),
        status: "failed".into(),
        amount: 40,
        refund_id: Some("r1".into()),
    });
    let (_, s) = w
        .processor
        .handle_batch(vec![msg("m1", &refund("r1", "p1", Some(40)))], now + 60_000)
        .await;
    assert_eq!(s.dead_lettered.get("refund_failed"), Some(&1), "{s:?}");
    assert!(
        w.provider.calls.lock().unwrap().is_empty(),
        "no second refund"
    );
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!(
        (p.refunded, p.refunds.len()),
        (0, 0),
        "the reservation given back"
    );
}

/// A refund made, its record gone since (its TTL ran while the payment's ledger, which every
/// later change keeps, lived on), and its message sent again (a held refund resumed late):
/// the reservation is found already on the payment, so the charge's refunds are looked up
/// before any call; the refund is found made and nothing is sent, where a blind call with a
/// key the provider has forgotten would refund it twice. One the provider does not hold is
/// made, once.
#[tokio::test]
async fn a_refund_reserved_before_its_record_was_lost_is_looked_up_not_made_twice() {
    let w = world();
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    for rid in ["r1", "r2"] {
        let seen = w.ledger.payment("p1").await.unwrap().unwrap();
        w.ledger
            .reserve("p1", rid, 40, &seen, "gone", 0, None)
            .await
            .unwrap();
    }
    w.provider.found.lock().unwrap().push(FoundRefund {
        provider_refund_id: "re_1".into(),
        status: "succeeded".into(),
        amount: 40,
        refund_id: Some("r1".into()),
    });
    let batch = vec![
        msg("m1", &refund("r1", "p1", Some(40))),
        msg("m2", &refund("r2", "p1", Some(40))),
    ];
    let (response, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("refunded"), 2, "{s:?}");
    let calls = w.provider.calls.lock().unwrap().clone();
    assert_eq!(
        calls
            .iter()
            .map(|c| c.refund_id.as_str())
            .collect::<Vec<_>>(),
        ["r2"],
        "r1 found made, not made again"
    );
    let r1 = w.store.get("r1").await.unwrap().unwrap().outcome.unwrap();
    assert_eq!(r1.text("provider_refund_id"), Some("re_1"));
    let p = w.ledger.payment("p1").await.unwrap().unwrap();
    assert_eq!(p.refunded, 80);
}

/// A world on a clock of the test's own, where payment p1 (100, charged) holds 40 reserved for
/// r1 by an attempt whose record is long gone (its refund window ran out).
async fn reserved_a_year_ago() -> (Arc<sqs_once::clock::ShiftedClock>, World) {
    let clock = Arc::new(sqs_once::clock::ShiftedClock::new());
    let w = world_on(clock.clone());
    charged(&w, "p1", RecordStatus::Completed, "succeeded", 100);
    let seen = w.ledger.payment("p1").await.unwrap().unwrap();
    w.ledger
        .reserve("p1", "r1", 40, &seen, "a year ago", 0, None)
        .await
        .unwrap();
    (clock, w)
}

/// The same refund sent again after its record expired, and its first attempt cut off in the
/// lookup (its answer lost: the record is marked unknown). The attempt that takes over inherits
/// the unknown mark, and its record is new: the runner's key horizon, counted from this
/// record's first attempt, says the provider still remembers the key, so only the refund's own
/// lookup of a reservation older than the claim stands between it and a blind call under a key
/// the provider forgot long ago. Found by `make sim FIRST_SEED=3 SEEDS=1 SWEEP=true
/// DISPUTE_DAYS=1,20 API_SHARE=0.5` (issue 65): the second call was refused
/// (`charge_already_refunded`) and the amount of the refund made was given back.
#[tokio::test]
async fn a_refund_sent_again_after_its_record_expired_is_looked_up_even_by_an_attempt_that_took_over(
) {
    let (clock, w) = reserved_a_year_ago().await;
    w.provider.found.lock().unwrap().push(FoundRefund {
        provider_refund_id: "re_1".into(),
        status: "succeeded".into(),
        amount: 40,
        refund_id: Some("r1".into()),
    });
    *w.provider.find_times_out.lock().unwrap() = true;
    let body = refund("r1", "p1", Some(40));
    let (response, s) = w
        .processor
        .handle_batch(vec![msg("m1", &body)], clock.now_ms() + 60_000)
        .await;
    assert_eq!(response.batch_item_failures.len(), 1, "{s:?}");
    let record = w.store.get("r1").await.unwrap().unwrap();
    assert!(record.unknown_outcome, "{record:?}");
    assert!(w.provider.calls.lock().unwrap().is_empty());
    // The lookup answers again; the message comes back after the attempt's calls could land.
    *w.provider.find_times_out.lock().unwrap() = false;
    clock.advance(Duration::from_secs(60));
    let (response, s) = w
        .processor
        .handle_batch(vec![msg("m1", &body)], clock.now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert!(
        w.provider.calls.lock().unwrap().is_empty(),
        "r1 is made already: no second refund is asked for"
    );
    let r1 = w.store.get("r1").await.unwrap().unwrap().outcome.unwrap();
    assert_eq!(r1.text("provider_refund_id"), Some("re_1"));
    assert_eq!(w.ledger.payment("p1").await.unwrap().unwrap().refunded, 40);
}

/// A refund whose outcome is unknown (its attempt's lookup timed out), sent again once its
/// payment's record has expired (the API's row still there, older than a record can be
/// claimed): whether the earlier attempt refunded cannot be looked up, so the refund is
/// neither refused `payment_unknown` (which would record "nothing refunded" over a refund that
/// may be made) nor sent: it stays unknown for an operator (issue 65's review). The attempt
/// that went on with the reservation made a year before kept the payment's record the refund
/// window from its claim, as a reservation of its own would: the record can expire only once
/// that window has passed.
#[tokio::test]
async fn an_unknown_refund_of_a_payment_whose_record_expired_stays_unknown() {
    let (clock, w) = reserved_a_year_ago().await;
    *w.provider.find_times_out.lock().unwrap() = true;
    let body = refund("r1", "p1", Some(40));
    let (response, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body)], clock.now_ms() + 60_000)
        .await;
    assert_eq!(response.batch_item_failures.len(), 1);
    assert!(w.store.get("r1").await.unwrap().unwrap().unknown_outcome);
    let kept = w.ledger.payment("p1").await.unwrap().unwrap().expires_at_s;
    assert!(
        kept >= clock.now_ms() / 1000 + 365 * 86_400 - 60,
        "the payment's record is kept the refund window from the attempt: {kept}"
    );
    // The window passes and the payment's record expires; its row is older than a record can
    // still be claimed.
    clock.advance(Duration::from_secs(366 * 86_400));
    w.ledger.expire("p1");
    w.ledger.accept("p1", clock.now_ms() / 1000 - 400 * 86_400);
    *w.provider.find_times_out.lock().unwrap() = false;
    // The message comes back (redriven): sent now, as a redrive's copy is.
    let mut sent_now = msg("m1", &body);
    sent_now
        .attributes
        .insert("SentTimestamp".into(), clock.now_ms().to_string());
    let (response, s) = w
        .processor
        .handle_batch(vec![sent_now], clock.now_ms() + 60_000)
        .await;
    assert_eq!(response.batch_item_failures.len(), 1, "handed back: {s:?}");
    assert_eq!(s.dead_lettered.get("payment_unknown"), None, "{s:?}");
    let record = w.store.get("r1").await.unwrap().unwrap();
    assert_ne!(record.status, RecordStatus::Completed, "{record:?}");
    assert!(record.unknown_outcome, "still unknown: {record:?}");
    assert!(w.provider.calls.lock().unwrap().is_empty(), "nothing sent");
    // Once the provider's search names the payment's PaymentIntent, its refunds say what the
    // earlier attempt did: it refunded, and the record completes so, nothing sent again.
    *w.provider.intents.lock().unwrap() = vec!["pi_p1".into()];
    w.provider.found.lock().unwrap().push(FoundRefund {
        provider_refund_id: "re_1".into(),
        status: "succeeded".into(),
        amount: 40,
        refund_id: Some("r1".into()),
    });
    clock.advance(Duration::from_secs(3_600));
    let mut again = msg("m1", &body);
    again
        .attributes
        .insert("SentTimestamp".into(), clock.now_ms().to_string());
    let (response, s) = w
        .processor
        .handle_batch(vec![again], clock.now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    let o = w.store.get("r1").await.unwrap().unwrap().outcome.unwrap();
    assert_eq!(o.text("provider_refund_id"), Some("re_1"));
    assert!(w.provider.calls.lock().unwrap().is_empty(), "nothing sent");
}

/// A merchant's resend of refunds whose records, and their payment's, have expired (the refund
/// window passed): no record names the charge, so the provider's search names the payment's
/// PaymentIntents and their refunds are listed. One made before under its refund id is answered
/// as made: no call, no dead letter for a person to refund by hand a second time (the simulator's
/// "no refund made and dead-lettered", 171 letters in 15 seeds before this). One the provider
/// holds as failed, or none at all, is refused `payment_unknown`: nothing was refunded under it.
/// Whatever the search names nothing for stays as before (refused, or unknown when its own
/// attempt reserved: `an_unknown_refund_of_a_payment_whose_record_expired_stays_unknown`).
#[tokio::test]
async fn a_refund_resent_after_its_payment_s_record_expired_is_found_made_at_the_provider() {
    let w = world();
    *w.provider.intents.lock().unwrap() = vec!["pi_gone".into()];
    w.provider.found.lock().unwrap().extend([
        FoundRefund {
            provider_refund_id: "re_made".into(),
            status: "succeeded".into(),
            amount: 40,
            refund_id: Some("r-made".into()),
        },
        FoundRefund {
            provider_refund_id: "re_failed".into(),
            status: "failed".into(),
            amount: 25,
            refund_id: Some("r-failed".into()),
        },
    ]);
    let batch = vec![
        msg("m1", &refund("r-made", "gone", Some(40))),
        msg("m2", &refund("r-failed", "gone", Some(25))),
        msg("m3", &refund("r-never", "gone", Some(10))),
    ];
    let (response, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert_eq!(s.dead_lettered.get("payment_unknown"), Some(&2), "{s:?}");
    let made = w.store.get("r-made").await.unwrap().unwrap();
    let o = made.outcome.unwrap();
    assert_eq!(
        (
            o.status.as_str(),
            o.text("provider_refund_id"),
            o.number("amount")
        ),
        ("succeeded", Some("re_made"), Some(40))
    );
    assert!(w.provider.calls.lock().unwrap().is_empty(), "nothing sent");
}

/// A refund whose first attempt was cut off before anything was kept (its lease taken over: an
/// unknown outcome inherited), of a payment that has no record and no API row. No attempt of
/// the refund's record can have reserved, so none called: a reservation keeps the payment's
/// record the refund window, and this record's first claim is younger. The refusal is stored
/// at once; before, the refund waited for a lookup that can never be made, was dead-lettered
/// `retries_exhausted`, and again after each redrive (issue 65: found by the default sweep's
/// seeds 14, 16 and 20 once the pace booked a refund's two requests together).
#[tokio::test]
async fn an_unknown_refund_of_a_payment_with_no_record_that_it_cannot_have_reserved_on_is_refused()
{
    let clock = Arc::new(sqs_once::clock::ShiftedClock::new());
    let w = world_on(clock.clone());
    let body = refund("r2", "p2", Some(40));
    let work = RefundWork::new(
        Arc::new(Provider::default()),
        Arc::new(InMemoryRefundLedger::default()),
        Duration::from_secs(86_400),
    );
    let request = sqs_once::Work::parse(&work, &body).unwrap();
    let now = clock.now_ms();
    let claimed = w
        .store
        .claim(&sqs_once::record::ClaimRequest {
            key: "r2".into(),
            payload_hash: sqs_once::Work::fingerprint(&work, &request),
            owner: "crashed".into(),
            now_ms: now,
            lease_expires_at_ms: now + 10_000,
            expires_at_s: now / 1000 + 86_400,
            traceparent: None,
        })
        .await
        .unwrap();
    assert!(matches!(
        claimed,
        sqs_once::record::ClaimResult::Claimed { .. }
    ));
    clock.advance(Duration::from_secs(60));
    let (response, s) = w
        .processor
        .handle_batch(vec![msg("m1", &body)], clock.now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty(), "{s:?}");
    assert_eq!(s.dead_lettered.get("payment_unknown"), Some(&1), "{s:?}");
    let record = w.store.get("r2").await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Completed, "{record:?}");
    assert!(!record.unknown_outcome, "{record:?}");
    assert!(w.provider.calls.lock().unwrap().is_empty(), "nothing sent");
}

/// A refund whose answer was lost after the provider made it (an unknown outcome), whose
/// payment's record is then gone (deleted by hand, or a refund window lowered and raised
/// again): its attempt held a reservation, so it may have refunded. It stays unknown for an
/// operator, never stored as refused, whatever the refund window says now (issue 65's
/// review: a check on the window in force would have stored "nothing refunded" over a refund
/// made, after the window was raised).
#[tokio::test]
async fn an_unknown_refund_that_reserved_stays_unknown_when_its_payment_record_is_gone() {
    let clock = Arc::new(sqs_once::clock::ShiftedClock::new());
    let w = world_on(clock.clone());
    charged(&w, "p3", RecordStatus::Completed, "succeeded", 100);
    *w.provider.create_answer_lost.lock().unwrap() = true;
    let body = refund("r3", "p3", Some(40));
    let (response, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body)], clock.now_ms() + 60_000)
        .await;
    assert_eq!(response.batch_item_failures.len(), 1);
    assert!(w.store.get("r3").await.unwrap().unwrap().unknown_outcome);
    // Sent under its key (the call loop retried the lost answer under the same key).
    let sent = w.provider.calls.lock().unwrap().len();
    assert!(sent >= 1, "the refund was asked for");
    w.ledger.expire("p3");
    *w.provider.create_answer_lost.lock().unwrap() = false;
    clock.advance(Duration::from_secs(120));
    let (response, s) = w
        .processor
        .handle_batch(vec![msg("m1", &body)], clock.now_ms() + 60_000)
        .await;
    assert_eq!(response.batch_item_failures.len(), 1, "handed back: {s:?}");
    assert_eq!(s.dead_lettered.get("payment_unknown"), None, "{s:?}");
    let record = w.store.get("r3").await.unwrap().unwrap();
    assert_ne!(record.status, RecordStatus::Completed, "{record:?}");
    assert!(record.unknown_outcome, "still unknown: {record:?}");
    assert_eq!(
        w.provider.calls.lock().unwrap().len(),
        sent,
        "not asked again"
    );
}
