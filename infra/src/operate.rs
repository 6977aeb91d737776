//! What `payctl run` needs around the processor to be an operator's tool: a start-up check that
//! names the missing resource and the fix in one line (instead of an SDK error dump on the first
//! payment), progress lines while it works, and a summary that it prints however it stops, with
//! an exit status that says whether anything succeeded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use aws_sdk_sqs::types::QueueAttributeName;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::esm::EsmStats;

/// Where the SDK sends its calls, for messages: `AWS_ENDPOINT_URL`, or AWS and the region.
pub fn endpoint(sdk: &aws_config::SdkConfig) -> String {
    std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| {
        format!(
            "AWS ({})",
            sdk.region()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "no region set".into())
        )
    })
}

/// One line for an SDK error about `resource`: what is wrong and what to do, never the SDK's
/// debug dump.
pub fn explain<E, R>(e: &SdkError<E, R>, resource: &str, endpoint: &str) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let message = e.message().unwrap_or_default();
    match e.code() {
        Some("ResourceNotFoundException")
        | Some("AWS.SimpleQueueService.NonExistentQueue")
        | Some("QueueDoesNotExist") => format!(
            "{resource} does not exist at {endpoint}: create it (payctl provision locally, sam deploy on AWS) or fix the name"
        ),
        Some(
            code @ ("AccessDeniedException" | "AccessDenied" | "UnrecognizedClientException"
            | "InvalidClientTokenId" | "ExpiredTokenException"),
        ) => format!(
            "{resource}: access refused by {endpoint} ({code}: {message}): check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID) and their IAM policy"
        ),
        Some(code) => format!("{resource}: {code} from {endpoint}: {message}"),
        None => {
            let chain = aws_sdk_sqs::error::DisplayErrorContext(e).to_string();
            let lower = chain.to_lowercase();
            if lower.contains("credential") || lower.contains("imds") {
                format!(
                    "{resource}: no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE; for a local emulator also AWS_ENDPOINT_URL (the local scripts write all of them to .local/env)"
                )
            } else if lower.contains("connection refused")
                || lower.contains("dns error")
                || lower.contains("timed out")
                || lower.contains("timeout")
            {
                format!(
                    "{resource}: {endpoint} does not answer: is the emulator running, and is AWS_ENDPOINT_URL right?"
                )
            } else {
                format!("{resource}: the call to {endpoint} failed: {e}")
            }
        }
    }
}

/// Fails with one line naming the table (as `resource` describes it) and the fix when it
/// cannot be described.
pub async fn check_table(sdk: &aws_config::SdkConfig, table: &str, resource: &str) -> Result<()> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    if let Err(e) = ddb.describe_table().table_name(table).send().await {
        bail!(explain(&e, resource, &endpoint(sdk)));
    }
    Ok(())
}

/// Fails with one line naming the queue (as `resource` describes it) and the fix when its
/// attributes cannot be read.
pub async fn check_queue(sdk: &aws_config::SdkConfig, url: &str, resource: &str) -> Result<()> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    if let Err(e) = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
    {
        bail!(explain(&e, resource, &endpoint(sdk)));
    }
    Ok(())
}

/// Fails fast, naming the variable and the fix, when the processor's table or queues cannot be
/// reached: `DescribeTable` and `GetQueueAttributes` before the first message is received.
pub async fn check_processor_resources(
    sdk: &aws_config::SdkConfig,
    table: &str,
    queue_url: &str,
    dlq_url: &str,
) -> Result<()> {
    check_table(
        sdk,
        table,
        &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    check_queue(
        sdk,
        queue_url,
        &format!("the payments queue {queue_url} (PAYMENTS_QUEUE_URL)"),
    )
    .await?;
    check_queue(
        sdk,
        dlq_url,
        &format!("the dead-letter queue {dlq_url} (DEAD_LETTER_QUEUE_URL)"),
    )
    .await?;
    Ok(())
}

/// What a `payctl run` did, as printed and as `--json` writes it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Batches handed to the processor.
    pub invocations: u64,
    /// Deliveries received (a message that came back counts again).
    pub received: u64,
    /// Payments charged.
    pub charged: u32,
    /// Payments declined (recorded, final).
    pub declined: u32,
    /// Refunds made (a refund run).
    pub refunded: u32,
    /// Copies of finished payments acknowledged without a charge.
    pub duplicates: u32,
    /// Deliveries handed back to come again later.
    pub retried: u32,
    /// Messages dead-lettered, by `error_code`.
    pub dead_lettered: BTreeMap<String, u32>,
    /// Invocations that hit the function timeout.
    pub timeouts: u64,
    /// Invocations that failed as a whole.
    pub function_errors: u64,
    /// Stopped by Ctrl-C before the queue drained.
    pub interrupted: bool,
}

