//! The payment as a [`Work`] of the generic runner: parse a payment message, claim its
//! `payment_id`, charge it with `Idempotency-Key: <payment_id>`, store what the provider said.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqs_once::{AttemptContext, CallError, Outcome, Redaction, Rejection, Verdict, Work};
use tracing::{error, info};

use crate::domain::{mask_card_numbers, PaymentRequest};
use crate::provider::{FailureKind, PaymentProvider, ProviderError, ProviderResponse};

/// Clock skew allowed between this host and the payment provider, in the key-retention margin
/// (and the refund window's start).
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The batch runner over payments: the payment-processor Lambda's whole handler.
pub type Processor = sqs_once::BatchRunner<PaymentWork>;

/// Labels of a payment's outcomes in the batch summary and its metrics.
pub mod labels {
    /// Charged (or found charged): the PaymentIntent `succeeded` (or `requires_capture`).
    pub const CHARGED: &str = "charged";
    /// Declined by the provider: recorded and acknowledged.
    pub const DECLINED: &str = "declined";
    /// The card needs the customer (off-session `authentication_required`, or an intent in
    /// `requires_action`): nothing charged; the merchant must bring the customer on-session.
    pub const REQUIRES_ACTION: &str = "requires_action";
    /// The PaymentIntent is `processing`: the provider settles it later; nothing charged yet.
    pub const PROCESSING: &str = "processing";
}

/// What the merchant must do about a payment recorded as `requires_action`.
pub fn requires_action_hint(provider_payment_id: Option<&str>) -> String {
    format!(
        "the card needs the customer to authenticate, which an off-session charge cannot do; nothing was charged: bring the customer back on-session to confirm PaymentIntent {} (with its client_secret, e.g. stripe.confirmCardPayment / handleNextAction), or send a new payment with another payment method",
        provider_payment_id.unwrap_or("(not named by the provider)")
    )
}

/// The stored result of a payment: what the provider said, in the record's `outcome` map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentOutcome {
    /// The PaymentIntent's status (`succeeded`, `requires_action`, `processing`, ...), or
    /// `declined` / `rejected`.
    pub status: String,
    /// The provider's PaymentIntent id, when there is one.
    pub provider_payment_id: Option<String>,
    /// The card's decline code, for `declined`.
    pub decline_code: Option<String>,
    /// The amount charged or attempted, minor units.
    pub amount: i64,
    /// Lowercase ISO 4217 code.
    pub currency: String,
    /// For `rejected`: the provider's error code and message, so an operator sees why.
    pub reason: Option<String>,
}

impl PaymentOutcome {
    /// True for a decline: a business outcome, acknowledged and never retried.
    pub fn is_declined(&self) -> bool {
        self.status == "declined"
    }

    /// True when the provider refused the request itself (the message is dead-lettered).
    pub fn is_rejected(&self) -> bool {
        self.status == "rejected"
    }

    /// True when the payment moved money: the PaymentIntent `succeeded` (or is authorised,
    /// `requires_capture`). `processing` and `requires_action` are not charges.
    pub fn is_charge(&self) -> bool {
        crate::provider::is_charged_status(&self.status)
    }

    /// The batch label of this outcome (`charged`, `declined`, `requires_action`,
    /// `processing`); `None` for a rejection, which is dead-lettered.
    pub fn label(&self) -> Option<&'static str> {
        match self.status.as_str() {
            "rejected" => None,
            "declined" => Some(labels::DECLINED),
            "processing" => Some(labels::PROCESSING),
            "requires_action" | "requires_confirmation" => Some(labels::REQUIRES_ACTION),
            s if crate::provider::is_charged_status(s) => Some(labels::CHARGED),
            // Any other status the provider may answer (`requires_payment_method`,
            // `canceled`) moved no money: recorded as it is and counted with the declines.
            _ => Some(labels::DECLINED),
        }
    }

    /// The generic record's outcome map.
    pub fn to_outcome(&self) -> Outcome {
        Outcome::new(&self.status)
            .with_text_opt("provider_payment_id", self.provider_payment_id.clone())
            .with_text_opt("decline_code", self.decline_code.clone())
            .with_number("amount", self.amount)
            .with_text("currency", &self.currency)
            .with_text_opt("reason", self.reason.clone())
    }

    /// Reads a record's outcome map (absent values are empty).
    pub fn from_outcome(o: &Outcome) -> Self {
        Self {
            status: o.status.clone(),
            provider_payment_id: o.text("provider_payment_id").map(str::to_owned),
            decline_code: o.text("decline_code").map(str::to_owned),
            amount: o.number("amount").unwrap_or(0),
            currency: o.text("currency").unwrap_or_default().to_owned(),
            reason: o.text("reason").map(str::to_owned),
        }
    }
}

