//! What a million payments cost on AWS with what a contender used: DynamoDB item sizes, the
//! wire counts per payment, and the prices of [`crate::prices`].

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{json, Value};

use crate::prices;

/// The size DynamoDB bills for an attribute value (names count where they appear).
fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        // About one byte per two significant digits, plus one.
        AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| k.len() + value_size(v))
                .sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::Ss(ss) => ss.iter().map(String::len).sum(),
        AttributeValue::Ns(ns) => ns.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(bs) => bs.iter().map(|b| b.as_ref().len()).sum(),
        _ => 0,
    }
}

/// The largest item in `table`, bytes as DynamoDB counts them (0 for an empty table).
pub async fn largest_item(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<usize> {
    let mut largest = 0;
    let mut pages = ddb.scan().table_name(table).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.with_context(|| format!("scanning {table}"))?;
        for item in page.items() {
            let size = item.iter().map(|(k, v)| k.len() + value_size(v)).sum();
            largest = largest.max(size);
        }
    }
    Ok(largest)
}

/// DynamoDB operations that write (billed in write units) and that read, by the operation's
/// name after the target's prefix (`DynamoDB_20120810.PutItem`).
fn is_write(op: &str) -> bool {
    matches!(
        op.rsplit('.').next(),
        Some("PutItem" | "UpdateItem" | "DeleteItem" | "BatchWriteItem")
    )
}

fn is_read(op: &str) -> bool {
    matches!(
        op.rsplit('.').next(),
        Some("GetItem" | "Query" | "Scan" | "BatchGetItem")
    )
}

/// One contender's wire counts per payment from a counted run: DynamoDB writes, reads and
/// calls, SQS calls of the function itself, and everything else.
pub fn wire_per_payment(
    counts: &BTreeMap<String, crate::wire_count::OpCount>,
    payments: usize,
) -> Value {
    let n = payments.max(1) as f64;
    let sum = |f: &dyn Fn(&str) -> bool| {
        counts
            .iter()
            .filter(|(op, _)| f(op))
            .map(|(_, c)| c.calls)
            .sum::<u64>() as f64
            / n
    };
    json!({
        "dynamodb_calls": sum(&|op| op.starts_with("DynamoDB")),
        "dynamodb_writes": sum(&|op| op.starts_with("DynamoDB") && is_write(op)),
        "dynamodb_reads": sum(&|op| op.starts_with("DynamoDB") && is_read(op)),
        "function_sqs_calls": sum(&|op| op.starts_with("AmazonSQS")),
        "other_calls": sum(&|op| !op.starts_with("DynamoDB") && !op.starts_with("AmazonSQS")),
        "by_operation": counts.iter().map(|(op, c)| (op.clone(), json!(c.calls))).collect::<serde_json::Map<_, _>>(),
    })
}

/// What a million payments cost on AWS with what one contender used per payment:
/// `run` is a drain by one batch at a time (billed duration, invocations, the function's log
/// bytes) and `counted` its counted run (`wire` per payment, `largest_item_bytes`, SQS
/// requests), which the provider's answer time does not change.
pub fn cost_per_million(run: &Value, counted: &Value, memory_mb: u64) -> Value {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let payments = f(&run["payments"]).max(1.0);
    let billed_ms = f(&run["billed_ms"]) / payments;
    let invocations = f(&run["invocations"]) / payments;
    let log_bytes = f(&run["log_bytes"]) / payments
        + invocations * prices::LAMBDA_PLATFORM_LOG_BYTES_PER_INVOCATION;
    let item = f(&counted["largest_item_bytes"]);
    let write_units = f(&counted["wire"]["dynamodb_writes"]) * (item / 1024.0).ceil().max(1.0);
    let read_units = f(&counted["wire"]["dynamodb_reads"]) * (item / 4096.0).ceil().max(1.0);
    let sqs = f(&counted["sqs_requests_per_payment"]);
    let million = 1e6;
    let compute = million * billed_ms / 1000.0 * memory_mb as f64 / 1024.0
        * prices::LAMBDA_ARM64_PER_GB_SECOND;
    let requests = invocations * prices::LAMBDA_PER_MILLION_REQUESTS;
    let dynamodb = write_units * prices::DYNAMODB_PER_MILLION_WRITE_UNITS
        + read_units * prices::DYNAMODB_PER_MILLION_READ_UNITS;
    let sqs_cost = sqs * prices::SQS_PER_MILLION_REQUESTS;
    let logs = million * log_bytes / 1e9 * prices::CLOUDWATCH_LOGS_PER_GB;
    json!({
        "usage_per_payment": {
            "billed_ms": billed_ms,
            "invocations": invocations,
            "dynamodb_write_units": write_units,
            "dynamodb_read_units": read_units,
            "sqs_requests": sqs,
            "log_bytes": log_bytes,
        },
        "usd": {
            "lambda_compute": compute,
            "lambda_requests": requests,
            "dynamodb": dynamodb,
            "sqs": sqs_cost,
            "cloudwatch_logs": logs,
            "total": compute + requests + dynamodb + sqs_cost + logs,
        },
        "memory_mb": memory_mb,
    })
}

