//! A local OTLP/HTTP trace receiver: what the local runs and the tests export their spans to
//! (`POST /v1/traces`, protobuf `ExportTraceServiceRequest`), decoded with the OpenTelemetry
//! project's own generated messages (`opentelemetry-proto`), kept in memory and, when asked,
//! written one JSON object a span to a file (`.local/run/traces.jsonl` in `make demo`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use serde::Serialize;

/// One span as received.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReceivedSpan {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent_span_id: String,
    /// `process payments`, `POST /v1/payment_intents`, ...
    pub name: String,
    /// `server`, `client`, `producer`, `consumer` or `internal`.
    pub kind: &'static str,
    /// The resource's `service.name`.
    pub service: String,
    /// The span's attributes, each value as JSON.
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// The spans it links to: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// Its events' names.
    pub events: Vec<String>,
    /// Its status is `ERROR`.
    pub error: bool,
    /// Start, epoch ns.
    pub start_ns: u64,
}

impl ReceivedSpan {
    /// An attribute as text (a string's value, a number's digits).
    pub fn attr(&self, name: &str) -> Option<String> {
        self.attributes.get(name).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

fn value_of(v: Option<&AnyValue>) -> serde_json::Value {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone().into(),
        Some(any_value::Value::BoolValue(b)) => (*b).into(),
        Some(any_value::Value::IntValue(i)) => (*i).into(),
        Some(any_value::Value::DoubleValue(d)) => (*d).into(),
        Some(any_value::Value::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| value_of(Some(v)))
            .collect::<Vec<_>>()
            .into(),
        Some(other) => format!("{other:?}").into(),
        None => serde_json::Value::Null,
    }
}

fn attributes_of(kvs: &[KeyValue]) -> BTreeMap<String, serde_json::Value> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value_of(kv.value.as_ref())))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The spans of one export request's body.
pub fn decode(body: &[u8]) -> Result<Vec<ReceivedSpan>> {
    let request =
        ExportTraceServiceRequest::decode(body).context("not an OTLP ExportTraceServiceRequest")?;
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes_of(&r.attributes))
            .unwrap_or_default();
        let service = resource
            .get("service.name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        for scope in resource_spans.scope_spans {
            for s in scope.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    kind: match s.kind {
                        2 => "server",
                        3 => "client",
                        4 => "producer",
                        5 => "consumer",
                        _ => "internal",
                    },
                    service: service.clone(),
                    attributes: attributes_of(&s.attributes),
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    events: s.events.into_iter().map(|e| e.name).collect(),
                    error: s.status.is_some_and(|st| st.code == 2),
                    start_ns: s.start_time_unix_nano,
                });
            }
        }
    }
    Ok(out)
}

struct State {
    spans: Mutex<Vec<ReceivedSpan>>,
    out: Option<Mutex<std::fs::File>>,
}

/// The receiver, serving until dropped.
pub struct OtlpReceiver {
    address: std::net::SocketAddr,
    state: Arc<State>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl OtlpReceiver {
    /// Serves on `address` (`127.0.0.1:0`: an ephemeral port), appending each span to `out`
    /// as a JSON line when given.
    pub async fn start(address: &str, out: Option<&std::path::Path>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("binding the OTLP receiver to {address}"))?;
        let address = listener.local_addr()?;
        let out = match out {
            Some(path) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            )),
            None => None,
        };
        let state = Arc::new(State {
            spans: Mutex::new(Vec::new()),
            out,
        });
        let shared = state.clone();
        let server = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                connections.spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req| receive(state.clone(), req));
                    // A connection ends when its exporter goes; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            state,
            server,
        })
    }

    /// The base URL to export to (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.state
            .spans
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        "application/x-protobuf".parse().expect("a header value"),
    );
    response
}

