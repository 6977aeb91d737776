//! What a million payments cost for the whole deployed stack (webhook shape, arm64): the
//! payments API and its access log, the relay, the processor, the provider's events (receiver
//! and inbox), the records kept for their lifetimes, the logs kept for their retention, X-Ray,
//! and what the stack costs a month whatever its traffic (the key, alarms, dashboard, custom
//! metrics, secrets, the event-source mappings' idle polls, the catch-up's schedule).
//!
//! Inputs: the bench's measurements (the processor's drain at zero latency and at the
//! provider's, the API path's write units, its largest item and its request latency), the
//! template's shape (its parameters and resource counts, [`payctl::template::shape_of`]), the
//! prices of [`crate::prices`], and the rules below for what was not measured apart, each
//! named in the table's notes. Two volumes: a million payments in a month and in a day;
//! batches, X-Ray's sampling and the fixed costs' share depend on the rate.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::prices;
use payctl::template::Shape;

/// The provider's events the inbox applies per card payment confirmed at once: its
/// `payment_intent.succeeded` (the endpoint is subscribed to nothing else such a payment
/// makes). Refunds and disputes bring their own.
pub const EVENTS_PER_PAYMENT: f64 = 1.0;
/// The inbox's DynamoDB requests per such event, counted from its code path: the event's
/// claim, the payment's settlement (the event noted on its record) and the completion write;
/// one read of the payment's record.
pub const INBOX_WRITES_PER_EVENT: f64 = 3.0;
pub const INBOX_READS_PER_EVENT: f64 = 1.0;
/// The template's batching windows, seconds (held to `template.yaml` by a test): the
/// processors' and the inbox's queues, and the relay's stream.
pub const QUEUE_WINDOW_S: f64 = 5.0;
pub const RELAY_WINDOW_S: f64 = 1.0;
pub const RELAY_BATCH: f64 = 100.0;
/// Lambda's SQS pollers per event-source mapping when idle, and the long poll each waits.
pub const IDLE_POLLERS: f64 = 5.0;
pub const LONG_POLL_S: f64 = 20.0;
/// A month, in seconds and days.
const MONTH_S: f64 = 30.44 * 86_400.0;
const MONTH_DAYS: f64 = 30.44;
/// KMS: SQS asks for a data key once per reuse period (300 s by default) per queue and side
/// (sender, receiver); DynamoDB refreshes its table key as often per table.
const KMS_REUSE_S: f64 = 300.0;

/// An HTTP API access-log line of the template's format, with values of their usual length.
fn access_log_line_bytes() -> f64 {
    r#"{"requestId":"JxYz1AbCdEFgHiJ=","caller":"AIDAEXAMPLEEXAMPLE123","routeKey":"POST /v1/payments","status":"202","latency":"25","integrationError":"-"}"#
        .len() as f64
        + 1.0
}

fn num(v: &Value, path: &[&str]) -> Result<f64> {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    match at.as_f64() {
        Some(x) => Ok(x),
        None => bail!(
            "the bench's results have no {}: run make bench",
            path.join(".")
        ),
    }
}

fn param(shape: &Shape, name: &str) -> Result<f64> {
    match shape.parameters.get(name).and_then(|v| v.parse().ok()) {
        Some(x) => Ok(x),
        None => bail!("the template's {name} is not a number"),
    }
}

/// Traces X-Ray's default rule records a second of `per_second` invocations of one function.
fn traced_per_second(per_second: f64) -> f64 {
    per_second.min(1.0) + prices::XRAY_DEFAULT_SAMPLED * (per_second - 1.0).max(0.0)
}

/// Invocations per message of a mapping that batches `batch` messages or `window_s` seconds
/// of them, at `per_second` messages.
fn invocations_per_message(per_second: f64, window_s: f64, batch: f64) -> f64 {
    1.0 / (per_second * window_s).clamp(1.0, batch)
}

