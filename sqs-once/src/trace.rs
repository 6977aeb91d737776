//! Trace context on SQS messages, and what the runner records on its spans.
//!
//! A producer sends its span's W3C Trace Context with each message, as the `String` message
//! attributes `traceparent` (and `tracestate`), as OpenTelemetry's messaging conventions do
//! for SQS ([`current_attributes`] gives them). The runner then gives each message a span
//! (`process <queue>`, kind consumer) whose parent is the producer's span, so that the message
//! continues the trace that sent it, and the batch one span (also `process <queue>`) that
//! links every message's producer. On those spans it records `messaging.*` attributes and the
//! idempotency outcome (`idempotency.outcome`, see [`Outcome`]).
//!
//! All of it needs the `opentelemetry` feature and a `tracing-opentelemetry` layer in the
//! process's subscriber; without either, these functions do nothing and the spans are plain
//! `tracing` spans (the logs' `message_id` and `key`).

use aws_lambda_events::event::sqs::SqsMessage;

/// The target of the spans that exist for the trace alone (a claim, a call, a completion, the
/// batch): a log layer leaves them out (`tracing_subscriber`'s per-layer filter on
/// `metadata.target() != "otel"`), so that each line logged inside a message still names the
/// message's span, with its `message_id` and `key`, as its current span.
pub const SPAN_TARGET: &str = "otel";

/// A span for the trace alone ([`SPAN_TARGET`], INFO); none without the `opentelemetry`
/// feature, so that a process without a trace layer logs as before.
macro_rules! otel_span {
    ($name:literal $($rest:tt)*) => {{
        #[cfg(feature = "opentelemetry")]
        let span = ::tracing::info_span!(target: "otel", $name $($rest)*);
        #[cfg(not(feature = "opentelemetry"))]
        let span = ::tracing::Span::none();
        span
    }};
}
pub(crate) use otel_span;

/// The message attribute carrying the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The message attribute carrying the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";

/// What the claim found, as the message span's `idempotency.outcome` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new key: this delivery holds the lease (`claimed`).
    Claimed,
    /// An expired lease or a failed attempt taken over (`taken_over`); with
    /// `idempotency.unknown_outcome` when an earlier call's outcome is not known.
    TakenOver,
    /// Completed before: absorbed without executing (`duplicate`).
    Duplicate,
    /// Another delivery holds the lease (`in_progress_elsewhere`).
    InProgressElsewhere,
    /// An earlier call may still land downstream; not before its time (`not_yet`).
    NotYet,
    /// The key was used for a different request: never executed (`key_reused`).
    KeyReused,
    /// This delivery's own claim, whose answer was lost (`own_claim_recovered`).
    OwnClaimRecovered,
    /// The record changed during the claim (`claim_raced`).
    ClaimRaced,
}

impl Outcome {
    /// The attribute's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Claimed => "claimed",
            Outcome::TakenOver => "taken_over",
            Outcome::Duplicate => "duplicate",
            Outcome::InProgressElsewhere => "in_progress_elsewhere",
            Outcome::NotYet => "not_yet",
            Outcome::KeyReused => "key_reused",
            Outcome::OwnClaimRecovered => "own_claim_recovered",
            Outcome::ClaimRaced => "claim_raced",
        }
    }
}

/// A message's `String` attribute.
fn attribute<'a>(msg: &'a SqsMessage, name: &str) -> Option<&'a str> {
    msg.message_attributes
        .get(name)
        .and_then(|a| a.string_value.as_deref())
        .filter(|v| !v.is_empty())
}

/// The queue's name, from the message's `eventSourceARN` (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
pub(crate) fn queue_name(msg: &SqsMessage) -> &str {
    msg.event_source_arn
        .as_deref()
        .and_then(|arn| arn.rsplit(':').next())
        .unwrap_or("")
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::collections::HashMap;

    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The remote span context a `traceparent` (and `tracestate`) name, if valid.
    pub(super) fn context(
        traceparent: &str,
        tracestate: Option<&str>,
    ) -> Option<opentelemetry::Context> {
        let mut carrier = HashMap::new();
        carrier.insert(crate::trace::TRACEPARENT.to_owned(), traceparent.to_owned());
        if let Some(s) = tracestate {
            carrier.insert(crate::trace::TRACESTATE.to_owned(), s.to_owned());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        cx.span().span_context().is_valid().then_some(cx)
    }

    /// `span`'s context as W3C headers, if it has a valid one.
    pub(super) fn headers(span: &tracing::Span) -> Vec<(String, String)> {
        let cx = span.context();
        if !cx.span().span_context().is_valid() {
            return Vec::new();
        }
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        let mut out: Vec<(String, String)> =
            carrier.into_iter().filter(|(_, v)| !v.is_empty()).collect();
        out.sort();
        out
    }

    pub(super) fn trace_id(span: &tracing::Span) -> Option<String> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| sc.trace_id().to_string())
    }

    pub(super) fn set_parent(span: &tracing::Span, cx: opentelemetry::Context) {
        let _ = span.set_parent(cx);
    }

    pub(super) fn link(span: &tracing::Span, cx: &opentelemetry::Context) {
        span.add_link(cx.span().span_context().clone());
    }

    pub(super) fn set(span: &tracing::Span, key: &'static str, value: crate::trace::Value) {
        match value {
            crate::trace::Value::Str(s) => span.set_attribute(key, s),
            crate::trace::Value::Int(i) => span.set_attribute(key, i),
            crate::trace::Value::Bool(b) => span.set_attribute(key, b),
        }
    }
}

