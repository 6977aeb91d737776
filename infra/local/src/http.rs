//! An HTTP API served locally: the same handler a Lambda behind API Gateway runs, behind a
//! plain HTTP/1 server on loopback, standing in for API Gateway when no emulator runs the
//! deployed HTTP API (`make demo`, the tests, `payctl api serve`).
//!
//! Like an `AWS_IAM` route on the emulators, a request without a SigV4 `Authorization` header
//! is refused with `403`; the signature itself is verified by API Gateway only. A body over the
//! handler's limit (by its `Content-Length`, or as read) reaches it as one byte more than the
//! limit, so that it answers `413` itself; a body declared over the limit is not read.
//!
//! [`LocalHttp::stop`] stops like a drained load balancer: no new connection is accepted, the
//! requests being handled are answered, idle connections are closed.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// One request as a Lambda proxy integration sees it.
pub struct HttpRequest<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The headers, by lower-case name.
    pub headers: &'a hyper::HeaderMap,
    /// The body (at most the handler's limit plus one byte).
    pub body: &'a [u8],
}

impl HttpRequest<'_> {
    /// A header's value, when it is text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// What the handler answers; served as `application/json` unless its headers say otherwise.
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

/// The function behind the API.
#[async_trait::async_trait]
pub trait HttpHandler: Send + Sync + 'static {
    /// The largest body it accepts, bytes.
    fn max_body_bytes(&self) -> usize;
    /// Answers one request.
    async fn handle(&self, request: HttpRequest<'_>) -> HttpAnswer;

    /// Whether the route at `path` needs a signed caller (API Gateway's `AWS_IAM`); `false`
    /// for a route the function authenticates itself (`AuthorizationType: NONE`).
    fn requires_auth(&self, path: &str) -> bool {
        let _ = path;
        true
    }
}

/// A running local API; stops accepting when dropped (the connections open then are closed
/// once answered), or stops and waits for them with [`LocalHttp::stop`].
pub struct LocalHttp {
    url: String,
    server: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
    in_flight: Arc<AtomicUsize>,
}

/// Counts a request while its handler runs.
struct Handling(Arc<AtomicUsize>);

impl Handling {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for LocalHttp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn answer(
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
) -> Response<Full<Bytes>> {
    let mut r = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for (k, v) in headers {
        r = r.header(k, v);
    }
    r.body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

async fn route(
    api: Arc<dyn HttpHandler>,
    in_flight: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let _handling = Handling::start(&in_flight);
    let (parts, body) = req.into_parts();
    if api.requires_auth(parts.uri.path()) && !parts.headers.contains_key("authorization") {
        return Ok(answer(403, Vec::new(), r#"{"message":"Forbidden"}"#.into()));
    }
    // A body declared over the limit is not read at all, and reading any other stops one
    // byte over it: the API answers 413 before parsing.
    let limit = api.max_body_bytes();
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let a = api
            .handle(HttpRequest {
                method: parts.method.as_str(),
                path: parts.uri.path(),
                headers: &parts.headers,
                body: &vec![0u8; limit + 1],
            })
            .await;
        return Ok(answer(a.status, a.headers, a.body));
    }
    let bytes = match Limited::new(body, limit + 1).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => vec![0u8; limit + 1].into(),
        Err(e) => {
            let message = format!(r#"{{"message":"the request body could not be read: {e}"}}"#);
            return Ok(answer(400, Vec::new(), message));
        }
    };
    let a = api
        .handle(HttpRequest {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            headers: &parts.headers,
            body: &bytes,
        })
        .await;
    Ok(answer(a.status, a.headers, a.body))
}

impl LocalHttp {
    /// Serves `api` on `address` (`127.0.0.1:0` for an ephemeral port).
    pub async fn start(api: Arc<dyn HttpHandler>, address: &str) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("listening on {address}"))?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, mut stopping) = tokio::sync::watch::channel(false);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let counted = in_flight.clone();
        let server = tokio::spawn(async move {
            let graceful = hyper_util::server::graceful::GracefulShutdown::new();
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stopping.wait_for(|s| *s) => break,
                };
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // Out of file descriptors, say: wait rather than spin.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let api = api.clone();
                let counted = counted.clone();
                let service =
                    hyper::service::service_fn(move |req| route(api.clone(), counted.clone(), req));
                // A client that connects and sends nothing is dropped after 10 s, so that a
                // graceful stop never waits on it.
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
            drop(listener);
            graceful.shutdown().await;
        });
        Ok(Self {
            url,
            server,
            stop,
            in_flight,
        })
    }

    /// The requests being answered now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The count of requests being answered, readable after [`LocalHttp::stop`] took the
    /// server.
    pub fn in_flight_gauge(&self) -> Arc<AtomicUsize> {
        self.in_flight.clone()
    }

    /// Stops accepting, answers the requests being handled, closes the connections; returns
    /// when all are closed.
    pub async fn stop(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        (&mut self.server).await?;
        Ok(())
    }

    /// The base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }
}
