//! Refunds of payments this system charged, as a second [`Work`] of the same runner.
//!
//! A message `{"refund_id", "payment_id", "amount"?, "reason"?}` asks to refund (part of) a
//! payment. The refund's record is `refund#<refund_id>`; the provider gets
//! `POST /v1/refunds` with `Idempotency-Key: refund:<refund_id>`. Before the call the amount is
//! reserved on the payment's record ([`crate::refunds::ledger`]), so all refunds of a payment
//! together never exceed its charge. Without an amount, what is left of the charge is
//! refunded (fixed at the reservation, so a retry refunds the same).
//!
//! Only a payment whose record is `COMPLETED` with a `succeeded` outcome is refunded. A payment
//! still being charged (no record yet, `IN_PROGRESS`, `FAILED`) makes the refund come back
//! later, until its retry horizon ends (`retries_exhausted`; the reason says what it waits
//! for). A payment still settling at the provider (`processing`: a bank debit, days;
//! `requires_action`: the customer has not authenticated yet) *holds* the refund: its amount
//! is reserved as for any refund, its message kept on the payment's record
//! ([`crate::refunds::ledger`]), and the refund is completed [`HELD`], its message
//! acknowledged. Whatever applies the payment's settlement reopens the held refund and sends
//! its message again ([`crate::refunds::held`]); this work then runs once more and makes the
//! refund (the payment succeeded) or gives its amount back and completes it [`CANCELED`] (the
//! payment failed). A payment that ended without a charge (declined, canceled, rejected) is
//! `payment_not_refundable`, a refund beyond what is left `refund_exceeds_charge`, a refund
//! past what one payment's record keeps (its 200th, or a fifth held at once while the payment
//! settles) `refund_limit_reached`, each dead-lettered and never redriven (their records are
//! complete).
//!
//! Why ~760 lines: the refund's decision on its payment (charged, settling, failed), its
//! reservation or hold, and its call are one path, read with the `Work` that runs it.
//!
//! A refund's record is kept for the refund window from its completion
//! ([`Work::retention_after`]), as long as the payment's ledger it reserved on: the provider
//! can fail a refund weeks later, and that event must still find it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqs_once::clock::Clock;
use sqs_once::{AttemptContext, CallError, Outcome, Rejection, Verdict, Work};

use crate::provider::{RefundCall, RefundProvider, RefundResponse};
use crate::refunds::ledger::{
    RefundLedger, RefundablePayment, Reservation, MAX_HELD_REFUNDS, MAX_REFUNDS_PER_PAYMENT,
};
pub use crate::refunds::request::{RefundRequest, REASONS};

/// The batch runner over refunds: the refund-processor Lambda's whole handler.
pub type RefundProcessor = sqs_once::BatchRunner<RefundWork>;

/// The label of a refund done, in the batch summary and its metrics.
pub const REFUNDED: &str = "refunded";

/// The outcome, and the batch label, of a refund held until its payment settles.
pub const HELD: &str = "held";

/// The outcome, and the batch label, of a held refund whose payment failed: nothing was sent
/// to the provider and its amount was given back.
pub const CANCELED: &str = "canceled";

/// The dead-letter code of a refund whose payment is known nowhere.
pub const PAYMENT_UNKNOWN: &str = "payment_unknown";

/// Refunding through a [`RefundProvider`], with the totals in a [`RefundLedger`].
pub struct RefundWork {
    /// The provider client.
    provider: Arc<dyn RefundProvider>,
    /// The refunded totals on the payments' records.
    ledger: Arc<dyn RefundLedger>,
    /// How long the provider remembers an idempotency key.
    key_retention: Duration,
    /// How long a refund's record, and the payment's record it reserved on, are kept after
    /// each change (`REFUND_WINDOW_DAYS`).
    refund_window: Duration,
    /// How long a payment's record lives at least from its first claim (the payments'
    /// `IDEMPOTENCY_TTL_DAYS`): past it (and a day for its message's send) a payment the API
    /// accepted that has no record never will.
    payment_record_ttl: Duration,
    /// Time, injected (the timeline test moves it months ahead).
    clock: Arc<dyn Clock>,
}

