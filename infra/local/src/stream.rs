//! A local event-source mapping for a table's DynamoDB stream: reads the stream the way
//! Lambda's DynamoDB trigger does (every shard from its trim horizon, in order), keeps the
//! records the handler's filter wants (the mapping's filter criteria), and hands them to the
//! handler in order. A failed record is read again from its own sequence number after a pause,
//! like a checkpointed batch with `ReportBatchItemFailures`; its successors come again too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use aws_sdk_dynamodbstreams::types::{Record, ShardIteratorType};
use tracing::warn;

/// What the mapping runs: the stream's function.
#[async_trait::async_trait]
pub trait StreamHandler: Send + Sync {
    /// Keeps a record for the handler (the filter criteria); the others are skipped.
    fn wants(&self, record: &Record) -> bool;
    /// Handles records in stream order.
    async fn handle(&self, records: &[Record]) -> Handled;
}

/// What a handler made of its records.
#[derive(Debug, Default)]
pub struct Handled {
    /// Records done (before the first failure).
    pub done: usize,
    /// The first record that failed: it and its successors are read again.
    pub first_failed: Option<usize>,
    /// Why, for the log.
    pub errors: Vec<String>,
}

/// Counts of a running mapping.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Records the handler did.
    pub handled: AtomicU64,
    /// Passes that failed and were retried.
    pub retries: AtomicU64,
}

/// A running mapping; stops at once when dropped, or after the records it is handling with
/// [`StreamMapping::stop`].
pub struct StreamMapping {
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
    /// What it did so far.
    pub stats: Arc<StreamStats>,
}

impl StreamMapping {
    /// Reads no more: the records being handled are finished, then the mapping ends. What it
    /// did is in `stats`.
    pub async fn stop(mut self) -> Result<Arc<StreamStats>> {
        let _ = self.stop.send(true);
        (&mut self.task).await?;
        Ok(self.stats.clone())
    }
}

impl Drop for StreamMapping {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts running `handler` on `table`'s stream.
pub async fn start(
    sdk: &aws_config::SdkConfig,
    table: &str,
    handler: Arc<dyn StreamHandler>,
) -> Result<StreamMapping> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let streams = aws_sdk_dynamodbstreams::Client::new(sdk);
    let described = ddb
        .describe_table()
        .table_name(table)
        .send()
        .await
        .with_context(|| format!("describing the table {table}"))?;
    let stream_arn = described
        .table()
        .and_then(|t| t.latest_stream_arn())
        .ok_or_else(|| {
            anyhow!("the table {table} has no stream: its StreamSpecification is missing")
        })?
        .to_owned();
    let stats = Arc::new(StreamStats::default());
    let counts = stats.clone();
    let (stop, mut stopping) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut iterators: HashMap<String, Option<String>> = HashMap::new();
        while !*stopping.borrow() {
            let pause = match pass(&streams, &stream_arn, &*handler, &mut iterators, &counts).await
            {
                Ok(()) => Duration::from_millis(100),
                Err(e) => {
                    // The whole chain: "describing the stream ...: dispatch failure: Connection
                    // refused", not its first line alone.
                    warn!(
                        error = format!("{e:#}"),
                        "reading the stream failed; retrying"
                    );
                    counts.retries.fetch_add(1, Ordering::Relaxed);
                    Duration::from_millis(600)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stopping.wait_for(|s| *s) => {}
            }
        }
    });
    Ok(StreamMapping { task, stop, stats })
}

async fn iterator(
    streams: &aws_sdk_dynamodbstreams::Client,
    stream_arn: &str,
    shard: &str,
    at: Option<&str>,
) -> Result<Option<String>> {
    let mut request = streams
        .get_shard_iterator()
        .stream_arn(stream_arn)
        .shard_id(shard);
    request = match at {
        Some(sequence) => request
            .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
            .sequence_number(sequence),
        None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    Ok(request.send().await?.shard_iterator().map(str::to_owned))
}

/// The stream's shards, open and closed.
pub async fn shard_ids(
    streams: &aws_sdk_dynamodbstreams::Client,
    stream_arn: &str,
) -> Result<Vec<String>> {
    let described = streams
        .describe_stream()
        .stream_arn(stream_arn)
        .send()
        .await
        .with_context(|| format!("describing the stream {stream_arn}"))?;
    Ok(described
        .stream_description()
        .map(|d| {
            d.shards()
                .iter()
                .filter_map(|s| s.shard_id().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// One read of every shard (closed shards that are drained are left alone).
async fn pass(
    streams: &aws_sdk_dynamodbstreams::Client,
    stream_arn: &str,
    handler: &dyn StreamHandler,
    iterators: &mut HashMap<String, Option<String>>,
    stats: &StreamStats,
) -> Result<()> {
    for shard in shard_ids(streams, stream_arn).await? {
        if !iterators.contains_key(&shard) {
            let it = iterator(streams, stream_arn, &shard, None).await?;
            iterators.insert(shard.clone(), it);
        }
        let Some(Some(it)) = iterators.get(&shard).cloned() else {
            continue; // a closed shard, read to its end
        };
        let out = streams
            .get_records()
            .shard_iterator(it)
            .limit(100)
            .send()
            .await
            .with_context(|| format!("reading the shard {shard} of {stream_arn}"))?;
        let records: Vec<Record> = out
            .records()
            .iter()
            .filter(|r| handler.wants(r))
            .cloned()
            .collect();
        let report = handler.handle(&records).await;
        stats
            .handled
            .fetch_add(report.done as u64, Ordering::Relaxed);
        let next = match report.first_failed.and_then(|i| records.get(i)) {
            Some(failed) => {
                // Read again from the failed record, as a checkpointed batch would be.
                stats.retries.fetch_add(1, Ordering::Relaxed);
                warn!(errors = ?report.errors, "the handler failed; the record and its successors come again");
                tokio::time::sleep(Duration::from_millis(500)).await;
                let sequence = failed
                    .dynamodb()
                    .and_then(|c| c.sequence_number())
                    .context("a stream record without a sequence number")?;
                iterator(streams, stream_arn, &shard, Some(sequence)).await?
            }
            None => out.next_shard_iterator().map(str::to_owned),
        };
        iterators.insert(shard, next);
    }
    Ok(())
}
