//! The payments API as its clients reach it: `POST /v1/payments` under an `Idempotency-Key`,
//! answered by the API's own code (`PaymentsApi`, built as its function's environment says, on
//! the run's DynamoDB client and clock). An invocation killed by a crash or by its function's
//! `Timeout` answers the client nothing it can use (API Gateway's `5xx`), and so does one that
//! outlives the integration's `TimeoutInMillis` (a `504`), which goes on running to its own
//! timeout meanwhile; the client sends the same request again, with the same key, until it has
//! an answer that is not a `5xx` or a `429`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use payment_core::api::{PaymentsApi, IDEMPOTENCY_KEY};
use payment_core::edges::config::ApiConfig;

use super::super::World;

/// The payments API function of the provisioned stack, and the timeouts its clients meet.
pub(in crate::world) struct ApiFunction {
    /// The API's own code, as its function's init builds it.
    api: Arc<PaymentsApi>,
    /// The function's `Timeout`: Lambda ends an invocation there.
    timeout: Duration,
    /// The integration's `TimeoutInMillis`: API Gateway answers `504` there.
    integration_timeout: Duration,
}

/// The payments API function of the provisioned stack.
pub(in crate::world) fn build(
    stack: &payctl::template::Stack,
    shape: &payctl::template::Shape,
    sdk: &aws_config::SdkConfig,
    clock: Arc<dyn sqs_once::clock::Clock>,
) -> Result<ApiFunction> {
    const NAME: &str = "PaymentsApiFunction";
    let env = stack
        .function_envs
        .get(NAME)
        .context("the template has no PaymentsApiFunction")?;
    let config = ApiConfig::from_lookup(|k| env.get(k).cloned())
        .context("PaymentsApiFunction's configuration")?;
    let timeout = *stack
        .function_timeouts
        .get(NAME)
        .context("the template gives PaymentsApiFunction no timeout")?;
    let integration_ms = *shape
        .integration_timeouts_ms
        .get(NAME)
        .context("the template has no HTTP API integration of PaymentsApiFunction")?;
    Ok(ApiFunction {
        api: Arc::new(payment_core::edges::bootstrap::build_api_on(
            &config,
            crate::wire::dynamodb_client(sdk),
            clock,
        )),
        timeout: Duration::from_secs(timeout.max(1) as u64),
        integration_timeout: Duration::from_millis(integration_ms.max(1) as u64),
    })
}

/// One client's `POST /v1/payments` of `body` under `key`, sent again (same key, same body)
/// after a `5xx` or no answer, backing off from 1 s to five minutes: the status it ends with.
pub(super) async fn post(w: &Arc<World>, key: &str, body: &str) -> u16 {
    let mut wait = Duration::from_secs(1);
    loop {
        w.stats.lock().expect("stats").api_requests += 1;
        match invoke(w, key, body).await {
            Some(status) if status < 500 && status != 429 => return status,
            answer => w.note(format!("api: POST {key} answered {answer:?}; sent again")),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(300));
    }
}

/// One invocation of the API function: its answer's status, or `None` when the client had no
/// answer from it: the invocation was killed (a crash, drawn as the processors' are, or its
/// function's timeout) or outlived the integration's timeout (it then runs on, to its own
/// timeout, holding its concurrency). What it sent to DynamoDB before it ended lands all the same.
async fn invoke(w: &Arc<World>, key: &str, body: &str) -> Option<u16> {
    let function = w
        .api
        .as_ref()
        .expect("the API is built when payments use it");
    let api = Arc::clone(&function.api);
    let (key, body) = (key.to_owned(), body.to_owned());
    let lives = if w.draw() < w.opts.crash_rate {
        Duration::from_secs_f64((-(1.0 - w.draw()).ln() * 0.05).min(function.timeout.as_secs_f64()))
    } else {
        function.timeout
    };
    let now = w.clock.now_ms();
    let gated = w
        .api_gate
        .lock()
        .expect("gate")
        .as_mut()
        .is_some_and(|g| !g.admits(now));
    if gated {
        // The stage's route throttle: API Gateway answers 429 without invoking the function.
        w.stats.lock().expect("stats").api_throttled += 1;
        return Some(429);
    }
    let busy = w
        .api_in_flight
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if busy > w.api_reserved {
        // The function's reserved concurrency is taken: Lambda throttles the invocation and
        // the client is answered 429, before anything runs.
        w.api_in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        w.stats.lock().expect("stats").api_throttled += 1;
        return Some(429);
    }
    {
        let mut stats = w.stats.lock().expect("stats");
        let peak = stats.peak_concurrency.entry("api".into()).or_default();
        *peak = (*peak).max(busy);
    }
    // The invocation, to its answer or its end (Lambda's), releasing its concurrency then,
    // however it ends (a panic in the API's code too: the slot is a guard's).
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<Option<u16>>();
    let slot = InFlight(Arc::clone(w));
    tokio::spawn(async move {
        let slot = slot;
        let handled = tokio::time::timeout(lives, async move {
            let header = |name: &str| {
                name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
                    .then(|| key.clone())
            };
            api.handle("POST", "/v1/payments", header, body.as_bytes())
                .await
        })
        .await;
        let answer = match handled {
            Ok(answer) => Some(answer.status),
            Err(_) => {
                slot.0.stats.lock().expect("stats").api_killed += 1;
                None
            }
        };
        drop(slot);
        let _ = answer_tx.send(answer);
    });
    // API Gateway waits for the integration's timeout at most.
    match tokio::time::timeout(function.integration_timeout, answer_rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => {
            // The invocation ended without an answer or a timeout: the API's code panicked
            // (a function error: API Gateway answers 5xx).
            w.stats.lock().expect("stats").api_killed += 1;
            w.note("api: the invocation failed (a panic in the API's code)".into());
            None
        }
        Err(_) => {
            w.stats.lock().expect("stats").api_gateway_timeouts += 1;
            None
        }
    }
}

/// An API invocation's hold on the function's concurrency, given back when it is dropped.
struct InFlight(Arc<World>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .api_in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
