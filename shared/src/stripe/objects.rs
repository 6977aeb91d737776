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

/// An entry of the event list that is not an event this system can read, kept in its place
/// with its id and time (the walk goes on after it) and its text, which the inbox refuses
/// (`invalid_event`, dead-lettered with the parser's reason): one bad event never stops the
/// catch-up. `None` when even its id or time cannot be read: the page cannot be walked past.
fn unreadable_entry(value: &serde_json::Value, text: String) -> Option<(ProviderEvent, String)> {
    let id = value.get("id")?.as_str()?;
    let created = value.get("created")?.as_i64()?;
    if !id.starts_with("evt_") {
        return None;
    }
    let kind = value
        .get("type")
        .and_then(|v| v.as_str())
        .unwrap_or("unreadable")
        .chars()
        .take(100)
        .collect();
    Some((
        ProviderEvent {
            id: id.to_owned(),
            kind,
            created,
            object: serde_json::Value::Null,
        },
        text,
    ))
}

/// Which of the provider's events a listing holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Every event of the inbox's types.
    All,
    /// Only those not delivered to every webhook endpoint (`delivery_success=false`: still
    /// pending, or failed all their attempts), as Stripe's guide to undelivered events lists
    /// them: the delivered ones were queued by the receiver when they arrived.
    Undelivered,
}

/// The provider's event list as the catch-up walks it: every event, or only the undelivered
/// ones ([`Listed`]).
pub struct EventListing {
    client: StripeClient,
    listed: Listed,
}

impl EventListing {
    /// `client`'s event list, restricted to `listed`.
    pub fn new(client: StripeClient, listed: Listed) -> Self {
        Self { client, listed }
    }
}

#[async_trait]
impl EventLister for EventListing {
    async fn page_back(
        &self,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.client
            .events_back(since_s, until_s, starting_after, self.listed)
            .await
    }

    async fn page_after(&self, cursor: &str) -> Result<EventPage, ProviderError> {
        self.client.events_after(cursor, self.listed).await
    }
}

impl StripeClient {
    async fn event_page(
        &self,
        extra: &[(&str, &str)],
        listed: Listed,
    ) -> Result<EventPage, ProviderError> {
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
        if listed == Listed::Undelivered {
            query.push(("delivery_success", "false"));
        }
        query.extend_from_slice(extra);
        let (status, headers, body) = self.get("/v1/events", &query).await?;
        let page: WirePage = listing(status, &headers, &body, |_: &WirePage| false)?;
        let mut events = Vec::with_capacity(page.data.len());
        for value in page.data {
            let text = value.to_string();
            let entry = match ProviderEvent::parse(&text) {
                Ok(e) => (e, text),
                Err(r) => unreadable_entry(&value, text).ok_or_else(|| {
                    ProviderError::new(
                        FailureKind::Network,
                        format!(
                            "the event list holds an entry without an event id and time: {}",
                            r.message
                        ),
                    )
                })?,
            };
            events.push(entry);
        }
        Ok(EventPage {
            events,
            has_more: page.has_more,
        })
    }
}

impl StripeClient {
    async fn events_back(
        &self,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
        listed: Listed,
    ) -> Result<EventPage, ProviderError> {
        let (since, until) = (since_s.to_string(), until_s.to_string());
        let mut extra = vec![
            ("created[gte]", since.as_str()),
            ("created[lte]", until.as_str()),
        ];
        if let Some(a) = starting_after {
            extra.push(("starting_after", a));
        }
        self.event_page(&extra, listed).await
    }

    async fn events_after(&self, cursor: &str, listed: Listed) -> Result<EventPage, ProviderError> {
        self.event_page(&[("ending_before", cursor)], listed).await
    }
}

/// Every event of the inbox's types ([`Listed::All`]): what a catch-up by hand lists.
#[async_trait]
impl EventLister for StripeClient {
    async fn page_back(
        &self,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.events_back(since_s, until_s, starting_after, Listed::All)
            .await
    }

    async fn page_after(&self, cursor: &str) -> Result<EventPage, ProviderError> {
        self.events_after(cursor, Listed::All).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_entry_keeps_its_place_and_its_text_for_the_inbox_to_refuse() {
        let text = r#"{"id":"evt_9","object":"event","type":"payment_intent.succeeded","created":77,"data":"not an object"}"#;
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(ProviderEvent::parse(text).is_err());
        let (e, kept) = unreadable_entry(&value, text.to_owned()).unwrap();
        assert_eq!((e.id.as_str(), e.created), ("evt_9", 77));
        assert_eq!(kept, text);
        // The inbox refuses it with the parser's reason (its dead letter says why).
        let refusal = ProviderEvent::parse_queued(&kept).unwrap_err();
        assert_eq!(refusal.code, "invalid_event");
        // Without an event id or a time there is no place to go on from.
        for bad in [r#"{"id":"ch_1","created":1}"#, r#"{"id":"evt_1"}"#] {
            let v: serde_json::Value = serde_json::from_str(bad).unwrap();
            assert!(unreadable_entry(&v, bad.to_owned()).is_none(), "{bad}");
        }
    }
}