/// Reservations tried before the message comes back (each lost race reads the payment again).
const RESERVE_TRIES: usize = 8;

fn rejected(code: &str, reason: String) -> Outcome {
    Outcome::new("rejected")
        .with_text("code", code)
        .with_text("reason", reason)
}

/// The payment's charge is not finished yet: the refund comes back later.
fn not_yet(payment_id: &str, why: &str) -> CallError {
    CallError {
        retry_now: false,
        ..CallError::transient(format!(
            "payment {payment_id} {why}: a refund waits for its charge to complete"
        ))
    }
}

fn store_error(e: sqs_once::record::StoreError) -> CallError {
    CallError::transient(format!(
        "reading or reserving the refunded total failed: {e}"
    ))
}

/// What the provider holds of a refund whose payment has no record.
enum Earlier {
    /// Made under this refund id (succeeded or pending): the outcome to store.
    Made(Outcome),
    /// The payment's PaymentIntents were found and none holds a refund of it that moved money
    /// (a list is consistent): nothing was refunded under this refund id.
    NotMade,
    /// The search named no PaymentIntent of the payment: nothing can be told.
    Unknown,
}

/// Where a refund's payment stands.
enum Payment {
    /// Charged: refunded from this PaymentIntent.
    Charged {
        payment: RefundablePayment,
        intent: String,
        currency: String,
        amount: i64,
    },
    /// Still settling at the provider: the refund is held.
    Settling {
        payment: RefundablePayment,
        waits_for: String,
        currency: String,
        amount: i64,
    },
    /// Ended without a charge: nothing to refund (a held refund of it is canceled).
    Failed {
        payment: RefundablePayment,
        status: String,
    },
    /// Never refundable, and nothing of the refund on it.
    Refused(Outcome),
}

impl RefundWork {
    /// The work over a provider that remembers keys for `key_retention`.
    pub fn new(
        provider: Arc<dyn RefundProvider>,
        ledger: Arc<dyn RefundLedger>,
        key_retention: Duration,
    ) -> Self {
        Self {
            provider,
            ledger,
            key_retention,
            refund_window: crate::payments::charge::DEFAULT_REFUND_WINDOW,
            payment_record_ttl: Duration::from_secs(sqs_once::settings::DEFAULT_TTL_SECONDS),
            clock: sqs_once::clock::system(),
        }
    }

    /// The payments' record retention (`IDEMPOTENCY_TTL_DAYS`), when not the default.
    pub fn with_payment_record_ttl(mut self, ttl: Duration) -> Self {
        self.payment_record_ttl = ttl;
        self
    }

    /// Keeps refund records, and the payments' records they change, this long after each
    /// change.
    pub fn with_refund_window(mut self, window: Duration) -> Self {
        self.refund_window = window;
        self
    }

    /// The same work on another clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Until when a write to the payment's record, read with TTL `read_s`, keeps it: the
    /// refund window from now, never less than it was.
    fn keep_until(&self, read_s: i64) -> i64 {
        read_s.max(self.clock.now_ms() / 1000 + self.refund_window.as_secs() as i64)
    }

    /// Whether no attempt of this refund's record ever held a reservation on its payment, and
    /// so none can have called the provider (an attempt calls only after one, and each marks
    /// the record in the reservation's own transaction: [`RefundLedger::reserved_by`]): an
    /// unknown outcome it inherited is then no refund made by it.
    async fn none_reserved(&self, r: &RefundRequest) -> Result<bool, CallError> {
        if sqs_once::mutation::on("unknown_refund_of_a_gone_payment_waits") {
            return Ok(false);
        }
        Ok(!self
            .ledger
            .reserved_by(&r.refund_id)
            .await
            .map_err(store_error)?)
    }

