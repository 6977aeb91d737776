//! Riding out AWS failures as Lambda's pollers do: which failures are passing (throttled, a
//! `5xx`, a timeout, a lost or refused connection) and which are a configuration error that
//! calling again cannot fix; the backoff between tries; one line for each.

use std::time::Duration;

use anyhow::Result;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use sqs_once::runner::now_ms;
use tracing::warn;

/// The queue's ARN (the records' `eventSourceARN`), read again after a passing failure for up
/// to `within`; and the passing failures met.
pub(crate) async fn queue_arn_riding_out(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    within: Duration,
) -> Result<(String, u64)> {
    use anyhow::Context;
    use aws_sdk_sqs::types::QueueAttributeName;
    let started = std::time::Instant::now();
    let mut backoff = Backoff::default();
    let (_keep, mut never) = tokio::sync::watch::channel(false);
    let doing = "reading the ARN of";
    loop {
        match sqs
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
        {
            Ok(out) => {
                let arn = out
                    .attributes()
                    .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
                    .context("the endpoint returned no QueueArn")?;
                return Ok((arn, u64::from(backoff.failures())));
            }
            Err(e) if started.elapsed() < within => {
                ride_out(e, doing, queue_url, &mut backoff, &mut never).await?
            }
            Err(e) => return Err(fatal(e, doing, queue_url)),
        }
    }
}

/// Tries of a delete after its first failure (about 6 s in all).
const DELETE_TRIES: u32 = 5;

/// Deletes processed messages: a delete that fails is tried again (the receipt handles hold
/// until the visibility timeout); one that keeps failing is left, its messages to come back
/// and their records to absorb them. The messages deleted, and the passing failures met.
pub(crate) async fn delete_processed(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    entries: Vec<DeleteMessageBatchRequestEntry>,
) -> (usize, u64) {
    let mut backoff = Backoff::default();
    loop {
        match sqs
            .delete_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries.clone()))
            .send()
            .await
        {
            Ok(out) => {
                // A receipt handle the queue no longer knows is a message already deleted
                // (the function deleted it itself, or a lost answer's first try did).
                let (gone, kept): (Vec<_>, Vec<_>) = out
                    .failed()
                    .iter()
                    .partition(|f| f.code() == "ReceiptHandleIsInvalid");
                if let Some(f) = kept.first() {
                    warn!(
                        messages = kept.len(),
                        code = f.code(),
                        "the queue did not delete processed messages: they come back after the visibility timeout, and their records absorb them"
                    );
                }
                return (
                    out.successful().len() + gone.len(),
                    u64::from(backoff.failures()),
                );
            }
            Err(e) if passing(&e) && backoff.failures() < DELETE_TRIES => {
                let wait = backoff.wait();
                warn!(error = %sdk_error_line(&e), retry_in_ms = wait.as_millis() as u64, "deleting processed messages failed; trying again");
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                warn!(
                    error = %sdk_error_line(&e),
                    messages = entries.len(),
                    "deleting processed messages failed: they come back after the visibility timeout, and their records absorb them"
                );
                return (0, u64::from(backoff.failures()) + u64::from(passing(&e)));
            }
        }
    }
}

/// Error codes of a passing failure besides throttling and `5xx`: calling again can succeed.
const PASSING_CODES: [&str; 7] = [
    "OverLimit",
    "RequestThrottled",
    "TooManyRequestsException",
    "KmsThrottled",
    "RequestTimeout",
    "RequestTimeoutException",
    "ServiceUnavailable",
];

/// Whether an AWS call's failure is passing (throttled, a `5xx`, a timeout, a connection lost
/// or refused, an unreadable answer): calling again later can succeed, so a poller backs off
/// and goes on, as Lambda's do. Anything else (a queue that does not exist, access refused, a
/// request the service refuses) is a configuration error that calling again cannot fix.
pub fn passing<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> bool {
    match e {
        SdkError::ConstructionFailure(_) => false,
        SdkError::ServiceError(_) => {
            let code = e.code().unwrap_or_default();
            let code = code.rsplit('#').next().unwrap_or(code);
            let status = e.raw_response().map(|r| r.status().as_u16()).unwrap_or(0);
            status >= 500
                || status == 429
                || code.contains("Throttl")
                || code.starts_with("Internal")
                || PASSING_CODES.contains(&code)
        }
        // A connection refused or reset, a timeout, an answer cut off are passing; what the
        // SDK could not even send (no credentials found, no endpoint resolved) is not.
        SdkError::DispatchFailure(d) => {
            d.is_io()
                || d.is_timeout()
                || d.as_other() == Some(aws_smithy_types::retry::ErrorKind::TransientError)
        }
        _ => true,
    }
}

