//! The payments API served locally (`payctl api serve`, the proving ground, the tests): the same
//! [`PaymentsApi`] the Lambda runs, behind [`lambda_local::http`]'s stand-in for API Gateway,
//! and beside it, when given, the provider-events receiver on its own route
//! (`POST /v1/provider-events`, no IAM auth: it verifies the provider's signature itself), as
//! the template puts both on one HTTP API.

use std::sync::Arc;

use anyhow::Result;
use lambda_local::http::{HttpAnswer, HttpHandler, HttpRequest, LocalHttp};
use payment_core::api::{PaymentsApi, MAX_REQUEST_BYTES};
use payment_core::stripe::receiver::{EventReceiver, EVENTS_PATH, MAX_EVENT_BYTES};

struct Api {
    payments: Option<Arc<PaymentsApi>>,
    events: Option<Arc<EventReceiver>>,
    /// Requests of any `Host` are served (behind something that authenticates them); else only
    /// a loopback name's, so that a page the operator's browser opens cannot reach this API
    /// (and the operator's credentials behind it) by rebinding its own name to 127.0.0.1.
    any_host: bool,
}

/// Whether a `Host` header names this machine's loopback (`localhost`, `127.x.x.x`, `[::1]`,
/// with or without a port).
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `address` (`HOST:PORT`) listens on loopback only.
pub fn is_loopback_address(address: &str) -> bool {
    address
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or_else(|_| is_loopback_host(address))
}

impl Api {
    fn is_events(&self, path: &str) -> bool {
        self.events.is_some() && path.trim_end_matches('/') == EVENTS_PATH
    }
}

#[async_trait::async_trait]
impl HttpHandler for Api {
    fn max_body_bytes(&self) -> usize {
        // Each handler refuses what is over its own limit.
        if self.events.is_some() {
            MAX_REQUEST_BYTES.max(MAX_EVENT_BYTES)
        } else {
            MAX_REQUEST_BYTES
        }
    }

    fn requires_auth(&self, path: &str) -> bool {
        !self.is_events(path)
    }

    async fn handle(&self, request: HttpRequest<'_>) -> HttpAnswer {
        if !self.any_host && !request.header("host").is_some_and(|h| is_loopback_host(&h)) {
            return HttpAnswer {
                status: 421,
                headers: Vec::new(),
                body: r#"{"error":{"type":"invalid_request_error","code":"host_refused","message":"this local API answers requests for localhost only (payctl api serve --behind-authenticating-proxy serves others)"}}"#.to_owned(),
            };
        }
        if let (true, Some(events)) = (self.is_events(request.path), &self.events) {
            let signature = request.header("stripe-signature");
            let a = events
                .handle(
                    request.method,
                    request.path,
                    signature.as_deref(),
                    request.body,
                )
                .await;
            return HttpAnswer {
                status: a.status,
                headers: Vec::new(),
                body: a.body,
            };
        }
        let Some(payments) = &self.payments else {
            return HttpAnswer {
                status: 404,
                headers: Vec::new(),
                body: format!(
                    r#"{{"error":{{"type":"invalid_request_error","message":"only POST {EVENTS_PATH} is served here"}}}}"#
                ),
            };
        };
        let a = payments
            .handle(
                request.method,
                request.path,
                |name| request.header(name),
                request.body,
            )
            .await;
        HttpAnswer {
            status: a.status,
            headers: a.headers,
            body: a.body,
        }
    }
}

/// Serves `api` (and `events`, when given) on `address` (`127.0.0.1:0` for an ephemeral
/// port) until dropped.
pub async fn serve(
    api: Arc<PaymentsApi>,
    events: Option<Arc<EventReceiver>>,
    address: &str,
) -> Result<LocalHttp> {
    serve_exposed(api, events, address, false).await
}

/// [`serve`], answering requests of any `Host` when `any_host` (behind something that
/// authenticates them: `payctl api serve --behind-authenticating-proxy`).
pub async fn serve_exposed(
    api: Arc<PaymentsApi>,
    events: Option<Arc<EventReceiver>>,
    address: &str,
    any_host: bool,
) -> Result<LocalHttp> {
    LocalHttp::start(
        Arc::new(Api {
            payments: Some(api),
            events,
            any_host,
        }),
        address,
    )
    .await
}

/// Serves the provider-events route alone on `address`: the webhook endpoint of a stack whose
/// payments API is elsewhere (or of the partner's side of a local EventBridge run).
pub async fn serve_events(events: Arc<EventReceiver>, address: &str) -> Result<LocalHttp> {
    LocalHttp::start(
        Arc::new(Api {
            payments: None,
            events: Some(events),
            any_host: false,
        }),
        address,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_are_served_unless_told_otherwise() {
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.3.2.1:1",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "10.0.0.5:8080",
            "0.0.0.0:8080",
            "",
            "[::2]:80",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
        assert!(is_loopback_address("127.0.0.1:8080"));
        assert!(is_loopback_address("[::1]:0"));
        assert!(is_loopback_address("localhost:8080"));
        assert!(!is_loopback_address("0.0.0.0:8080"));
        assert!(!is_loopback_address("192.168.1.4:8080"));
    }
}
