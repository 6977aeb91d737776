//! The payments API served locally: the same [`PaymentsApi`] the Lambda runs, behind a plain
//! HTTP/1 server on loopback, standing in for API Gateway when no emulator runs the deployed
//! HTTP API (`make demo`, the tests, `payctl api serve`).
//!
//! Like an `AWS_IAM` route on the emulators, a request without a SigV4 `Authorization` header
//! is refused with `403`; the signature itself is verified by API Gateway only.

use std::convert::Infallible;
use std::sync::Arc;

use anyhow::Result;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use payment_core::api::{PaymentsApi, MAX_REQUEST_BYTES};

/// A running local API; stops when dropped.
pub struct LocalApi {
    url: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for LocalApi {
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
    api: Arc<PaymentsApi>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    if !parts.headers.contains_key("authorization") {
        return Ok(answer(403, Vec::new(), r#"{"message":"Forbidden"}"#.into()));
    }
    // Reading stops one byte over the limit: the API answers 413 before parsing.
    let bytes = match Limited::new(body, MAX_REQUEST_BYTES + 1).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => vec![0u8; MAX_REQUEST_BYTES + 1].into(),
        Err(e) => {
            let message = format!(r#"{{"message":"the request body could not be read: {e}"}}"#);
            return Ok(answer(400, Vec::new(), message));
        }
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let a = api
        .handle(parts.method.as_str(), parts.uri.path(), header, &bytes)
        .await;
    Ok(answer(a.status, a.headers, a.body))
}

impl LocalApi {
    /// Serves `api` on `address` (`127.0.0.1:0` for an ephemeral port).
    pub async fn start(api: Arc<PaymentsApi>, address: &str) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let api = api.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| route(api.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url, server })
    }

    /// The base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Serves until the task is cancelled (for `payctl api serve`).
    pub async fn wait(mut self) -> Result<()> {
        (&mut self.server).await?;
        Ok(())
    }
}