/// The cost table, USD per million payments, at `payments_per_month`.
pub fn whole_stack(results: &Value, shape: &Shape, payments_per_month: f64) -> Result<Value> {
    let zero = &results["comparison"]["cost_per_million_payments"]["this"]["usage_per_payment"];
    let lat =
        &results["comparison"]["cost_per_million_payments_at_latency"]["this"]["usage_per_payment"];
    let memory_gb = 256.0 / 1024.0;
    let rate = payments_per_month / MONTH_S;
    let batch = param(shape, "BatchSize")?;
    let count = |t: &str| shape.counts.get(t).copied().unwrap_or(0) as f64;

    // Measured: the processor's drain (billed time and SQS requests per message, full
    // batches), the API path's write units and item size, the API's request latency.
    let drain_inv = num(lat, &["invocations"])?;
    let billed_per_batch_lat = num(lat, &["billed_ms"])? / drain_inv;
    let billed_per_batch_zero = num(zero, &["billed_ms"])? / num(zero, &["invocations"])?;
    let sqs_per_message = num(lat, &["sqs_requests"])?;
    let own_log_per_message =
        num(lat, &["log_bytes"])? - drain_inv * prices::LAMBDA_PLATFORM_LOG_BYTES_PER_INVOCATION;
    let api_writes = num(results, &["api", "write_units_per_payment"])?;
    let item = num(results, &["api", "largest_item_bytes"])?;
    let api_ms = num(results, &["api", "latency_ms", "p50"])?;

    // Per payment, by function: (invocations, billed ms).
    let events = EVENTS_PER_PAYMENT;
    let queue_inv = invocations_per_message(rate, QUEUE_WINDOW_S, batch);
    let relay_inv = invocations_per_message(rate, RELAY_WINDOW_S, RELAY_BATCH);
    let functions = [
        ("payments-api", 1.0, api_ms),
        ("outbox-relay", relay_inv, relay_inv * api_ms),
        // A smaller batch is billed at most what a full one was: the slowest of fewer calls.
        (
            "payment-processor",
            queue_inv,
            queue_inv * billed_per_batch_lat,
        ),
        ("provider-events", events, events * api_ms),
        (
            "event-processor",
            events * queue_inv,
            events * queue_inv * billed_per_batch_zero,
        ),
    ];
    let invocations: f64 = functions.iter().map(|f| f.1).sum();
    let billed_ms: f64 = functions.iter().map(|f| f.2).sum();
    let traces: f64 = functions
        .iter()
        .map(|(_, inv, _)| {
            let per_second = inv * rate;
            if per_second > 0.0 {
                traced_per_second(per_second) / per_second * inv
            } else {
                0.0
            }
        })
        .sum();
    let write_units = api_writes + events * INBOX_WRITES_PER_EVENT;
    let read_units = events * INBOX_READS_PER_EVENT * (item / 4096.0).ceil().max(1.0);
    // The relay's batch send, the processor's and the inbox's receives and deletes as
    // measured per message, the receiver's send of each event.
    let sqs = relay_inv + sqs_per_message + events * (1.0 + sqs_per_message);
    let http_requests = 1.0 + events;
    let log_bytes = invocations * prices::LAMBDA_PLATFORM_LOG_BYTES_PER_INVOCATION
        + (1.0 + events) * own_log_per_message
        + http_requests * access_log_line_bytes();

    // Kept: the payment's record for the refund window, the API's row for twice the record
    // retention and a day, each event's inbox record 31 days; point-in-time recovery on both
    // tables; the logs for their retention.
    let stored = item + prices::DYNAMODB_ITEM_OVERHEAD_BYTES;
    let retention = param(shape, "IdempotencyTtlDays")?;
    let record_days = param(shape, "RefundWindowDays")? + (2.0 * retention + 1.0) + events * 31.0;
    let gb_months = stored * record_days / MONTH_DAYS / 1e9;
    let log_gb_months = log_bytes * param(shape, "LogRetentionDays")? / MONTH_DAYS / 1e9;

    let m = 1e6;
    let per_million = [
        (
            "api_gateway",
            m * http_requests / 1e6 * prices::HTTP_API_PER_MILLION_REQUESTS,
        ),
        (
            "lambda_requests",
            m * invocations / 1e6 * prices::LAMBDA_PER_MILLION_REQUESTS,
        ),
        (
            "lambda_compute",
            m * billed_ms / 1000.0 * memory_gb * prices::LAMBDA_ARM64_PER_GB_SECOND,
        ),
        (
            "dynamodb_requests",
            m * (write_units * prices::DYNAMODB_PER_MILLION_WRITE_UNITS
                + read_units * prices::DYNAMODB_PER_MILLION_READ_UNITS)
                / 1e6,
        ),
        (
            "dynamodb_storage_and_backups",
            m * gb_months
                * (prices::DYNAMODB_STORAGE_PER_GB_MONTH + prices::DYNAMODB_PITR_PER_GB_MONTH),
        ),
        ("sqs", m * sqs / 1e6 * prices::SQS_PER_MILLION_REQUESTS),
        (
            "cloudwatch_logs",
            m * (log_bytes / 1e9 * prices::CLOUDWATCH_LOGS_PER_GB
                + log_gb_months * prices::CLOUDWATCH_LOGS_STORAGE_PER_GB_MONTH),
        ),
        ("xray", m * traces / 1e6 * prices::XRAY_PER_MILLION_TRACES),
    ];

    // A month, whatever the traffic.
    let queues_polled = count("AWS::Lambda::EventSourceMapping") - 1.0; // the relay reads a stream
    let kms_requests =
        (count("AWS::SQS::Queue") * 2.0 + count("AWS::DynamoDB::Table")) * MONTH_S / KMS_REUSE_S;
    let catch_ups = MONTH_S / 60.0 / param(shape, "EventsCatchUpMinutes")?;
    let monthly = [
        (
            "kms",
            count("AWS::KMS::Key") * prices::KMS_PER_KEY_MONTH
                + kms_requests / 1e4 * prices::KMS_PER_10K_REQUESTS,
        ),
        (
            "alarms",
            count("AWS::CloudWatch::Alarm") * prices::CLOUDWATCH_PER_ALARM_MONTH,
        ),
        (
            "dashboard",
            count("AWS::CloudWatch::Dashboard") * prices::CLOUDWATCH_PER_DASHBOARD_MONTH,
        ),
        (
            "custom_metrics",
            shape.custom_metrics.len() as f64 * prices::CLOUDWATCH_PER_CUSTOM_METRIC_MONTH,
        ),
        ("secrets", 2.0 * prices::SECRETS_MANAGER_PER_SECRET_MONTH),
        (
            "idle_polls",
            queues_polled * IDLE_POLLERS * MONTH_S / LONG_POLL_S / 1e6
                * prices::SQS_PER_MILLION_REQUESTS,
        ),
        (
            "catch_up",
            catch_ups
                * (prices::LAMBDA_PER_MILLION_REQUESTS / 1e6
                    + billed_per_batch_zero / 1000.0
                        * memory_gb
                        * prices::LAMBDA_ARM64_PER_GB_SECOND),
        ),
    ];
    let variable: f64 = per_million.iter().map(|l| l.1).sum();
    let fixed: f64 = monthly.iter().map(|l| l.1).sum();
    let share = fixed * 1e6 / payments_per_month;
    Ok(json!({
        "payments_per_month": payments_per_month,
        "payments_per_second": rate,
        "per_million_usd": per_million.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "monthly_usd": monthly.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "variable_per_million_usd": variable,
        "fixed_per_month_usd": fixed,
        "fixed_share_per_million_usd": share,
        "total_per_million_usd": variable + share,
        "usage_per_payment": {
            "http_requests": http_requests, "invocations": invocations, "billed_ms": billed_ms,
            "dynamodb_write_units": write_units, "dynamodb_read_units": read_units,
            "sqs_requests": sqs, "log_bytes": log_bytes, "xray_traces": traces,
            "stored_gb_months": gb_months,
        },
        "prices": prices::AS_OF,
    }))
}

