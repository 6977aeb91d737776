//! The `payments-api` Lambda: API Gateway HTTP API requests in, JSON answers out.
//!
//! `POST /v1/payments` and `GET /v1/payments/{id}`; everything but the HTTP glue lives in
//! `payment_core::api`.

use std::sync::Arc;

use lambda_http::request::RequestContext;
use lambda_http::{service_fn, Body, Error, Request, RequestExt, Response};
use payment_core::api::PaymentsApi;
use payment_core::telemetry::{self, traces};

/// The IAM principal API Gateway authenticated (the route's `AWS_IAM` authorization) and the
/// request's id (the access log's `requestId`): from the request's context, which API Gateway
/// writes, never from a header the caller sends.
fn context_of(request: &Request) -> (Option<String>, Option<String>) {
    match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => (
            // A role session's name is the caller's choice of text: a card number in it is
            // masked before the row, the answer or a log line keeps it.
            ctx.authorizer
                .as_ref()
                .and_then(|a| a.iam.as_ref())
                .and_then(|i| i.user_arn.clone())
                .map(|arn| payment_core::domain::mask_card_numbers(&arn).unwrap_or(arn)),
            ctx.request_id.clone(),
        ),
        _ => (None, None),
    }
}

/// The payment a request is about, to be logged: the `Idempotency-Key` of a `POST`, the path's
/// id of a `GET`, only when it is an id this API makes (a card number, or any other text, is
/// never logged).
fn payment_of(method: &str, path: &str, key: Option<String>) -> Option<String> {
    let id = match method {
        "POST" => key?,
        _ => path.trim_end_matches('/').rsplit('/').next()?.to_owned(),
    };
    payment_core::domain::PaymentId::parse(&id)
        .ok()
        .filter(|_| payment_core::domain::mask_card_numbers(&id).is_none())
        .map(|_| id)
}

async fn handle(api: Arc<PaymentsApi>, request: Request) -> Result<Response<Body>, Error> {
    let (caller, request_id) = context_of(&request);
    let (parts, body) = request.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let answer = api
        .handle_as(
            caller.as_deref(),
            parts.method.as_str(),
            parts.uri.path(),
            header,
            body.as_ref(),
        )
        .await;
    // The access log (API Gateway's) has the request id, the caller and the path, not a POST's
    // payment id (an HTTP API logs no header): this line joins them by the request id.
    tracing::info!(
        api_request_id = request_id.as_deref().unwrap_or_default(),
        method = parts.method.as_str(),
        payment_id = payment_of(
            parts.method.as_str(),
            parts.uri.path(),
            header("idempotency-key")
        )
        .unwrap_or_default(),
        caller = caller.as_deref().unwrap_or_default(),
        status = answer.status,
        "payments API request"
    );
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