/// An attribute's value.
#[derive(Debug, Clone)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A flag.
    Bool(bool),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// Sets an OpenTelemetry attribute on `span` (not a `tracing` field: the logs do not carry it).
pub fn set_attribute(span: &tracing::Span, key: &'static str, value: impl Into<Value>) {
    #[cfg(feature = "opentelemetry")]
    otel::set(span, key, value.into());
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, key, value.into());
}

/// The current span's trace context as message attributes (`traceparent`, and `tracestate`
/// when it has one), for a producer to send with its message. Empty when the span has no
/// valid context (no exporting layer, or the feature is off).
pub fn current_attributes() -> Vec<(String, String)> {
    #[cfg(feature = "opentelemetry")]
    return otel::headers(&tracing::Span::current());
    #[cfg(not(feature = "opentelemetry"))]
    Vec::new()
}

/// The current span's `traceparent`, for a record or a row to keep.
pub fn current_traceparent() -> Option<String> {
    current_attributes()
        .into_iter()
        .find(|(k, _)| k == TRACEPARENT)
        .map(|(_, v)| v)
}

/// The current span's trace id (32 lowercase hex digits), when it has a valid context.
pub fn current_trace_id() -> Option<String> {
    #[cfg(feature = "opentelemetry")]
    return otel::trace_id(&tracing::Span::current());
    #[cfg(not(feature = "opentelemetry"))]
    None
}

/// The trace id a `traceparent` names (`00-<trace id>-<span id>-<flags>`), if well formed.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_, id) = (parts.next()?, parts.next()?);
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id != "0".repeat(32))
        .then_some(id)
}

/// Makes `span` continue the trace `traceparent` names: its parent. Call before the span is
/// first entered. Nothing when the value is not a valid `traceparent`.
pub fn continue_trace(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    #[cfg(feature = "opentelemetry")]
    if let Some(cx) = otel::context(traceparent, tracestate) {
        otel::set_parent(span, cx);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, traceparent, tracestate);
}

/// Links `span` to the span `traceparent` names (another trace: the payment a refund or an
/// event belongs to, a message of a batch). Nothing when it is not a valid `traceparent`.
pub fn link(span: &tracing::Span, traceparent: &str) {
    #[cfg(feature = "opentelemetry")]
    if let Some(cx) = otel::context(traceparent, None) {
        otel::link(span, &cx);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, traceparent);
}

tokio::task_local! {
    /// The runner's call attempt (1, 2, ...) the work's requests are made for.
    static ATTEMPT: i64;
}

/// Which of the runner's call attempts for this delivery the current request belongs to
/// (1 for the first), inside `Work::execute`; `None` elsewhere (a lookup).
pub fn attempt() -> Option<i64> {
    ATTEMPT.try_with(|n| *n).ok()
}

/// Runs `work` as call attempt `n`.
pub(crate) async fn in_attempt<F: std::future::Future>(n: i64, work: F) -> F::Output {
    ATTEMPT.scope(n, work).await
}

/// A producer's side: a `create <queue>` span (kind producer) for one message about to be sent,
/// continuing `parent` (a `traceparent` kept by a row, say) or else the current span's trace
/// (a new one when there is none), and the message attributes that carry its context
/// (`traceparent`, `tracestate`): send them with the message, as the payments API's outbox
/// relay and `payctl send` do. `queue` is the queue's URL (or its name); `key` is the
/// message's idempotency key, for the span. Empty when no trace layer records the span.
pub fn create_attributes(
    queue: &str,
    parent: Option<&str>,
    key: Option<&str>,
) -> Vec<(String, String)> {
    let queue = queue.rsplit('/').next().unwrap_or(queue);
    let span = otel_span!(
        "create",
        otel.name = format!("create {queue}"),
        otel.kind = "producer",
    );
    if let Some(parent) = parent {
        continue_trace(&span, parent, None);
    }
    set_attribute(&span, "messaging.system", "aws_sqs");
    set_attribute(&span, "messaging.operation.type", "create");
    set_attribute(&span, "messaging.operation.name", "create");
    set_attribute(&span, "messaging.destination.name", queue);
    if let Some(key) = key {
        set_attribute(&span, "idempotency.key", key);
    }
    let _entered = span.enter();
    current_attributes()
}

