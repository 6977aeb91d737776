//! The account's webhook endpoints (`/v1/webhook_endpoints`): listed by the catch-up before it
//! trusts `delivery_success=false` and by `payctl preflight`; registered, brought up to date
//! and replaced by `payctl connect`.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::Deserialize;

use crate::events::catch_up::EVENT_TYPES;
use crate::provider::{FailureKind, ProviderError};
use crate::stripe::{listing, StripeClient};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

/// A webhook endpoint as Stripe answers one (`webhook_endpoint`), without its secret.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WebhookEndpoint {
    /// `we_...`.
    pub id: String,
    /// Where Stripe sends the events.
    pub url: String,
    /// `enabled` or `disabled`.
    pub status: String,
    /// The event types sent (`*`: all of them).
    #[serde(default)]
    pub enabled_events: Vec<String>,
    /// The version the events are rendered in (`None`: the account's default).
    #[serde(default)]
    pub api_version: Option<String>,
    /// The endpoint's metadata (`payctl connect` names its stack there).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// When it was registered (Unix seconds).
    #[serde(default)]
    pub created: i64,
}

/// Whether two URLs name one endpoint (case, spaces and a trailing slash aside).
pub fn same_url(a: &str, b: &str) -> bool {
    let bare = |u: &str| u.trim().trim_end_matches('/').to_ascii_lowercase();
    bare(a) == bare(b)
}

impl WebhookEndpoint {
    /// Whether the endpoint is at `url`.
    pub fn is_at(&self, url: &str) -> bool {
        same_url(&self.url, url)
    }

    /// The event types the inbox applies that the endpoint is not sent (none under `*`).
    pub fn missing_types(&self) -> Vec<&'static str> {
        EVENT_TYPES
            .iter()
            .filter(|t| !self.enabled_events.iter().any(|x| x == "*" || x == *t))
            .copied()
            .collect()
    }
}

/// What to register.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    /// The public URL of the stack's events route.
    pub url: String,
    /// The event types to send.
    pub events: Vec<String>,
    /// The version to render them in (the one the stack pins).
    pub api_version: String,
    /// A description shown in Stripe's Dashboard.
    pub description: String,
    /// Metadata to set (the stack's name).
    pub metadata: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct Created {
    #[serde(flatten)]
    endpoint: WebhookEndpoint,
    secret: Option<String>,
}

#[derive(Deserialize)]
struct Page {
    data: Vec<WebhookEndpoint>,
    #[serde(default)]
    has_more: bool,
}

/// A write's answer: the object, or the provider's own message of why not (its limit of 16
/// endpoints, a URL it cannot reach, a key reused with other parameters).
fn object<T: serde::de::DeserializeOwned>(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
) -> Result<T, ProviderError> {
    if status.is_success() {
        return listing(status, headers, body, |_: &T| false);
    }
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(200).collect());
    let kind = match status.as_u16() {
        429 => FailureKind::RateLimited,
        500..=599 => FailureKind::ServerError,
        _ => FailureKind::Misconfigured,
    };
    Err(ProviderError::new(
        kind,
        format!("HTTP {status}: {message}"),
    ))
}

fn events_form(events: &[String]) -> impl Iterator<Item = (String, String)> + '_ {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| (format!("enabled_events[{i}]"), e.clone()))
}

impl StripeClient {
    /// Every webhook endpoint of the account (`GET /v1/webhook_endpoints`, every page).
    pub async fn webhook_endpoints(&self) -> Result<Vec<WebhookEndpoint>, ProviderError> {
        let mut endpoints: Vec<WebhookEndpoint> = Vec::new();
        loop {
            let after = endpoints.last().map(|e| e.id.clone());
            let mut query = vec![("limit", "100")];
            if let Some(a) = &after {
                query.push(("starting_after", a));
            }
            let (status, headers, body) = self.get("/v1/webhook_endpoints", &query).await?;
            let page: Page = listing(status, &headers, &body, |_: &Page| false)?;
            let more = page.has_more && !page.data.is_empty();
            endpoints.extend(page.data);
            if !more {
                return Ok(endpoints);
            }
        }
    }

    /// Registers an endpoint (`POST /v1/webhook_endpoints`) under `key`: the endpoint and its
    /// signing secret, which only this answer carries (a replay of `key` within Stripe's 24
    /// hours answers the same endpoint and secret again).
    pub async fn create_webhook_endpoint(
        &self,
        key: &str,
        spec: &EndpointSpec,
    ) -> Result<(WebhookEndpoint, SecretString), ProviderError> {
        let mut form = vec![
            ("url".to_owned(), spec.url.clone()),
            ("api_version".to_owned(), spec.api_version.clone()),
            ("description".to_owned(), spec.description.clone()),
        ];
        form.extend(events_form(&spec.events));
        form.extend(
            spec.metadata
                .iter()
                .map(|(k, v)| (format!("metadata[{k}]"), v.clone())),
        );
        let (status, headers, body) = self.post_form("/v1/webhook_endpoints", key, &form).await?;
        let created: Created = object(status, &headers, &body)?;
        let secret = created.secret.filter(|s| !s.is_empty()).ok_or_else(|| {
            ProviderError::new(
                FailureKind::Misconfigured,
                format!(
                    "the provider registered {} without answering its signing secret",
                    created.endpoint.id
                ),
            )
        })?;
        Ok((created.endpoint, SecretString::from(secret)))
    }

    /// Enables `id`, sends it the event types `events` (when given) and sets `metadata`
    /// (`POST /v1/webhook_endpoints/{id}`).
    pub async fn update_webhook_endpoint(
        &self,
        key: &str,
        id: &str,
        events: Option<&[String]>,
        metadata: &[(String, String)],
    ) -> Result<WebhookEndpoint, ProviderError> {
        let mut form = vec![("disabled".to_owned(), "false".to_owned())];
        form.extend(events.into_iter().flat_map(events_form));
        form.extend(
            metadata
                .iter()
                .map(|(k, v)| (format!("metadata[{k}]"), v.clone())),
        );
        let path = format!("/v1/webhook_endpoints/{id}");
        let (status, headers, body) = self.post_form(&path, key, &form).await?;
        object(status, &headers, &body)
    }

    /// Deletes `id` (`DELETE /v1/webhook_endpoints/{id}`); one already gone is not an error.
    pub async fn delete_webhook_endpoint(&self, id: &str) -> Result<(), ProviderError> {
        let path = format!("/v1/webhook_endpoints/{id}");
        let (status, headers, body) = self.delete(&path).await?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(());
        }
        object::<serde_json::Value>(status, &headers, &body).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_s_published_webhook_endpoint_reads_with_what_connect_and_the_catch_up_need() {
        let fixture = crate::stripe::client::tests::fixture("webhook_endpoint");
        let e: WebhookEndpoint = serde_json::from_value(fixture).unwrap();
        assert!(e.id.starts_with("we_") && e.created > 0);
        assert_eq!(
            (e.status.as_str(), e.api_version.as_deref()),
            ("enabled", None)
        );
        assert!(e.is_at("HTTPS://example.com/my/webhook/endpoint/"));
        assert_eq!(e.missing_types().len(), EVENT_TYPES.len());
        let all = WebhookEndpoint {
            enabled_events: vec!["*".into()],
            ..e
        };
        assert!(all.missing_types().is_empty());
    }
}
