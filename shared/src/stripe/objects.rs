//! The provider's objects as they are now (`GET /v1/payment_intents/{id}`, `/v1/refunds/{id}`,
//! `/v1/disputes/{id}`, `/v1/charges/{id}`), read as an event would carry them: what the
//! events inbox applies when an event's payload cannot decide; and the event list
//! (`GET /v1/events`, `/v1/events/{id}`) the catch-up walks.

use std::time::Duration;

use async_trait::async_trait;

use crate::events::catch_up::{EventLister, EventPage, Place, EVENT_TYPES, PAGE_SIZE};
use crate::provider::event::{DisputeChange, PaymentChange, ProviderEvent, RefundChange, Subject};
use crate::provider::{FailureKind, PaymentProvider, ProviderError};
use crate::stripe::{listing, StripeClient};

/// The provider's objects as they are now, for the events inbox.
#[async_trait]
impl crate::events::inbox::ProviderObjects for StripeClient {
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

#[derive(serde::Deserialize)]
struct WirePage {
    data: Vec<serde_json::Value>,
    #[serde(default)]
    has_more: bool,
}

impl StripeClient {
    async fn event_page(&self, extra: &[(&str, &str)]) -> Result<EventPage, ProviderError> {
        let type_keys: Vec<String> = (0..EVENT_TYPES.len())
            .map(|i| format!("types[{i}]"))
            .collect();
        let limit = PAGE_SIZE.to_string();
        let mut query: Vec<(&str, &str)> = vec![("limit", &limit)];
        query.extend(
            type_keys
                .iter()
                .map(String::as_str)
                .zip(EVENT_TYPES.iter().copied()),
        );
        query.extend_from_slice(extra);
        let (status, headers, body) = self.get("/v1/events", &query).await?;
        let page: WirePage = listing(status, &headers, &body, |_: &WirePage| false)?;
        let mut events = Vec::with_capacity(page.data.len());
        for value in page.data {
            let text = value.to_string();
            let e = ProviderEvent::parse(&text).map_err(|r| {
                ProviderError::new(
                    FailureKind::Network,
                    format!("the event list holds an unreadable event: {}", r.message),
                )
            })?;
            events.push((e, text));
        }
        Ok(EventPage {
            events,
            has_more: page.has_more,
        })
    }
}

#[async_trait]
impl EventLister for StripeClient {
    async fn page_back(
        &self,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        let (since, until) = (since_s.to_string(), until_s.to_string());
        let mut extra = vec![
            ("created[gte]", since.as_str()),
            ("created[lte]", until.as_str()),
        ];
        if let Some(a) = starting_after {
            extra.push(("starting_after", a));
        }
        self.event_page(&extra).await
    }

    async fn page_after(&self, cursor: &str) -> Result<EventPage, ProviderError> {
        self.event_page(&[("ending_before", cursor)]).await
    }
}

impl StripeClient {
    /// An event's place (`GET /v1/events/{id}`): where `payctl events checkpoint --set` puts
    /// the checkpoint.
    pub async fn event_place(&self, id: &str) -> Result<Place, ProviderError> {
        let (status, headers, body) = self.get(&format!("/v1/events/{id}"), &[]).await?;
        let value: serde_json::Value =
            listing(status, &headers, &body, |_: &serde_json::Value| false)?;
        let e = ProviderEvent::parse(&value.to_string()).map_err(|r| {
            ProviderError::new(
                FailureKind::Network,
                format!("unreadable event {id}: {}", r.message),
            )
        })?;
        Ok(Place::of(&e))
    }
}