/// [`link`]s the current span to `traceparent`'s span, when there is one.
pub fn link_current(traceparent: Option<&str>) {
    if let Some(tp) = traceparent {
        link(&tracing::Span::current(), tp);
    }
}

/// The message's producer context (`traceparent`, `tracestate`), when it carries one.
pub(crate) fn producer(msg: &SqsMessage) -> Option<(&str, Option<&str>)> {
    attribute(msg, TRACEPARENT).map(|p| (p, attribute(msg, TRACESTATE)))
}

/// The span of one message: `message_id` and `key` for the logs; for the trace, the name
/// `process <queue>`, kind consumer, the producer's span as parent and a link to the batch's.
pub(crate) fn message_span(msg: &SqsMessage, batch: &tracing::Span) -> tracing::Span {
    let queue = queue_name(msg);
    // At the highest level, so it is enabled whatever RUST_LOG lets through: a warning logged
    // with RUST_LOG=warn still names its message_id and idempotency key. The trace's name and
    // kind are fields too (tracing-opentelemetry reads them there), so a log line inside a
    // message carries them: only with the feature.
    #[cfg(feature = "opentelemetry")]
    let span = tracing::error_span!(
        "message",
        message_id = msg.message_id.as_deref().unwrap_or_default(),
        key = tracing::field::Empty,
        otel.name = format!("process {queue}"),
        otel.kind = "consumer",
    );
    #[cfg(not(feature = "opentelemetry"))]
    let span = tracing::error_span!(
        "message",
        message_id = msg.message_id.as_deref().unwrap_or_default(),
        key = tracing::field::Empty,
    );
    // The producer's trace; a message that carries none starts its own (not the batch's, which
    // it shares with up to nine unrelated messages): the record keeps one trace a payment.
    match producer(msg) {
        Some((parent, state)) => continue_trace(&span, parent, state),
        None => {
            #[cfg(feature = "opentelemetry")]
            otel::set_parent(&span, opentelemetry::Context::new());
        }
    }
    #[cfg(feature = "opentelemetry")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let cx = batch.context();
        let sc = opentelemetry::trace::TraceContextExt::span(&cx)
            .span_context()
            .clone();
        if sc.is_valid() {
            span.add_link(sc);
        }
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = batch;
    messaging(&span, queue);
    if let Some(id) = &msg.message_id {
        set_attribute(&span, "messaging.message.id", id.as_str());
    }
    if let Some(n) = msg
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse::<i64>().ok())
    {
        set_attribute(&span, "messaging.aws_sqs.receive_count", n);
    }
    span
}

/// The span of one batch: `process <queue>`, kind consumer, linking each message's producer.
pub(crate) fn batch_span(records: &[SqsMessage]) -> tracing::Span {
    let queue = records.first().map(queue_name).unwrap_or("");
    let span = otel_span!(
        "batch",
        otel.name = format!("process {queue}"),
        otel.kind = "consumer",
    );
    for (parent, _) in records.iter().filter_map(producer) {
        link(&span, parent);
    }
    messaging(&span, queue);
    set_attribute(&span, "messaging.batch.message_count", records.len() as i64);
    span
}

fn messaging(span: &tracing::Span, queue: &str) {
    set_attribute(span, "messaging.system", "aws_sqs");
    set_attribute(span, "messaging.operation.type", "process");
    set_attribute(span, "messaging.operation.name", "process");
    set_attribute(span, "messaging.destination.name", queue);
}

/// Adds an event to the current span (the trace only: not a log line).
pub(crate) fn event(name: &'static str, attributes: &[(&'static str, i64)]) {
    #[cfg(feature = "opentelemetry")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        tracing::Span::current().add_event(
            name,
            attributes
                .iter()
                .map(|(k, v)| opentelemetry::KeyValue::new(*k, *v))
                .collect(),
        );
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (name, attributes);
}

/// Records the claim's outcome on the message's span (the current one).
pub(crate) fn outcome(outcome: Outcome) {
    on_message("idempotency.outcome", outcome.as_str());
}

/// Sets an attribute on the current span when it is a message's: a message handed back or
/// dead-lettered before its own span began (no permit, the deadline, a FIFO follower) records
/// nothing, rather than on the batch's span, where each would overwrite the last.
pub(crate) fn on_message(key: &'static str, value: impl Into<Value>) {
    let span = tracing::Span::current();
    if span.metadata().is_some_and(|m| m.name() == "message") {
        set_attribute(&span, key, value);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_trace_id_is_read_from_a_well_formed_traceparent_only() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            super::trace_id_of(tp),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "",
            "00",
            "00-4bf92f35-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(super::trace_id_of(bad), None, "{bad}");
        }
    }
}
