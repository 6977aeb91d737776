//! A counting relay between a function process and the AWS endpoint: it forwards every request
//! unchanged and counts it by operation (`X-Amz-Target`, as the JSON protocols of DynamoDB, SQS
//! and Secrets Manager name it). It counts what a process in any language sends on the wire,
//! so the benchmark compares the calls of this project's `bootstrap` and of the Python peer
//! the same way.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// Requests of one operation.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct OpCount {
    /// Requests sent (every attempt, retries included).
    pub calls: u64,
    /// Request body bytes.
    pub request_bytes: u64,
}

type Counts = Arc<Mutex<BTreeMap<String, OpCount>>>;

/// Names a kind of request beyond its operation, from the operation and the body (a
/// processor's claims among its DynamoDB writes): counted under that name too.
pub type Classify = fn(&str, &[u8]) -> Option<&'static str>;

/// The relay, listening on an ephemeral loopback port until dropped.
pub struct CountingRelay {
    url: String,
    counts: Counts,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for CountingRelay {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

impl CountingRelay {
    /// Relays to `upstream` (the AWS endpoint URL).
    pub async fn start(upstream: &str) -> Result<Self> {
        Self::start_classified(upstream, |_, _| None).await
    }

    /// Relays to `upstream`, counting each request under its operation and also under the
    /// name `classify` gives it, if any.
    pub async fn start_classified(upstream: &str, classify: Classify) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let counts: Counts = Arc::default();
        let client = reqwest::Client::builder().no_proxy().build()?;
        let upstream = upstream.trim_end_matches('/').to_owned();
        let shared = counts.clone();
        let server = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (counts, client, upstream) = (shared.clone(), client.clone(), upstream.clone());
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        relay(
                            counts.clone(),
                            classify,
                            client.clone(),
                            upstream.clone(),
                            req,
                        )
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            url,
            counts,
            server,
        })
    }

    /// The URL to give a process as `AWS_ENDPOINT_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Requests so far, by operation (`DynamoDB_20120810.PutItem`, `AmazonSQS.SendMessage`).
    pub fn counts(&self) -> BTreeMap<String, OpCount> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

async fn relay(
    counts: Counts,
    classify: Classify,
    client: reqwest::Client,
    upstream: String,
    req: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(error(format!("reading the request: {e}"))),
    };
    let op = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("other")
        .to_owned();
    if let Ok(mut c) = counts.lock() {
        if let Some(kind) = classify(&op, &body) {
            let e = c.entry(kind.to_owned()).or_default();
            e.calls += 1;
            e.request_bytes += body.len() as u64;
        }
        let e = c.entry(op).or_default();
        e.calls += 1;
        e.request_bytes += body.len() as u64;
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut forward = client.request(parts.method, format!("{upstream}{path}"));
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            forward = forward.header(name, value);
        }
    }
    let answer = match forward.body(body).send().await {
        Ok(a) => a,
        Err(e) => return Ok(error(format!("relaying: {e}"))),
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            response = response.header(name, value);
        }
    }
    let bytes = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => return Ok(error(format!("reading the answer: {e}"))),
    };
    Ok(response
        .body(Full::new(bytes))
        .unwrap_or_else(|e| error(format!("building the answer: {e}"))))
}

fn error(message: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(message)));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}