async fn receive(
    state: Arc<State>,
    req: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" {
        return Ok(reply(StatusCode::NOT_FOUND, Bytes::new()));
    }
    let Ok(body) = req.into_body().collect().await else {
        return Ok(reply(StatusCode::BAD_REQUEST, Bytes::new()));
    };
    let spans = match decode(&body.to_bytes()) {
        Ok(spans) => spans,
        Err(_) => return Ok(reply(StatusCode::BAD_REQUEST, Bytes::new())),
    };
    if let Some(out) = &state.out {
        if let Ok(mut file) = out.lock() {
            for span in &spans {
                if let Ok(line) = serde_json::to_string(span) {
                    let _ = writeln!(file, "{line}");
                }
            }
        }
    }
    if let Ok(mut all) = state.spans.lock() {
        all.extend(spans);
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    Ok(reply(StatusCode::OK, Bytes::new()))
}

/// The spans of `trace` as an indented tree, each line a span's name, kind and what it says
/// (`idempotency.outcome`, the status code, Stripe's `Request-Id`), children under parents in
/// start order; a span whose parent was not received is a root.
pub fn tree(spans: &[ReceivedSpan], trace: &str) -> Vec<String> {
    let mut of_trace: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.trace_id == trace).collect();
    of_trace.sort_by_key(|s| s.start_ns);
    let known: std::collections::HashSet<&str> =
        of_trace.iter().map(|s| s.span_id.as_str()).collect();
    let mut out = Vec::new();
    fn walk(
        all: &[&ReceivedSpan],
        parent: Option<&str>,
        known: &std::collections::HashSet<&str>,
        depth: usize,
        out: &mut Vec<String>,
    ) {
        for s in all.iter().filter(|s| match parent {
            Some(p) => s.parent_span_id == p,
            None => !known.contains(s.parent_span_id.as_str()),
        }) {
            let said: Vec<String> = [
                "idempotency.outcome",
                "http.response.status_code",
                "stripe.request_id",
                "error.type",
            ]
            .iter()
            .filter_map(|k| s.attr(k).map(|v| format!("{k}={v}")))
            .collect();
            out.push(format!(
                "{}{} ({}, {}){}",
                "  ".repeat(depth + 1),
                s.name,
                s.kind,
                s.service,
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {}", said.join(" "))
                }
            ));
            if depth < 12 {
                walk(all, Some(&s.span_id), known, depth + 1, out);
            }
        }
    }
    walk(&of_trace, None, &known, 0, &mut out);
    out
}

/// What a run's traces were, for its report: how many spans in how many traces went to `file`,
/// and one charged payment's trace as a [`tree`], one the API accepted when there is one (what
/// `payctl status`'s trace id finds).
pub fn summary(spans: &[ReceivedSpan], file: &std::path::Path) -> Vec<String> {
    let traces: std::collections::HashSet<&str> =
        spans.iter().map(|s| s.trace_id.as_str()).collect();
    let mut out = vec![format!(
        "traces:                   {} spans in {} traces, written to {}",
        spans.len(),
        traces.len(),
        file.display()
    )];
    let charged = |trace: &str| {
        spans.iter().any(|c| {
            c.trace_id == trace
                && c.name == "POST /v1/payment_intents"
                && c.attr("http.response.status_code").as_deref() == Some("200")
        })
    };
    let shown = spans
        .iter()
        .find(|s| s.name == "POST /v1/payments" && charged(&s.trace_id))
        .or_else(|| spans.iter().find(|s| charged(&s.trace_id)));
    if let Some(s) = shown {
        out.push(format!("one payment's trace ({}):", s.trace_id));
        out.extend(tree(spans, &s.trace_id));
    }
    out
}

/// Starts a receiver writing every span to `file` (emptied first) and makes this process's
/// spans go there as `service`, through the layer a function installs (before any other thread
/// reads the environment: call it first).
pub async fn export_this_process(file: &std::path::Path, service: &str) -> Result<OtlpReceiver> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(file);
    let receiver = OtlpReceiver::start("127.0.0.1:0", Some(file)).await?;
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    std::env::set_var("OTEL_SERVICE_NAME", service);
    payment_core::telemetry::init_traces();
    Ok(receiver)
}