    /// What the provider holds of this refund when no record of its payment names its charge:
    /// the payment's PaymentIntents, by the provider's search (a PaymentIntent whose record has
    /// expired is months old, long past the search's lag), and each one's refunds, listed.
    async fn made_before(&self, r: &RefundRequest) -> Result<Earlier, CallError> {
        if sqs_once::mutation::on("refund_with_no_payment_record_not_searched") {
            return Ok(Earlier::Unknown);
        }
        let intents = self.provider.payment_intents_of(&r.payment_id).await?;
        if intents.is_empty() {
            return Ok(Earlier::Unknown);
        }
        for intent in intents {
            let made = self
                .provider
                .find_refunds(&intent)
                .await?
                .into_iter()
                .find(|f| {
                    f.refund_id.as_deref() == Some(r.refund_id.as_str())
                        && !matches!(f.status.as_str(), "failed" | "canceled")
                });
            if let Some(f) = made {
                return Ok(Earlier::Made(
                    Outcome::new(f.status)
                        .with_text("provider_refund_id", f.provider_refund_id)
                        .with_text("payment_id", &r.payment_id)
                        .with_number("amount", f.amount)
                        .with_text(
                            "reason",
                            format!("made before under refund_id {}, at {intent}; the payment's record had expired (the refund window) when this message came", r.refund_id),
                        ),
                ));
            }
        }
        Ok(Earlier::NotMade)
    }

    /// Where the refund's payment stands.
    async fn charged(&self, r: &RefundRequest) -> Result<Payment, CallError> {
        let pid = &r.payment_id;
        let p = self.ledger.payment(pid).await.map_err(store_error)?;
        // The refund's span links to the payment's trace.
        sqs_once::trace::link_current(p.as_ref().and_then(|p| p.traceparent.as_deref()));
        let Some(p) = p else {
            if let Some(created_s) = self.ledger.accepted_at(pid).await.map_err(store_error)? {
                // Accepted by the API and on its way: wait (boundedly: the retry horizon).
                // Its message is sent within a day of the row and claimed within the record
                // retention of its send, or refused `request_expired`: a payment accepted
                // longer ago that has no record will never have one again. Its record, kept
                // the refund window after its last change, expired: waiting would only
                // dead-letter the refund for waiting, and a redrive would wait again.
                let last_claim_s = created_s.saturating_add(
                    (self.payment_record_ttl + Duration::from_secs(86_400)).as_secs() as i64,
                );
                if self.clock.now_ms() / 1000 <= last_claim_s
                    || sqs_once::mutation::on("expired_payment_record_waited_for")
                {
                    return Err(not_yet(pid, "is accepted but has no record yet"));
                }
                return Ok(Payment::Refused(rejected(
                    PAYMENT_UNKNOWN,
                    format!("payment {pid}, accepted by the payments API at {created_s} (epoch s), has no record any more, and none can come: its record expired (a charged payment's is kept the refund window after its last change, so that window has passed; one that never completed, the record retention). Nothing was refunded by this message (a refund made before under this refund_id stands); a refund still owed is made by hand in Stripe's Dashboard"),
                )));
            }
            // Known nowhere: no charge can be refunded, and waiting would only delay the
            // answer (a payment sent after its refund is refunded under a new refund_id).
            return Ok(Payment::Refused(rejected(
                PAYMENT_UNKNOWN,
                format!("no payment {pid} was processed or accepted by the payments API when this refund came: nothing to refund; once it is charged, send the refund again under a new refund_id"),
            )));
        };
        if p.status != sqs_once::record::RecordStatus::Completed {
            return Err(not_yet(pid, &format!("is {}", p.status.as_str())));
        }
        let Some(o) = p.outcome.clone() else {
            return Ok(Payment::Refused(rejected(
                "payment_not_refundable",
                format!("payment {pid} has no outcome: nothing to refund"),
            )));
        };
        let settling = crate::provider::event::payment_settling(&o.status);
        if settling && sqs_once::mutation::on("early_refund_not_held") {
            return Err(not_yet(pid, &format!("is {} at the provider", o.status)));
        }
        // Not charged yet, not refused either: the provider settles it later (a bank debit in
        // days, a customer's authentication whenever they come back). A refund held before its
        // payment was declined stays held: the customer may still pay the PaymentIntent, and
        // the refund was promised for that (a refund that comes after the decline is refused
        // below, on what the provider holds then).
        if settling
            || (crate::provider::event::payment_may_still_charge(&o.status)
                && p.held.contains_key(&r.refund_id))
        {
            return Ok(Payment::Settling {
                waits_for: o.status.clone(),
                currency: o.currency.clone(),
                amount: o.amount,
                payment: p,
            });
        }
        match o
            .provider_payment_id
            .clone()
            .filter(|_| o.status == "succeeded")
        {
            Some(intent) => Ok(Payment::Charged {
                intent,
                currency: o.currency.clone(),
                amount: o.amount,
                payment: p,
            }),
            None => {
                // A decline is not final at the provider: the customer may have confirmed the
                // PaymentIntent again, its event not applied here yet. The refund is refused
                // only on what the provider holds now; else it waits for the record.
                if let (Some(intent), "declined") = (&o.provider_payment_id, o.status.as_str()) {
                    match self.provider.payment_status(intent).await? {
                        Some(now) if now != "declined" && now != "canceled" => {
                            return Err(not_yet(
                                pid,
                                &format!("is recorded declined and is {now} at the provider (its event not applied yet)"),
                            ));
                        }
                        _ => {}
                    }
                }
                Ok(Payment::Failed {
                    status: o.status.clone(),
                    payment: p,
                })
            }
        }
    }

