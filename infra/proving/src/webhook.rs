//! The public events route (`POST /v1/provider-events`, no IAM) under attack: what the worst
//! forged request costs beside a genuine delivery ([`costs`], a row of `make bench`), and a
//! flood of forgeries while genuine deliveries keep arriving ([`flood`]: a short run in
//! `make test`, 20 s in `make chaos`).
//!
//! The route is the one the stack runs ([`payctl::api::serve`] with the provider-events
//! receiver), holding two signing secrets as during a roll (the most a request can make it
//! hash); the verified events go to an in-memory queue, so what is measured is the route.
//!
//! Why ~530 lines (the flood command with them): the route's costs, the function's decoding
//! of API Gateway's event and the flood share the route, the forgeries and the genuine
//! deliveries they are measured with.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use payment_core::events::queue::EventQueue;
use payment_core::provider::event::ProviderEvent;
use payment_core::stripe::receiver::{EventReceiver, FixedSecrets, EVENTS_PATH, MAX_EVENT_BYTES};
use payment_core::stripe::webhook::{
    sign, SignatureCheck, DEFAULT_TOLERANCE_SECONDS, MAX_HEADER_BYTES, MAX_HEADER_ITEMS,
};
use secrecy::SecretString;
use serde_json::json;

/// The secrets the route holds: two, as while one is rolled.
const HELD: [&str; 2] = ["whsec_bench_old", "whsec_bench_new"];

fn now_s() -> i64 {
    sqs_once::runner::now_ms() / 1000
}

