//! The `outbox-relay` Lambda: DynamoDB stream batches of the payments table in (the `INSERT`s
//! of payment rows), payment messages on the payments queue out (`ReportBatchItemFailures`).
//!
//! Everything but the runtime glue lives in `payment_core::payments::outbox`.

use std::sync::Arc;

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use payment_core::payments::outbox::{entry_from_image, Relay};
use payment_core::telemetry;
use tracing::{error, info};

async fn handle(
    relay: Arc<Relay>,
    event: LambdaEvent<Event>,
) -> Result<DynamoDbEventResponse, Error> {
    // The stream's filter passes new payment rows only; anything else is skipped.
    let mut entries = Vec::new();
    let mut sequences = Vec::new();
    let mut unreadable = None;
    for record in event.payload.records {
        let sequence = record.change.sequence_number.clone().unwrap_or_default();
        match entry_from_image(record.change.new_image) {
            Ok(Some(entry)) => {
                entries.push(entry);
                sequences.push(sequence);
            }
            Ok(None) => {}
            Err(e) => {
                // Relay what comes before it; it and what follows are retried, then sent to the
                // mapping's on-failure destination.
                error!(sequence, error = %e, "unreadable payment row");
                unreadable = Some(sequence);
                break;
            }
        }
    }
    let report = relay.relay(&entries).await;
    info!(
        sent = report.sent,
        "relayed {} payment messages",
        entries.len()
    );
    for e in &report.errors {
        error!(error = %e, "relay failed");
    }
    let failed = report
        .first_failed
        .and_then(|i| sequences.get(i).cloned())
        .or(unreadable);
    let mut response = DynamoDbEventResponse::default();
    if let Some(sequence) = failed {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(sequence);
        response.batch_item_failures.push(failure);
    }
    Ok(response)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let relay = payment_core::edges::bootstrap::relay_from_env().await?;
    lambda_runtime::run(service_fn(|event| handle(Arc::clone(&relay), event))).await
}
