//! The `event-processor` Lambda: SQS batches of the provider's verified events in,
//! `SqsBatchResponse` out; and, when its schedule invokes it with `{"catch_up": true}`, the
//! catch-up that queues the events the endpoint missed.
//!
//! The batch runner is `sqs-once`'s; the inbox work (one event id, applied once), the catch-up
//! and their wiring are `payment-core`'s.

use std::sync::Arc;
use std::time::Duration;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use payment_core::events::catch_up::{Budget, ScheduledCatchUp};
use payment_core::events::inbox::EventProcessor;
use payment_core::telemetry::{self, traces};
use serde_json::Value;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn handle(
    processor: Arc<EventProcessor>,
    catch_up: Arc<Option<ScheduledCatchUp>>,
    event: LambdaEvent<Value>,
) -> Result<Value, Error> {
    let (payload, context) = event.into_parts();
    if payload.get("catch_up").is_some() {
        let Some(catch_up) = catch_up.as_ref() else {
            return Err("the catch-up needs PROVIDER_EVENTS_QUEUE_URL".into());
        };
        // Stops starting pages 15 s before the function's deadline (a page: one list call and
        // ten SendMessageBatch calls, each within its client's timeout); the next run goes on
        // from the checkpoint.
        let budget = Budget::before_deadline(context.deadline as i64, Duration::from_secs(15));
        let run = catch_up.run(budget).await;
        // The lag, the jump and the held refunds, for the alarms and the dashboard (EMF on
        // stdout), for whatever part ran, before a failure fails the invocation.
        if telemetry::metrics_on() {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            for line in run.emf_lines(now_ms) {
                println!("{line}");
            }
        }
        let report = run.into_result()?;
        tracing::info!(
            since = report.since_s,
            until = report.until_s,
            queued = report.queued,
            set_aside = report.set_aside,
            pages = report.pages,
            finished = report.finished,
            checked_through = report.checked_through_s,
            jumped = report.jumped,
            "catch-up"
        );
        return Ok(serde_json::to_value(report)?);
    }
    let batch = serde_json::from_value(payload)?;
    let answer = processor
        .handle_event(LambdaEvent::new(batch, context))
        .await?;
    Ok(serde_json::to_value(answer)?)
}

// One thread, as the payment processor: the work waits on the network.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let (processor, catch_up) = payment_core::edges::bootstrap::event_processor_from_env().await?;
    let catch_up = Arc::new(catch_up);
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        // The invocation's spans leave before the answer does (Lambda freezes the process after).
        traces::flushed(
            event.context.deadline,
            handle(Arc::clone(&processor), Arc::clone(&catch_up), event),
        )
    }))
    .await
}
