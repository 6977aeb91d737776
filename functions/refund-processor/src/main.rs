//! The `refund-processor` Lambda: SQS batches of refunds in, `SqsBatchResponse` out.
//!
//! The batch runner is `sqs-once`'s; the refund work and its wiring are `payment-core`'s.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use payment_core::telemetry::{self, traces};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread, as the payment processor: the work waits on the network.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let processor = payment_core::edges::bootstrap::refund_processor_from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let processor = Arc::clone(&processor);
        // The batch's spans leave before the answer does (Lambda freezes the process after).
        async move { traces::flushed(event.context.deadline, processor.handle_event(event)).await }
    }))
    .await
}
