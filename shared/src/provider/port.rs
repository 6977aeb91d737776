//! The payment provider port: one call that charges a payment, keyed by its payment id.
//!
//! The adapter for Stripe's wire format is [`crate::stripe::StripeClient`]. Answers are split
//! into definitive ones ([`ProviderResponse`]), which end the attempt and are recorded, and
//! [`ProviderError`]s, which are retried with the same key.

use std::time::Duration;

use async_trait::async_trait;

use crate::domain::PaymentRequest;

/// A definitive answer from the provider. Each is recorded as the payment's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderResponse {
    /// `200`: a PaymentIntent exists for the key. Only `succeeded` (or `requires_capture`)
    /// moved money; `processing` is settled later; `requires_action` needs the customer.
    Charged {
        /// The PaymentIntent id.
        provider_payment_id: String,
        /// The PaymentIntent status as the provider reported it.
        status: String,
        /// The provider replayed a stored answer (`Idempotent-Replayed: true`).
        replayed: bool,
    },
    /// `402` with `card_error`: a business outcome, never retried.
    Declined {
        /// The PaymentIntent the decline belongs to, when the provider names it.
        provider_payment_id: Option<String>,
        /// The card's decline code (`insufficient_funds`, ...).
        decline_code: Option<String>,
    },
    /// `402` with `card_error` code `authentication_required`: the card needs the customer to
    /// authenticate, which an off-session charge cannot do. Nothing was charged; the merchant
    /// must bring the customer back on-session to confirm this PaymentIntent.
    NeedsAuthentication {
        /// The PaymentIntent waiting for the customer, when the provider names it.
        provider_payment_id: Option<String>,
    },
    /// `400` other than key reuse: this payment is refused as sent.
    Rejected {
        /// The provider's error code, or its type when it gives no code.
        code: String,
        /// The provider's message.
        message: String,
    },
    /// `400` with `idempotency_error`: the provider holds this key for other parameters.
    KeyReused {
        /// The provider's message.
        message: String,
    },
}

/// How a failed call failed. Every kind is retried with the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// `409`: another request with this key is in flight at the provider.
    KeyInUse,
    /// `429`.
    RateLimited,
    /// `5xx`.
    ServerError,
    /// No answer within the client timeout.
    Timeout,
    /// The connection failed before the request was sent.
    Connect,
    /// The connection dropped after the request was sent, or the answer was unreadable.
    Network,
    /// `401`/`403`/`404`: the processor is misconfigured (wrong key or URL); the provider
    /// refused the request before acting on it. Retryable, because fixing the configuration
    /// lets the payment through.
    Misconfigured,
    /// Any other status this client does not know (a `3xx`, a `418`, ...): nothing says whether
    /// the provider acted, so the outcome is unknown.
    Unexpected,
    /// Not sent: the process's request pace had no slot before the call's latest start
    /// ([`sqs_once::pace`]). Nothing reached the provider.
    NotSent,
}

/// What a `429` was about (`Stripe-Rate-Limited-Reason`, or the error's `lock_timeout` code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    /// The account's limit (`global-rate`, `global-concurrency`), or a `429` that says
    /// nothing: the process slows down.
    Account,
    /// One endpoint's limit (`endpoint-rate`, `endpoint-concurrency`): the process slows
    /// down (its calls are to few endpoints).
    Endpoint,
    /// One object (`resource-specific`, a `lock_timeout`): only that object waits; the rate
    /// is not the cause.
    Object,
}

/// A call that ended without a definitive answer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ProviderError {
    /// What went wrong.
    pub kind: FailureKind,
    /// Description for logs and the record; never contains the API key.
    pub message: String,
    /// `Retry-After`, when the provider sent it.
    pub retry_after: Option<Duration>,
    /// `Stripe-Should-Retry`, when the provider sent it.
    pub should_retry: Option<bool>,
    /// The provider replayed a stored error for this key (`Idempotent-Replayed: true` on a
    /// `5xx`): retrying with the key will not change it; only a lookup can tell what happened.
    pub replayed: bool,
    /// For a `429`, what it was about.
    pub rate_limit: Option<RateLimit>,
}