impl From<ProviderError> for CallError {
    fn from(e: ProviderError) -> Self {
        CallError {
            message: e.to_string(),
            ambiguous: e.is_ambiguous(),
            retry_now: e.retry_now(),
            retry_after: e.retry_after,
            // Only a replayed 5xx needs a lookup; a replayed 409 or 429 still resolves.
            replayed: e.replayed && e.kind == FailureKind::ServerError,
            misconfigured: e.kind == FailureKind::Misconfigured,
        }
    }
}

/// Charging payments through a [`PaymentProvider`].
pub struct PaymentWork {
    /// The provider client.
    provider: Arc<dyn PaymentProvider>,
    /// How long the provider remembers an idempotency key.
    key_retention: Duration,
    /// How long after a charge refunds are accepted: the charge's record, which holds its
    /// refund ledger, is kept that long (`REFUND_WINDOW_DAYS`).
    refund_window: Duration,
}

/// Refunds accepted for a year after the charge by default: Stripe documents no fixed window
/// for refunding a card charge (a late refund the bank cannot take ends `failed`), and a year
/// covers the windows that card acquirers commonly allow.
pub const DEFAULT_REFUND_WINDOW: Duration = Duration::from_secs(365 * 86_400);

/// How long a payment's record completed (or settled by hand) with `outcome` is kept from
/// then, when longer than the record retention: the refund window for every outcome whose
/// PaymentIntent exists at the provider, which can still change it. A charge's record holds
/// the refund ledger, and disputes and failed refunds land on it for months; a payment still
/// settling (`processing`: a bank debit succeeds days later; `requires_action`,
/// `requires_confirmation`: the customer may come back until the intent is canceled) and even
/// a declined one (its PaymentIntent may be confirmed again on-session) get events later.
/// `None`: the record retention from the first claim, for a payment the provider refused
/// before creating any PaymentIntent (`rejected`: nothing there to change).
pub fn lifetime_after(outcome: &PaymentOutcome, refund_window: Duration) -> Option<Duration> {
    (outcome.provider_payment_id.is_some() && outcome.status != "rejected").then_some(refund_window)
}

impl PaymentWork {
    /// The work over a provider that remembers keys for `key_retention`, keeping charged
    /// payments' records for [`DEFAULT_REFUND_WINDOW`].
    pub fn new(provider: Arc<dyn PaymentProvider>, key_retention: Duration) -> Self {
        Self {
            provider,
            key_retention,
            refund_window: DEFAULT_REFUND_WINDOW,
        }
    }

    /// Keeps a charged payment's record (and its refund ledger) this long after the charge.
    pub fn with_refund_window(mut self, window: Duration) -> Self {
        self.refund_window = window;
        self
    }
}

#[async_trait]
impl Work for PaymentWork {
    type Request = PaymentRequest;

    /// A body this release refuses by a rule earlier releases did not have is read as they
    /// read it ([`PaymentRequest::parse_as_before`]): it may be a payment one of them claimed,
    /// whose record must be finished (looked up, never charged anew); its first attempt refuses
    /// it ([`PaymentWork::execute`]), with a record and a mark that `GET` reads as `failed`.
    fn parse(&self, body: &str) -> Result<PaymentRequest, Rejection> {
        PaymentRequest::parse_as_before(body).map_err(|e| Rejection::new(e.code(), e.to_string()))
    }

    fn key(&self, request: &PaymentRequest) -> String {
        request.payment_id.as_str().to_owned()
    }

    fn fingerprint(&self, request: &PaymentRequest) -> String {
        request.payload_hash()
    }

    fn same_request(&self, request: &PaymentRequest, stored: &str) -> bool {
        request.has_payload_hash(stored)
    }

    /// See [`lifetime_after`].
    fn retention_after(&self, outcome: &Outcome) -> Option<Duration> {
        lifetime_after(&PaymentOutcome::from_outcome(outcome), self.refund_window)
    }

