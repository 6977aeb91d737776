//! Structured JSON logs, CloudWatch Embedded Metric Format (EMF) metrics, and [`traces`]
//! (OpenTelemetry).
//!
//! May use: nothing else (the floors above log through it).

pub mod traces;

/// Installs the JSON log subscriber (level from `RUST_LOG`: `error`, `warn`, `info`, `debug`,
/// `trace` or `off`; default `info`). Each line carries the current span's fields, so every
/// line of a message names its `message_id` and idempotency `key`. Safe to call twice (the second
/// call does nothing). A plain level, not per-module directives: the regex engine those need
/// would grow every bootstrap.
pub fn init() {
    METRICS.store(true, std::sync::atomic::Ordering::Relaxed);
    init_with(false);
}

/// Whether this process writes EMF metric lines on stdout: a Lambda function's does ([`init`]);
/// a local process (`payctl run`) keeps its stdout for its own output.
static METRICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True in a Lambda function (after [`init`]).
pub fn metrics_on() -> bool {
    METRICS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One EMF line of the `Provider` namespace, with no dimension but this process's own
/// ([`dimensions`]): `name` (`ProviderRateLimited`, `ProviderErrors`,
/// `ProviderAuthenticationFailures`) counted `count` times. The dashboard and the alarms read
/// them as is.
pub fn provider_metric(name: &str, count: u64, now_ms: i64) -> String {
    with_dimensions(
        serde_json::json!({
            "_aws": {
                "Timestamp": now_ms,
                "CloudWatchMetrics": [{
                    "Namespace": "Provider",
                    "Dimensions": [[]],
                    "Metrics": [{"Name": name, "Unit": "Count"}]
                }]
            },
            name: count,
        }),
        dimensions(),
    )
    .to_string()
}

/// The dimensions every metric line of this process carries ahead of its own: `Stack`, from
/// `STACK_NAME` (the template sets it on every function to the stack's name), so that two
/// stacks in one account and region (staging and production, or the two halves of a split
/// load) publish apart and each stack's alarms and dashboard read its own. None when unset.
pub fn dimensions() -> &'static [(String, String)] {
    static DIMENSIONS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    DIMENSIONS.get_or_init(|| dimensions_of(std::env::var(STACK_VAR).ok()))
}

/// The variable [`dimensions`] reads (`make check-template` holds every function of the
/// template to being given it, with the stack's name).
pub const STACK_VAR: &str = "STACK_NAME";

/// [`dimensions`] of a stack's name (`None` or blank: none).
pub fn dimensions_of(stack: Option<String>) -> Vec<(String, String)> {
    stack
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .map(|s| vec![("Stack".to_owned(), s)])
        .unwrap_or_default()
}

/// An EMF document with `dims` put ahead of each of its dimension sets, and their values.
pub fn with_dimensions(mut doc: serde_json::Value, dims: &[(String, String)]) -> serde_json::Value {
    if dims.is_empty() {
        return doc;
    }
    if let Some(directives) = doc["_aws"]["CloudWatchMetrics"].as_array_mut() {
        for directive in directives {
            if let Some(sets) = directive["Dimensions"].as_array_mut() {
                for set in sets {
                    let own = set.as_array().cloned().unwrap_or_default();
                    *set = dims
                        .iter()
                        .map(|(name, _)| serde_json::Value::from(name.as_str()))
                        .chain(own)
                        .collect();
                }
            }
        }
    }
    for (name, value) in dims {
        doc[name.as_str()] = value.as_str().into();
    }
    doc
}

/// A budget of lines a second for something that can happen at any rate (refused deliveries,
/// the provider's refusals): the first [`LineBudget::LINES`] of each second are written at
/// once; those past it are counted into the next second's first line (a count still pending
/// when the process stops is lost: a flood is undercounted, a few events never are).
pub struct LineBudget {
    /// (the current second's start, lines written in it, events not written yet)
    state: std::sync::Mutex<(Option<std::time::Instant>, u32, u64)>,
}

impl Default for LineBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl LineBudget {
    const WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
    /// Lines a second.
    pub const LINES: u32 = 10;

    /// A budget with nothing counted.
    pub const fn new() -> Self {
        Self {
            state: std::sync::Mutex::new((None, 0, 0)),
        }
    }

    /// Counts one event at `now`; the count to write, when a line is due.
    pub fn tally(&self, now: std::time::Instant) -> Option<u64> {
        let mut state = self.state.lock().ok()?;
        let (start, lines, pending) = &mut *state;
        *pending += 1;
        if start.is_none_or(|at| now.saturating_duration_since(at) >= Self::WINDOW) {
            *start = Some(now);
            *lines = 0;
        }
        if *lines >= Self::LINES {
            return None;
        }
        *lines += 1;
        Some(std::mem::take(pending))
    }
}

/// [`init`] with a timestamp on every line, for processes outside Lambda (`payctl run`, the
/// local API and relay), where nothing else stamps the lines; on a terminal, short text lines
/// instead of JSON, so that the log does not bury the progress and the summary.
pub fn init_timed() {
    init_with(true);
}

