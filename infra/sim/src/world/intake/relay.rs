//! Lambda's event-source mapping on the payments table's stream, feeding the outbox relay (the
//! `outbox-relay` function's own code, `payment_core::payments::outbox::relay_stream_batch`):
//! the records after its checkpoint that the template's filter keeps, in batches of its
//! `BatchSize` gathered over its batching window, one invocation at a time (one shard,
//! `ParallelizationFactor` 1); a batch whose invocation is killed (a crash, its timeout) is
//! split in two and tried again (`BisectBatchOnFunctionError`), one that reports a failed record
//! goes on from that record, and one that keeps failing past `MaximumRetryAttempts` or
//! `MaximumRecordAgeInSeconds` is given up: a record of it to the on-failure destination.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use aws_lambda_events::event::dynamodb::Event;
use payctl::template::StreamSource;
use payment_core::payments::outbox::Relay;
use serde_json::{json, Value as Json};

use super::super::checks::check_now;
use super::super::World;
use crate::sqs::url_of;

/// Lambda's pause before it sends a failed batch again (it documents none; the model's).
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The relay's function and its stream mapping.
pub(in crate::world) struct Mapping {
    /// The mapping's settings, from the template.
    pub(in crate::world) source: StreamSource,
    /// The filter's patterns.
    filters: Vec<Json>,
    /// The relay, as its function's init builds it.
    relay: Arc<Relay>,
    /// The payments queue it sends to.
    queue_url: String,
    /// Its FIFO groups.
    group_by: payment_core::payments::outbox::GroupBy,
}

/// The outbox relay of the provisioned stack and its stream mapping.
pub(in crate::world) fn build(
    stack: &payctl::template::Stack,
    sdk: &aws_config::SdkConfig,
    clock: &Arc<dyn sqs_once::clock::Clock>,
) -> Result<Mapping> {
    let source = stack
        .stream_sources
        .get("OutboxRelayFunction")
        .context("the template has no stream mapping for OutboxRelayFunction")?
        .clone();
    let env = stack
        .function_envs
        .get("OutboxRelayFunction")
        .context("the template has no OutboxRelayFunction")?;
    let config = payment_core::edges::config::RelayConfig::from_lookup(|k| env.get(k).cloned())
        .context("OutboxRelayFunction's configuration")?;
    // `build_relay`'s relay, on clients with their own retry quota (as each process has).
    let mut relay = Relay::new(
        crate::wire::sqs_client(sdk),
        config.queue_url.clone(),
        config.group_by,
    );
    if let Some(table) = &config.idempotency_table {
        relay = relay.with_marks(
            Arc::new(payment_core::payment_store(
                crate::wire::dynamodb_client(sdk),
                table,
            )),
            Arc::clone(clock),
        );
    }
    let filters = source
        .filters
        .iter()
        .map(|p| {
            let pattern: Json =
                serde_json::from_str(p).context("a filter pattern that is not JSON")?;
            // The model matches exact values only: a pattern beyond them would drop every record.
            crate::eventbridge::supported(&pattern)
                .map_err(|e| anyhow::anyhow!("the relay's filter {p}: {e}"))?;
            Ok(pattern)
        })
        .collect::<Result<Vec<Json>>>()?;
    Ok(Mapping {
        source,
        filters,
        relay: Arc::new(relay),
        queue_url: config.queue_url,
        group_by: config.group_by,
    })
}

/// The relay `payctl outbox republish` sends with: the relay's own code, to the same queue.
pub(in crate::world) fn build_for_operator(
    sdk: &aws_config::SdkConfig,
    m: &Mapping,
) -> Result<Relay> {
    Ok(Relay::new(
        crate::wire::sqs_client(sdk),
        m.queue_url.clone(),
        m.group_by,
    ))
}

/// The stream's records after `next` that the filter keeps, up to `limit`, and the sequence
/// after the last record looked at (a filtered record is passed by, as Lambda drops it); the
/// records the stream's 24 hours trimmed before they were read are counted.
fn read(
    w: &World,
    m: &Mapping,
    next: &mut u64,
    limit: usize,
    until: Option<u64>,
) -> (Vec<(u64, i64, Json)>, u64) {
    let aws = w.wire.aws.lock().expect("aws");
    let Some(t) = aws.dynamo.tables.get(&m.source.table) else {
        return (Vec::new(), *next);
    };
    let mut lost = 0;
    if let Some(first) = t.first_sequence() {
        if first > *next {
            lost = first - *next;
            *next = first;
        }
    }
    let arn = format!(
        "arn:aws:dynamodb:us-east-1:000000000000:table/{}/stream/1970-01-01T00:00:00.000",
        t.name
    );
    let mut kept = Vec::new();
    let mut after = *next;
    for c in t.changes_from(*next) {
        if kept.len() >= limit || until.is_some_and(|u| c.sequence > u) {
            break;
        }
        after = c.sequence + 1;
        let mut record = t.record_of(c);
        if m.filters.is_empty()
            || m.filters
                .iter()
                .any(|p| crate::eventbridge::matches(p, &record))
        {
            record["eventSourceARN"] = json!(arn);
            kept.push((c.sequence, c.at_s, record));
        }
    }
    drop(aws);
    if lost > 0 {
        let mut s = w.stats.lock().expect("stats");
        s.relay_trimmed += lost;
        s.relay_alarm = true;
        w.note(format!(
            "relay: {lost} stream records trimmed before they were read"
        ));
    }
    (kept, after)
}

