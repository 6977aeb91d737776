//! The provider's objects as they are now (`GET /v1/payment_intents/{id}`, `/v1/refunds/{id}`,
//! `/v1/disputes/{id}`, `/v1/charges/{id}`), read as an event would carry them: what the
//! events inbox applies when an event's payload cannot decide.

use std::time::Duration;

use async_trait::async_trait;

use crate::provider::{FailureKind, PaymentProvider, ProviderError};
use crate::provider_event::{DisputeChange, PaymentChange, ProviderEvent, RefundChange, Subject};
use crate::stripe::{listing, StripeClient};

/// The provider's objects as they are now, for the events inbox.
#[async_trait]
impl crate::event_inbox::ProviderObjects for StripeClient {
    fn request_timeout(&self) -> Duration {
        PaymentProvider::request_timeout(self)
    }

    async fn payment_intent(&self, id: &str) -> Result<PaymentChange, ProviderError> {
        match self.object(&format!("/v1/payment_intents/{id}")).await? {
            Subject::Payment(c) => Ok(c),
            _ => Err(unreadable("payment_intent", id)),
        }
    }

    async fn refund(&self, id: &str) -> Result<RefundChange, ProviderError> {
        match self.object(&format!("/v1/refunds/{id}")).await? {
            Subject::Refund(c) => Ok(c),
            _ => Err(unreadable("refund", id)),
        }
    }

    async fn dispute(&self, id: &str) -> Result<DisputeChange, ProviderError> {
        match self.object(&format!("/v1/disputes/{id}")).await? {
            Subject::Dispute(c) => Ok(c),
            _ => Err(unreadable("dispute", id)),
        }
    }

    async fn charge_intent(&self, charge: &str) -> Result<Option<String>, ProviderError> {
        let (status, headers, body) = self.get(&format!("/v1/charges/{charge}"), &[]).await?;
        let value: serde_json::Value =
            listing(status, &headers, &body, |_: &serde_json::Value| false)?;
        Ok(value
            .get("payment_intent")
            .and_then(|v| v.as_str())
            .map(str::to_owned))
    }
}

fn unreadable(kind: &str, id: &str) -> ProviderError {
    ProviderError::new(
        FailureKind::Network,
        format!("the provider's {kind} {id} is not one this system can read"),
    )
}

impl StripeClient {
    /// One object as the provider holds it now, read as an event would carry it.
    async fn object(&self, path: &str) -> Result<Subject, ProviderError> {
        let (status, headers, body) = self.get(path, &[]).await?;
        let object: serde_json::Value =
            listing(status, &headers, &body, |_: &serde_json::Value| false)?;
        let kind = object
            .get("object")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(ProviderEvent {
            id: String::new(),
            kind: format!("{kind}.retrieved"),
            created: 0,
            object,
        }
        .subject())
    }
}