/// The lines of the cost table, in its order (`total` last).
pub const COST_LINES: [&str; 5] = [
    "lambda_compute",
    "lambda_requests",
    "dynamodb",
    "sqs",
    "cloudwatch_logs",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_million_payments_cost_what_the_prices_say() {
        // 1,000 payments in 125 invocations billed 4,000 ms in all; a counted run with 2.1
        // writes and 0.5 strongly consistent reads per payment on items under 1 KB, 0.4 SQS
        // requests and 100 bytes of output per payment.
        let run =
            json!({"payments": 1000, "billed_ms": 4000, "invocations": 125, "log_bytes": 100_000});
        let counted = json!({
            "payments": 1000, "largest_item_bytes": 700,
            "sqs_requests_per_payment": 0.4,
            "wire": {"dynamodb_writes": 2.1, "dynamodb_reads": 0.5},
        });
        let c = cost_per_million(&run, &counted, 256);
        let usd = |k: &str| c["usd"][k].as_f64().unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // 4 ms × 1e6 = 4,000 s at 0.25 GB = 1,000 GB-s.
        assert!(close(
            usd("lambda_compute"),
            1000.0 * prices::LAMBDA_ARM64_PER_GB_SECOND
        ));
        assert!(close(
            usd("lambda_requests"),
            0.125 * prices::LAMBDA_PER_MILLION_REQUESTS
        ));
        assert!(close(
            usd("dynamodb"),
            2.1 * prices::DYNAMODB_PER_MILLION_WRITE_UNITS
                + 0.5 * prices::DYNAMODB_PER_MILLION_READ_UNITS
        ));
        assert!(close(usd("sqs"), 0.4 * prices::SQS_PER_MILLION_REQUESTS));
        let log_bytes = 100.0 + 0.125 * prices::LAMBDA_PLATFORM_LOG_BYTES_PER_INVOCATION;
        assert!(close(
            usd("cloudwatch_logs"),
            log_bytes / 1000.0 * prices::CLOUDWATCH_LOGS_PER_GB
        ));
        let parts: f64 = [
            "lambda_compute",
            "lambda_requests",
            "dynamodb",
            "sqs",
            "cloudwatch_logs",
        ]
        .iter()
        .map(|k| usd(k))
        .sum();
        assert!(close(usd("total"), parts));
    }

    #[test]
    fn items_over_a_kilobyte_cost_more_write_units() {
        let run = json!({"payments": 1, "billed_ms": 0, "invocations": 0, "log_bytes": 0});
        let counted = |bytes: u64| {
            json!({"payments": 1, "largest_item_bytes": bytes,
                   "sqs_requests_per_payment": 0, "wire": {"dynamodb_writes": 2.0, "dynamodb_reads": 0.0}})
        };
        let units = |bytes| {
            cost_per_million(&run, &counted(bytes), 256)["usage_per_payment"]
                ["dynamodb_write_units"]
                .as_f64()
                .unwrap()
        };
        assert_eq!(units(1024), 2.0);
        assert_eq!(units(1025), 4.0);
    }

    #[test]
    fn item_sizes_count_names_and_values() {
        let m = AttributeValue::M([("amount".to_owned(), AttributeValue::N("1000".into()))].into());
        // "pk" + "pay_1"; "outcome" + map overhead 3 + "amount" + 1000 (2 digit pairs + 1).
        assert_eq!(2 + value_size(&AttributeValue::S("pay_1".into())), 7);
        assert_eq!("outcome".len() + value_size(&m), 7 + 3 + 6 + 3);
    }
}
