//! A local event-source mapping: polls an SQS queue the way Lambda's SQS trigger does and runs
//! the processor's handler, in-process or as `bootstrap` processes behind a local Runtime API.
//!
//! Like Lambda it receives batches (up to `batch_size`, gathering for up to the batching
//! window), builds the SQS event records (`eventSourceARN`, `SentTimestamp`,
//! `ApproximateReceiveCount`, message attributes), gives each invocation the function timeout as
//! its deadline, and with `ReportBatchItemFailures` deletes exactly the messages that were not
//! reported. A timed-out invocation deletes nothing: its messages come back after the
//! visibility timeout, as on Lambda.
//!
//! Like Lambda's pollers it rides out a passing AWS failure (throttled, a `5xx`, a timeout, a
//! lost answer): it backs off and polls again, and a delete that keeps failing leaves its
//! messages to come back (the record absorbs them). Only what polling again cannot fix (a queue
//! that does not exist, access refused) or the run's time limit ends it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::get_queue_attributes::GetQueueAttributesError;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use sqs_once::runner::now_ms;
use sqs_once::{BatchRunner, BatchSummary, Work};
use tokio::sync::Mutex;
use tracing::{info, warn};

pub use crate::sqs_event::to_record;

use crate::faults::{delete_processed, ride_out, Backoff};
use crate::runtime_api::RuntimeApi;

/// A batch handler in this process: any `sqs_once::BatchRunner`.
#[async_trait::async_trait]
pub trait InProcessHandler: Send + Sync {
    /// Handles one batch before `deadline_ms`.
    async fn handle(
        &self,
        records: Vec<SqsMessage>,
        deadline_ms: i64,
    ) -> (SqsBatchResponse, BatchSummary);
}

/// A runner shared by the pollers.
struct Runner<W: Work>(Arc<BatchRunner<W>>);

#[async_trait::async_trait]
impl<W: Work> InProcessHandler for Runner<W> {
    async fn handle(
        &self,
        records: Vec<SqsMessage>,
        deadline_ms: i64,
    ) -> (SqsBatchResponse, BatchSummary) {
        self.0.handle_batch(records, deadline_ms).await
    }
}

/// What the mapping invokes.
#[derive(Clone)]
pub enum Function {
    /// A runner's handler in this process, shared by all pollers.
    InProcess(Arc<dyn InProcessHandler>),
    /// Function processes, one per poller (an execution environment runs one invocation at a
    /// time), reached through their Runtime APIs.
    Processes(Vec<Arc<RuntimeApi>>),
}

impl<W: Work> From<Arc<BatchRunner<W>>> for Function {
    fn from(p: Arc<BatchRunner<W>>) -> Self {
        Function::InProcess(Arc::new(Runner(p)))
    }
}

/// One poller's function.
enum Target {
    InProcess(Arc<dyn InProcessHandler>),
    Process(Arc<RuntimeApi>),
}

/// What an invocation came back with.
enum Answer {
    Response(SqsBatchResponse, Option<BatchSummary>),
    FunctionError(String),
}

impl Target {
    async fn call(&self, records: Vec<SqsMessage>, deadline_ms: i64) -> Result<Answer> {
        match self {
            Target::InProcess(p) => {
                let (response, summary) = p.handle(records, deadline_ms).await;
                if summary.unreportable > 0 {
                    // As the function does: the whole batch comes back.
                    return Ok(Answer::FunctionError(format!(
                        "{} message(s) without a messageId must be redelivered",
                        summary.unreportable
                    )));
                }
                Ok(Answer::Response(response, Some(summary)))
            }
            Target::Process(api) => {
                let mut event = SqsEvent::default();
                event.records = records;
                match api.invoke(serde_json::to_vec(&event)?, deadline_ms).await? {
                    Ok(body) => Ok(Answer::Response(
                        serde_json::from_slice(&body)
                            .context("the function's answer is not an SQS batch response")?,
                        None,
                    )),
                    Err(e) => Ok(Answer::FunctionError(e)),
                }
            }
        }
    }
}

