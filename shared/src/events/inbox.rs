//! The inbox of the provider's events: an [`sqs_once::Work`] keyed by the event id (`evt_...`),
//! so each event is applied once whatever the duplicates (Stripe delivers an event more than
//! once, out of order, and retries for days; the catch-up feeds the same events again).
//!
//! Applying is itself repeatable: every change is a conditional write that names the state it
//! moves from ([`crate::events::settlement`]), so an attempt that crashed after its write and runs
//! again finds the state moved and changes nothing. The rules are in
//! [`crate::provider::event`].
//!
//! No state is taken from an event's payload: an event that may change what is stored has its
//! object read from the provider by id, at the pinned API version, and the object read must be
//! the one the record names (its PaymentIntent, its refund, a dispute of its charge). Whoever
//! can send to the events queue can make the inbox read, never make it write what the provider
//! does not hold; and the version an event was rendered in (the account's default on its day)
//! changes nothing.
//!
//! What an event finds:
//! - its object was not created by this system: neither its metadata nor the PaymentIntent
//!   recorded on the payment's record match (no `metadata[payment_id]` / `metadata[refund_id]`,
//!   no record of that id: the processors claim a record before they call the provider, so one
//!   of theirs always has one; or a PaymentIntent the payment's record does not name), or its
//!   type is not one the inbox applies: acknowledged and counted (`foreign`, `unhandled`). A
//!   refund event whose refund record is gone (past its lifetime) but whose payment's record
//!   names its PaymentIntent is ours: the payment's ledger is the truth for its reservation;
//!
//! Every write keeps the records it changes for the refund window from now (never less than
//! they were kept): the provider goes on changing a payment for months.
//!
//! Why ~700 lines: the payment, refund and dispute paths share one vocabulary (the outcomes,
//! the not-ours and not-yet rules, the retry on a moved state, the records' lifetime), and a
//! reader checks each path against the others.
//! - its object is this system's but its record is not completed yet (the answer that creates
//!   it is still on its way): handed back, to come again once the record is there;
//! - otherwise the rule's step: `applied` or `unchanged`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqs_once::record::{RecordStatus, StoreError};
use sqs_once::{AttemptContext, CallError, Fingerprint, Outcome, Rejection, Work};

use sqs_once::clock::Clock;

use crate::events::settlement::{EventNote, Settlements};
use crate::provider::event::{
    dispute_decided, dispute_fetched, dispute_holds_amount, dispute_may_move, payment_current,
    payment_may_move, refund_current, refund_may_move, refund_returns_nothing, DisputeChange,
    PaymentChange, ProviderEvent, RefundChange, Step, Subject,
};
use crate::provider::ProviderError;

/// The batch labels of the inbox.
pub mod labels {
    /// The event changed a payment, a refund or a dispute.
    pub const APPLIED: &str = "applied";
    /// The event was the state stored, or older.
    pub const UNCHANGED: &str = "unchanged";
    /// The event's object was not created by this system.
    pub const FOREIGN: &str = "foreign";
    /// The inbox does not apply this type.
    pub const UNHANDLED: &str = "unhandled";
}

/// The events inbox: the batch runner around [`EventWork`].
pub type EventProcessor = sqs_once::BatchRunner<EventWork>;

/// The inbox's metric names.
pub fn metric_names() -> sqs_once::metrics::MetricNames {
    sqs_once::metrics::MetricNames {
        namespace: "ProviderEvents".into(),
        service: "event-processor".into(),
        labels: vec![
            (labels::APPLIED.into(), "Applied".into()),
            (labels::UNCHANGED.into(), "Unchanged".into()),
            (labels::FOREIGN.into(), "Foreign".into()),
            (labels::UNHANDLED.into(), "Unhandled".into()),
        ],
        // The process's own (the stack's name) are added where it is wired (edges).
        dimensions: vec![],
    }
}

