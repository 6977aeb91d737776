//! The provider's objects as they are now (`GET /v1/payment_intents/{id}`, `/v1/refunds/{id}`,
//! `/v1/disputes/{id}`, `/v1/charges/{id}`), read as an event would carry them: what the
//! events inbox applies when an event's payload cannot decide; and the event list
//! (`GET /v1/events`, `/v1/events/{id}`) the catch-up walks.

use std::time::Duration;

use async_trait::async_trait;

use crate::events::catch_up::{EventLister, EventPage, Listed, Place, EVENT_TYPES, PAGE_SIZE};
use crate::provider::event::{DisputeChange, PaymentChange, ProviderEvent, RefundChange, Subject};
use crate::provider::{FailureKind, PaymentProvider, ProviderError};
use crate::stripe::endpoints::WebhookEndpoint;
use crate::stripe::receiver::EVENTS_PATH;
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

/// The provider's event list: every event of the inbox's types, or only the undelivered.
#[async_trait]
impl EventLister for StripeClient {
    async fn page_back(
        &self,
        listed: Listed,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.events_back(since_s, until_s, starting_after, listed)
            .await
    }

    async fn page_after(&self, listed: Listed, cursor: &str) -> Result<EventPage, ProviderError> {
        self.events_after(cursor, listed).await
    }

    async fn webhook_unfit(&self, since_s: Option<i64>) -> Result<Option<String>, ProviderError> {
        Ok(webhook_unfit(
            &self.webhook_endpoints().await?,
            None,
            since_s,
        ))
    }
}

/// The provider's event list, checked against this stack's own webhook endpoint: what the
/// scheduled catch-up reads.
pub struct EventListing {
    client: StripeClient,
    endpoint: Option<String>,
}

impl EventListing {
    /// `client`'s event list; `endpoint`: this stack's endpoint URL as registered (`None`:
    /// every endpoint at the receiver's path counts).
    pub fn new(client: StripeClient, endpoint: Option<String>) -> Self {
        Self { client, endpoint }
    }
}

#[async_trait]
impl EventLister for EventListing {
    async fn page_back(
        &self,
        listed: Listed,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.client
            .page_back(listed, since_s, until_s, starting_after)
            .await
    }

    async fn page_after(&self, listed: Listed, cursor: &str) -> Result<EventPage, ProviderError> {
        self.client.page_after(listed, cursor).await
    }

    async fn webhook_unfit(&self, since_s: Option<i64>) -> Result<Option<String>, ProviderError> {
        let endpoints = self.client.webhook_endpoints().await?;
        Ok(webhook_unfit(&endpoints, self.endpoint.as_deref(), since_s))
    }
}