/// How to poll.
#[derive(Debug, Clone)]
pub struct EsmOptions {
    /// Queue to poll.
    pub queue_url: String,
    /// Messages per invocation, 1 to 10.
    pub batch_size: i32,
    /// How long to gather a batch before invoking with fewer than `batch_size` messages.
    pub batching_window: Duration,
    /// Visibility timeout of received messages; `None` uses the queue's (as Lambda does).
    pub visibility_timeout: Option<i32>,
    /// Invocation timeout: the handler's deadline, and its hard stop.
    pub function_timeout: Duration,
    /// With `ReportBatchItemFailures`; without it any failure returns the whole batch.
    pub report_batch_item_failures: bool,
    /// Concurrent pollers (Lambda scales these with the queue).
    pub pollers: usize,
    /// Stop when the queue is drained (nothing visible, in flight or delayed).
    pub until_empty: bool,
    /// Give up after this long (an error: something never drained).
    pub max_duration: Duration,
}

/// Totals of a run.
#[derive(Debug, Default, Clone)]
pub struct EsmStats {
    /// Invocations made.
    pub invocations: u64,
    /// Invocations that hit the function timeout.
    pub timeouts: u64,
    /// Messages received (deliveries, not distinct messages).
    pub received: u64,
    /// Invocations that ended in a function error (their whole batch comes back).
    pub function_errors: u64,
    /// The handler's own counts, summed.
    pub summary: BatchSummary,
    /// Billed duration of the invocations, ms: each invocation's time from invoke to answer,
    /// rounded up to the millisecond as Lambda bills it.
    pub billed_ms: u64,
    /// When each deleted message was deleted (ms since the epoch): its acknowledgement.
    pub acked_at_ms: Vec<i64>,
    /// Messages received and handed to the function, not yet answered: what a run stopped at
    /// once leaves in flight (they come back after the queue's visibility timeout).
    pub in_flight: u64,
    /// Messages of the invocations that timed out or failed whole: all come back.
    pub in_failed_batches: u64,
    /// Messages processed whose delete failed (after its tries): they come back after the
    /// visibility timeout, and their records absorb them.
    pub unacknowledged: u64,
    /// Passing AWS failures the pollers rode out (backed off and tried again).
    pub aws_failures: u64,
}

impl EsmStats {
    /// Messages deleted after a successful invocation.
    pub fn deleted(&self) -> u64 {
        self.acked_at_ms.len() as u64
    }

    /// Adds another run's totals to these.
    pub fn merge(&mut self, other: &EsmStats) {
        self.invocations += other.invocations;
        self.timeouts += other.timeouts;
        self.received += other.received;
        self.function_errors += other.function_errors;
        self.summary.merge(&other.summary);
        self.billed_ms += other.billed_ms;
        self.acked_at_ms.extend_from_slice(&other.acked_at_ms);
        self.in_failed_batches += other.in_failed_batches;
        self.unacknowledged += other.unacknowledged;
        self.aws_failures += other.aws_failures;
    }
}