    /// Reserves the refund's amount on the payment as read (or finds it reserved by an
    /// earlier attempt, or by its own hold: [`Reserved::earlier`]), holding the refund when
    /// `hold` carries its message. `Ok(None)`: the payment changed since it was read; decide
    /// again. A held
    /// refund's entry stays on the payment until whatever resumes held refunds reads this
    /// refund's record completed ([`crate::refunds::held`]): until then it is sent again.
    async fn reserve(
        &self,
        r: &RefundRequest,
        p: &RefundablePayment,
        charged: i64,
        attempt: &AttemptContext,
        hold: Option<&str>,
    ) -> Result<Option<Result<Reserved, Outcome>>, CallError> {
        let owner = attempt.owner.as_str();
        let keep = self.keep_until(p.expires_at_s);
        if let Some(a) = p.refunds.get(&r.refund_id) {
            // This attempt may call with it: as a reservation of its own would, it keeps the
            // payment's record the refund window from this record's first claim at least, and
            // marks this record as one whose attempt held a reservation
            // ([`RefundWork::none_reserved`]); one write, made only when either is missing
            // (a reservation made by an earlier record of this refund id, since expired).
            let from_first_claim =
                attempt.first_attempt_at_ms / 1000 + self.refund_window.as_secs() as i64;
            let kept = p.expires_at_s >= from_first_claim
                && self
                    .ledger
                    .reserved_by(&r.refund_id)
                    .await
                    .map_err(store_error)?;
            if !kept
                && !self
                    .ledger
                    .keep_reserved(&r.payment_id, &r.refund_id, *a, owner, keep)
                    .await
                    .map_err(store_error)?
            {
                return Ok(None);
            }
            return Ok(Some(Ok(Reserved {
                amount: *a,
                earlier: true,
            })));
        }
        let amount = r.amount.unwrap_or(p.left(charged));
        if amount <= 0 || amount > p.left(charged) {
            let disputed = if p.disputed > 0 {
                format!(", {} held by disputes", p.disputed)
            } else {
                String::new()
            };
            return Ok(Some(Err(rejected(
                "refund_exceeds_charge",
                format!(
                    "a refund of {} on payment {} exceeds what is left: {} of {charged} refunded{disputed}",
                    r.amount.map_or("the rest".to_owned(), |a| a.to_string()),
                    r.payment_id,
                    p.refunded
                ),
            ))));
        }
        // What one payment's record keeps is bounded (DynamoDB's 400 KB an item): the count
        // read is pinned by the reservation's write, so no two refunds pass it together.
        if p.refunds_made >= MAX_REFUNDS_PER_PAYMENT {
            return Ok(Some(Err(rejected(
                "refund_limit_reached",
                format!(
                    "payment {} has had {} refunds, the most one payment takes ({MAX_REFUNDS_PER_PAYMENT}); refund what is left of it by hand",
                    r.payment_id, p.refunds_made
                ),
            ))));
        }
        if hold.is_some() && !p.held.contains_key(&r.refund_id) && p.held.len() >= MAX_HELD_REFUNDS
        {
            return Ok(Some(Err(rejected(
                "refund_limit_reached",
                format!(
                    "payment {} holds {} refunds waiting for it to settle, the most it holds ({MAX_HELD_REFUNDS}); send this refund under a new refund_id once the payment has settled",
                    r.payment_id,
                    p.held.len()
                ),
            ))));
        }
        let reservation = self
            .ledger
            .reserve(&r.payment_id, &r.refund_id, amount, p, owner, keep, hold)
            .await
            .map_err(store_error)?;
        Ok(
            (reservation == Reservation::Reserved).then_some(Ok(Reserved {
                amount,
                earlier: false,
            })),
        )
    }

