//! The payments API served locally (`payctl api serve`, the proving ground, the tests): the same
//! [`PaymentsApi`] the Lambda runs, behind [`lambda_local::http`]'s stand-in for API Gateway.

use std::sync::Arc;

use anyhow::Result;
use lambda_local::http::{HttpAnswer, HttpHandler, HttpRequest, LocalHttp};
use payment_core::api::{PaymentsApi, MAX_REQUEST_BYTES};

struct Api(Arc<PaymentsApi>);

#[async_trait::async_trait]
impl HttpHandler for Api {
    fn max_body_bytes(&self) -> usize {
        MAX_REQUEST_BYTES
    }

    async fn handle(&self, request: HttpRequest<'_>) -> HttpAnswer {
        let a = self
            .0
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

/// Serves `api` on `address` (`127.0.0.1:0` for an ephemeral port) until dropped.
pub async fn serve(api: Arc<PaymentsApi>, address: &str) -> Result<LocalHttp> {
    LocalHttp::start(Arc::new(Api(api)), address).await
}