/// The provider's objects as they are now, read at the pinned API version: what the inbox applies.
#[async_trait]
pub trait ProviderObjects: Send + Sync {
    /// The longest a call may take.
    fn request_timeout(&self) -> Duration;
    /// `GET /v1/payment_intents/{id}`.
    async fn payment_intent(&self, id: &str) -> Result<PaymentChange, ProviderError>;
    /// `GET /v1/refunds/{id}`.
    async fn refund(&self, id: &str) -> Result<RefundChange, ProviderError>;
    /// `GET /v1/disputes/{id}`.
    async fn dispute(&self, id: &str) -> Result<DisputeChange, ProviderError>;
    /// The PaymentIntent of a charge (`GET /v1/charges/{id}`), for a dispute that names only
    /// its charge.
    async fn charge_intent(&self, charge: &str) -> Result<Option<String>, ProviderError>;
}

/// Mutations of the inbox that the whole-system simulator puts back
/// (`sqs_once::mutation::put_back_from`) to show that it finds them; in a build without
/// `sqs-once`'s `sim-mutations` feature they are never on.
pub const MUTATIONS: &[(&str, &str)] = &[
    (
        "inbox_reads_not_booked",
        "the inbox as before its events were paced: a dispute's event is claimed before its first read has a slot of the pace, and a read the pace refused is an attempt",
    ),
    (
        "inbox_applies_payload",
        "the inbox as before it read what it applies: the event's payload is taken for the provider's copy of its object, so whoever can send to the events queue settles payments, refunds and disputes",
    ),
];

/// How many times a change is decided again when the state moved under it.
const TRIES: usize = 4;

/// The inbox's work.
pub struct EventWork {
    settlements: Arc<dyn Settlements>,
    provider: Arc<dyn ProviderObjects>,
    /// Resumes the refunds a settled payment held (none: nothing is resumed here, as in a
    /// process that has no refunds queue; the catch-up's sweep still does).
    held: Option<Arc<crate::refunds::held::HeldRefunds>>,
    /// How long a charged payment's record is kept from its charge (its refund ledger).
    refund_window: Duration,
    /// Time, injected (the timeline test moves it months ahead).
    clock: Arc<dyn Clock>,
    /// What was read that never changes ([`crate::events::known`]).
    known: crate::events::known::Known,
}

/// How long an event's inbox record is kept: as long as the provider can send the event again
/// (Stripe keeps `/v1/events` for 30 days, and the catch-up may list it until then), plus a
/// day.
pub const EVENT_RECORD_LIFETIME: Duration = Duration::from_secs(31 * 86_400);

fn store_error(e: StoreError) -> CallError {
    CallError::transient(format!("the idempotency table: {e}"))
}

fn not_yet(what: &str) -> CallError {
    CallError {
        retry_now: false,
        ..CallError::transient(format!("{what}: the event comes back once it is"))
    }
}

/// An event whose record changed under every one of its [`TRIES`]: handed back.
fn kept_changing(what: &str, id: &str, event: &ProviderEvent) -> CallError {
    CallError::transient(format!(
        "{what} {id} kept changing while event {} was applied",
        event.id
    ))
}

/// An event about an id with no record here. The processors claim a record before they call
/// the provider, so an object they created always has one (until its retention ends): this is
/// another system's object on the same account, or one long forgotten.
fn no_record(event: &ProviderEvent, what: &str, id: &str) -> Outcome {
    outcome(
        labels::FOREIGN,
        event,
        format!("no record of {what} {id} here: not this system's, or past its retention"),
    )
}

/// An event's outcome. Its type and what it says it changed may quote the payload (an id of
/// its metadata, whatever a sender wrote there): a card number in them is masked before the
/// record keeps them or a log line shows them.
fn outcome(label: &str, event: &ProviderEvent, change: impl Into<String>) -> Outcome {
    let masked = |text: String| crate::domain::mask_card_numbers(&text).unwrap_or(text);
    Outcome::new(label)
        .with_text("type", masked(event.kind.clone()))
        .with_number("created", event.created)
        .with_text("change", masked(change.into()))
}

