//! A proxy in front of the local AWS endpoint that loses one answer: it forwards the first
//! DynamoDB call of a given operation whose body names a given key, lets the endpoint apply
//! it, and then closes the client's connection without answering, as a network that dropped
//! the response would. The SDK retries the call; what the retry meets is the test's subject.
//! Or, started refusing, it answers every such call `500` without forwarding it, as an
//! endpoint that refuses the operation would, until told to stop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use proving::aws_faults;

/// What the proxy forwards to and which answer it drops.
struct Rule {
    http: reqwest::Client,
    upstream: String,
    target: String,
    needle: String,
    /// Answers dropped so far (0 or 1).
    dropped: AtomicU64,
    /// Calls of the operation that named the key (the applied one and its retries).
    matching: AtomicU64,
    /// Refuse matching calls with `500` instead of forwarding them.
    refusing: AtomicBool,
}

/// A running proxy; stops when dropped.
pub struct AnswerDroppingProxy {
    /// `http://127.0.0.1:<port>`: the endpoint URL to give a client.
    pub url: String,
    rule: Arc<Rule>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AnswerDroppingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AnswerDroppingProxy {
    /// Starts a proxy to `upstream` that drops the answer to the first call whose
    /// `X-Amz-Target` is `target` (e.g. `DynamoDB_20120810.UpdateItem`) and whose body
    /// contains `needle`.
    pub async fn start(upstream: &str, target: &str, needle: &str) -> Self {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("binding the proxy");
        let url = format!("http://{}", listener.local_addr().expect("proxy address"));
        let rule = Arc::new(Rule {
            http: reqwest::Client::new(),
            upstream: upstream.trim_end_matches('/').to_owned(),
            target: target.to_owned(),
            needle: needle.to_owned(),
            dropped: AtomicU64::new(0),
            matching: AtomicU64::new(0),
            refusing: AtomicBool::new(false),
        });
        let task = aws_faults::serve(listener, rule.clone(), |req, rule| async move {
            forward(req, &rule).await
        });
        Self { url, rule, task }
    }

    /// Starts a proxy that refuses every call of `target` naming `needle` with `500` (and
    /// drops no answer) until [`Self::refuse`] turns it off.
    pub async fn start_refusing(upstream: &str, target: &str, needle: &str) -> Self {
        let proxy = Self::start(upstream, target, needle).await;
        proxy.rule.dropped.store(1, Ordering::SeqCst);
        proxy.refuse(true);
        proxy
    }

    /// Turns refusing on or off.
    pub fn refuse(&self, on: bool) {
        self.rule.refusing.store(on, Ordering::SeqCst);
    }

    /// Answers dropped so far.
    pub fn dropped(&self) -> u64 {
        self.rule.dropped.load(Ordering::SeqCst)
    }

    /// Calls that matched the operation and key (the dropped one and its retries).
    pub fn matching(&self) -> u64 {
        self.rule.matching.load(Ordering::SeqCst)
    }
}

async fn forward(
    req: Request<Incoming>,
    rule: &Rule,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (parts, body) = aws_faults::read(req).await?;
    let is_match = parts
        .headers
        .get("x-amz-target")
        .is_some_and(|v| v.as_bytes() == rule.target.as_bytes())
        && String::from_utf8_lossy(&body).contains(&rule.needle);
    if is_match && rule.refusing.load(Ordering::SeqCst) {
        rule.matching.fetch_add(1, Ordering::SeqCst);
        return Ok(aws_faults::error_response(
            hyper::StatusCode::INTERNAL_SERVER_ERROR,
            "com.amazonaws.dynamodb.v20120810#InternalServerError",
            "refused by the test's proxy",
        ));
    }
    let answer = aws_faults::forward(&rule.http, &rule.upstream, &parts, body).await?;
    if is_match {
        rule.matching.fetch_add(1, Ordering::SeqCst);
        if rule
            .dropped
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            // Applied upstream; the client never hears of it: hyper closes the connection.
            return Err(std::io::Error::other("answer dropped on purpose"));
        }
    }
    aws_faults::relay(answer).await
}