    /// Decides the refund on its payment, reading it again each time it changed under a
    /// write: the refund reserved (`Ok(Ok(..))`, to be sent), or its final outcome (held,
    /// canceled, refused).
    async fn decide(
        &self,
        r: &RefundRequest,
        attempt: &AttemptContext,
    ) -> Result<Result<(String, String, Reserved, i64), Outcome>, CallError> {
        let owner = attempt.owner.as_str();
        let pid = &r.payment_id;
        for _ in 0..RESERVE_TRIES {
            let (p, hold, charged, currency, intent) = match self.charged(r).await? {
                Payment::Refused(refused) => return Ok(Err(refused)),
                Payment::Failed { payment, status } => {
                    return self.cancel(r, &payment, &status, owner).await.map(Err)
                }
                Payment::Charged {
                    payment,
                    intent,
                    currency,
                    amount,
                } => (payment, None, amount, currency, Some(intent)),
                Payment::Settling {
                    payment,
                    waits_for,
                    currency,
                    amount,
                } => (payment, Some(waits_for), amount, currency, None),
            };
            // A refund reserved already (held, or by a release before the currency's rule) goes
            // on: refused now, its reservation would never be given back.
            if let (Some(a), false) = (r.amount, p.refunds.contains_key(&r.refund_id)) {
                if let Err(why) = crate::domain::limits::check_refund_amount(a, &currency) {
                    return Ok(Err(rejected("invalid_refund", why)));
                }
            }
            let body = hold.as_ref().map(|_| r.to_message_body());
            let reserved = match self
                .reserve(r, &p, charged, attempt, body.as_deref())
                .await?
            {
                None => continue,
                Some(Err(refused)) => return Ok(Err(refused)),
                Some(Ok(reserved)) => reserved,
            };
            let amount = reserved.amount;
            return Ok(match (intent, hold) {
                (Some(intent), _) => Ok((intent, currency, reserved, p.expires_at_s)),
                (None, waits_for) => Err(Outcome::new(HELD)
                    .with_text("payment_id", pid)
                    .with_number("amount", amount)
                    .with_text("currency", currency)
                    .with_text(
                        "reason",
                        match waits_for.as_deref().unwrap_or_default() {
                            "declined" => format!("payment {pid} was declined at the provider and may still be paid: the refund is made if its customer pays it, canceled if it is canceled"),
                            w => format!("payment {pid} is {w} at the provider: the refund is made when it succeeds, canceled if it fails for good"),
                        },
                    )),
            });
        }
        Err(CallError::transient(format!(
            "the refunds of payment {pid} kept changing during {RESERVE_TRIES} reservations"
        )))
    }

