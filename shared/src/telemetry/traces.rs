//! Traces: the process's `tracing` spans exported as OpenTelemetry spans over OTLP/HTTP
//! (protobuf), when the standard `OTEL_*` variables turn it on.
//!
//! On when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` names a
//! collector, or `OTEL_TRACES_EXPORTER=otlp`; off when none is set, or `OTEL_SDK_DISABLED=true`,
//! or `OTEL_TRACES_EXPORTER=none`. The SDK reads the rest itself: the sampler
//! (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`; parent-based, always on by default), the
//! resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the exporter's headers, timeout
//! and compression. A configuration it cannot use (another protocol or exporter, a bad
//! endpoint) is logged as an error and leaves traces off: tracing never stops a payment.
//!
//! Spans leave from the SDK's own thread in batches; [`flush`] sends what is pending, and each
//! function calls it before its invocation returns (Lambda freezes the process after).

use std::sync::OnceLock;

use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The provider, once traces are on.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether traces go out, from the process's variables: `Ok(false)` off, `Err` a setting this
/// build cannot honour (the reason, for the log).
pub fn wanted(var: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let exporter = set("OTEL_TRACES_EXPORTER");
    match exporter.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("none") => return Ok(false),
        Some("otlp") | None => {}
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other}: this build exports traces over OTLP only (otlp, or none)"
            ))
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = set(name) {
            if p != "http/protobuf" {
                return Err(format!(
                    "{name}={p}: this build exports OTLP over HTTP with protobuf only (http/protobuf)"
                ));
            }
            break;
        }
    }
    Ok(exporter.is_some()
        || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
}

/// The exporting layer for `service` (the name used when `OTEL_SERVICE_NAME` is unset: the
/// Lambda function's name, else the process's), or `None` when traces are off. Called once, by
/// `telemetry::init`.
pub(crate) fn layer<S>(service: &str) -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    match wanted(|name| std::env::var(name).ok()) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(why) => {
            eprintln!("{{\"level\":\"ERROR\",\"message\":\"traces are off: {why}\"}}");
            return None;
        }
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "{{\"level\":\"ERROR\",\"message\":\"traces are off: the OTLP exporter: {}\"}}",
                e.to_string().replace('"', "'")
            );
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service.to_owned());
    }
    let attributes = [
        (
            "cloud.provider",
            std::env::var("AWS_LAMBDA_FUNCTION_NAME")
                .ok()
                .map(|_| "aws".to_owned()),
        ),
        ("cloud.region", std::env::var("AWS_REGION").ok()),
        ("faas.name", std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok()),
        (
            "faas.version",
            std::env::var("AWS_LAMBDA_FUNCTION_VERSION").ok(),
        ),
    ];
    let resource = resource
        .with_attributes(
            attributes
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| KeyValue::new(k, v))),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let layer = layer_for(&provider);
    let _ = PROVIDER.set(provider);
    Some(layer)
}

/// The layer that turns this process's own spans at INFO and above into `provider`'s spans
/// (no source locations, threads or targets: what a span means is in its name and attributes).
/// Its own: those of `sqs-once` and this crate, not a dependency's (the Lambda runtime's span
/// around each invocation would be every batch's parent and end only after the flush, so it
/// would leave with the next invocation's spans, or never).
/// [`crate::telemetry::init`] installs it with the provider the `OTEL_*` variables configure;
/// a test can give its own.
pub fn layer_for<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    let tracer = opentelemetry::trace::TracerProvider::tracer(provider, "exactly-once-payments");
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            *m.level() <= tracing::Level::INFO && ours(m.target())
        }))
}

