//! The Lambda handler around [`BatchRunner::handle_batch`] (feature `lambda`, on by default).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent};

use crate::runner::{now_ms, BatchRunner};
use crate::work::Work;

impl<W: Work> BatchRunner<W> {
    /// Handles one SQS event: the batch's messages, the EMF lines of its metrics on stdout
    /// (when [`BatchRunner::with_metrics`] named them), and the partial batch response.
    ///
    /// Fails the invocation, so that the whole batch comes back, only when a message that
    /// must come back has no `messageId` to report it by (duplicates of what finished are
    /// absorbed by the records). A batch whose every message comes back is a partial batch
    /// response like any other, not an invocation error: each message was already given its
    /// redelivery delay (its visibility), so nothing spins, and one busy message in a quiet
    /// period does not trip an alarm on the function's `Errors` metric. The event source
    /// mapping needs `FunctionResponseTypes: [ReportBatchItemFailures]`.
    pub async fn handle_event(
        self: &std::sync::Arc<Self>,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, Error> {
        let deadline_ms = i64::try_from(event.context.deadline).unwrap_or(i64::MAX);
        let (response, summary) = self.handle_batch(event.payload.records, deadline_ms).await;
        if let Some(names) = &self.metrics {
            for line in crate::metrics::emf_lines(&summary, names, now_ms()) {
                println!("{line}");
            }
        }
        if summary.unreportable > 0 {
            return Err(format!(
                "{} message(s) without a messageId must be redelivered; failing the whole batch",
                summary.unreportable
            )
            .into());
        }
        Ok(response)
    }
}