/// Looks up the queue's ARN (the records' `eventSourceARN`).
pub async fn queue_arn(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Result<String> {
    sqs.get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .context("reading the queue ARN")?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .context("the endpoint returned no QueueArn")
}

/// Messages visible, in flight and delayed, as SQS approximates them.
pub async fn queue_counts(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Result<[i64; 3]> {
    counts(sqs, queue_url)
        .await
        .context("reading the queue depth")
}

async fn counts(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> Result<[i64; 3], SdkError<GetQueueAttributesError, HttpResponse>> {
    let names = [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        QueueAttributeName::ApproximateNumberOfMessagesDelayed,
    ];
    let out = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .set_attribute_names(Some(names.to_vec()))
        .send()
        .await?;
    let count = |k: &QueueAttributeName| {
        out.attributes()
            .and_then(|a| a.get(k))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    Ok([count(&names[0]), count(&names[1]), count(&names[2])])
}

/// Messages visible + in flight + delayed.
pub async fn queue_depth(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Result<i64> {
    Ok(queue_counts(sqs, queue_url).await?.iter().sum())
}

/// Polls until drained (with `until_empty`) or forever, invoking the function per batch.
pub async fn run(
    function: impl Into<Function>,
    sqs: aws_sdk_sqs::Client,
    opts: EsmOptions,
) -> Result<EsmStats> {
    let stats = Arc::new(Mutex::new(EsmStats::default()));
    run_observed(function, sqs, opts, stats.clone()).await?;
    let s = stats.lock().await.clone();
    Ok(s)
}

/// [`run`], counting into `stats` as it goes, so that a caller can show progress or a summary
/// when it stops the run.
pub async fn run_observed(
    function: impl Into<Function>,
    sqs: aws_sdk_sqs::Client,
    opts: EsmOptions,
    stats: Arc<Mutex<EsmStats>>,
) -> Result<()> {
    let (_keep, never) = tokio::sync::watch::channel(false);
    run_until(function, sqs, opts, stats, never).await
}

/// [`run_observed`] until `stop` turns true: from then on no poller receives again, and each
/// finishes the batch it holds (the function answers it, what it processed is acknowledged)
/// before it returns. A caller that wants to stop at once drops the future instead;
/// [`EsmStats::in_flight`] then says how many messages it left.
pub async fn run_until(
    function: impl Into<Function>,
    sqs: aws_sdk_sqs::Client,
    opts: EsmOptions,
    stats: Arc<Mutex<EsmStats>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let pollers = opts.pollers.max(1);
    let targets: Vec<Target> = match function.into() {
        Function::InProcess(p) => (0..pollers).map(|_| Target::InProcess(p.clone())).collect(),
        Function::Processes(apis) => {
            if apis.len() < pollers {
                bail!(
                    "{pollers} pollers need {pollers} function processes, got {}",
                    apis.len()
                );
            }
            apis.into_iter()
                .take(pollers)
                .map(Target::Process)
                .collect()
        }
    };
    let started = Instant::now();
    let (arn, failures) =
        crate::faults::queue_arn_riding_out(&sqs, &opts.queue_url, opts.max_duration).await?;
    stats.lock().await.aws_failures += failures;
    let region = sqs
        .config()
        .region()
        .map(|r| r.to_string())
        .unwrap_or_default();
    let mut pollers = Vec::new();
    for target in targets {
        let (sqs, opts, arn, region, stats, stop) = (
            sqs.clone(),
            opts.clone(),
            arn.clone(),
            region.clone(),
            stats.clone(),
            stop.clone(),
        );
        let mut stop = stop;
        pollers.push(tokio::spawn(async move {
            let mut idle = 0u32;
            let mut backoff = Backoff::default();
            let url = opts.queue_url.clone();
            loop {
                if *stop.borrow() {
                    return Ok(());
                }
                if started.elapsed() > opts.max_duration {
                    bail!("the queue did not drain within {:?}", opts.max_duration);
                }
                let batch = match receive_batch(&sqs, &opts).await {
                    Ok(batch) => batch,
                    Err(e) => {
                        let doing = "receiving messages from";
                        ride_out(e, doing, &url, &mut backoff, &mut stop).await?;
                        stats.lock().await.aws_failures += 1;
                        continue;
                    }
                };
                backoff.reset();
                if batch.is_empty() {
                    if opts.until_empty {
                        // Two empty looks in a row, so a message between receive and depth
                        // check is not missed.
                        match counts(&sqs, &url).await {
                            Ok(c) if c.iter().sum::<i64>() == 0 => {
                                idle += 1;
                                if idle >= 2 {
                                    return Ok(());
                                }
                            }
                            Ok(_) => idle = 0,
                            Err(e) => {
                                let doing = "reading the depth of";
                                ride_out(e, doing, &url, &mut backoff, &mut stop).await?;
                                stats.lock().await.aws_failures += 1;
                            }
                        }
                    }
                    continue;
                }
                idle = 0;
                invoke(&target, &sqs, &opts, &arn, &region, batch, &stats).await?;
            }
        }));
    }
    for p in pollers {
        p.await.context("poller task failed")??;
    }
    Ok(())
}

async fn receive_batch(
    sqs: &aws_sdk_sqs::Client,
    opts: &EsmOptions,
) -> Result<Vec<aws_sdk_sqs::types::Message>, SdkError<ReceiveMessageError, HttpResponse>> {
    let window_end = Instant::now() + opts.batching_window;
    let mut batch = Vec::new();
    loop {
        let want = (opts.batch_size.clamp(1, 10) as usize) - batch.len();
        let wait = if batch.is_empty() { 1 } else { 0 };
        let out = sqs
            .receive_message()
            .queue_url(&opts.queue_url)
            .max_number_of_messages(want as i32)
            .wait_time_seconds(wait)
            .set_visibility_timeout(opts.visibility_timeout)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await;
        let out = match out {
            Ok(out) => out,
            // Messages already received are invoked, not dropped: dropped, they would stay
            // invisible for the visibility timeout with a delivery counted against them.
            Err(e) if !batch.is_empty() => {
                warn!(error = %crate::faults::sdk_error_line(&e), messages = batch.len(), "receiving more messages for the batch failed; invoking with those received");
                return Ok(batch);
            }
            Err(e) => return Err(e),
        };
        let got = out.messages().len();
        batch.extend(out.messages().iter().cloned());
        if batch.len() >= opts.batch_size.clamp(1, 10) as usize
            || Instant::now() >= window_end
            || (got == 0 && batch.is_empty())
        {
            return Ok(batch);
        }
        if got == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn invoke(
    target: &Target,
    sqs: &aws_sdk_sqs::Client,
    opts: &EsmOptions,
    arn: &str,
    region: &str,
    batch: Vec<aws_sdk_sqs::types::Message>,
    stats: &Mutex<EsmStats>,
) -> Result<()> {
    let records: Vec<SqsMessage> = batch.iter().map(|m| to_record(m, arn, region)).collect();
    let deadline_ms = now_ms() + opts.function_timeout.as_millis() as i64;
    let n = records.len() as u64;
    stats.lock().await.in_flight += n;
    let invoked = Instant::now();
    let result =
        tokio::time::timeout(opts.function_timeout, target.call(records, deadline_ms)).await;
    let billed = invoked.elapsed().as_micros().div_ceil(1000) as u64;
    let mut s = stats.lock().await;
    s.in_flight -= n;
    s.invocations += 1;
    s.received += n;
    s.billed_ms += billed;
    let response = match result {
        Err(_) => {
            s.timeouts += 1;
            s.in_failed_batches += n;
            warn!(
                messages = n,
                "invocation timed out; its messages come back after the visibility timeout"
            );
            return Ok(());
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Answer::FunctionError(e))) => {
            s.function_errors += 1;
            s.in_failed_batches += n;
            warn!(messages = n, error = %e, "function error; the whole batch comes back");
            return Ok(());
        }
        Ok(Ok(Answer::Response(response, summary))) => {
            if let Some(summary) = summary {
                s.summary.merge(&summary);
            }
            response
        }
    };
    drop(s);
    let failed: std::collections::HashSet<String> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    if !failed.is_empty() && !opts.report_batch_item_failures {
        return Ok(()); // without partial batch responses the whole batch comes back
    }
    let to_delete: Vec<_> = batch
        .iter()
        .filter(|m| !failed.contains(m.message_id().unwrap_or_default()))
        .collect();
    for chunk in to_delete.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (ok, failures) = delete_processed(sqs, &opts.queue_url, entries.clone()).await;
        let at = now_ms();
        let mut s = stats.lock().await;
        s.aws_failures += failures;
        s.acked_at_ms.extend(std::iter::repeat_n(at, ok));
        s.unacknowledged += (entries.len() - ok) as u64;
    }
    info!(messages = n, failures = failed.len(), "invocation done");
    Ok(())
}