impl EventWork {
    /// The inbox over the idempotency table's records and the provider.
    pub fn new(
        settlements: Arc<dyn Settlements>,
        provider: Arc<dyn ProviderObjects>,
        refund_window: Duration,
    ) -> Self {
        Self {
            settlements,
            provider,
            held: None,
            refund_window,
            clock: sqs_once::clock::system(),
            known: Default::default(),
        }
    }

    /// Resumes the refunds a payment held once the payment settled, through `held`.
    pub fn with_held_refunds(mut self, held: Arc<crate::refunds::held::HeldRefunds>) -> Self {
        self.held = Some(held);
        self
    }

    /// After a payment's settlement was applied, or found applied: its held refunds are sent
    /// again before this event's record completes, so a crash in between leaves the event to
    /// come back and resume them.
    async fn resume_held(&self, pid: &str, held: bool, status: &str) -> Result<(), CallError> {
        match &self.held {
            Some(h) if held && !crate::provider::event::payment_may_still_charge(status) => {
                let resumed = h.resume(pid).await.map_err(store_error)?;
                if resumed.busy > 0 {
                    // An attempt holds one of them now: one that read the payment settling
                    // completes it `held` after this read, and nothing else would send it
                    // until the catch-up's sweep. This event comes back and resumes again.
                    return Err(not_yet(&format!(
                        "{} held refunds of payment {pid} are being decided by another attempt",
                        resumed.busy
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The same inbox on another clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The payment's record as the events see it; the event's span links to the payment's
    /// trace.
    async fn payment_record(
        &self,
        pid: &str,
    ) -> Result<Option<crate::events::settlement::PaymentState>, CallError> {
        let p = self.settlements.payment(pid).await.map_err(store_error)?;
        sqs_once::trace::link_current(p.as_ref().and_then(|p| p.traceparent.as_deref()));
        Ok(p)
    }

    /// Until when a write keeps the records it changes, read with TTLs `read_s`: the refund
    /// window from now, never less than any was.
    fn keep_until(&self, read_s: &[i64]) -> i64 {
        let window = self.clock.now_ms() / 1000 + self.refund_window.as_secs() as i64;
        read_s.iter().copied().fold(window, i64::max)
    }

    /// The event's note, on a payment's record that listed `listed` notes when read.
    fn note(&self, event: &ProviderEvent, change: &str, listed: usize) -> EventNote {
        EventNote {
            created: event.created,
            event_id: event.id.clone(),
            kind: event.kind.clone(),
            change: change.to_owned(),
            listed: listed < crate::events::settlement::MAX_EVENT_NOTES,
        }
    }

    async fn payment(&self, event: &ProviderEvent, c: PaymentChange) -> Result<Outcome, CallError> {
        let Some(pid) = c.payment_id.clone() else {
            return Ok(outcome(
                labels::FOREIGN,
                event,
                format!("{} has no metadata[payment_id]", c.intent_id),
            ));
        };
        for _ in 0..TRIES {
            let Some(p) = self.payment_record(&pid).await? else {
                return Ok(no_record(event, "payment", &pid));
            };
            if p.record_status != RecordStatus::Completed {
                return Err(not_yet(&format!("payment {pid} is not completed yet")));
            }
            let stored = p.status.clone().unwrap_or_default();
            if p.provider_payment_id.as_deref() != Some(c.intent_id.as_str()) {
                // Another PaymentIntent of the payment (one an earlier attempt left behind):
                // the record settles the one it names.
                return Ok(outcome(
                    labels::FOREIGN,
                    event,
                    format!(
                        "{} is not the PaymentIntent payment {pid} is recorded with",
                        c.intent_id
                    ),
                ));
            }
            let holds = !p.held.is_empty();
            if !payment_may_move(&stored) {
                self.resume_held(&pid, holds, &stored).await?;
                return Ok(outcome(
                    labels::UNCHANGED,
                    event,
                    format!("payment {pid} stays {stored}"),
                ));
            }
            // The PaymentIntent the record names, as the provider holds it now: the payload
            // only said which one to read.
            let now = if payload_taken() {
                c.clone()
            } else {
                self.provider.payment_intent(&c.intent_id).await?
            };
            let (to, decline) = match payment_current(&stored, &now.status) {
                Step::Apply(to) => (to, now.decline_code),
                Step::Unchanged => {
                    self.resume_held(&pid, holds, &stored).await?;
                    return Ok(outcome(
                        labels::UNCHANGED,
                        event,
                        format!(
                            "payment {pid} stays {stored} (the provider holds it {})",
                            now.status
                        ),
                    ));
                }
            };
            let change = format!("payment {stored} -> {to}");
            let keep = self.keep_until(&[p.expires_at_s]);
            let decline = decline.filter(|_| to == "declined");
            if self
                .settlements
                .settle_payment(
                    &pid,
                    &stored,
                    &to,
                    decline.as_deref(),
                    keep,
                    &self.note(event, &change, p.events.len()),
                )
                .await
                .map_err(store_error)?
            {
                // A crash here leaves the settlement written and its held refunds unsent:
                // this event comes back and resumes them (tests/integration/held_refunds.rs).
                crate::failpoint!("inbox_after_settle");
                // Always looked for: a refund may have held after this event read the payment
                // and before its write, which names only the status it moves from.
                self.resume_held(&pid, true, &to).await?;
                return Ok(outcome(labels::APPLIED, event, change).with_text("payment_id", pid));
            }
        }
        Err(kept_changing("payment", &pid, event))
    }

    async fn refund(&self, event: &ProviderEvent, c: RefundChange) -> Result<Outcome, CallError> {
        let Some(rid) = c.refund_id.clone() else {
            return Ok(outcome(
                labels::FOREIGN,
                event,
                format!("{} has no metadata[refund_id]", c.provider_refund_id),
            ));
        };
        for _ in 0..TRIES {
            let Some(r) = self.settlements.refund(&rid).await.map_err(store_error)? else {
                match self.refund_on_payment(event, &c, &rid).await? {
                    Some(done) => return Ok(done),
                    None => continue,
                }
            };
            if r.record_status != RecordStatus::Completed {
                return Err(not_yet(&format!("refund {rid} is not completed yet")));
            }
            let stored = r.status.clone().unwrap_or_default();
            let Some(pid) = r.payment_id.clone() else {
                return Ok(outcome(
                    labels::UNCHANGED,
                    event,
                    format!("refund {rid} stays {stored}"),
                ));
            };
            if r.provider_refund_id.as_deref() != Some(c.provider_refund_id.as_str()) {
                return Ok(outcome(
                    labels::FOREIGN,
                    event,
                    format!(
                        "{} is not the refund {rid} is recorded with",
                        c.provider_refund_id
                    ),
                ));
            }
            if !refund_may_move(&stored) {
                return Ok(outcome(
                    labels::UNCHANGED,
                    event,
                    format!("refund {rid} stays {stored}"),
                ));
            }
            // The refund the record names, as the provider holds it now.
            let now = if payload_taken() {
                c.clone()
            } else {
                self.provider.refund(&c.provider_refund_id).await?
            };
            let to = match refund_current(&stored, &now.status) {
                Step::Apply(to) => to,
                Step::Unchanged => {
                    return Ok(outcome(
                        labels::UNCHANGED,
                        event,
                        format!(
                            "refund {rid} stays {stored} (the provider holds it {})",
                            now.status
                        ),
                    ))
                }
            };
            // The refund's payment may be past its lifetime: then nothing holds its money any
            // more, and only the refund's own record moves.
            let p = self.payment_record(&pid).await?;
            let release = p
                .as_ref()
                .filter(|_| refund_returns_nothing(&to))
                .and_then(|p| p.refunds.get(&rid).copied());
            let keep = self.keep_until(&[r.expires_at_s, p.as_ref().map_or(0, |p| p.expires_at_s)]);
            let change = match release {
                Some(a) => format!("refund {rid} {stored} -> {to}, {a} given back"),
                None => format!("refund {rid} {stored} -> {to}"),
            };
            if self
                .settlements
                .settle_refund(
                    &rid,
                    p.as_ref().map(|_| pid.as_str()),
                    &stored,
                    &to,
                    release,
                    keep,
                    &self.note(event, &change, p.as_ref().map_or(0, |p| p.events.len())),
                )
                .await
                .map_err(store_error)?
            {
                return Ok(outcome(labels::APPLIED, event, change)
                    .with_text("payment_id", pid)
                    .with_text("refund_id", rid));
            }
        }
        Err(kept_changing("refund", &rid, event))
    }

    /// A refund event whose refund record is gone: the payment its metadata names, if that
    /// payment's record names the refund's PaymentIntent, holds the truth of its reservation. A
    /// refund that moved no money gives back what the payment still holds for it; anything
    /// else changes nothing. `None`: the payment changed under the write (read again).
    async fn refund_on_payment(
        &self,
        event: &ProviderEvent,
        c: &RefundChange,
        rid: &str,
    ) -> Result<Option<Outcome>, CallError> {
        let Some(pid) = c.payment_id.clone() else {
            return Ok(Some(no_record(event, "refund", rid)));
        };
        let Some(p) = self.payment_record(&pid).await? else {
            return Ok(Some(no_record(event, "refund", rid)));
        };
        if p.provider_payment_id.is_none() || p.provider_payment_id != c.intent_id {
            return Ok(Some(outcome(
                labels::FOREIGN,
                event,
                format!(
                    "no record of refund {rid} here, and {} is not the PaymentIntent payment {pid} is recorded with",
                    c.intent_id.as_deref().unwrap_or("a refund naming no PaymentIntent")
                ),
            )));
        }
        let Some(held) = p.refunds.get(rid).copied() else {
            let was = if p.released.contains_key(rid) {
                "given back before"
            } else {
                "never reserved on it"
            };
            return Ok(Some(outcome(
                labels::UNCHANGED,
                event,
                format!("refund {rid} of payment {pid} is {was}"),
            )));
        };
        // A reservation is given back only for a refund the provider holds failed or canceled,
        // read by its id: the one this payment's PaymentIntent was refunded by, under this
        // refund id.
        let now = if payload_taken() {
            c.clone()
        } else {
            self.provider.refund(&c.provider_refund_id).await?
        };
        if now.refund_id.as_deref() != Some(rid) || now.intent_id != p.provider_payment_id {
            return Ok(Some(outcome(
                labels::FOREIGN,
                event,
                format!(
                    "{} is not refund {rid} of payment {pid}'s PaymentIntent",
                    c.provider_refund_id
                ),
            )));
        }
        if !refund_returns_nothing(&now.status) {
            return Ok(Some(outcome(
                labels::UNCHANGED,
                event,
                format!(
                    "refund {rid} stays reserved on payment {pid} (the provider holds it {})",
                    now.status
                ),
            )));
        }
        let amount = held;
        let change = format!(
            "refund {rid} -> {} (its record past its lifetime), {amount} given back",
            now.status
        );
        let keep = self.keep_until(&[p.expires_at_s]);
        if self
            .settlements
            .settle_refund_on_payment(
                &pid,
                rid,
                amount,
                keep,
                &self.note(event, &change, p.events.len()),
            )
            .await
            .map_err(store_error)?
        {
            return Ok(Some(
                outcome(labels::APPLIED, event, change)
                    .with_text("payment_id", pid)
                    .with_text("refund_id", rid),
            ));
        }
        Ok(None)
    }

    /// The PaymentIntent a dispute names, or that of the charge it names (read from the
    /// provider unless this process read it before).
    async fn dispute_intent(&self, c: &DisputeChange) -> Result<Option<String>, CallError> {
        Ok(match (&c.intent_id, &c.charge) {
            (Some(i), _) => Some(i.clone()),
            (None, Some(ch)) => match self.known.intent_of(ch) {
                Some(i) => Some(i),
                None => {
                    let i = self.provider.charge_intent(ch).await?;
                    if let Some(i) = &i {
                        self.known.keep_intent(ch, i);
                    }
                    i
                }
            },
            (None, None) => None,
        })
    }

    async fn dispute(&self, event: &ProviderEvent, c: DisputeChange) -> Result<Outcome, CallError> {
        let intent = self.dispute_intent(&c).await?;
        let Some(intent) = intent else {
            return Ok(outcome(
                labels::FOREIGN,
                event,
                format!("{} names no PaymentIntent", c.dispute_id),
            ));
        };
        let pid = match self.known.payment_of(&intent) {
            Some(pid) => pid,
            None => {
                let Some(pid) = self.provider.payment_intent(&intent).await?.payment_id else {
                    return Ok(outcome(
                        labels::FOREIGN,
                        event,
                        format!("{intent} has no metadata[payment_id]"),
                    ));
                };
                self.known.keep_payment(&intent, &pid);
                pid
            }
        };
        let did = &c.dispute_id;
        for _ in 0..TRIES {
            let Some(p) = self.payment_record(&pid).await? else {
                return Ok(no_record(event, "payment", &pid));
            };
            if p.record_status != RecordStatus::Completed {
                return Err(not_yet(&format!("payment {pid} is not completed yet")));
            }
            if p.provider_payment_id.as_deref() != Some(intent.as_str()) {
                // Another system's PaymentIntent whose metadata happens to name one of our
                // payment ids, or one an earlier attempt of ours left behind: not this record's.
                return Ok(outcome(
                    labels::FOREIGN,
                    event,
                    format!("{intent} is not the PaymentIntent payment {pid} is recorded with"),
                ));
            }
            let stored = p.disputes.get(did).cloned();
            let version = p.dispute_versions.get(did).copied().unwrap_or(0);
            let from = stored.as_ref().map(|(s, _)| (s.as_str(), version));
            let was = from.map_or("", |(s, _)| s);
            if !dispute_may_move(from.map(|(s, _)| s)) {
                return Ok(outcome(
                    labels::UNCHANGED,
                    event,
                    format!("dispute {did} stays {was}"),
                ));
            }
            // Read after the record: the copy is at least as new as what the record holds,
            // and the write below names the version read.
            let now = if payload_taken() {
                c.clone()
            } else {
                self.provider.dispute(did).await?
            };
            // The dispute read is of this payment's charge, or the event named another's.
            if self.dispute_intent(&now).await?.as_deref() != Some(intent.as_str()) {
                return Ok(outcome(
                    labels::FOREIGN,
                    event,
                    format!(
                        "{did} is not a dispute of {intent}, which payment {pid} is recorded with"
                    ),
                ));
            }
            // `unchanged`: the provider's copy, read past a loss, says what the record holds.
            let (to, amount, unchanged) = match dispute_fetched(was, &now.status) {
                Some(to) => (to, now.amount, None),
                // Unchanged, and written so all the same (the version raised, the amount the
                // provider's): a copy another event read before this one finds the version
                // moved and reads again, where its write would have named a status that still
                // held (the same loss, before and after an appeal).
                None if stored.is_some() && dispute_decided(was) => (
                    was.to_owned(),
                    now.amount,
                    Some(format!(
                        "dispute {did} stays {was} (the provider holds it {})",
                        now.status
                    )),
                ),
                None => {
                    return Ok(outcome(
                        labels::UNCHANGED,
                        event,
                        if stored.is_some() {
                            format!(
                                "dispute {did} stays {was} (the provider holds it {})",
                                now.status
                            )
                        } else {
                            format!(
                                "dispute {did} is not recorded (the provider holds it {})",
                                now.status
                            )
                        },
                    ))
                }
            };
            let held_before = stored
                .as_ref()
                .filter(|(s, _)| dispute_holds_amount(s))
                .map_or(0, |(_, a)| *a);
            let held_after = if dispute_holds_amount(&to) { amount } else { 0 };
            let moved = stored.as_ref().is_some_and(|(_, a)| *a != amount);
            let change = match (&stored, &unchanged) {
                (_, Some(same)) if !moved => same.clone(),
                (Some((from, _)), _) => {
                    format!("dispute {did} {from} -> {to} ({amount} held: {held_after})")
                }
                (None, _) => format!("dispute {did} {to} ({amount} held: {held_after})"),
            };
            if self
                .settlements
                .settle_dispute(
                    &pid,
                    did,
                    from,
                    &to,
                    amount,
                    held_after - held_before,
                    self.keep_until(&[p.expires_at_s]),
                    &self.note(event, &change, p.events.len()),
                )
                .await
                .map_err(store_error)?
            {
                let label = if unchanged.is_some() && !moved {
                    labels::UNCHANGED
                } else {
                    labels::APPLIED
                };
                return Ok(outcome(label, event, change).with_text("payment_id", pid));
            }
        }
        Err(kept_changing("payment", &pid, event))
    }
}

/// Whether the payload is taken for the provider's copy (the mutation `inbox_applies_payload`,
/// which the simulator's forger finds).
fn payload_taken() -> bool {
    sqs_once::mutation::on("inbox_applies_payload")
}

#[async_trait]
impl Work for EventWork {
    type Request = ProviderEvent;

    /// A Stripe event, or EventBridge's envelope of one: the same event either way.
    fn parse(&self, body: &str) -> Result<ProviderEvent, Rejection> {
        ProviderEvent::parse_queued(body)
    }

    fn key(&self, event: &ProviderEvent) -> String {
        event.id.clone()
    }

    /// The event's id and type: a redelivery, or the same event listed by the catch-up
    /// (serialised anew), is the same request.
    fn fingerprint(&self, event: &ProviderEvent) -> String {
        Fingerprint::new("event/v1")
            .field("id", &event.id)
            .field("type", &event.kind)
            .finish()
    }

    async fn execute(
        &self,
        event: &ProviderEvent,
        _attempt: &AttemptContext,
    ) -> Result<Outcome, CallError> {
        match event.subject() {
            Subject::Payment(c) => self.payment(event, c).await,
            Subject::Refund(c) => self.refund(event, c).await,
            Subject::Dispute(c) => self.dispute(event, c).await,
            Subject::Unhandled => Ok(outcome(
                labels::UNHANDLED,
                event,
                "not applied by the inbox",
            )),
        }
    }

    fn call_timeout(&self) -> Duration {
        self.provider.request_timeout()
    }

    /// A dispute reads its PaymentIntent (and its charge's, or the dispute itself) unless this
    /// process read them before ([`crate::events::known`]): its first read's slot is booked
    /// before the claim, so that waiting for the pace is never an attempt. A payment or refund
    /// event reads its object only when the state stored is not final (a card payment's
    /// `succeeded` finds it recorded `succeeded`: no read), so its read takes its slot when it
    /// is needed (and one the pace refuses hands the event back unattempted, see
    /// [`Work::reads_only`]).
    fn paces_first_call(&self, event: &Self::Request) -> bool {
        matches!(event.subject(), Subject::Dispute(_))
            && !sqs_once::mutation::on("inbox_reads_not_booked")
    }

    /// The inbox only reads from the provider; its writes are conditional writes of its own
    /// records, made after its reads.
    fn reads_only(&self, _event: &Self::Request) -> bool {
        !sqs_once::mutation::on("inbox_reads_not_booked")
    }

    /// An event's record outlives every copy the provider may still send of it.
    fn retention_after(&self, _outcome: &Outcome) -> Option<Duration> {
        Some(EVENT_RECORD_LIFETIME)
    }
}