    async fn execute(
        &self,
        request: &PaymentRequest,
        attempt: &AttemptContext,
    ) -> Result<Outcome, CallError> {
        if let Some(why) = &request.refused_now {
            // Never sent by this release. An earlier attempt's call may have taken effect
            // (an earlier release's, which sent it; or this release's own attempt, cut off
            // after its claim, which sent nothing): what the provider holds for it is its
            // outcome, and nothing held is nothing charged. The takeover came after any such
            // call could land, so the customer's listing holds it.
            if attempt.inherited_unknown {
                if let Some(found) = self.lookup(request, attempt).await? {
                    return Ok(found);
                }
            }
            return Ok(refused_at_intake(request, &why.to_string()).to_outcome());
        }
        let response = self.provider.create_payment(request).await?;
        Ok(outcome_of(request, &response).0.to_outcome())
    }

    /// The provider's PaymentIntents for the payment_id (`metadata[payment_id]`), listed from
    /// the customer's since the first attempt (less the clock skew allowed): a charge wins,
    /// then an intent still alive (`processing`, `requires_action`), else an intent whose
    /// confirmation failed: `requires_action` when it failed for want of the customer
    /// (`last_payment_error` `authentication_required`), else a decline with its code; nothing
    /// found is `None`.
    async fn lookup(
        &self,
        request: &PaymentRequest,
        attempt: &AttemptContext,
    ) -> Result<Option<Outcome>, CallError> {
        let query = crate::provider::PaymentQuery {
            payment_id: request.payment_id.clone(),
            customer: Some(request.customer_id.clone()),
            created_from_s: Some(
                attempt.first_attempt_at_ms / 1000 - MAX_CLOCK_SKEW.as_secs() as i64,
            ),
        };
        let found = self.provider.find_payments(&query).await?;
        let charges = found.iter().filter(|f| f.is_charge()).count();
        if charges > 1 {
            error!(
                count = charges,
                "the provider holds more than one charge for this payment id"
            );
        }
        let Some(f) = crate::provider::FoundPayment::pick(&found) else {
            return Ok(None);
        };
        info!(provider_payment_id = %f.provider_payment_id, status = %f.status, "lookup found the payment's intent");
        let response = f.as_response();
        Ok(Some(outcome_of(request, &response).0.to_outcome()))
    }

    /// A customer's list is consistent: what it does not show was not created.
    fn lookup_is_consistent(&self) -> bool {
        true
    }

    fn verdict(&self, outcome: &Outcome) -> Verdict {
        let o = PaymentOutcome::from_outcome(outcome);
        match o.label() {
            Some(label) => Verdict::Done(label.to_owned()),
            None => {
                let (code, reason) = rejection_code(&o);
                Verdict::DeadLetter {
                    code: code.to_owned(),
                    reason,
                }
            }
        }
    }

    fn call_timeout(&self) -> Duration {
        self.provider.request_timeout()
    }

    fn key_retention(&self) -> Option<Duration> {
        Some(self.key_retention)
    }

    /// A body that can never be processed keeps no card number at rest (14 days in the DLQ).
    fn redact(&self, body: &str) -> Option<Redaction> {
        card_data_masked(body)
    }

    /// A payment id that holds a card number is never a key of this release's: refused
    /// (`invalid_payment`, masked) unless an earlier release left its record.
    fn refused_unless_recorded(&self, request: &PaymentRequest) -> Option<sqs_once::Rejection> {
        crate::domain::text::id_holds_card_number(request.payment_id.as_str()).then(|| {
            sqs_once::Rejection::new(
                REFUSED_AT_INTAKE,
                "payment_id holds what looks like a card number (its digits pass the card check); \
                 send the payment under an id that is not one",
            )
        })
    }

    /// A payment this release's rules refuse (`invalid_payment`, never redriven) keeps no card
    /// number at rest either.
    fn redact_refused(&self, request: &PaymentRequest, body: &str) -> Option<Redaction> {
        request.refused_now.as_ref()?;
        self.redact(body)
    }

    fn settle_hint(&self, key: &str) -> String {
        format!("run `payctl reconcile {key}` to settle the record from the provider")
    }
}

/// The dead-letter attribute that says card numbers in the body were masked (first six, last
/// four digits kept).
pub const CARD_DATA_MASKED: &str = "card_data_masked";

/// `body` with its card numbers masked and flagged [`CARD_DATA_MASKED`], when it holds any:
/// the redaction of every work whose refused bodies may hold one.
pub fn card_data_masked(body: &str) -> Option<Redaction> {
    mask_card_numbers(body).map(|body| Redaction {
        body,
        attribute: CARD_DATA_MASKED.to_owned(),
    })
}

