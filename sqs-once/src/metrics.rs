//! CloudWatch Embedded Metric Format (EMF) documents for a batch: print each line to stdout
//! in a Lambda and CloudWatch turns it into metrics, with no API call.

use std::collections::{BTreeMap, HashMap};

/// Counts of one batch, for metrics and logs.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BatchSummary {
    /// Messages executed and acknowledged, by label.
    pub done: BTreeMap<String, u32>,
    /// Duplicates suppressed.
    pub duplicates: u32,
    /// Messages dead-lettered, by code.
    pub dead_lettered: HashMap<String, u32>,
    /// Messages handed back to the queue.
    pub retried: u32,
    /// Messages that must come back but carry no `messageId` to report them by: the
    /// invocation must fail as a whole so that the batch comes back (never an empty id).
    pub unreportable: u32,
    /// Duration of every call of [`crate::Work::execute`], milliseconds.
    pub call_latencies_ms: Vec<f64>,
    /// When each message handed back becomes visible again, epoch ms.
    pub returns_at_ms: Vec<i64>,
}

impl BatchSummary {
    /// Messages done under this label.
    pub fn done(&self, label: &str) -> u32 {
        self.done.get(label).copied().unwrap_or(0)
    }

    /// Messages dead-lettered, whatever the code.
    pub fn dead_lettered_total(&self) -> u32 {
        self.dead_lettered.values().sum()
    }

    /// Adds another batch's counts to these.
    pub fn merge(&mut self, other: &BatchSummary) {
        for (k, v) in &other.done {
            *self.done.entry(k.clone()).or_default() += v;
        }
        self.duplicates += other.duplicates;
        self.retried += other.retried;
        self.unreportable += other.unreportable;
        for (k, v) in &other.dead_lettered {
            *self.dead_lettered.entry(k.clone()).or_default() += v;
        }
        self.call_latencies_ms
            .extend_from_slice(&other.call_latencies_ms);
        self.returns_at_ms.extend_from_slice(&other.returns_at_ms);
    }
}

/// Names of a batch's metrics.
#[derive(Debug, Clone)]
pub struct MetricNames {
    /// CloudWatch namespace (`OrderProcessor`, ...).
    pub namespace: String,
    /// The `Service` dimension's value.
    pub service: String,
    /// Every label [`crate::Work::verdict`] gives, with its metric name, in order: each is
    /// present in every document (zero when nothing had it), so an alarm never lacks data.
    pub labels: Vec<(String, String)>,
    /// The metric of every call's duration, milliseconds (`CallLatency`, ...).
    pub latency: String,
}

/// The EMF documents for a batch, one JSON line each. The first carries one metric per
/// label, `DuplicatesSuppressed`, `DeadLettered`, `Retried` and the latency of every call, by
/// the `Service` dimension; then one line per dead-letter reason with `DeadLettered` by
/// `Service, Reason`. A label the names do not list is counted under its own name.
pub fn emf_lines(summary: &BatchSummary, names: &MetricNames, timestamp_ms: i64) -> Vec<String> {
    let mut counts: Vec<(String, u32)> = names
        .labels
        .iter()
        .map(|(label, metric)| (metric.clone(), summary.done(label)))
        .collect();
    for (label, n) in &summary.done {
        if !names.labels.iter().any(|(l, _)| l == label) {
            counts.push((label.clone(), *n));
        }
    }
    counts.push(("DuplicatesSuppressed".into(), summary.duplicates));
    counts.push(("DeadLettered".into(), summary.dead_lettered_total()));
    counts.push(("Retried".into(), summary.retried));
    let mut metrics: Vec<serde_json::Value> = counts
        .iter()
        .map(|(name, _)| serde_json::json!({"Name": name, "Unit": "Count"}))
        .collect();
    metrics.push(serde_json::json!({"Name": names.latency, "Unit": "Milliseconds"}));
    let mut doc = serde_json::json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": names.namespace,
                "Dimensions": [["Service"]],
                "Metrics": metrics
            }]
        },
        "Service": names.service,
    });
    for (name, n) in counts {
        doc[name] = n.into();
    }
    doc[names.latency.as_str()] = summary.call_latencies_ms.clone().into();
    let mut lines = vec![doc.to_string()];
    let mut reasons: Vec<_> = summary.dead_lettered.iter().collect();
    reasons.sort();
    for (reason, n) in reasons {
        lines.push(
            serde_json::json!({
                "_aws": {
                    "Timestamp": timestamp_ms,
                    "CloudWatchMetrics": [{
                        "Namespace": names.namespace,
                        "Dimensions": [["Service", "Reason"]],
                        "Metrics": [{"Name": "DeadLettered", "Unit": "Count"}]
                    }]
                },
                "Service": names.service,
                "Reason": reason,
                "DeadLettered": n,
            })
            .to_string(),
        );
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_documents_name_every_metric_they_carry() {
        let names = MetricNames {
            namespace: "Orders".into(),
            service: "order-processor".into(),
            labels: vec![
                ("shipped".into(), "Shipped".into()),
                ("held".into(), "Held".into()),
            ],
            latency: "CallLatency".into(),
        };
        let mut s = BatchSummary {
            duplicates: 1,
            call_latencies_ms: vec![12.5, 40.0],
            ..Default::default()
        };
        s.done.insert("shipped".into(), 3);
        s.done.insert("surprise".into(), 1);
        s.dead_lettered.insert("invalid_json".into(), 2);
        let lines = emf_lines(&s, &names, 1_700_000_000_000);
        assert_eq!(lines.len(), 2);
        let main: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        for m in main["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            let name = m["Name"].as_str().unwrap();
            assert!(!main[name].is_null(), "{name} declared but missing");
        }
        assert_eq!(main["Shipped"], 3);
        assert_eq!(main["Held"], 0, "a listed label is always present");
        assert_eq!(main["surprise"], 1, "an unlisted label is counted too");
        assert_eq!(main["DeadLettered"], 2);
        assert_eq!(main["CallLatency"], serde_json::json!([12.5, 40.0]));
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