/// Waits between tries after a passing failure: 200 ms doubling to 10 s, each with up to a
/// fifth more at random so that pollers do not try in step.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The wait before the next try (and counts the failure).
    pub fn wait(&mut self) -> Duration {
        let base = 200u64 << self.failures.min(6);
        self.failures += 1;
        let base = base.min(10_000);
        let jitter = (now_ms().unsigned_abs() ^ (u64::from(self.failures) * 7919)) % (base / 5 + 1);
        Duration::from_millis(base + jitter)
    }

    /// A call succeeded: the next failure waits the shortest time again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// An SDK error in one line: the service's code and message when it answered, else the chain
/// of causes (never the SDK's `Debug` dump of the request and response).
pub fn sdk_error_line<E, R>(e: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match (e.code(), e.message()) {
        (Some(code), message) => format!("{code}: {}", message.unwrap_or("no message")),
        (None, _) => crate::cause_chain(e),
    }
}

/// A configuration error, in one line: what was being done, to which queue, and why.
pub(crate) fn fatal<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(
    e: SdkError<E, HttpResponse>,
    doing: &str,
    queue: &str,
) -> anyhow::Error {
    anyhow::anyhow!("{doing} {queue}: {}", sdk_error_line(&e))
}

/// After a failed call: a passing failure is logged with its cause, counted, and waited out
/// (a stop cuts the wait short); a configuration error ends the poller.
pub(crate) async fn ride_out<
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
>(
    e: SdkError<E, HttpResponse>,
    doing: &str,
    queue: &str,
    backoff: &mut Backoff,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    if !passing(&e) {
        return Err(fatal(e, doing, queue));
    }
    let wait = backoff.wait();
    warn!(
        error = %sdk_error_line(&e),
        failures_in_a_row = backoff.failures(),
        retry_in_ms = wait.as_millis() as u64,
        "{doing} {queue} failed; backing off and trying again"
    );
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sqs::error::ErrorMetadata;
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;
    use aws_smithy_types::body::SdkBody;

    fn service(status: u16, code: &str) -> SdkError<ReceiveMessageError, HttpResponse> {
        let raw = HttpResponse::new(status.try_into().unwrap(), SdkBody::empty());
        let err = ReceiveMessageError::generic(ErrorMetadata::builder().code(code).build());
        SdkError::service_error(err, raw)
    }

    #[test]
    fn throttling_5xx_and_lost_answers_are_passing_a_missing_queue_is_not() {
        assert!(passing(&service(400, "ThrottlingException")));
        assert!(passing(&service(
            400,
            "com.amazonaws.sqs#ThrottlingException"
        )));
        assert!(passing(&service(400, "RequestThrottled")));
        assert!(passing(&service(500, "InternalServerError")));
        assert!(passing(&service(503, "ServiceUnavailable")));
        assert!(passing(
            &SdkError::<ReceiveMessageError, HttpResponse>::timeout_error("slow")
        ));
        assert!(!passing(&service(
            400,
            "AWS.SimpleQueueService.NonExistentQueue"
        )));
        assert!(!passing(&service(400, "QueueDoesNotExist")));
        assert!(!passing(&service(403, "AccessDenied")));
        assert!(!passing(
            &SdkError::<ReceiveMessageError, HttpResponse>::construction_failure("no region")
        ));
    }

    #[test]
    fn a_lost_connection_is_passing_missing_credentials_are_not() {
        use aws_smithy_runtime_api::client::result::ConnectorError;
        let dispatch =
            |c: ConnectorError| SdkError::<ReceiveMessageError, HttpResponse>::dispatch_failure(c);
        assert!(passing(&dispatch(ConnectorError::io(
            "connection refused".into()
        ))));
        assert!(passing(&dispatch(ConnectorError::timeout("slow".into()))));
        assert!(passing(&dispatch(ConnectorError::other(
            "connection closed before message completed".into(),
            Some(aws_smithy_types::retry::ErrorKind::TransientError)
        ))));
        assert!(!passing(&dispatch(ConnectorError::other(
            "no credentials in the chain".into(),
            None
        ))));
        assert!(passing(&service(403, "OverLimit")));
    }

    #[test]
    fn the_backoff_doubles_to_ten_seconds_and_starts_over_after_a_success() {
        let mut b = Backoff::default();
        let waits: Vec<u128> = (0..8).map(|_| b.wait().as_millis()).collect();
        assert!((200..=240).contains(&waits[0]), "{waits:?}");
        assert!((400..=480).contains(&waits[1]), "{waits:?}");
        assert!(waits[7] >= 10_000 && waits[7] <= 12_000, "{waits:?}");
        b.reset();
        assert!(b.wait().as_millis() <= 240);
    }

    #[test]
    fn a_cause_chain_is_one_line_without_debug() {
        let e = anyhow::anyhow!("connection refused").context("dispatch failure");
        let line = crate::cause_chain(e.as_ref());
        assert_eq!(line, "dispatch failure: connection refused");
    }
}
