//! Structured JSON logs and CloudWatch Embedded Metric Format (EMF) metrics.

use crate::processor::BatchSummary;

/// Installs the JSON log subscriber (level from `RUST_LOG`: `error`, `warn`, `info`, `debug`,
/// `trace` or `off`; default `info`). Each line carries the current span's fields, so every
/// line of a message names its `message_id` and `payment_id`. Safe to call twice (the second
/// call does nothing). A plain level, not per-module directives: the regex engine those need
/// would grow every bootstrap.
pub fn init() {
    init_with(false);
}

/// [`init`] with a timestamp on every line, for processes outside Lambda (`payctl run`, the
/// local API and relay), where nothing else stamps the lines.
pub fn init_timed() {
    init_with(true);
}

fn init_with(timed: bool) {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| {
            v.trim()
                .parse::<tracing_subscriber::filter::LevelFilter>()
                .ok()
        })
        .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO);
    let builder = tracing_subscriber::fmt()
        .json()
        .with_max_level(level)
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .with_writer(std::io::stderr);
    // CloudWatch stamps each line of a Lambda's output; a local process stamps its own.
    let _ = if timed {
        builder.try_init()
    } else {
        builder.without_time().try_init()
    };
}

/// The EMF documents for a batch, one JSON line each. The first carries the metrics `Charged`,
/// `Declined`, `DuplicatesSuppressed`, `DeadLettered`, `Retried` and `ProviderLatency` (every
/// provider call of the batch, milliseconds) in the `PaymentProcessor` namespace, dimension
/// `Service`; then one line per dead-letter reason with `DeadLettered` by `Service, Reason`.
pub fn emf_lines(summary: &BatchSummary, timestamp_ms: i64) -> Vec<String> {
    let dead: u32 = summary.dead_lettered.values().sum();
    let mut lines = vec![serde_json::json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["Service"]],
                "Metrics": [
                    {"Name": "Charged", "Unit": "Count"},
                    {"Name": "Declined", "Unit": "Count"},
                    {"Name": "DuplicatesSuppressed", "Unit": "Count"},
                    {"Name": "DeadLettered", "Unit": "Count"},
                    {"Name": "Retried", "Unit": "Count"},
                    {"Name": "ProviderLatency", "Unit": "Milliseconds"}
                ]
            }]
        },
        "Service": SERVICE,
        "Charged": summary.charged,
        "Declined": summary.declined,
        "DuplicatesSuppressed": summary.duplicates,
        "DeadLettered": dead,
        "Retried": summary.retried,
        "ProviderLatency": summary.provider_latencies_ms,
    })
    .to_string()];
    let mut reasons: Vec<_> = summary.dead_lettered.iter().collect();
    reasons.sort();
    for (reason, n) in reasons {
        lines.push(
            serde_json::json!({
                "_aws": {
                    "Timestamp": timestamp_ms,
                    "CloudWatchMetrics": [{
                        "Namespace": NAMESPACE,
                        "Dimensions": [["Service", "Reason"]],
                        "Metrics": [{"Name": "DeadLettered", "Unit": "Count"}]
                    }]
                },
                "Service": SERVICE,
                "Reason": reason,
                "DeadLettered": n,
            })
            .to_string(),
        );
    }
    lines
}

const NAMESPACE: &str = "PaymentProcessor";
const SERVICE: &str = "payment-processor";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_documents_name_every_metric_they_carry() {
        let mut s = BatchSummary {
            charged: 3,
            duplicates: 1,
            provider_latencies_ms: vec![12.5, 40.0],
            ..Default::default()
        };
        s.dead_lettered.insert("invalid_json".into(), 2);
        let lines = emf_lines(&s, 1_700_000_000_000);
        assert_eq!(lines.len(), 2);
        let main: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        for m in main["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            let name = m["Name"].as_str().unwrap();
            assert!(!main[name].is_null(), "{name} declared but missing");
        }
        assert_eq!(main["Charged"], 3);
        assert_eq!(main["ProviderLatency"], serde_json::json!([12.5, 40.0]));
        let by_reason: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            (
                by_reason["Reason"].as_str(),
                by_reason["DeadLettered"].as_u64()
            ),
            (Some("invalid_json"), Some(2))
        );
    }
}