#[derive(Default)]
struct Memory(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl EventQueue for Memory {
    async fn enqueue(&self, _event: &ProviderEvent, body: &str) -> Result<(), String> {
        self.0
            .lock()
            .map_err(|e| e.to_string())?
            .push(body.to_owned());
        Ok(())
    }
}

/// The route, served on loopback, and what it queued.
pub struct Route {
    server: lambda_local::http::LocalHttp,
    receiver: Arc<EventReceiver>,
    queued: Arc<Memory>,
}

impl Route {
    /// Serves the payments API and the events route on an ephemeral port.
    pub async fn start() -> Result<Self> {
        let held = HELD
            .iter()
            .map(|s| SecretString::from((*s).to_owned()))
            .collect();
        let queued = Arc::new(Memory::default());
        let receiver = Arc::new(EventReceiver::new(
            Arc::new(FixedSecrets(held)),
            queued.clone(),
            DEFAULT_TOLERANCE_SECONDS,
        ));
        let config = payment_core::edges::config::ApiConfig::from_lookup(|k| match k {
            "PAYMENTS_TABLE" | "IDEMPOTENCY_TABLE" => Some("not-used-by-the-events-route".into()),
            _ => None,
        })?;
        let sdk = payment_core::edges::bootstrap::sdk_config().await;
        let api =
            payment_core::edges::bootstrap::build_api(&config, aws_sdk_dynamodb::Client::new(&sdk));
        let server =
            payctl::api::serve(Arc::new(api), Some(receiver.clone()), "127.0.0.1:0").await?;
        Ok(Self {
            server,
            receiver,
            queued,
        })
    }

    fn url(&self) -> String {
        format!("{}{EVENTS_PATH}", self.server.url())
    }
}

/// A genuine delivery: a fresh event signed now under the new secret.
fn genuine_delivery(n: usize) -> (String, String) {
    let body = json!({
        "id": format!("evt_flood_{n}_{}", uuid::Uuid::new_v4().simple()),
        "object": "event",
        "type": "payment_intent.succeeded",
        "created": now_s(),
        "data": {"object": {"id": format!("pi_flood_{n}"), "object": "payment_intent", "status": "succeeded"}},
    })
    .to_string();
    (sign(&[HELD[1]], now_s(), body.as_bytes()), body)
}

/// The forgeries, each with a body of the largest size accepted (valid UTF-8) and a fresh
/// timestamp (a stale one is refused before anything is hashed): the header as full of
/// well-formed `v1`s as the caps allow (the most comparisons), and the shapes that cost the
/// most before the caps (2,000 `v1`s, hex or empty).
fn forgeries() -> Vec<(&'static str, String)> {
    let t = now_s();
    let hex = |i: usize| format!("{:064x}", 0xf0f0_u128.wrapping_mul(i as u128 + 1));
    let mut full = format!("t={t}");
    for i in 0..MAX_HEADER_ITEMS - 1 {
        full.push_str(&format!(",v1={}", hex(i)));
    }
    assert!(full.len() <= MAX_HEADER_BYTES);
    let many: String = (0..2000).map(|i| format!(",v1={}", hex(i))).collect();
    vec![
        ("full header within the caps", full),
        ("2,000 hex v1", format!("t={t}{many}")),
        ("2,000 empty v1", format!("t={t}{}", ",v1=".repeat(2000))),
    ]
}

fn forged_body() -> String {
    let mut body = String::from(r#"{"id":"evt_forged","object":"event","pad":""#);
    body.push_str(&"x".repeat(MAX_EVENT_BYTES - body.len() - 2));
    body.push_str("\"}");
    body
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn summary(v: Vec<f64>) -> serde_json::Value {
    let v = sorted(v);
    json!({"samples": v.len(), "p50": quantile(&v, 0.5), "max": quantile(&v, 1.0)})
}

/// What one request costs, genuine and forged: the verifier alone (µs) and through the route
/// (ms, loopback, one request at a time), with the MACs each computed.
pub async fn costs(runs: usize) -> Result<serde_json::Value> {
    let route = Route::start().await?;
    let http = reqwest::Client::new();
    let check = SignatureCheck::new(
        HELD.iter()
            .map(|s| SecretString::from((*s).to_owned()))
            .collect(),
        DEFAULT_TOLERANCE_SECONDS,
    );
    let body = forged_body();
    let (worst_name, worst) = forgeries().remove(0);
    let mut rows = Vec::new();
    let cases: Vec<(String, String, String, u16)> = {
        let (h, b) = genuine_delivery(0);
        let mut c = vec![("genuine delivery".to_owned(), h, b, 200)];
        for (name, header) in forgeries() {
            c.push((format!("forged: {name}"), header, body.clone(), 400));
        }
        c
    };
    for (name, header, body, want) in &cases {
        let mut alone = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            let verdict = check.verify(Some(header), body.as_bytes(), sqs_once::runner::now_ms());
            alone.push(started.elapsed().as_secs_f64() * 1e6);
            if verdict.is_ok() != (*want == 200) {
                bail!("{name}: the verifier said {verdict:?}");
            }
        }
        let macs_before = route.receiver.macs_computed();
        let mut through = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            let status = http
                .post(route.url())
                .header("Stripe-Signature", header)
                .body(body.clone())
                .send()
                .await?
                .status()
                .as_u16();
            through.push(started.elapsed().as_secs_f64() * 1e3);
            if status != *want {
                bail!("{name}: the route answered {status}, not {want}");
            }
        }
        let macs = (route.receiver.macs_computed() - macs_before) as f64 / runs as f64;
        rows.push(json!({
            "case": name, "header_bytes": header.len(), "body_bytes": body.len(),
            "verifier_us": summary(alone), "route_ms": summary(through), "macs_per_request": macs,
        }));
    }
    // A body declared over the limit: answered 413 without being read.
    let oversized = declared_oversized(&route).await?;
    // As the function meets them: API Gateway's event decoded (lambda_http), then answered.
    let largest = "x".repeat(LAMBDA_LARGEST_BODY);
    let (genuine_header, genuine_body) = genuine_delivery(1);
    let mut function = Vec::new();
    for (name, header, body, want) in [
        (
            "genuine delivery",
            genuine_header.as_str(),
            genuine_body.as_str(),
            200,
        ),
        (
            "forged: full header within the caps",
            worst.as_str(),
            body.as_str(),
            400,
        ),
        (
            "forged: the largest body Lambda accepts (6 MB)",
            worst.as_str(),
            largest.as_str(),
            413,
        ),
    ] {
        let event = api_gateway_event(header, body);
        let mut times = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            let status = function_answer(&route.receiver, &event).await?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            if status != want {
                bail!("{name}: the function answered {status}, not {want}");
            }
        }
        function.push(json!({"case": name, "event_bytes": event.len(), "ms": summary(times)}));
    }
    let genuine_queued = route.queued.0.lock().map(|q| q.len()).unwrap_or(0);
    if genuine_queued != 2 * runs {
        bail!("{genuine_queued} genuine deliveries queued of {runs}");
    }
    Ok(json!({
        "runs": runs,
        "secrets_held": HELD.len(),
        "worst": worst_name,
        "worst_header_bytes": worst.len(),
        "cases": rows,
        "declared_oversized_ms": oversized,
        "function": function,
    }))
}

/// The largest request body API Gateway can hand the function: a synchronous invocation's
/// payload is at most 6 MB, the event's other fields included.
const LAMBDA_LARGEST_BODY: usize = 6 * 1000 * 1000 - 4096;

