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

/// Names of a batch's metrics. Build it with `..Default::default()` after the fields you set,
/// so that a field added later (as `dimensions` was) does not break the build.
#[derive(Debug, Clone, Default)]
pub struct MetricNames {
    /// CloudWatch namespace (`OrderProcessor`, ...).
    pub namespace: String,
    /// The `Service` dimension's value.
    pub service: String,
    /// Every label [`crate::Work::verdict`] gives, with its metric name, in order.
    pub labels: Vec<(String, String)>,
    /// Dimensions every line carries ahead of `Service`, as (name, value): a deployment's
    /// name (`("Stack", "payments-prod")`) keeps two deployments in one account and region
    /// apart in the same namespace, for their alarms and dashboards. Empty: `Service` alone.
    pub dimensions: Vec<(String, String)>,
}

/// The EMF documents for a batch, one JSON line each: the batch's counts, then one line per
/// dead-letter reason with `DeadLettered` by `Service, Reason` (each set led by
/// [`MetricNames::dimensions`]).
///
/// The first line carries, by the `Service` dimension, one metric per label, then
/// `DuplicatesSuppressed`, `DeadLettered` and `Retried`, each only when the batch had one:
/// a batch that simply succeeded costs one short line (its size is a log bill paid per
/// batch). A count that is absent is no data, not zero: an alarm on one of these treats
/// missing data as not breaching. A label the names do not list is counted under its own
/// name. The calls' durations are not in it: the function's `Duration` is the batch's
/// slowest call, and each call's is on the message's `debug` line.
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
    counts.retain(|(_, n)| *n > 0);
    let mut lines = Vec::new();
    if !counts.is_empty() {
        let metrics: Vec<serde_json::Value> = counts
            .iter()
            .map(|(name, _)| serde_json::json!({ "Name": name }))
            .collect();
        let mut doc = serde_json::json!({
            "_aws": {
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": names.namespace,
                    "Dimensions": [dimension_set(names, &["Service"])],
                    "Metrics": metrics
                }]
            },
            "Service": names.service,
        });
        with_dimensions(&mut doc, names);
        for (name, n) in counts {
            doc[name] = n.into();
        }
        lines.push(doc.to_string());
    }
    let mut reasons: Vec<_> = summary.dead_lettered.iter().collect();
    reasons.sort();
    for (reason, n) in reasons {
        let mut doc = serde_json::json!({
            "_aws": {
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": names.namespace,
                    "Dimensions": [dimension_set(names, &["Service", "Reason"])],
                    "Metrics": [{"Name": "DeadLettered"}]
                }]
            },
            "Service": names.service,
            "Reason": reason,
            "DeadLettered": n,
        });
        with_dimensions(&mut doc, names);
        lines.push(doc.to_string());
    }
    lines
}

/// The names' own dimensions, then `rest`.
fn dimension_set(names: &MetricNames, rest: &[&str]) -> Vec<String> {
    names
        .dimensions
        .iter()
        .map(|(name, _)| name.clone())
        .chain(rest.iter().map(|d| (*d).to_owned()))
        .collect()
}

/// Writes the names' own dimensions' values into a document.
fn with_dimensions(doc: &mut serde_json::Value, names: &MetricNames) {
    for (name, value) in &names.dimensions {
        doc[name.as_str()] = value.clone().into();
    }
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
            dimensions: vec![],
        };
        let mut s = BatchSummary {
            duplicates: 1,
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
        assert!(
            main.get("Held").is_none(),
            "a count the batch did not have is absent"
        );
        assert_eq!(main["surprise"], 1, "an unlisted label is counted too");
        assert_eq!(main["DeadLettered"], 2);
        assert_eq!(
            main["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["Service"]]),
            "no dimensions of its own: Service alone"
        );
        assert!(main.get("Retried").is_none());
        let by_reason: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            (
                by_reason["Reason"].as_str(),
                by_reason["DeadLettered"].as_u64()
            ),
            (Some("invalid_json"), Some(2))
        );
    }

    #[test]
    fn a_batch_that_simply_succeeded_costs_one_short_line() {
        let names = MetricNames {
            namespace: "PaymentProcessor".into(),
            service: "payment-processor".into(),
            labels: vec![
                ("charged".into(), "Charged".into()),
                ("declined".into(), "Declined".into()),
            ],
            dimensions: vec![("Stack".into(), "payments-prod".into())],
        };
        let mut s = BatchSummary {
            call_latencies_ms: vec![350.0; 10],
            ..Default::default()
        };
        s.done.insert("charged".into(), 10);
        let lines = emf_lines(&s, &names, 1_796_162_920_497);
        assert_eq!(lines.len(), 1);
        // The log budget: 24 bytes a payment beside Lambda's own lines, for a batch of ten.
        assert!(
            lines[0].len() <= 240,
            "{} bytes: {}",
            lines[0].len(),
            lines[0]
        );
        let doc: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(doc["Charged"], 10);
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Metrics"],
            serde_json::json!([{"Name": "Charged"}])
        );
        // Two deployments in one account publish apart: the stack leads every dimension set.
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["Stack", "Service"]])
        );
        assert_eq!(doc["Stack"], "payments-prod");
        s.dead_lettered.insert("invalid_json".into(), 1);
        let by_reason: serde_json::Value =
            serde_json::from_str(&emf_lines(&s, &names, 1_796_162_920_497)[1]).unwrap();
        assert_eq!(
            by_reason["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["Stack", "Service", "Reason"]])
        );
        assert_eq!(by_reason["Stack"], "payments-prod");
    }
}
