//! The Lambda handler around [`BatchRunner::handle_batch`] (feature `lambda`, on by default).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent};

use crate::runner::{now_ms, BatchRunner};
use crate::work::Work;

impl<W: Work> BatchRunner<W> {
    /// Handles one SQS event: the batch's messages, the EMF lines of its metrics on stdout
    /// (when [`BatchRunner::with_metrics`] named them), and the partial batch response.
    ///
    /// Fails the invocation, so that the whole batch comes back, when a message that must
    /// come back has no `messageId` to report it by; and when every message of the batch
    /// must come back, so that Lambda backs off polling instead of spinning. Duplicates of
    /// what finished are absorbed by the records. The event source mapping needs
    /// `FunctionResponseTypes: [ReportBatchItemFailures]`.
    pub async fn handle_event(
        self: &std::sync::Arc<Self>,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, Error> {
        let total = event.payload.records.len();
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
        if total > 0 && response.batch_item_failures.len() == total {
            return Err(format!(
                "all {total} messages of the batch failed and will be redelivered"
            )
            .into());
        }
        Ok(response)
    }
}
