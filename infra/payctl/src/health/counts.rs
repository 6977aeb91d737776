//! `payctl health`'s count of the records in the idempotency table, by work: from the sparse
//! index `OpenRecords` (the failed and unfinished records alone), or by a scan of the whole
//! table (`--scan-records`), with what the reading cost.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;

/// One work's records (payments, refunds, events) in the idempotency table: those that failed
/// and are not completed (read from the `OpenRecords` index), or every one (a scan).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecordHealth {
    /// Finished: an outcome is stored (`None`: not counted; only a scan counts them).
    pub completed: Option<u64>,
    /// Claimed by an attempt whose lease has not run out: being processed now.
    pub in_progress: u64,
    /// Claimed by an attempt whose lease ran out: a crash or a timeout; the next delivery
    /// takes it over.
    pub stalled: u64,
    /// The last attempt failed in a retryable way; the next delivery may claim it.
    pub failed: u64,
    /// Not finished, and a call's outcome is unknown (it may have reached the provider):
    /// settled by the next delivery's lookup, or by `payctl reconcile` once dead-lettered.
    pub unknown: u64,
    /// The oldest unfinished record's first attempt, seconds ago.
    pub oldest_unfinished_s: Option<u64>,
}

/// How the records were read.
#[derive(Debug, Clone, Serialize)]
pub struct RecordsRead {
    /// `index` (the failed and unfinished records, from `OpenRecords`) or `scan` (every
    /// record).
    pub how: String,
    /// The read units the reading consumed, as DynamoDB reported them.
    pub read_units: f64,
    /// Items read.
    pub items: u64,
}

/// The works whose records the table holds, by their key layouts.
fn works() -> [(&'static str, sqs_once::dynamo::KeyLayout); 3] {
    [
        ("payment", payment_core::payment_keys()),
        ("refund", payment_core::refund_keys()),
        ("event", payment_core::event_keys()),
    ]
}

/// Counts one record's status fields into its work's health.
fn count(r: &mut RecordHealth, item: &HashMap<String, AttributeValue>, now_ms: i64) {
    let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    let number = |k: &str| {
        item.get(k)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<i64>().ok())
    };
    match text("status").as_deref() {
        Some("COMPLETED") => {
            *r.completed.get_or_insert(0) += 1;
            return;
        }
        Some("IN_PROGRESS") if number("lease_expires_at").unwrap_or(0) > now_ms => {
            r.in_progress += 1
        }
        Some("IN_PROGRESS") => r.stalled += 1,
        _ => r.failed += 1,
    }
    let unknown = item
        .get("unknown_outcome")
        .and_then(|v| v.as_bool().ok())
        .copied()
        .unwrap_or(false);
    if unknown {
        r.unknown += 1;
    }
    if let Some(first) = number("first_attempt_at") {
        let age = ((now_ms - first).max(0) / 1000) as u64;
        r.oldest_unfinished_s = Some(r.oldest_unfinished_s.map_or(age, |a| a.max(age)));
    }
}

/// The records that failed and are not completed, by work, from the sparse index
/// `OpenRecords` (one query a work; its cost grows with those records, not the table).
pub(super) async fn open_records(
    sdk: &aws_config::SdkConfig,
    table: &str,
    now_ms: i64,
) -> Result<(BTreeMap<String, RecordHealth>, RecordsRead)> {
    use sqs_once::dynamo::{OPEN, OPEN_INDEX};
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let mut out = BTreeMap::new();
    let mut read = RecordsRead {
        how: "index".into(),
        read_units: 0.0,
        items: 0,
    };
    for (work, layout) in works() {
        let r: &mut RecordHealth = out.entry(work.to_owned()).or_default();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = ddb
                .query()
                .table_name(table)
                .index_name(OPEN_INDEX)
                .key_condition_expression("#o = :w")
                .expression_attribute_names("#o", OPEN)
                .expression_attribute_values(":w", AttributeValue::S(layout.record_prefix.clone()))
                .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "reading the {OPEN_INDEX} index of the idempotency table {table}: {} (a table made before the index: `payctl provision` or `sam deploy` adds it; `--scan-records` reads the records by a scan instead)",
                        aws_sdk_dynamodb::error::DisplayErrorContext(&e)
                    )
                })?;
            read.read_units += page
                .consumed_capacity()
                .and_then(|c| c.capacity_units())
                .unwrap_or(0.0);
            for item in page.items() {
                read.items += 1;
                count(r, item, now_ms);
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
    }
    Ok((out, read))
}

