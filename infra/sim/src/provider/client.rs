//! One process's client of the simulated provider, paced as the wire client is.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use payment_core::domain::PaymentRequest;
use payment_core::provider::{
    FailureKind, FoundPayment, FoundRefund, PaymentProvider, PaymentQuery, ProviderError,
    ProviderResponse, RateLimit, RefundCall, RefundProvider, RefundResponse,
};
use sqs_once::pace::Pace;

use super::Provider;

/// One process's client of the provider: its requests paced as the wire client paces them
/// (a slot before each request, a `429` about the account slowing the pace, another answer
/// speeding it up again).
#[derive(Clone)]
pub struct Client {
    /// The provider.
    pub provider: Provider,
    /// The process's pace, shared with its runner.
    pub pace: Option<Arc<Pace>>,
}

impl Client {
    /// Waits for a request's slot; `writes` when the request may change something at the
    /// provider (a read's refusal leaves its call's attempt unspent, see `sqs_once::pace`).
    pub(super) async fn slot(&self, writes: bool) -> Result<(), ProviderError> {
        let Some(p) = &self.pace else { return Ok(()) };
        let slot = if writes {
            p.acquire(self.provider.timeout).await
        } else {
            p.acquire_read(self.provider.timeout).await
        };
        slot.map_err(|e| ProviderError::new(FailureKind::NotSent, e.to_string()))
    }

    /// Keeps which PaymentIntents a refund's request failed about (the checks' oracle of a
    /// refund given up only for waiting).
    fn refund_answer<T>(&self, payment_intent: &str, answer: &Result<T, ProviderError>) {
        if answer.is_err() {
            self.provider
                .books
                .lock()
                .expect("books")
                .refund_trouble
                .insert(payment_intent.to_owned());
        }
    }

    pub(super) fn told<T>(&self, answer: &Result<T, ProviderError>) {
        let Some(pace) = &self.pace else { return };
        match answer {
            Err(e) if e.kind == FailureKind::RateLimited => {
                if e.rate_limit != Some(RateLimit::Object) {
                    pace.slowed(e.retry_after);
                }
            }
            Err(e)
                if matches!(
                    e.kind,
                    FailureKind::ServerError | FailureKind::Timeout | FailureKind::NotSent
                ) => {}
            _ => pace.succeeded(),
        }
    }
}

/// Runs a request that writes at the provider on a task of its own: it lands whether or not
/// its sender still waits (a call sent by an invocation that is killed stays in the network,
/// is executed, and keeps its key busy while it runs, as at the provider).
async fn landed<T: Send + 'static>(
    request: impl std::future::Future<Output = Result<T, ProviderError>> + Send + 'static,
) -> Result<T, ProviderError> {
    tokio::spawn(request)
        .await
        .unwrap_or_else(|e| Err(ProviderError::new(FailureKind::Timeout, e.to_string())))
}

#[async_trait]
impl PaymentProvider for Client {
    fn request_timeout(&self) -> Duration {
        self.provider.timeout
    }

    async fn create_payment(
        &self,
        request: &PaymentRequest,
    ) -> Result<ProviderResponse, ProviderError> {
        self.slot(true).await?;
        let (provider, request) = (self.provider.clone(), request.clone());
        let answer = landed(async move { provider.create_payment(&request).await }).await;
        self.told(&answer);
        answer
    }

    async fn find_payments(
        &self,
        query: &PaymentQuery,
    ) -> Result<Vec<FoundPayment>, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.find_payments(query).await;
        self.told(&answer);
        answer
    }
}

#[async_trait]
impl RefundProvider for Client {
    fn request_timeout(&self) -> Duration {
        self.provider.timeout
    }

    async fn create_refund(&self, call: &RefundCall) -> Result<RefundResponse, ProviderError> {
        self.slot(true).await?;
        let (provider, c) = (self.provider.clone(), call.clone());
        let answer = landed(async move { provider.create_refund(&c).await }).await;
        self.told(&answer);
        self.refund_answer(&call.payment_intent, &answer);
        answer
    }

    async fn find_refunds(&self, payment_intent: &str) -> Result<Vec<FoundRefund>, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.find_refunds(payment_intent).await;
        self.told(&answer);
        self.refund_answer(payment_intent, &answer);
        answer
    }

    async fn payment_intents_of(&self, payment_id: &str) -> Result<Vec<String>, ProviderError> {
        let Ok(id) = payment_core::domain::PaymentId::parse(payment_id) else {
            return Ok(Vec::new());
        };
        let query = PaymentQuery {
            payment_id: id,
            customer: None,
            created_from_s: None,
        };
        self.slot(false).await?;
        let answer = self.provider.find_payments(&query).await;
        self.told(&answer);
        Ok(answer?
            .into_iter()
            .filter(|f| f.payment_id.as_deref() == Some(payment_id))
            .map(|f| f.provider_payment_id)
            .collect())
    }

    async fn payment_status(&self, payment_intent: &str) -> Result<Option<String>, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.payment_status(payment_intent).await;
        self.told(&answer);
        self.refund_answer(payment_intent, &answer);
        answer
    }
}

#[async_trait]
impl payment_core::events::inbox::ProviderObjects for Client {
    fn request_timeout(&self) -> Duration {
        self.provider.timeout
    }

    async fn payment_intent(
        &self,
        id: &str,
    ) -> Result<payment_core::provider::event::PaymentChange, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.payment_intent(id).await;
        self.told(&answer);
        answer
    }

    async fn refund(
        &self,
        id: &str,
    ) -> Result<payment_core::provider::event::RefundChange, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.refund(id).await;
        self.told(&answer);
        answer
    }

    async fn dispute(
        &self,
        id: &str,
    ) -> Result<payment_core::provider::event::DisputeChange, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.dispute(id).await;
        self.told(&answer);
        answer
    }

    async fn charge_intent(&self, charge: &str) -> Result<Option<String>, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.charge_intent(charge).await;
        self.told(&answer);
        answer
    }
}