impl ProviderError {
    /// True when the answer does not prove that the request was not executed: a timeout, a
    /// dropped connection, a `5xx`, a `409` (another request with the key is in flight, and may
    /// charge), or a status this client does not know. Such an attempt leaves the outcome
    /// unknown. Only a refusal before execution (`429`, `401`/`403`/`404`, a connection that
    /// never opened) is not.
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self.kind,
            FailureKind::ServerError
                | FailureKind::Timeout
                | FailureKind::Network
                | FailureKind::KeyInUse
                | FailureKind::Unexpected
        )
    }

    /// True when retrying within this delivery may help: honours `Stripe-Should-Retry: false`;
    /// a misconfiguration is not retried in a tight loop (it is retried on the next delivery);
    /// a replayed error never changes.
    pub fn retry_now(&self) -> bool {
        self.should_retry != Some(false)
            && self.kind != FailureKind::Misconfigured
            && self.kind != FailureKind::NotSent
            && !self.replayed
    }

    /// A failure with no retry hints.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            should_retry: None,
            replayed: false,
            rate_limit: None,
        }
    }
}

/// A payment the provider holds for a payment id, as a lookup finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundPayment {
    /// The PaymentIntent id.
    pub provider_payment_id: String,
    /// Its status (`succeeded`, `processing`, `requires_action`, `requires_payment_method`
    /// after a decline, `canceled`).
    pub status: String,
    /// Its `metadata[payment_id]`, when it carries one (a listing by customer holds other
    /// payments too).
    pub payment_id: Option<String>,
    /// Its amount in minor units, when the provider says (for an operator's settlement).
    pub amount: Option<i64>,
    /// Its lowercase currency, when the provider says.
    pub currency: Option<String>,
    /// Why its last confirmation failed (`last_payment_error`: the decline code, else the
    /// error code), when it did: `authentication_required` tells a card that needs the
    /// customer from a decline.
    pub failure_code: Option<String>,
}

impl FoundPayment {
    /// True when the intent moved money (`succeeded`, or authorised for capture): only that
    /// counts as the payment's charge.
    pub fn is_charge(&self) -> bool {
        is_charged_status(&self.status)
    }

    /// True when the intent is still alive without money moved: `processing` (settled later by
    /// the provider) or waiting for the customer (`requires_action`, `requires_confirmation`).
    pub fn is_pending(&self) -> bool {
        matches!(
            self.status.as_str(),
            "processing" | "requires_action" | "requires_confirmation"
        )
    }

    /// The intent that stands for the payment among those a lookup found: a charge, else an
    /// intent still alive, else the first (one that did not charge).
    pub fn pick(found: &[FoundPayment]) -> Option<&FoundPayment> {
        found
            .iter()
            .find(|f| f.is_charge())
            .or_else(|| found.iter().find(|f| f.is_pending()))
            .or_else(|| found.first())
    }

    /// The answer this intent stands for, as if its creation had been heard: a charge or an
    /// intent still alive as it is; one whose confirmation failed for want of the customer as
    /// [`ProviderResponse::NeedsAuthentication`]; else a decline with its code.
    pub fn as_response(&self) -> ProviderResponse {
        if self.is_charge() || self.is_pending() {
            return ProviderResponse::Charged {
                provider_payment_id: self.provider_payment_id.clone(),
                status: self.status.clone(),
                replayed: true,
            };
        }
        if self.failure_code.as_deref() == Some("authentication_required") {
            return ProviderResponse::NeedsAuthentication {
                provider_payment_id: Some(self.provider_payment_id.clone()),
            };
        }
        ProviderResponse::Declined {
            provider_payment_id: Some(self.provider_payment_id.clone()),
            decline_code: self.failure_code.clone(),
        }
    }
}

/// True for the PaymentIntent statuses that mean the money moved: `succeeded`, and
/// `requires_capture` (authorised; the project does not capture manually today).
pub fn is_charged_status(status: &str) -> bool {
    matches!(status, "succeeded" | "requires_capture")
}

/// What a lookup of a payment at the provider knows about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentQuery {
    /// The payment (`metadata[payment_id]` of its PaymentIntent).
    pub payment_id: crate::domain::PaymentId,
    /// The customer charged, when known: the lookup lists that customer's PaymentIntents (a
    /// consistent read); without it the lookup can only search (which may lag).
    pub customer: Option<String>,
    /// No PaymentIntent of the payment was created before this epoch second (its first
    /// attempt, less the clock skew allowed): the listing starts there.
    pub created_from_s: Option<i64>,
}