    /// A refund of a payment that ended without a charge: refused, or, when it was held while
    /// the payment settled, canceled with its reservation given back (by this attempt, or by
    /// an earlier one that stopped before it completed).
    async fn cancel(
        &self,
        r: &RefundRequest,
        p: &RefundablePayment,
        status: &str,
        owner: &str,
    ) -> Result<Outcome, CallError> {
        let pid = &r.payment_id;
        let reserved = p.refunds.get(&r.refund_id).copied();
        if reserved.is_none() && !p.held.contains_key(&r.refund_id) {
            return Ok(rejected(
                "payment_not_refundable",
                format!(
                    "payment {pid} was not charged (its outcome is {status}): nothing to refund"
                ),
            ));
        }
        if let Some(amount) = reserved {
            let keep = self.keep_until(p.expires_at_s);
            self.ledger
                .release(pid, &r.refund_id, amount, owner, keep)
                .await
                .map_err(store_error)?;
        }
        Ok(Outcome::new(CANCELED)
            .with_text("payment_id", pid)
            .with_text("code", "payment_failed")
            .with_text(
                "reason",
                format!("payment {pid} ended {status} before it settled: nothing was refunded, and the amount held for the refund was given back"),
            ))
    }
}

#[async_trait]
impl Work for RefundWork {
    type Request = RefundRequest;

    fn parse(&self, body: &str) -> Result<RefundRequest, Rejection> {
        RefundRequest::parse(body)
    }

    fn key(&self, r: &RefundRequest) -> String {
        r.refund_id.clone()
    }

    fn fingerprint(&self, r: &RefundRequest) -> String {
        r.fingerprint()
    }

    fn same_request(&self, r: &RefundRequest, stored: &str) -> bool {
        r.has_fingerprint(stored)
    }

    async fn execute(
        &self,
        r: &RefundRequest,
        attempt: &AttemptContext,
    ) -> Result<Outcome, CallError> {
        let (intent, currency, reserved, read_ttl) = match self.decide(r, attempt).await? {
            Ok(reserved) => reserved,
            // An earlier attempt's outcome is unknown, and no record of the payment names its
            // charge: whether that attempt refunded cannot be looked up. It stays unknown (an
            // operator reconciles it by the refund's id in Stripe), never stored as refused,
            // unless no attempt of this record ever held a reservation: then none called, and
            // the refusal is stored.
            // No record of the payment (expired with the refund window, or never): a refund
            // made under this refund id before its records expired (a merchant's resend) is
            // found at the provider through the payment's PaymentIntents and answered as made,
            // never dead-lettered for a person to make by hand again.
            Err(done) if done.text("code") == Some(PAYMENT_UNKNOWN) => {
                match self.made_before(r).await? {
                    Earlier::Made(made) => return Ok(made),
                    Earlier::NotMade => return Ok(done),
                    Earlier::Unknown
                        if attempt.inherited_unknown && !self.none_reserved(r).await? =>
                    {
                        return Err(CallError::transient(format!(
                            "an earlier attempt's outcome is unknown and cannot be looked up: {}",
                            done.text("reason").unwrap_or(PAYMENT_UNKNOWN)
                        )));
                    }
                    Earlier::Unknown => return Ok(done),
                }
            }
            Err(done) => return Ok(done),
        };
        let amount = reserved.amount;
        if reserved.earlier
            && !attempt.looked_up_nothing()
            && !(attempt.inherited_unknown
                && sqs_once::mutation::on("inherited_unknown_skips_refund_lookup"))
        {
            // The amount was reserved before this attempt's claim: by a hold now resumed, by
            // an attempt that stopped before its call, or by one whose call was made and
            // whose record is gone since (its TTL ran while the payment's ledger lived on).
            // The key may be forgotten by the provider after a day: a blind call could refund
            // twice. The charge's refunds say which (one list call). An unknown outcome
            // inherited changes nothing here: the runner's own lookup counts the key's
            // horizon from this record's first attempt, which may be a new record's, a day
            // ahead, while the reservation is a year old (issue 65). Unless that lookup was
            // made in this attempt, before any call of it, and found nothing: the same list,
            // read again, would say the same.
            if let Some(found) = self.lookup(r, attempt).await? {
                return Ok(found);
            }
        }
        let call = RefundCall {
            refund_id: r.refund_id.clone(),
            payment_id: r.payment_id.clone(),
            payment_intent: intent,
            amount,
            reason: r.reason.clone(),
        };
        let refused = match self.provider.create_refund(&call).await? {
            RefundResponse::Refunded {
                provider_refund_id,
                status,
            } if !matches!(status.as_str(), "failed" | "canceled") => {
                return Ok(Outcome::new(status)
                    .with_text("provider_refund_id", provider_refund_id)
                    .with_text("payment_id", &r.payment_id)
                    .with_number("amount", amount)
                    .with_text("currency", currency));
            }
            RefundResponse::Refunded { status, .. } => rejected(
                "refund_failed",
                format!("the provider created the refund as {status}: no money moved"),
            ),
            RefundResponse::Rejected { code, message } => {
                rejected("provider_rejected", format!("{code}: {message}"))
            }
            // The provider refused the key (used on another endpoint, or with other
            // parameters) before acting on it: nothing was refunded by this request.
            RefundResponse::KeyReused { message } => rejected(
                "idempotency_key_reused",
                format!(
                    "the provider refused the key {} of refund_id {}: {message}",
                    crate::domain::refund_key(&r.refund_id),
                    r.refund_id
                ),
            ),
        };
        // Nothing was refunded: give the amount back to the payment.
        let keep = self.keep_until(read_ttl);
        self.ledger
            .release(&r.payment_id, &r.refund_id, amount, &attempt.owner, keep)
            .await
            .map_err(store_error)?;
        Ok(refused)
    }

