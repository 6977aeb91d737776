//! A fault-injecting proxy in front of the AWS endpoint, for the chaos run: the processes given
//! its URL as `AWS_ENDPOINT_URL` see DynamoDB and SQS throttle, answer `500`, stall, and apply a
//! request whose answer is then lost (the connection closes unanswered, so the SDK retries a
//! request that already took effect). Each call draws from a seeded die; a fault strikes a
//! call with the given rate, the four kinds equally often.
//!
//! The forwarding helpers ([`forward`], [`relay`], [`error_response`]) are shared with the
//! integration tests' answer-dropping proxy.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// How long a stalled call waits before it is forwarded.
pub const STALL: Duration = Duration::from_secs(2);

/// The faults, in the die's order.
const KINDS: [&str; 4] = ["throttled", "server_error", "stalled", "answer_lost"];

/// What the proxy did, by kind.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Calls seen.
    pub calls: AtomicU64,
    /// Faults by kind, in `KINDS` order.
    pub faults: [AtomicU64; 4],
}

impl FaultCounts {
    /// One line: the calls and each fault's count.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = KINDS
            .iter()
            .zip(&self.faults)
            .map(|(k, n)| format!("{} {k}", n.load(Ordering::Relaxed)))
            .collect();
        format!(
            "{} AWS calls through the fault proxy: {}",
            self.calls.load(Ordering::Relaxed),
            parts.join(", ")
        )
    }

    /// Faults injected, all kinds.
    pub fn total(&self) -> u64 {
        self.faults.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }
}

struct Plan {
    http: reqwest::Client,
    upstream: String,
    rate: f64,
    dice: Mutex<fastrand::Rng>,
    counts: Arc<FaultCounts>,
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>`: the endpoint URL to give the processes.
    pub url: String,
    /// What it did so far.
    pub counts: Arc<FaultCounts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` striking each call with a fault with probability `rate`
    /// (seeded by `seed`).
    pub async fn start(upstream: &str, rate: f64, seed: u64) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .context("binding the AWS fault proxy")?;
        let url = format!("http://{}", listener.local_addr()?);
        let counts = Arc::new(FaultCounts::default());
        let plan = Arc::new(Plan {
            http: reqwest::Client::new(),
            upstream: upstream.trim_end_matches('/').to_owned(),
            rate,
            dice: Mutex::new(fastrand::Rng::with_seed(seed)),
            counts: counts.clone(),
        });
        let task = serve(listener, plan, |req, plan| async move {
            strike(req, &plan).await
        });
        Ok(Self { url, counts, task })
    }
}

/// Which fault, if any, strikes this call.
fn draw(plan: &Plan) -> Option<usize> {
    let mut dice = plan.dice.lock().ok()?;
    (dice.f64() < plan.rate).then(|| dice.usize(0..KINDS.len()))
}

async fn strike(
    req: Request<Incoming>,
    plan: &Plan,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    plan.counts.calls.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = read(req).await?;
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let fault = draw(plan);
    if let Some(i) = fault {
        plan.counts.faults[i].fetch_add(1, Ordering::Relaxed);
    }
    match fault.map(|i| KINDS[i]) {
        Some("throttled") => {
            // DynamoDB's and SQS's own throttling codes: the SDK retries both with backoff.
            let code = if target.starts_with("DynamoDB") {
                "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
            } else {
                "com.amazonaws.sqs#ThrottlingException"
            };
            return Ok(error_response(
                StatusCode::BAD_REQUEST,
                code,
                "Rate exceeded (fault proxy)",
            ));
        }
        Some("server_error") => {
            return Ok(error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "internal error (fault proxy)",
            ))
        }
        Some("stalled") => tokio::time::sleep(STALL).await,
        _ => {}
    }
    let answer = forward(&plan.http, &plan.upstream, &parts, body).await?;
    if fault.map(|i| KINDS[i]) == Some("answer_lost") {
        // Applied upstream; the client never hears of it: hyper closes the connection.
        return Err(std::io::Error::other("answer lost on purpose"));
    }
    relay(answer).await
}

/// Serves HTTP/1 on `listener`, each request answered by `handle` with the shared `state`; an
/// `Err` closes the connection unanswered (a lost answer). Stops when the task is aborted.
pub fn serve<S, F, Fut>(
    listener: tokio::net::TcpListener,
    state: Arc<S>,
    handle: F,
) -> tokio::task::JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Request<Incoming>, Arc<S>) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| handle(req, state.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// A request's parts and its whole body.
pub async fn read(
    req: Request<Incoming>,
) -> Result<(hyper::http::request::Parts, Bytes), std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((parts, body))
}

/// Sends a request's parts and body to `upstream`, as they came.
pub async fn forward(
    http: &reqwest::Client,
    upstream: &str,
    parts: &hyper::http::request::Parts,
    body: Bytes,
) -> Result<reqwest::Response, std::io::Error> {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let mut out = http.request(parts.method.clone(), format!("{upstream}{path}"));
    for (k, v) in &parts.headers {
        if k != hyper::header::HOST && k != hyper::header::CONTENT_LENGTH {
            out = out.header(k, v);
        }
    }
    out.body(body).send().await.map_err(std::io::Error::other)
}

/// The upstream's answer, passed on.
pub async fn relay(answer: reqwest::Response) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = answer.bytes().await.map_err(std::io::Error::other)?;
    let mut response = Response::new(Full::new(bytes));
    *response.status_mut() = status;
    for (k, v) in &headers {
        if k != hyper::header::CONTENT_LENGTH && k != hyper::header::TRANSFER_ENCODING {
            response.headers_mut().insert(k, v.clone());
        }
    }
    Ok(response)
}

/// An AWS JSON-protocol error answer.
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"__type": code, "message": message}).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_die_strikes_at_about_the_rate_with_every_kind() {
        let counts = Arc::new(FaultCounts::default());
        let plan = Plan {
            http: reqwest::Client::new(),
            upstream: String::new(),
            rate: 0.2,
            dice: Mutex::new(fastrand::Rng::with_seed(3)),
            counts,
        };
        let mut by_kind = [0u32; 4];
        for _ in 0..10_000 {
            if let Some(i) = draw(&plan) {
                by_kind[i] += 1;
            }
        }
        let total: u32 = by_kind.iter().sum();
        assert!((1_800..2_200).contains(&total), "{total}");
        assert!(by_kind.iter().all(|n| *n > 350), "{by_kind:?}");
        let none = Plan { rate: 0.0, ..plan };
        assert!((0..1_000).all(|_| draw(&none).is_none()));
    }
}