/// Runs the mapping until `end_ms`.
pub(in crate::world) async fn stream_source(w: Arc<World>, m: Arc<Mapping>, end_ms: i64) {
    let streamed = {
        let aws = w.wire.aws.lock().expect("aws");
        match aws.dynamo.tables.get(&m.source.table) {
            Some(t) => Arc::clone(&t.streamed),
            None => return,
        }
    };
    let batch = m.source.batch_size.max(1) as usize;
    let window = Duration::from_secs(m.source.batching_window_seconds.max(0) as u64);
    // TRIM_HORIZON from the stack's start: the table's first change (sequence 1), so that
    // records trimmed before the first read are counted lost too.
    let mut next: u64 = 1;
    let mut size = batch;
    let mut attempts: i32 = 0;
    // While a batch is retried: its last record (a retry is of what is left of it, not of
    // records that came after it).
    let mut retrying: Option<u64> = None;
    while w.running(end_ms) {
        let dynamo_down = {
            let aws = w.wire.aws.lock().expect("aws");
            let f = &aws.dynamo_faults;
            (f.outage_from_ms..f.outage_until_ms).contains(&w.clock.now_ms())
        };
        if dynamo_down {
            tokio::time::sleep(Duration::from_secs(10)).await;
            continue;
        }
        let notified = streamed.notified();
        let (mut records, mut after) = read(&w, &m, &mut next, size, retrying);
        if records.is_empty() {
            next = after;
            retrying = None;
            let left = (end_ms - w.clock.now_ms()).max(1) as u64;
            let _ = tokio::time::timeout(Duration::from_millis(left), notified).await;
            continue;
        }
        if retrying.is_none() && records.len() < size && !window.is_zero() {
            // The batching window: gather for it, then take what is there.
            tokio::time::sleep(window).await;
            (records, after) = read(&w, &m, &mut next, size, retrying);
            if records.is_empty() {
                // Trimmed meanwhile (a mapping a day behind).
                next = after;
                continue;
            }
        }
        let oldest_s = records.first().map_or(0, |r| r.1);
        let age_s = w.clock.now_ms() / 1000 - oldest_s;
        if age_s > 60 && !w.stats.lock().expect("stats").relay_alarm {
            w.stats.lock().expect("stats").relay_alarm = true;
            w.note(format!("alarm: the relay's iterator is {age_s} s behind"));
        }
        let max_age = m.source.maximum_record_age_seconds;
        let max_attempts = m.source.maximum_retry_attempts;
        if (max_age >= 0 && age_s > i64::from(max_age))
            || (max_attempts >= 0 && attempts > max_attempts)
        {
            give_up(&w, &m, &records);
            next = after;
            attempts = 0;
            size = batch;
            if retrying.is_some_and(|r| after > r) {
                retrying = None;
            }
            continue;
        }
        let sequences: Vec<u64> = records.iter().map(|r| r.0).collect();
        let last = sequences[sequences.len() - 1];
        match invoke(&w, &m, records).await {
            Some(None) => {
                next = after;
                attempts = 0;
                size = batch;
                if retrying.is_some_and(|r| after > r) {
                    retrying = None;
                }
            }
            Some(Some(failed)) if sequences.contains(&failed) => {
                // ReportBatchItemFailures: what came before the failed record is done.
                next = failed;
                attempts += 1;
                retrying = Some(retrying.unwrap_or(last).max(last));
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            // A function error, or a failure naming no record of the batch (Lambda takes that
            // as the whole batch failing).
            _ => {
                retrying = Some(retrying.unwrap_or(last).max(last));
                if m.source.bisect_on_error && sequences.len() > 1 {
                    size = sequences.len().div_ceil(2);
                    attempts = 0;
                } else {
                    attempts += 1;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        check_now(&w);
    }
}

/// The mapping gives a batch up: a record of it to the on-failure destination (while SQS
/// takes one), the batch's rows left to `payctl outbox republish`.
fn give_up(w: &World, m: &Mapping, records: &[(u64, i64, Json)]) {
    let (first, last) = (records[0].0, records[records.len() - 1].0);
    let body = json!({
        "requestContext": {"condition": "RetryAttemptsExhausted", "functionArn": "OutboxRelayFunction"},
        "DDBStreamBatchInfo": {"shardId": "shardId-00000000000000000001-00000001", "startSequenceNumber": format!("{first:021}"), "endSequenceNumber": format!("{last:021}"), "batchSize": records.len()},
    });
    let sent = m.source.on_failure_queue_url.as_deref().is_some_and(|url| {
        let mut aws = w.wire.aws.lock().expect("aws");
        let now = w.clock.now_ms();
        !aws.sqs_down(now)
            && aws
                .sqs
                .send(
                    &url_of(url.rsplit('/').next().unwrap_or_default()),
                    &body.to_string(),
                    Default::default(),
                    None,
                    None,
                    None,
                    now,
                )
                .is_ok()
    });
    {
        let mut s = w.stats.lock().expect("stats");
        s.relay_given_up += records.len() as u64;
        s.relay_alarm = true;
    }
    w.note(format!(
        "relay: gave up on {} records ({first}..={last}); on-failure record {}",
        records.len(),
        if sent {
            "sent"
        } else {
            "lost (SQS refused it)"
        }
    ));
}

/// One invocation of the relay: `Some(None)` when the batch is done, `Some(Some(sequence))`
/// when it reported a failed record, `None` when it was killed (a crash or its timeout).
async fn invoke(
    w: &Arc<World>,
    m: &Arc<Mapping>,
    records: Vec<(u64, i64, Json)>,
) -> Option<Option<u64>> {
    let n = records.len();
    let event: Event = match serde_json::from_value(json!({
        "Records": records.into_iter().map(|r| r.2).collect::<Vec<_>>()
    })) {
        Ok(e) => e,
        Err(e) => {
            w.violated(
                "relay_event",
                format!("Lambda's stream event did not parse: {e}"),
            );
            return None;
        }
    };
    {
        let mut s = w.stats.lock().expect("stats");
        s.relay_invocations += 1;
    }
    let timeout = Duration::from_secs(m.source.function_timeout_seconds.max(1) as u64);
    let limit = if w.draw() < w.opts.crash_rate {
        Duration::from_secs_f64((-(1.0 - w.draw()).ln()).min(timeout.as_secs_f64()))
    } else {
        timeout
    };
    let relay = Arc::clone(&m.relay);
    let run = tokio::spawn(async move {
        payment_core::payments::outbox::relay_stream_batch(&relay, event).await
    });
    let abort = run.abort_handle();
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(response)) => {
            let failed = checkpoint(&response);
            w.note(format!("relay: invocation of {n}: failed from {failed:?}"));
            Some(failed)
        }
        _ => {
            abort.abort();
            w.stats.lock().expect("stats").killed += 1;
            w.note(format!("relay: invocation of {n} killed after {limit:?}"));
            None
        }
    }
}

/// Where the mapping goes on from after a batch's answer: `None` when the batch is done, else
/// the lowest sequence reported; a null, empty or unreadable identifier among them fails the
/// whole batch, whatever else was reported (`u64::MAX`, in no batch): Lambda's documented rule
/// for `ReportBatchItemFailures` on a stream.
fn checkpoint(response: &aws_lambda_events::event::streams::DynamoDbEventResponse) -> Option<u64> {
    let ids: Option<Vec<u64>> = response
        .batch_item_failures
        .iter()
        .map(|f| {
            f.item_identifier
                .as_deref()
                .and_then(|s| s.parse::<u64>().ok())
        })
        .collect();
    match ids {
        Some(ids) => ids.into_iter().min(),
        None => Some(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoint;
    use aws_lambda_events::event::streams::DynamoDbEventResponse;

    fn answer(ids: &[Option<&str>]) -> DynamoDbEventResponse {
        serde_json::from_value(serde_json::json!({
            "batchItemFailures": ids.iter().map(|id| serde_json::json!({"itemIdentifier": id})).collect::<Vec<_>>()
        }))
        .expect("a stream response")
    }

    #[test]
    fn a_batch_goes_on_from_its_lowest_reported_record() {
        assert_eq!(checkpoint(&answer(&[])), None);
        assert_eq!(
            checkpoint(&answer(&[Some("00000000000000000007"), Some("5")])),
            Some(5)
        );
    }

    #[test]
    fn an_unreadable_identifier_fails_the_whole_batch_even_beside_a_valid_one() {
        for bad in [None, Some(""), Some("not-a-sequence")] {
            assert_eq!(
                checkpoint(&answer(&[Some("5"), bad])),
                Some(u64::MAX),
                "{bad:?}"
            );
            assert_eq!(checkpoint(&answer(&[bad])), Some(u64::MAX), "{bad:?}");
        }
    }
}
