//! The `outbox-relay` Lambda: DynamoDB stream batches of the payments table in (the `INSERT`s
//! of payment rows), payment messages on the payments queue out (`ReportBatchItemFailures`).
//!
//! Everything but the runtime glue lives in `payment_core::payments::outbox`.

use std::sync::Arc;

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use payment_core::payments::outbox::{relay_stream_batch, Relay};
use payment_core::telemetry::{self, traces};

async fn handle(
    relay: Arc<Relay>,
    event: LambdaEvent<Event>,
) -> Result<DynamoDbEventResponse, Error> {
    // The stream's filter passes new payment rows only; anything else is skipped.
    Ok(relay_stream_batch(&relay, event.payload).await)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let relay = payment_core::edges::bootstrap::relay_from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
        // The messages' spans leave before the answer does (Lambda freezes the process after).
        traces::flushed(event.context.deadline, handle(Arc::clone(&relay), event))
    }))
    .await
}