/// Whether this stack's endpoint (`ours`, its URL as registered) is enabled and sent every
/// event type the inbox applies (`*`, or each of [`EVENT_TYPES`]), and was registered by
/// `since_s` (where the catch-up last checked the list through): `None` when so; else why
/// not. One registered later was deleted and registered again, or added, since that check:
/// what was made before it was sent to no endpoint of this stack's, so never failed. Another
/// stack's endpoint at the same path being fit says nothing of this one (events it takes are
/// delivered, so never listed undelivered). Without `ours`, every endpoint at the receiver's
/// path ([`EVENTS_PATH`]) must be fit, and one at least there.
pub fn webhook_unfit(
    endpoints: &[WebhookEndpoint],
    ours_url: Option<&str>,
    since_s: Option<i64>,
) -> Option<String> {
    let path = |url: &str| {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let path = rest.find('/').map_or("", |i| &rest[i..]);
        path.split(['?', '#'])
            .next()
            .unwrap_or("")
            .trim_end_matches('/')
            .to_owned()
    };
    let ours: Vec<&WebhookEndpoint> = match ours_url {
        Some(url) => endpoints.iter().filter(|e| e.is_at(url)).collect(),
        None => endpoints
            .iter()
            .filter(|e| path(&e.url).ends_with(EVENTS_PATH))
            .collect(),
    };
    if ours.is_empty() {
        return Some(format!(
            "no webhook endpoint at {} is registered ({} other endpoints)",
            match ours_url {
                Some(url) => format!("{url} (this stack's ProviderEventsUrl)"),
                None => format!("a URL ending {EVENTS_PATH}"),
            },
            endpoints.len()
        ));
    }
    let why: Vec<String> = ours
        .iter()
        .filter_map(|e| {
            if e.status != "enabled" {
                return Some(format!("{} ({}) is {}", e.id, e.url, e.status));
            }
            let missing = e.missing_types();
            if !missing.is_empty() {
                return Some(format!("{} ({}) is not sent {}", e.id, e.url, missing.join(", ")));
            }
            since_s
                // Five minutes' margin for the clocks (Stripe's `created`, this run's time).
                .filter(|since| {
                    e.created > *since - 300
                        && !sqs_once::mutation::on("endpoint_registered_since_fit")
                })
                .map(|since| {
                    format!(
                        "{} ({}) was registered at {} (epoch s), after the catch-up last checked the list through {since}: what was made before it was sent to no endpoint of this stack's",
                        e.id, e.url, e.created
                    )
                })
        })
        .collect();
    (!why.is_empty()).then(|| why.join("; "))
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

    fn endpoint(id: &str, url: &str, status: &str, events: &[&str]) -> WebhookEndpoint {
        WebhookEndpoint {
            id: id.into(),
            url: url.into(),
            status: status.into(),
            enabled_events: events.iter().map(|e| (*e).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_undelivered_filter_is_trusted_only_while_every_endpoint_here_is_enabled_and_sent_every_type(
    ) {
        let url = "https://abc.execute-api.eu-west-1.amazonaws.com/v1/provider-events";
        assert_eq!(
            webhook_unfit(&[endpoint("we_1", url, "enabled", &["*"])], None, None),
            None
        );
        assert_eq!(
            webhook_unfit(&[endpoint("we_1", url, "enabled", EVENT_TYPES)], None, None),
            None
        );
        let no_disputes: Vec<&str> = EVENT_TYPES
            .iter()
            .copied()
            .filter(|t| !t.starts_with("charge.dispute"))
            .collect();
        let cases = [
            (vec![], "no webhook endpoint"),
            (
                vec![endpoint(
                    "we_1",
                    "https://other.example/hook",
                    "enabled",
                    &["*"],
                )],
                "no webhook endpoint",
            ),
            (vec![endpoint("we_1", url, "disabled", &["*"])], "we_1"),
            (
                vec![endpoint("we_1", url, "enabled", &no_disputes)],
                "charge.dispute.created",
            ),
            // Another stack's endpoint at the same path, disabled: not told apart, so not trusted.
            (
                vec![
                    endpoint("we_1", url, "enabled", &["*"]),
                    endpoint(
                        "we_2",
                        "https://pay.example.com/stripe/v1/provider-events/",
                        "disabled",
                        &["*"],
                    ),
                ],
                "we_2",
            ),
        ];
        for (endpoints, said) in cases {
            let why = webhook_unfit(&endpoints, None, None).expect("unfit");
            assert!(why.contains(said), "{why}");
        }
        // Told its own URL: another stack's endpoint, fit, does not stand for this one's.
        let theirs = endpoint(
            "we_2",
            "https://other.example/v1/provider-events",
            "enabled",
            &["*"],
        );
        let why =
            webhook_unfit(std::slice::from_ref(&theirs), Some(url), None).expect("ours is missing");
        assert!(why.contains("ProviderEventsUrl"), "{why}");
        let ours_disabled = endpoint("we_1", &format!("{url}/"), "disabled", &["*"]);
        let why =
            webhook_unfit(&[theirs, ours_disabled], Some(url), None).expect("ours is disabled");
        assert!(why.contains("we_1"), "{why}");
        let ours = endpoint("we_1", url, "enabled", &["*"]);
        let other_disabled = endpoint(
            "we_3",
            "https://x.example/v1/provider-events",
            "disabled",
            &["*"],
        );
        assert_eq!(
            webhook_unfit(&[ours, other_disabled], Some(url), None),
            None
        );
    }

    #[test]
    fn an_endpoint_registered_after_the_list_was_last_checked_is_unfit_for_that_run() {
        // Deleted and registered again between two runs (to change its URL or its types):
        // enabled and sent every type now, but nothing made in between was sent to it.
        let url = "https://abc.execute-api.us-east-1.amazonaws.com/prod/v1/provider-events";
        let mut ours = endpoint("we_2", url, "enabled", &["*"]);
        ours.created = 1_700_003_600;
        let why = webhook_unfit(std::slice::from_ref(&ours), Some(url), Some(1_700_000_000))
            .expect("registered after the last check");
        assert!(why.contains("we_2") && why.contains("1700000000"), "{why}");
        assert_eq!(
            webhook_unfit(std::slice::from_ref(&ours), Some(url), Some(1_700_003_900)),
            None,
            "registered by the last check, five minutes' margin for the clocks"
        );
        assert!(
            webhook_unfit(std::slice::from_ref(&ours), Some(url), Some(1_700_003_800)).is_some(),
            "within the clocks' margin"
        );
        assert_eq!(
            webhook_unfit(&[ours], Some(url), None),
            None,
            "no check yet"
        );
    }

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
