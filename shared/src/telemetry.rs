//! Structured JSON logs and CloudWatch Embedded Metric Format (EMF) metrics.

use crate::processor::BatchSummary;

/// Installs the JSON log subscriber (level from `RUST_LOG`, default `info`). Each line carries
/// the current span's fields, so every line of a message names its `message_id` and
/// `payment_id`. Safe to call twice (the second call does nothing).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .without_time()
        .with_writer(std::io::stderr)
        .try_init();
}

/// One EMF document for a batch: CloudWatch turns it into the metrics `Charged`, `Declined`,
/// `DuplicatesSuppressed`, `DeadLettered` and `Retried` in the `PaymentProcessor` namespace.
pub fn emf_line(summary: &BatchSummary, timestamp_ms: i64) -> String {
    let dead: u32 = summary.dead_lettered.values().sum();
    serde_json::json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": "PaymentProcessor",
                "Dimensions": [["Service"]],
                "Metrics": [
                    {"Name": "Charged", "Unit": "Count"},
                    {"Name": "Declined", "Unit": "Count"},
                    {"Name": "DuplicatesSuppressed", "Unit": "Count"},
                    {"Name": "DeadLettered", "Unit": "Count"},
                    {"Name": "Retried", "Unit": "Count"}
                ]
            }]
        },
        "Service": "payment-processor",
        "Charged": summary.charged,
        "Declined": summary.declined,
        "DuplicatesSuppressed": summary.duplicates,
        "DeadLettered": dead,
        "Retried": summary.retried,
        "DeadLetteredByReason": summary.dead_lettered,
    })
    .to_string()
}