/// The EMF metric names of the payment processor (namespace `PaymentProcessor`).
pub fn metric_names() -> sqs_once::metrics::MetricNames {
    sqs_once::metrics::MetricNames {
        namespace: "PaymentProcessor".into(),
        service: "payment-processor".into(),
        labels: vec![
            (labels::CHARGED.into(), "Charged".into()),
            (labels::DECLINED.into(), "Declined".into()),
            (labels::REQUIRES_ACTION.into(), "RequiresAction".into()),
            (labels::PROCESSING.into(), "Processing".into()),
        ],
        // The process's own (the stack's name) are added where it is wired (edges).
        dimensions: vec![],
    }
}

/// The record's outcome for a definitive answer, and the DLQ code where the message must go.
pub fn outcome_of(
    request: &PaymentRequest,
    response: &ProviderResponse,
) -> (PaymentOutcome, Option<(&'static str, String)>) {
    outcome_for(request.money.amount, &request.money.currency, response)
}

/// The outcome an intent found at the provider stands for (`payctl reconcile`, which has no
/// request): its own amount and currency.
pub fn outcome_of_found(found: &crate::provider::FoundPayment) -> PaymentOutcome {
    outcome_for(
        found.amount.unwrap_or_default(),
        found.currency.as_deref().unwrap_or_default(),
        &found.as_response(),
    )
    .0
}

fn outcome_for(
    amount: i64,
    currency: &str,
    response: &ProviderResponse,
) -> (PaymentOutcome, Option<(&'static str, String)>) {
    let base = |status: &str| PaymentOutcome {
        status: status.to_owned(),
        provider_payment_id: None,
        decline_code: None,
        amount,
        currency: currency.to_owned(),
        reason: None,
    };
    match response {
        ProviderResponse::Charged {
            provider_payment_id,
            status,
            ..
        } => (
            PaymentOutcome {
                provider_payment_id: Some(provider_payment_id.clone()),
                reason: (status == "requires_action")
                    .then(|| requires_action_hint(Some(provider_payment_id))),
                ..base(status)
            },
            None,
        ),
        ProviderResponse::Declined {
            provider_payment_id,
            decline_code,
        } => (
            PaymentOutcome {
                provider_payment_id: provider_payment_id.clone(),
                decline_code: decline_code.clone(),
                ..base("declined")
            },
            None,
        ),
        ProviderResponse::NeedsAuthentication {
            provider_payment_id,
        } => (
            PaymentOutcome {
                provider_payment_id: provider_payment_id.clone(),
                decline_code: Some("authentication_required".to_owned()),
                reason: Some(requires_action_hint(provider_payment_id.as_deref())),
                ..base("requires_action")
            },
            None,
        ),
        ProviderResponse::Rejected { code, message } => {
            let o = PaymentOutcome {
                reason: Some(format!("{code}: {message}")),
                ..base("rejected")
            };
            let (c, why) = rejection_code(&o);
            (o, Some((c, why)))
        }
        ProviderResponse::KeyReused { message } => {
            let o = PaymentOutcome {
                reason: Some(format!("{IDEMPOTENCY_ERROR}: {message}")),
                ..base("rejected")
            };
            let (c, why) = rejection_code(&o);
            (o, Some((c, why)))
        }
    }
}

const IDEMPOTENCY_ERROR: &str = "idempotency_error";
/// The reason's prefix of a payment this release's intake rules refuse
/// ([`PaymentRequest::refused_now`]): dead-lettered `invalid_payment`, never sent.
const REFUSED_AT_INTAKE: &str = "invalid_payment";

/// The outcome of a payment this release's intake rules refuse: `rejected`, never sent.
fn refused_at_intake(request: &PaymentRequest, why: &str) -> PaymentOutcome {
    PaymentOutcome {
        status: "rejected".to_owned(),
        provider_payment_id: None,
        decline_code: None,
        amount: request.money.amount,
        currency: request.money.currency.clone(),
        reason: Some(format!(
            "{REFUSED_AT_INTAKE}: {why}; never sent to the provider"
        )),
    }
}

/// The DLQ code and reason of a `rejected` outcome.
pub fn rejection_code(o: &PaymentOutcome) -> (&'static str, String) {
    let reason = o
        .reason
        .clone()
        .unwrap_or_else(|| "rejected by the provider".into());
    if let Some(why) = reason
        .strip_prefix(REFUSED_AT_INTAKE)
        .and_then(|r| r.strip_prefix(": "))
    {
        ("invalid_payment", why.to_owned())
    } else if reason.starts_with(IDEMPOTENCY_ERROR) {
        (
            "idempotency_key_reused",
            format!("the provider holds this payment_id for other parameters: {reason}"),
        )
    } else {
        ("provider_rejected", reason)
    }
}
