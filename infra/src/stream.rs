//! A local event-source mapping for the payments table's DynamoDB stream: reads the stream
//! the way Lambda's DynamoDB trigger does (every shard from its trim horizon, in order), keeps
//! new outbox entries only (the template's filter: `INSERT` of `kind = outbox`), and runs the
//! same [`Relay`] the `outbox-relay` Lambda runs. A failed entry is read again from its own
//! sequence number after a pause, like a checkpointed batch; its successors come again too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use aws_sdk_dynamodbstreams::types::{AttributeValue, OperationType, Record, ShardIteratorType};
use payment_core::outbox::{OutboxEntry, Relay, OUTBOX_KIND};
use tracing::warn;

/// Counts of a running mapping.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Outbox entries the queue accepted.
    pub relayed: AtomicU64,
    /// Relay passes that failed and were retried.
    pub retries: AtomicU64,
}

/// A running mapping; stops when dropped.
pub struct StreamMapping {
    task: tokio::task::JoinHandle<()>,
    /// What it did so far.
    pub stats: Arc<StreamStats>,
}

impl Drop for StreamMapping {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn entry_of(record: &Record) -> Option<(String, OutboxEntry)> {
    if record.event_name() != Some(&OperationType::Insert) {
        return None;
    }
    let change = record.dynamodb()?;
    let image = change.new_image()?;
    let text = |k: &str| match image.get(k) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    };
    if text("kind").as_deref() != Some(OUTBOX_KIND) {
        return None;
    }
    let created_at = match image.get("created_at") {
        Some(AttributeValue::N(n)) => n.parse().ok()?,
        _ => return None,
    };
    Some((
        change.sequence_number()?.to_owned(),
        OutboxEntry {
            payment_id: text("payment_id")?,
            message: text("message")?,
            created_at,
            customer_id: text("customer_id")?,
        },
    ))
}

/// Starts relaying `table`'s stream with `relay`.
pub async fn start(
    sdk: &aws_config::SdkConfig,
    table: &str,
    relay: Arc<Relay>,
) -> Result<StreamMapping> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let streams = aws_sdk_dynamodbstreams::Client::new(sdk);
    let described = ddb
        .describe_table()
        .table_name(table)
        .send()
        .await
        .with_context(|| format!("describing the payments table {table}"))?;
    let stream_arn = described
        .table()
        .and_then(|t| t.latest_stream_arn())
        .ok_or_else(|| {
            anyhow!("the payments table {table} has no stream: its StreamSpecification is missing")
        })?
        .to_owned();
    let stats = Arc::new(StreamStats::default());
    let counts = stats.clone();
    let task = tokio::spawn(async move {
        let mut iterators: HashMap<String, Option<String>> = HashMap::new();
        loop {
            if let Err(e) = pass(&streams, &stream_arn, &relay, &mut iterators, &counts).await {
                warn!(error = %e, "reading the payments stream failed; retrying");
                counts.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    Ok(StreamMapping { task, stats })
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
    relay: &Relay,
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
            .await?;
        let (sequences, entries): (Vec<String>, Vec<OutboxEntry>) =
            out.records().iter().filter_map(entry_of).unzip();
        let report = relay.relay(&entries).await;
        stats
            .relayed
            .fetch_add(report.sent as u64, Ordering::Relaxed);
        let next = match report.first_failed {
            Some(i) => {
                // Read again from the failed entry, as a checkpointed batch would be.
                stats.retries.fetch_add(1, Ordering::Relaxed);
                warn!(errors = ?report.errors, "relay failed; the entry and its successors come again");
                tokio::time::sleep(Duration::from_millis(500)).await;
                iterator(streams, stream_arn, &shard, Some(&sequences[i])).await?
            }
            None => out.next_shard_iterator().map(str::to_owned),
        };
        iterators.insert(shard, next);
    }
    Ok(())
}
