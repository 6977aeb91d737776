//! The `provider-events` Lambda: `POST /v1/provider-events` from API Gateway (no IAM auth:
//! the provider signs with `Stripe-Signature` instead), verified and queued; everything but the
//! HTTP glue lives in `payment_core::stripe::receiver`.

use std::sync::Arc;

use lambda_http::{service_fn, Body, Error, Request, RequestExt, Response};
use payment_core::stripe::receiver::EventReceiver;
use payment_core::telemetry::{self, traces};

async fn handle(receiver: Arc<EventReceiver>, request: Request) -> Result<Response<Body>, Error> {
    let (parts, body) = request.into_parts();
    let signature = parts
        .headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    // The raw bytes as sent (API Gateway base64-decodes a binary body): the signature is
    // over them.
    let answer = receiver
        .handle(
            parts.method.as_str(),
            parts.uri.path(),
            signature,
            body.as_ref(),
        )
        .await;
    Ok(Response::builder()
        .status(answer.status)
        .header("content-type", "application/json")
        .body(Body::Text(answer.body))?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let receiver = payment_core::edges::bootstrap::receiver_from_env().await?;
    lambda_http::run(service_fn(|request: Request| {
        // The request's spans leave before the answer does (Lambda freezes the process after).
        let deadline = request
            .lambda_context_ref()
            .map_or(u64::MAX, |c| c.deadline);
        traces::flushed(deadline, handle(Arc::clone(&receiver), request))
    }))
    .await
}