/// Only the trace exporter, when the `OTEL_*` variables turn it on, and no log: for a command
/// whose output is its own (`payctl send`).
pub fn init_traces() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    if let Some(layer) = traces::layer(&service_name()) {
        let _ = tracing_subscriber::registry().with(layer).try_init();
    }
}

fn init_with(timed: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| {
            v.trim()
                .parse::<tracing_subscriber::filter::LevelFilter>()
                .ok()
        })
        .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO);
    // Spans at INFO and above are exported whatever RUST_LOG lets into the log.
    let traces = traces::layer(&service_name());
    // A person at a terminal reads one short line an event; anything else (Lambda, a file, a
    // pipe) gets one JSON object a line.
    let log = if timed && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        tracing_subscriber::fmt::layer()
            .compact()
            .with_target(false)
            .with_writer(std::io::stderr)
            .with_filter(logged(level))
            .boxed()
    } else {
        json_log_layer(std::io::stderr, level, timed).boxed()
    };
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(traces)
        .try_init();
}

/// The JSON log layer: one object a line, with the current span's fields (a message's
/// `message_id` and `key`), no target; a timestamp when `timed` (CloudWatch stamps a Lambda's
/// lines itself). The spans that exist for the trace alone
/// ([`sqs_once::trace::SPAN_TARGET`]) are left out, so a line logged inside a claim or a
/// provider call still names its message.
pub fn json_log_layer<S, W>(
    writer: W,
    level: tracing_subscriber::filter::LevelFilter,
    timed: bool,
) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer;
    let json = tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .with_writer(writer);
    if timed {
        json.with_filter(logged(level)).boxed()
    } else {
        json.without_time().with_filter(logged(level)).boxed()
    }
}

/// What a log layer lets through: `level` and above, no span that exists for the trace alone.
fn logged<S>(
    level: tracing_subscriber::filter::LevelFilter,
) -> impl tracing_subscriber::layer::Filter<S> {
    use tracing_subscriber::filter::FilterExt;
    level.and(tracing_subscriber::filter::filter_fn(|m| {
        !(m.is_span() && m.target() == sqs_once::trace::SPAN_TARGET)
    }))
}

/// The service a process's spans name when `OTEL_SERVICE_NAME` is unset: the Lambda function's
/// name, else the program's.
fn service_name() -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME")
        .ok()
        .or_else(|| {
            std::env::args_os().next().and_then(|p| {
                std::path::Path::new(&p)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
        })
        .unwrap_or_else(|| "exactly-once-payments".to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_provider_metric_is_an_emf_line_without_dimensions() {
        let line: serde_json::Value =
            serde_json::from_str(&super::provider_metric("ProviderRateLimited", 3, 1_000)).unwrap();
        let m = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(m["Namespace"], "Provider");
        // No dimension of its own: only the process's (the stack's name, when STACK_NAME is set).
        let own: Vec<&str> = super::dimensions()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(m["Dimensions"], serde_json::json!([own]));
        assert_eq!(m["Metrics"][0]["Name"], "ProviderRateLimited");
        assert_eq!(line["ProviderRateLimited"], 3);
        assert_eq!(line["_aws"]["Timestamp"], 1_000);
    }

    #[test]
    fn a_stacks_name_leads_every_dimension_set_so_two_stacks_publish_apart() {
        let doc = || {
            serde_json::json!({
                "_aws": {"Timestamp": 1, "CloudWatchMetrics": [{
                    "Namespace": "ProviderEvents",
                    "Dimensions": [["Service"], []],
                    "Metrics": [{"Name": "SignatureFailures"}]
                }]},
                "Service": "provider-events",
                "SignatureFailures": 1,
            })
        };
        let lines: Vec<_> = ["staging", "production"]
            .iter()
            .map(|stack| {
                super::with_dimensions(doc(), &super::dimensions_of(Some((*stack).to_owned())))
            })
            .collect();
        for (line, stack) in lines.iter().zip(["staging", "production"]) {
            assert_eq!(
                line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
                serde_json::json!([["Stack", "Service"], ["Stack"]])
            );
            assert_eq!(line["Stack"], stack);
            assert_eq!(line["Service"], "provider-events");
        }
        assert_eq!(
            super::with_dimensions(doc(), &super::dimensions_of(None)),
            doc()
        );
        assert!(super::dimensions_of(Some("  ".into())).is_empty());
    }

    #[test]
    fn a_line_budget_writes_ten_a_second_and_carries_the_rest() {
        let budget = super::LineBudget::new();
        let t0 = std::time::Instant::now();
        for _ in 0..10 {
            assert_eq!(budget.tally(t0), Some(1));
        }
        assert_eq!(budget.tally(t0), None);
        assert_eq!(budget.tally(t0), None);
        assert_eq!(
            budget.tally(t0 + std::time::Duration::from_secs(1)),
            Some(3)
        );
    }
}