/// The volumes the table shows, payments a month: a million a month, a million a day.
pub const VOLUMES: [f64; 2] = [1e6, 1e6 * MONTH_DAYS];

/// [`whole_stack`] at each of [`VOLUMES`], for the template at `template` with its defaults.
pub fn columns(results: &Value, template: &std::path::Path) -> Result<Vec<Value>> {
    let shape = payctl::template::shape_of(template, &Default::default())?;
    VOLUMES
        .iter()
        .map(|per_month| whole_stack(results, &shape, *per_month))
        .collect()
}

/// The table from a bench's results file and a template (`proving stack-cost`).
pub fn table_from_files(results: &std::path::Path, template: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(results)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", results.display()))?;
    Ok(markdown(&columns(&serde_json::from_str(&text)?, template)?))
}

/// The table docs/performance.md shows, one column per volume.
pub fn markdown(columns: &[Value]) -> String {
    let mut s = String::from("| USD per million payments | ");
    let title = |c: &Value| {
        let per_month = c["payments_per_month"].as_f64().unwrap_or(0.0);
        let days = 1e6 / per_month * MONTH_DAYS;
        match days {
            d if (d - MONTH_DAYS).abs() < 0.01 => "a million a month".to_owned(),
            d if (d - 1.0).abs() < 0.01 => "a million a day".to_owned(),
            d => format!("a million in {d:.1} days"),
        }
    };
    s.push_str(&columns.iter().map(title).collect::<Vec<_>>().join(" | "));
    s.push_str(" |\n|---|");
    s.push_str(&"---|".repeat(columns.len()));
    s.push('\n');
    let row = |s: &mut String, label: &str, f: &dyn Fn(&Value) -> f64| {
        s.push_str(&format!("| {label} | "));
        s.push_str(
            &columns
                .iter()
                .map(|c| format!("{:.2}", f(c)))
                .collect::<Vec<_>>()
                .join(" | "),
        );
        s.push_str(" |\n");
    };
    for (key, label) in LINES {
        row(&mut s, label, &|c| {
            c["per_million_usd"][key].as_f64().unwrap_or(0.0)
        });
    }
    row(
        &mut s,
        "the month's fixed costs, shared by its payments",
        &|c| c["fixed_share_per_million_usd"].as_f64().unwrap_or(0.0),
    );
    row(&mut s, "**total**", &|c| {
        c["total_per_million_usd"].as_f64().unwrap_or(0.0)
    });
    s.push_str("\n| USD a month, whatever the traffic | |\n|---|---|\n");
    if let Some(first) = columns.first() {
        for (key, label) in MONTHLY {
            s.push_str(&format!(
                "| {label} | {:.2} |\n",
                first["monthly_usd"][key].as_f64().unwrap_or(0.0)
            ));
        }
    }
    s
}

