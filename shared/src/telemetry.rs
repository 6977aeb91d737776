//! Structured JSON logs and CloudWatch Embedded Metric Format (EMF) metrics.

/// Installs the JSON log subscriber (level from `RUST_LOG`: `error`, `warn`, `info`, `debug`,
/// `trace` or `off`; default `info`). Each line carries the current span's fields, so every
/// line of a message names its `message_id` and idempotency `key`. Safe to call twice (the second
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