impl RunSummary {
    /// The summary of what the mapping counted.
    pub fn of(stats: &EsmStats, interrupted: bool) -> Self {
        Self {
            invocations: stats.invocations,
            received: stats.received,
            charged: stats.summary.done(payment_core::charge::labels::CHARGED),
            declined: stats.summary.done(payment_core::charge::labels::DECLINED),
            refunded: stats.summary.done(payment_core::refund::REFUNDED),
            duplicates: stats.summary.duplicates,
            retried: stats.summary.retried,
            dead_lettered: stats
                .summary
                .dead_lettered
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            timeouts: stats.timeouts,
            function_errors: stats.function_errors,
            interrupted,
        }
    }

    /// Nothing was handled and something failed: the run's exit status is then non-zero.
    /// Handled: charged, declined, a duplicate, or dead-lettered for what the message itself
    /// is (bad input, a reused key, the provider's refusal, too old). Failed: handed back to
    /// come again, given up on (`retries_exhausted`), left unknown (`outcome_unknown`), timed
    /// out, or a whole batch failed (a wrong table or queue, provider down, a bad key).
    pub fn all_failed(&self) -> bool {
        let for_content = |code: &str| crate::dlq::never_redriven(code).is_some();
        let handled = (self.charged + self.declined + self.refunded + self.duplicates) as u64
            + self
                .dead_lettered
                .iter()
                .filter(|(code, _)| for_content(code))
                .map(|(_, n)| *n as u64)
                .sum::<u64>();
        let failed = self.retried as u64
            + self
                .dead_lettered
                .iter()
                .filter(|(code, _)| !for_content(code))
                .map(|(_, n)| *n as u64)
                .sum::<u64>()
            + self.timeouts
            + self.function_errors;
        handled == 0 && failed > 0
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let dead: u32 = self.dead_lettered.values().sum();
        let codes = if self.dead_lettered.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                self.dead_lettered
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!(
            "{}{} deliveries in {} batches: {}{} charged, {} declined, {} duplicates, {} retried later, {} dead-lettered{codes}; {} timeouts, {} failed batches",
            if self.interrupted { "interrupted: " } else { "" },
            self.received,
            self.invocations,
            if self.refunded > 0 {
                format!("{} refunded, ", self.refunded)
            } else {
                String::new()
            },
            self.charged,
            self.declined,
            self.duplicates,
            self.retried,
            dead,
            self.timeouts,
            self.function_errors
        )
    }
}

/// Prints a progress line to stderr every `every`, with the queue's own counts, until dropped.
pub fn progress(
    stats: Arc<Mutex<EsmStats>>,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let s = RunSummary::of(&*stats.lock().await, false);
            let counts = queue_counts(&sqs, &queue_url).await;
            eprintln!("{} | queue: {counts}", s.line());
        }
    })
}

async fn queue_counts(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> String {
    match crate::esm::queue_counts(sqs, queue_url).await {
        Ok([waiting, in_flight, delayed]) => {
            format!("{waiting} waiting, {in_flight} in flight, {delayed} delayed")
        }
        Err(_) => "counts unavailable".into(),
    }
}

/// An epoch-ms time as UTC, `2026-12-01T05:57:19.489Z`, for people reading operator output.
pub fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms since 1970"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_reads_epoch_milliseconds() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(1_796_102_405_123), "2026-12-01T05:20:05.123Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
