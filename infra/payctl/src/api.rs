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
    LocalHttp::start(
        Arc::new(Api {
            payments: Some(api),
            events,
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
        }),
        address,
    )
    .await
}
