//! # lambda-local: what makes a laptop look like Lambda
//!
//! The pieces of the Lambda service a local run needs, around the real handlers and the real
//! `bootstrap` binaries, on any endpoint the SDK reaches (`AWS_ENDPOINT_URL`):
//!
//! - [`esm`]: the SQS event-source mapping: receives batches like Lambda's SQS trigger,
//!   invokes the function (in this process, or `bootstrap` processes through
//!   [`runtime_api`]) with the function timeout as the deadline, and deletes what
//!   `ReportBatchItemFailures` did not report;
//! - [`runtime_api`]: the Lambda Runtime API a custom runtime's `bootstrap` polls, one
//!   invocation at a time, with the process's CPU time and memory;
//! - [`stream`]: the DynamoDB stream event-source mapping (trim horizon, in order, filtered,
//!   checkpointed at the first failure);
//! - [`http`]: API Gateway's HTTP API in front of a handler (`403` without a SigV4
//!   `Authorization` header, as an `AWS_IAM` route).
//!
//! Nothing here knows what the functions do: `payctl run` and the proving ground plug the
//! processors, the outbox relay and the payments API in.

pub mod esm;
pub mod faults;
pub mod http;
pub mod runtime_api;
pub mod sqs_event;
pub mod stream;

/// An error and its causes in one line, each cause's message once (`dispatch failure: ...:
/// connection closed before message completed`): what a log line or an operator needs, never a
/// `Debug` dump.
pub fn cause_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}