const LINES: [(&str, &str); 8] = [
    (
        "api_gateway",
        "API Gateway (payments POST, the events' deliveries)",
    ),
    (
        "lambda_requests",
        "Lambda requests (API, relay, processor, receiver, inbox)",
    ),
    ("lambda_compute", "Lambda compute (arm64, 256 MB)"),
    (
        "dynamodb_requests",
        "DynamoDB requests (API, processor, inbox)",
    ),
    (
        "dynamodb_storage_and_backups",
        "DynamoDB storage and point-in-time recovery, for the records' lifetimes",
    ),
    ("sqs", "SQS requests"),
    (
        "cloudwatch_logs",
        "CloudWatch Logs (ingestion, and storage for the retention)",
    ),
    ("xray", "X-Ray traces (Tracing: Active)"),
];

const MONTHLY: [(&str, &str); 7] = [
    ("kms", "the KMS key and its requests"),
    ("alarms", "alarms"),
    ("dashboard", "the dashboard"),
    (
        "custom_metrics",
        "custom metrics the alarms and the dashboard read",
    ),
    ("secrets", "two secrets"),
    ("idle_polls", "the queues' event-source mappings polling"),
    ("catch_up", "the scheduled catch-up"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;

    fn repo(path: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path)
    }

    fn measured() -> Value {
        serde_json::from_str(&std::fs::read_to_string(repo("bench/results/results.json")).unwrap())
            .unwrap()
    }

    fn shape(given: &[(&str, &str)]) -> Shape {
        let given: HashMap<String, String> = given
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        payctl::template::shape_of(&repo("template.yaml"), &given).unwrap()
    }

    #[test]
    fn the_model_s_batching_windows_are_the_template_s() {
        let text = std::fs::read_to_string(repo("template.yaml")).unwrap();
        let mut seen = 0;
        for block in text.split("Type: AWS::Lambda::EventSourceMapping").skip(1) {
            let block = &block[..block.find("\n\n").unwrap_or(block.len())];
            let window = |w: f64| block.contains(&format!("MaximumBatchingWindowInSeconds: {w}"));
            if block.contains("FunctionName: !Ref OutboxRelayFunction.Alias") {
                assert!(
                    window(RELAY_WINDOW_S) && block.contains(&format!("BatchSize: {RELAY_BATCH}"))
                );
            } else {
                assert!(
                    window(QUEUE_WINDOW_S) && block.contains("BatchSize: !Ref BatchSize"),
                    "{block}"
                );
            }
            seen += 1;
        }
        assert_eq!(seen, 4);
    }

    #[test]
    fn the_whole_stack_s_cost_follows_the_template_and_the_rate() {
        let (m, s) = (measured(), shape(&[]));
        let month = whole_stack(&m, &s, 1e6).unwrap();
        let day = whole_stack(&m, &s, 30.44e6).unwrap();
        let usd = |c: &Value, k: &str| c["per_million_usd"][k].as_f64().unwrap();
        // The fixed costs are the template's: its alarms, its dashboard.
        let alarms = s.counts["AWS::CloudWatch::Alarm"] as f64;
        assert!(alarms >= 20.0);
        assert!((month["monthly_usd"]["alarms"].as_f64().unwrap() - alarms * 0.10).abs() < 1e-9);
        // The code's metrics the alarms and the dashboard read, each name billed once.
        assert!(s
            .custom_metrics
            .contains(&("PaymentProcessor".into(), "Charged".into())));
        assert!(s
            .custom_metrics
            .contains(&("Provider".into(), "ProviderAuthenticationFailures".into())));
        assert!(s.custom_metrics.iter().all(|(ns, _)| ns != "true"));
        // More payments a second: fuller batches, a smaller sampled share of traces, the month's
        // fixed costs shared by more.
        assert!(usd(&day, "lambda_requests") < usd(&month, "lambda_requests"));
        assert!(usd(&day, "xray") < usd(&month, "xray"));
        assert!(day["total_per_million_usd"].as_f64() < month["total_per_million_usd"].as_f64());
        // What is stored is stored for the records' lifetimes: a longer refund window costs more.
        let longer = whole_stack(&m, &shape(&[("RefundWindowDays", "730")]), 1e6).unwrap();
        assert!(
            usd(&longer, "dynamodb_storage_and_backups")
                > 1.5 * usd(&month, "dynamodb_storage_and_backups")
        );
        // Every line is counted in the total.
        let lines: f64 = LINES.iter().map(|(k, _)| usd(&month, k)).sum();
        let share = month["fixed_share_per_million_usd"].as_f64().unwrap();
        assert!((lines + share - month["total_per_million_usd"].as_f64().unwrap()).abs() < 1e-9);
        let table = markdown(&[month, day]);
        assert!(
            table.contains("| a million a month | a million a day |"),
            "{table}"
        );
    }

    #[test]
    fn a_result_without_a_measurement_the_model_needs_is_refused() {
        let mut m = measured();
        m["api"] = Value::Null;
        let e = whole_stack(&m, &shape(&[]), 1e6).unwrap_err().to_string();
        assert!(
            e.contains("api.write_units_per_payment") && e.contains("make bench"),
            "{e}"
        );
    }
}
