//! A minimal Lambda Runtime API: the four endpoints a custom runtime's `bootstrap` calls (next
//! invocation, response, error, init error). With it the local event-source mapping runs the
//! shipped function as a process of its own, one invocation at a time, as a Lambda execution
//! environment does, and the OS accounts that process's CPU time and memory apart from the
//! poller's, the emulator's and the simulator's.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot, Mutex};

const PREFIX: &str = "/2018-06-01/runtime";
/// The function's name in its ARN and environment (one function per Runtime API).
const FUNCTION_NAME: &str = "local-function";
/// How long a `bootstrap` may take to ask for its first invocation.
const INIT_TIMEOUT: Duration = Duration::from_secs(10);

type Reply = oneshot::Sender<std::result::Result<Bytes, String>>;

struct Invocation {
    request_id: String,
    deadline_ms: i64,
    payload: Bytes,
    reply: Reply,
}

struct State {
    next: Mutex<mpsc::Receiver<Invocation>>,
    waiting: StdMutex<HashMap<String, Reply>>,
    init_error: StdMutex<Option<String>>,
    polled: std::sync::atomic::AtomicBool,
}

/// A Runtime API endpoint for one execution environment.
pub struct RuntimeApi {
    address: String,
    queue: mpsc::Sender<Invocation>,
    state: Arc<State>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl RuntimeApi {
    /// Serves on an ephemeral loopback port.
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (queue, next) = mpsc::channel(1);
        let state = Arc::new(State {
            next: Mutex::new(next),
            waiting: StdMutex::new(HashMap::new()),
            init_error: StdMutex::new(None),
            polled: std::sync::atomic::AtomicBool::new(false),
        });
        let shared = state.clone();
        let server = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| route(state.clone(), req));
                    // A connection ends when the bootstrap exits; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            queue,
            state,
            server,
        })
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Hands `payload` to the function and waits for its answer: `Ok(Ok(response))`,
    /// `Ok(Err(error))` when the function reported an error, `Err` when the function failed its
    /// init or this endpoint stopped.
    pub async fn invoke(
        &self,
        payload: Vec<u8>,
        deadline_ms: i64,
    ) -> Result<std::result::Result<Bytes, String>> {
        if let Some(e) = self.init_error() {
            bail!("the function failed its init: {e}");
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Invocation {
                request_id: uuid::Uuid::new_v4().to_string(),
                deadline_ms,
                payload: Bytes::from(payload),
                reply,
            })
            .await
            .context("the Runtime API has stopped")?;
        answer
            .await
            .context("the invocation was dropped without an answer")
    }

    fn init_error(&self) -> Option<String> {
        self.state.init_error.lock().ok().and_then(|e| e.clone())
    }
}

fn reply(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}

async fn route(
    state: Arc<State>,
    req: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let Some(rest) = path.strip_prefix(PREFIX) else {
        return Ok(reply(StatusCode::NOT_FOUND, "unknown path"));
    };
    if req.method() == Method::GET && rest == "/invocation/next" {
        state
            .polled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut next = state.next.lock().await;
        let Some(inv) = next.recv().await else {
            return Ok(reply(StatusCode::GONE, "the Runtime API has stopped"));
        };
        drop(next);
        if let Ok(mut w) = state.waiting.lock() {
            w.insert(inv.request_id.clone(), inv.reply);
        }
        let response = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .header("lambda-runtime-aws-request-id", &inv.request_id)
            .header("lambda-runtime-deadline-ms", inv.deadline_ms.to_string())
            // Lambda sends it with every event; AWS's Python runtime interface client
            // (awslambdaric 4.2) crashes without it.
            .header(
                "lambda-runtime-trace-id",
                format!("Root=1-{:08x}-{:024x}", inv.deadline_ms / 1000, 0),
            )
            .header(
                "lambda-runtime-invoked-function-arn",
                format!("arn:aws:lambda:us-east-1:000000000000:function:{FUNCTION_NAME}"),
            )
            .body(Full::new(inv.payload));
        return Ok(response.unwrap_or_else(|_| {
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not build the event",
            )
        }));
    }
    if req.method() != Method::POST {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, "not allowed"));
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(reply(StatusCode::BAD_REQUEST, "unreadable body")),
    };
    if rest == "/init/error" {
        if let Ok(mut e) = state.init_error.lock() {
            *e = Some(String::from_utf8_lossy(&body).into_owned());
        }
        return Ok(reply(StatusCode::ACCEPTED, "{}"));
    }
    let answer = if let Some(id) = rest
        .strip_prefix("/invocation/")
        .and_then(|r| r.strip_suffix("/response"))
    {
        Some((id, Ok(body)))
    } else {
        rest.strip_prefix("/invocation/")
            .and_then(|r| r.strip_suffix("/error"))
            .map(|id| (id, Err(String::from_utf8_lossy(&body).into_owned())))
    };
    let Some((id, answer)) = answer else {
        return Ok(reply(StatusCode::NOT_FOUND, "unknown path"));
    };
    let waiting = state.waiting.lock().ok().and_then(|mut w| w.remove(id));
    match waiting {
        Some(tx) => {
            // The poller may have given up on the invocation (timeout): nothing to tell it.
            let _ = tx.send(answer);
            Ok(reply(StatusCode::ACCEPTED, "{}"))
        }
        None => Ok(reply(StatusCode::BAD_REQUEST, "unknown request id")),
    }
}