/// API Gateway's HTTP API event (payload 2.0) of a delivery to the events route.
fn api_gateway_event(signature: &str, body: &str) -> String {
    json!({
        "version": "2.0",
        "routeKey": format!("POST {EVENTS_PATH}"),
        "rawPath": EVENTS_PATH,
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json; charset=utf-8",
            "host": "abc123.execute-api.us-east-1.amazonaws.com",
            "stripe-signature": signature,
            "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        },
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {"method": "POST", "path": EVENTS_PATH, "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1", "userAgent": "Stripe/1.0"},
            "requestId": "bench",
            "routeKey": format!("POST {EVENTS_PATH}"),
            "stage": "$default",
            "time": "03/Dec/2026:00:00:00 +0000",
            "timeEpoch": 1_796_256_000_000_i64,
        },
        "body": body,
        "isBase64Encoded": false,
    })
    .to_string()
}

/// What the provider-events function does with one invocation's event: decodes it as
/// `lambda_http` does and lets the receiver answer.
async fn function_answer(receiver: &EventReceiver, event: &str) -> Result<u16> {
    let request = lambda_http::request::from_str(event)?;
    let (parts, body) = request.into_parts();
    let signature = parts
        .headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    let answer = receiver
        .handle(
            parts.method.as_str(),
            parts.uri.path(),
            signature,
            body.as_ref(),
        )
        .await;
    Ok(answer.status)
}

/// The rows of `make bench`'s table.
pub fn markdown(w: &serde_json::Value) -> String {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let mut s = String::new();
    for c in w["cases"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| events route, {} ({} B header, {} B body, {} secrets held; loopback, one at a time, {} requests) | p50 {:.2} ms, max {:.2} ms; the verifier alone p50 {:.0} µs; {} MACs per request |\n",
            c["case"].as_str().unwrap_or(""),
            c["header_bytes"],
            c["body_bytes"],
            w["secrets_held"],
            w["runs"],
            f(&c["route_ms"]["p50"]),
            f(&c["route_ms"]["max"]),
            f(&c["verifier_us"]["p50"]),
            f(&c["macs_per_request"]),
        ));
    }
    s.push_str(&format!(
        "| events route, a body declared over 256 KiB (Content-Length 10 MB, the body never sent) | 413 after {:.2} ms |\n",
        f(&w["declared_oversized_ms"])
    ));
    for c in w["function"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| events function, one invocation on one core (API Gateway's event decoded, then answered): {} ({} B event) | p50 {:.2} ms, max {:.2} ms |\n",
            c["case"].as_str().unwrap_or(""),
            c["event_bytes"],
            f(&c["ms"]["p50"]),
            f(&c["ms"]["max"]),
        ));
    }
    s
}