/// Every record of the table by work, from their status fields alone: a scan of the whole
/// table (`--scan-records`).
pub(super) async fn scan(
    sdk: &aws_config::SdkConfig,
    table: &str,
    now_ms: i64,
) -> Result<(BTreeMap<String, RecordHealth>, RecordsRead)> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let works = works();
    let mut out: BTreeMap<String, RecordHealth> = works
        .iter()
        .map(|(w, _)| {
            (
                (*w).to_owned(),
                RecordHealth {
                    completed: Some(0),
                    ..RecordHealth::default()
                },
            )
        })
        .collect();
    let mut read = RecordsRead {
        how: "scan".into(),
        read_units: 0.0,
        items: 0,
    };
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    loop {
        let page = ddb
            .scan()
            .table_name(table)
            .projection_expression("#pk, #s, unknown_outcome, lease_expires_at, first_attempt_at")
            .expression_attribute_names("#pk", "pk")
            .expression_attribute_names("#s", "status")
            .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .with_context(|| format!("scanning the idempotency table {table}"))?;
        read.read_units += page
            .consumed_capacity()
            .and_then(|c| c.capacity_units())
            .unwrap_or(0.0);
        for item in page.items() {
            read.items += 1;
            let Some(pk) = item.get("pk").and_then(|v| v.as_s().ok()) else {
                continue;
            };
            let Some((work, _)) = works
                .iter()
                .find(|(_, layout)| pk.starts_with(&layout.record_prefix))
            else {
                continue; // a dead-letter mark, the checkpoint, another item
            };
            count(out.entry((*work).to_owned()).or_default(), item, now_ms);
        }
        match page.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Ok((out, read)),
        }
    }
}

/// The payments that hold refunds until they settle (the `refund_held` partition of the
/// `OpenRecords` index, whose sort key is when each payment's charge began) and the oldest
/// one's age, seconds. A payment stays there until the last of its held refunds is read done.
pub async fn held_refunds(
    sdk: &aws_config::SdkConfig,
    table: &str,
    now_ms: i64,
) -> Result<(usize, Option<i64>)> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let query = || {
        ddb.query()
            .table_name(table)
            .index_name(sqs_once::dynamo::OPEN_INDEX)
            .key_condition_expression("#o = :p")
            .expression_attribute_names("#o", sqs_once::dynamo::OPEN)
            .expression_attribute_values(
                ":p",
                aws_sdk_dynamodb::types::AttributeValue::S(
                    payment_core::refunds::ledger::HELD_PARTITION.to_owned(),
                ),
            )
    };
    let mut count = 0;
    let mut start = None;
    loop {
        let page = query()
            .select(aws_sdk_dynamodb::types::Select::Count)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(crate::aws::failed)
            .context("counting the held refunds (the OpenRecords index)")?;
        count += page.count() as usize;
        match page.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => break,
        }
    }
    let oldest = query()
        .scan_index_forward(true)
        .limit(1)
        .send()
        .await
        .map_err(crate::aws::failed)
        .context("reading the oldest held refund (the OpenRecords index)")?
        .items()
        .first()
        .and_then(|i| sqs_once::dynamo::get_n(i, "first_attempt_at"))
        .map(|t| (now_ms - t).max(0) / 1000);
    Ok((count, oldest))
}