/// The variables Lambda gives every function process, for the Runtime API at `address`, plus
/// the caller's AWS endpoint and credentials (the function reaches the same local stack).
pub fn lambda_environment(address: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("AWS_LAMBDA_RUNTIME_API", address),
        ("AWS_LAMBDA_FUNCTION_NAME", FUNCTION_NAME),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256"),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "local"),
        ("AWS_LAMBDA_LOG_GROUP_NAME", "local"),
        // Lambda's own PATH: a bootstrap script finds its tools.
        ("PATH", "/usr/local/bin:/usr/bin/:/bin:/opt/bin"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    // Lambda always sets the region, under both names.
    let region = std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".to_owned());
    env.push(("AWS_REGION".to_owned(), region.clone()));
    env.push(("AWS_DEFAULT_REGION".to_owned(), region));
    for k in [
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_owned(), v));
        }
    }
    env
}

/// CPU time and peak memory of a function process, from the OS.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessUsage {
    /// User plus system CPU seconds over the process's whole life, init included (`wait4`).
    pub cpu_seconds: f64,
    /// The system (kernel) part of `cpu_seconds`: here mostly the loopback network.
    pub system_seconds: f64,
    /// Peak resident set size of the function's own memory, KiB (`VmHWM`, read just before
    /// it stops). Not `wait4`'s `ru_maxrss`: Linux carries the spawning process's high-water
    /// mark over the `exec`, so that would report this poller's memory, not the function's.
    pub peak_rss_kib: i64,
}

/// The peak resident set size of a running process, KiB, from `/proc/<pid>/status`.
fn peak_rss_kib(pid: u32) -> Result<i64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmHWM in {path}"))
}

/// A `bootstrap` process running behind its own Runtime API.
pub struct FunctionProcess {
    api: Arc<RuntimeApi>,
    child: Option<std::process::Child>,
}

impl Drop for FunctionProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl FunctionProcess {
    /// Starts `bootstrap` with only the Lambda variables and `function_env`, its output (logs
    /// and metrics) going to `logs`; returns once it asks for its first invocation.
    pub async fn spawn(
        bootstrap: &Path,
        function_env: &BTreeMap<String, String>,
        logs: std::fs::File,
    ) -> Result<Self> {
        let api = Arc::new(RuntimeApi::start().await?);
        let child = std::process::Command::new(bootstrap)
            .env_clear()
            .envs(lambda_environment(api.address()))
            .envs(function_env)
            .stdin(Stdio::null())
            .stdout(logs.try_clone()?)
            .stderr(logs)
            .spawn()
            .with_context(|| format!("starting {}", bootstrap.display()))?;
        let mut process = Self {
            api,
            child: Some(child),
        };
        let started = Instant::now();
        while !process
            .api
            .state
            .polled
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            if let Some(e) = process.api.init_error() {
                bail!("{} failed its init: {e}", bootstrap.display());
            }
            if let Some(child) = process.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!("{} exited during init ({status})", bootstrap.display());
                }
            }
            if started.elapsed() > INIT_TIMEOUT {
                bail!(
                    "{} did not ask for an invocation within {INIT_TIMEOUT:?}",
                    bootstrap.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(process)
    }

    /// Its Runtime API, to invoke it through.
    pub fn api(&self) -> Arc<RuntimeApi> {
        self.api.clone()
    }

    /// Ends the process (SIGTERM, as Lambda does at shutdown) and returns what it used.
    pub async fn stop(mut self) -> Result<ProcessUsage> {
        let Some(child) = self.child.take() else {
            bail!("the function process was already stopped");
        };
        let pid = child.id() as libc::pid_t;
        let peak_rss_kib = peak_rss_kib(child.id())?;
        tokio::task::spawn_blocking(move || {
            // SAFETY: `pid` is our unreaped child (only this call waits for it); wait4 fills the
            // status and the rusage it is given.
            let usage = unsafe {
                libc::kill(pid, libc::SIGTERM);
                let mut status = 0;
                let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
                if libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) != pid {
                    bail!(
                        "waiting for the function process: {}",
                        std::io::Error::last_os_error()
                    );
                }
                usage.assume_init()
            };
            drop(child); // reaped: nothing left to kill or wait for
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            Ok(ProcessUsage {
                cpu_seconds: secs(usage.ru_utime) + secs(usage.ru_stime),
                system_seconds: secs(usage.ru_stime),
                peak_rss_kib,
            })
        })
        .await?
    }
}