    /// The refunds of the payment's charge at the provider, by `metadata[refund_id]`. A refund
    /// found `failed` or `canceled` moved no money: the reservation this refund holds is given
    /// back (fenced by this attempt's lease) and the refusal recorded, so no reservation is
    /// left that no refund holds.
    async fn lookup(
        &self,
        r: &RefundRequest,
        attempt: &AttemptContext,
    ) -> Result<Option<Outcome>, CallError> {
        let (payment, intent, currency) = match self.charged(r).await? {
            Payment::Charged {
                payment,
                intent,
                currency,
                ..
            } => (payment, intent, currency),
            // No record of the payment, and no attempt of this refund's record ever held a
            // reservation, so none called: nothing of it to find.
            Payment::Refused(outcome)
                if outcome.text("code") == Some(PAYMENT_UNKNOWN)
                    && self.none_reserved(r).await? =>
            {
                return Ok(None)
            }
            // No record of the payment (expired, or never) names its charge: the provider's
            // search names its PaymentIntents, whose refunds are listed. Where it names none,
            // finding nothing would prove nothing: an unknown outcome stays unknown (an
            // operator reconciles it by the refund's id in Stripe).
            Payment::Refused(outcome) => {
                return match self.made_before(r).await? {
                    Earlier::Made(made) => Ok(Some(made)),
                    Earlier::NotMade => Ok(None),
                    Earlier::Unknown => Err(CallError::transient(format!(
                        "the refunds of payment {} cannot be looked up: {}",
                        r.payment_id,
                        outcome
                            .text("reason")
                            .unwrap_or("its record names no charge")
                    ))),
                }
            }
            Payment::Settling { .. } | Payment::Failed { .. } => return Ok(None),
        };
        let found = self.provider.find_refunds(&intent).await?;
        let Some(f) = found
            .into_iter()
            .find(|f| f.refund_id.as_deref() == Some(r.refund_id.as_str()))
        else {
            return Ok(None);
        };
        if matches!(f.status.as_str(), "failed" | "canceled") {
            if let Some(held) = payment.refunds.get(&r.refund_id) {
                let keep = self.keep_until(payment.expires_at_s);
                self.ledger
                    .release(&r.payment_id, &r.refund_id, *held, &attempt.owner, keep)
                    .await
                    .map_err(store_error)?;
            }
            return Ok(Some(rejected(
                "refund_failed",
                format!(
                    "the provider holds refund {} as {}: no money moved",
                    f.provider_refund_id, f.status
                ),
            )));
        }
        Ok(Some(
            Outcome::new(f.status)
                .with_text("provider_refund_id", f.provider_refund_id)
                .with_text("payment_id", &r.payment_id)
                .with_number("amount", f.amount)
                .with_text("currency", currency),
        ))
    }