/// The port over the payment provider.
#[async_trait]
pub trait PaymentProvider: Send + Sync {
    /// The longest a call may take; a call is only sent while the caller's lease has more time
    /// left than this.
    fn request_timeout(&self) -> Duration;

    /// Creates and confirms a payment with `Idempotency-Key: <payment_id>`, so that every retry
    /// and every takeover of the same payment gets the same charge back.
    async fn create_payment(
        &self,
        request: &PaymentRequest,
    ) -> Result<ProviderResponse, ProviderError>;

    /// Looks up every PaymentIntent the provider holds for this payment id (by
    /// `metadata[payment_id]`), to settle an outcome that no answer told us: the customer's
    /// list since `created_from_s` when the customer is known (consistent), else a search
    /// (which may lag its writes: finding nothing proves nothing until the search lag passed).
    async fn find_payments(&self, query: &PaymentQuery)
        -> Result<Vec<FoundPayment>, ProviderError>;
}

/// A refund to ask the provider for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundCall {
    /// The refund's id: `metadata[refund_id]`, and the `Idempotency-Key` as
    /// `refund:<refund_id>` ([`crate::domain::REFUND_KEY_PREFIX`]).
    pub refund_id: String,
    /// The payment refunded (`metadata[payment_id]`).
    pub payment_id: String,
    /// The PaymentIntent the payment's charge is.
    pub payment_intent: String,
    /// Minor units, never more than what is left of the charge (the ledger reserved it).
    pub amount: i64,
    /// `duplicate`, `fraudulent` or `requested_by_customer`.
    pub reason: Option<String>,
}

/// A definitive answer to a refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundResponse {
    /// `200`: the refund exists (`succeeded`, `pending`, `requires_action`, or `failed` /
    /// `canceled` when the provider could not move the money).
    Refunded {
        /// The refund's id (`re_...`).
        provider_refund_id: String,
        /// Its status as the provider reported it.
        status: String,
    },
    /// `400` (other than key reuse) or `402`: refused as sent, with the provider's code.
    Rejected {
        /// `charge_already_refunded`, `amount_too_large`, `charge_not_refundable`, ...
        code: String,
        /// The provider's message.
        message: String,
    },
    /// `400` with `idempotency_error`: the provider holds this refund id for other parameters.
    KeyReused {
        /// The provider's message.
        message: String,
    },
}

/// A refund the provider holds for a PaymentIntent, as a lookup finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRefund {
    /// The refund's id.
    pub provider_refund_id: String,
    /// Its status.
    pub status: String,
    /// Minor units.
    pub amount: i64,
    /// The refund id it was created for (`metadata[refund_id]`), when it carries one.
    pub refund_id: Option<String>,
}

/// The port over the provider's refunds.
#[async_trait]
pub trait RefundProvider: Send + Sync {
    /// The longest a call may take.
    fn request_timeout(&self) -> Duration;

    /// Creates a refund with `Idempotency-Key: refund:<refund_id>`, so that every retry and
    /// takeover gets the same refund back, and no refund id can collide with a payment id at
    /// the provider (its keys are account-wide).
    async fn create_refund(&self, call: &RefundCall) -> Result<RefundResponse, ProviderError>;

    /// Every refund of a PaymentIntent, to settle an outcome that no answer told.
    async fn find_refunds(&self, payment_intent: &str) -> Result<Vec<FoundRefund>, ProviderError>;

    /// The PaymentIntents of payment `payment_id` (`metadata[payment_id]`, by the provider's
    /// search), to find a refund made under a record that has expired since: no record names
    /// them any more.
    async fn payment_intents_of(&self, payment_id: &str) -> Result<Vec<String>, ProviderError>;

    /// The PaymentIntent's status now, in the record's words (`declined` for
    /// `requires_payment_method`): a payment recorded `declined` may have been confirmed again
    /// since, and its event not applied yet; `None` when the answer names none.
    async fn payment_status(&self, payment_intent: &str) -> Result<Option<String>, ProviderError>;
}
