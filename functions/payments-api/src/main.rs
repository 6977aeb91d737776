//! The `payments-api` Lambda: API Gateway HTTP API requests in, JSON answers out.
//!
//! `POST /v1/payments` and `GET /v1/payments/{id}`; everything but the HTTP glue lives in
//! `payment_core::api`.

use std::sync::Arc;

use lambda_http::{service_fn, Body, Error, Request, RequestExt, Response};
use payment_core::api::PaymentsApi;
use payment_core::telemetry::{self, traces};

async fn handle(api: Arc<PaymentsApi>, request: Request) -> Result<Response<Body>, Error> {
    let (parts, body) = request.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let answer = api
        .handle(
            parts.method.as_str(),
            parts.uri.path(),
            header,
            body.as_ref(),
        )
        .await;
    let mut response = Response::builder()
        .status(answer.status)
        .header("content-type", "application/json");
    for (name, value) in answer.headers {
        response = response.header(name, value);
    }
    Ok(response.body(Body::Text(answer.body))?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let api = payment_core::edges::bootstrap::api_from_env().await?;
    lambda_http::run(service_fn(|request: Request| {
        // The request's spans leave before the answer does (Lambda freezes the process after).
        let deadline = request
            .lambda_context_ref()
            .map_or(u64::MAX, |c| c.deadline);
        traces::flushed(deadline, handle(Arc::clone(&api), request))
    }))
    .await
}