/// Whether a span or event of this target is the system's own.
fn ours(target: &str) -> bool {
    target == sqs_once::trace::SPAN_TARGET
        || ["sqs_once", "payment_core"].iter().any(|c| {
            target
                .strip_prefix(c)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
}

/// Sends the spans that ended and are still pending, and waits for the collector's answer
/// (bounded by the exporter's timeout). Nothing when traces are off. Call it after the
/// invocation's spans have ended and before the invocation returns.
pub fn flush() {
    if let Some(provider) = PROVIDER.get() {
        if let Err(e) = provider.force_flush() {
            tracing::warn!(error = %e, "traces: the flush failed; this invocation's spans may be lost");
        }
    }
}

/// Runs one invocation's `work`, then [`flush`]es its spans, waiting for the collector at most
/// until a second before `deadline_ms` (the invocation's deadline, epoch ms, as the Lambda
/// context gives it): a slow collector
/// costs the invocation's trace, never its answer (a late answer would send the whole batch
/// back).
pub async fn flushed<T>(deadline_ms: u64, work: impl std::future::Future<Output = T>) -> T {
    let out = work.await;
    let Some(provider) = PROVIDER.get() else {
        return out;
    };
    let deadline_ms = i64::try_from(deadline_ms).unwrap_or(i64::MAX);
    let left = deadline_ms
        .saturating_sub(sqs_once::runner::now_ms())
        .saturating_sub(1_000);
    let provider = provider.clone();
    let flush = tokio::task::spawn_blocking(move || provider.force_flush());
    match tokio::time::timeout(std::time::Duration::from_millis(left.max(0) as u64), flush).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "traces: the flush failed; this invocation's spans may be lost")
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "traces: the flush did not finish"),
        Err(_) => tracing::warn!(
            "traces: the collector did not take this invocation's spans before its deadline; answering without them"
        ),
    }
    out
}

/// Sends what is pending and stops exporting: a local process's last call before it exits
/// (`payctl run`), so that its last spans are not lost with it.
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        if let Err(e) = provider.shutdown() {
            eprintln!("traces: the last spans could not be sent: {e}");
        }
    }
}

/// The span of one HTTP request this system serves (kind server), `METHOD ROUTE`; record its
/// answer with [`answered`]. Its `idempotency.outcome` is for the route to record.
pub fn request_span(method: &str, route: &str) -> tracing::Span {
    tracing::info_span!(
        target: "otel",
        "request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        idempotency.outcome = tracing::field::Empty,
    )
}

/// Records a request's answer on its span: the status, and an error from 500 up.
pub fn answered(span: &tracing::Span, status: u16) {
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// Whether this process exports traces.
pub fn on() -> bool {
    PROVIDER.get().is_some()
}

#[cfg(test)]
mod tests {
    use super::wanted;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn traces_are_on_only_when_a_collector_is_named_and_nothing_turns_them_off() {
        assert_eq!(wanted(vars(&[])), Ok(false));
        assert_eq!(
            wanted(vars(&[(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://localhost:4318"
            )])),
            Ok(true)
        );
        assert_eq!(
            wanted(vars(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:4318/v1/traces"
            )])),
            Ok(true)
        );
        assert_eq!(wanted(vars(&[("OTEL_TRACES_EXPORTER", "otlp")])), Ok(true));
        for off in [
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "TRUE"),
            ],
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_EXPORTER", "none"),
            ],
        ] {
            assert_eq!(wanted(vars(&off)), Ok(false), "{off:?}");
        }
        assert_eq!(
            wanted(vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "false")
            ])),
            Ok(true)
        );
    }

    #[test]
    fn only_the_system_s_own_spans_are_exported() {
        for own in [
            "otel",
            "sqs_once",
            "sqs_once::trace",
            "payment_core::stripe::client",
        ] {
            assert!(super::ours(own), "{own}");
        }
        for other in [
            "lambda_runtime::layers::trace",
            "lambda_http",
            "aws_config",
            "sqs_oncer",
        ] {
            assert!(!super::ours(other), "{other}");
        }
    }

    #[test]
    fn a_protocol_or_exporter_this_build_lacks_is_refused_with_its_name() {
        for bad in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
        ] {
            let why = wanted(vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                bad,
            ]))
            .unwrap_err();
            assert!(why.contains(bad.0) && why.contains(bad.1), "{why}");
        }
        // The signal's own protocol wins over the general one.
        assert_eq!(
            wanted(vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ])),
            Ok(true)
        );
    }
}