    /// A lookup of the charge's refunds, then the refund's creation.
    fn requests_per_attempt(&self, _request: &RefundRequest) -> usize {
        2
    }

    /// The refunds of a PaymentIntent are a list: consistent.
    fn lookup_is_consistent(&self) -> bool {
        true
    }

    fn verdict(&self, outcome: &Outcome) -> Verdict {
        if outcome.status == "rejected" {
            Verdict::DeadLetter {
                code: outcome
                    .text("code")
                    .unwrap_or("provider_rejected")
                    .to_owned(),
                reason: outcome.text("reason").unwrap_or("refused").to_owned(),
            }
        } else if outcome.status == HELD || outcome.status == CANCELED {
            Verdict::Done(outcome.status.clone())
        } else {
            Verdict::Done(REFUNDED.to_owned())
        }
    }

    fn call_timeout(&self) -> Duration {
        self.provider.request_timeout()
    }

    fn key_retention(&self) -> Option<Duration> {
        Some(self.key_retention)
    }

    /// A refund the provider holds (`pending`, `succeeded`, ...) can still fail for weeks; one
    /// it refused moved no money, but its record still names the refund id: both are kept as
    /// long as the ledger they belong to.
    fn retention_after(&self, _outcome: &Outcome) -> Option<Duration> {
        Some(self.refund_window)
    }

    /// A refund that can never be processed keeps no card number at rest (14 days in the DLQ),
    /// nor does a reason that quotes its body.
    fn redact(&self, body: &str) -> Option<sqs_once::Redaction> {
        crate::payments::charge::card_data_masked(body)
    }

    /// A refund id, or the id of the payment it refunds, that holds a card number is never a
    /// key of this release's: refused (`invalid_refund`, masked) unless an earlier release
    /// left the refund's record.
    fn refused_unless_recorded(&self, r: &RefundRequest) -> Option<Rejection> {
        [("refund_id", &r.refund_id), ("payment_id", &r.payment_id)]
            .into_iter()
            .find(|(_, id)| crate::domain::text::id_holds_card_number(id))
            .map(|(field, _)| {
                Rejection::new(
                    "invalid_refund",
                    format!("{field} holds what looks like a card number (its digits pass the card check)"),
                )
            })
    }

    /// A refund refused for a card number in its ids keeps none at rest.
    fn redact_refused(&self, r: &RefundRequest, body: &str) -> Option<sqs_once::Redaction> {
        self.refused_unless_recorded(r)?;
        self.redact(body)
    }

    fn settle_hint(&self, key: &str) -> String {
        format!("find refund {key} at the provider (GET /v1/refunds?payment_intent=..., metadata[refund_id]) and settle its record refund#{key} by hand")
    }
}

/// A refund's amount reserved on its payment.
#[derive(Debug, Clone, Copy)]
struct Reserved {
    amount: i64,
    /// Reserved before this attempt read the payment (by a hold, or by an earlier attempt).
    earlier: bool,
}

/// The EMF metric names of the refund processor (namespace `RefundProcessor`).
pub fn metric_names() -> sqs_once::metrics::MetricNames {
    sqs_once::metrics::MetricNames {
        namespace: "RefundProcessor".into(),
        service: "refund-processor".into(),
        labels: vec![
            (REFUNDED.into(), "Refunded".into()),
            (HELD.into(), "Held".into()),
            (CANCELED.into(), "Canceled".into()),
        ],
        // The process's own (the stack's name) are added where it is wired (edges).
        dimensions: vec![],
    }
}