/// Sends only the head of a request declaring a body of 10 MB and times the answer: the
/// route must answer 413 without waiting for the body.
async fn declared_oversized(route: &Route) -> Result<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = route.server.url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await?;
    let started = Instant::now();
    stream
        .write_all(
            format!(
                "POST {EVENTS_PATH} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\nstripe-signature: t=1,v1=00\r\ncontent-length: 10485760\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut head = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut head))
        .await
        .context("no answer to a body declared over the limit without the body")??;
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    let line = String::from_utf8_lossy(&head[..n]);
    if !line.starts_with("HTTP/1.1 413") {
        bail!("a body declared over the limit was answered {line:?}");
    }
    Ok(elapsed)
}

/// The flood's settings.
#[derive(Debug, Clone)]
pub struct FloodSettings {
    /// How long the forgeries are sent.
    pub duration: Duration,
    /// Concurrent clients sending forgeries back to back.
    pub clients: usize,
    /// The gap between genuine deliveries.
    pub genuine_every: Duration,
    /// Each genuine delivery must be answered `200` within this.
    pub deadline: Duration,
}

/// What a flood measured.
#[derive(Debug, Clone)]
pub struct FloodReport {
    /// Genuine deliveries sent.
    pub genuine: usize,
    /// Of them, answered `200` within the deadline.
    pub genuine_in_time: usize,
    /// Genuine deliveries' latency, ms (p50, max).
    pub genuine_ms: (f64, f64),
    /// Forgeries answered, all `400`.
    pub forged: usize,
    /// Forgeries' latency, ms (p50, max).
    pub forged_ms: (f64, f64),
    /// Failures: a genuine delivery late or not `200`, a forgery not `400`.
    pub failures: Vec<String>,
    /// The events the route queued (each genuine delivery once, no forgery).
    pub queued: usize,
}

impl FloodReport {
    /// One line per figure, for the README and the runs' logs.
    pub fn lines(&self, s: &FloodSettings) -> String {
        format!(
            "flood: {} clients sending worst-case forgeries for {:.0} s, a genuine delivery every {:.1} s\n\
             forged: {} answered 400, p50 {:.1} ms, max {:.1} ms ({:.0}/s)\n\
             genuine: {} of {} answered 200 within {:.0} ms, p50 {:.1} ms, max {:.1} ms; {} queued\n",
            s.clients,
            s.duration.as_secs_f64(),
            s.genuine_every.as_secs_f64(),
            self.forged,
            self.forged_ms.0,
            self.forged_ms.1,
            self.forged as f64 / s.duration.as_secs_f64(),
            self.genuine_in_time,
            self.genuine,
            s.deadline.as_secs_f64() * 1e3,
            self.genuine_ms.0,
            self.genuine_ms.1,
            self.queued,
        )
    }
}

/// `settings.clients` clients send the worst forgeries back to back for `settings.duration`
/// while a genuine delivery arrives every `settings.genuine_every`.
pub async fn flood(settings: &FloodSettings) -> Result<FloodReport> {
    let route = Arc::new(Route::start().await?);
    let until = Instant::now() + settings.duration;
    let body = Arc::new(forged_body());
    let mut attackers = tokio::task::JoinSet::new();
    for client in 0..settings.clients {
        let (route, body) = (route.clone(), body.clone());
        attackers.spawn(async move {
            let http = reqwest::Client::new();
            let mut latencies = Vec::new();
            let mut wrong = Vec::new();
            let mut i = client;
            while Instant::now() < until {
                // Fresh timestamps: a stale forgery costs nothing.
                let shapes = forgeries();
                let (name, header) = &shapes[i % shapes.len()];
                i += 1;
                let started = Instant::now();
                let answer = http
                    .post(route.url())
                    .header("Stripe-Signature", header)
                    .body(body.as_bytes().to_vec())
                    .send()
                    .await;
                latencies.push(started.elapsed().as_secs_f64() * 1e3);
                match answer.map(|a| a.status().as_u16()) {
                    Ok(400) => {}
                    other => wrong.push(format!("forged ({name}): {other:?}")),
                }
            }
            (latencies, wrong)
        });
    }
    let http = reqwest::Client::new();
    let mut genuine = Vec::new();
    let mut failures = Vec::new();
    let mut n = 0;
    let mut next = Instant::now() + settings.genuine_every / 2;
    while next < until {
        tokio::time::sleep_until(next.into()).await;
        next += settings.genuine_every;
        n += 1;
        let (header, body) = genuine_delivery(n);
        let started = Instant::now();
        let status = http
            .post(route.url())
            .header("Stripe-Signature", header)
            .body(body)
            .send()
            .await
            .map(|a| a.status().as_u16());
        let ms = started.elapsed().as_secs_f64() * 1e3;
        genuine.push(ms);
        match status {
            Ok(200) if ms <= settings.deadline.as_secs_f64() * 1e3 => {}
            other => failures.push(format!("genuine delivery {n}: {other:?} after {ms:.0} ms")),
        }
    }
    let mut forged = Vec::new();
    while let Some(joined) = attackers.join_next().await {
        let (latencies, wrong) = joined?;
        forged.extend(latencies);
        failures.extend(wrong);
    }
    let queued = route.queued.0.lock().map(|q| q.len()).unwrap_or(0);
    if queued != n {
        failures.push(format!("{queued} events queued for {n} genuine deliveries"));
    }
    let (genuine_sorted, forged_sorted) = (sorted(genuine), sorted(forged));
    Ok(FloodReport {
        genuine: n,
        genuine_in_time: n - failures.iter().filter(|f| f.starts_with("genuine")).count(),
        genuine_ms: (
            quantile(&genuine_sorted, 0.5),
            quantile(&genuine_sorted, 1.0),
        ),
        forged: forged_sorted.len(),
        forged_ms: (quantile(&forged_sorted, 0.5), quantile(&forged_sorted, 1.0)),
        failures,
        queued,
    })
}

/// `proving webhook-flood`: the flood with these settings, its lines printed; an error names
/// the genuine deliveries not answered in time.
pub async fn flood_command(seconds: u64, clients: usize, deadline_ms: u64) -> Result<()> {
    let settings = FloodSettings {
        duration: Duration::from_secs(seconds),
        clients,
        genuine_every: Duration::from_secs(1),
        deadline: Duration::from_millis(deadline_ms),
    };
    let report = flood(&settings).await?;
    print!("{}", report.lines(&settings));
    if !report.failures.is_empty() {
        bail!("the flood: {}", report.failures.join("; "));
    }
    Ok(())
}
