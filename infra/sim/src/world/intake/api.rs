//! The payments API as its clients reach it: `POST /v1/payments` under an `Idempotency-Key`,
//! answered by the API's own code (`PaymentsApi`, built as its function's environment says, on
//! the run's DynamoDB client and clock); an invocation killed by a crash or API Gateway's
//! 30 s integration timeout answers nothing, and the client sends the same request again, with
//! the same key, until it has an answer that is not a `5xx`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use payment_core::api::{PaymentsApi, IDEMPOTENCY_KEY};
use payment_core::edges::config::ApiConfig;

use super::super::World;

/// API Gateway's integration timeout: an answer later than this is a `504` to the client.
const GATEWAY_TIMEOUT: Duration = Duration::from_secs(30);

/// The payments API function of the provisioned stack.
pub(in crate::world) fn build(
    stack: &payctl::template::Stack,
    sdk: &aws_config::SdkConfig,
    clock: Arc<dyn sqs_once::clock::Clock>,
) -> Result<Arc<PaymentsApi>> {
    let env = stack
        .function_envs
        .get("PaymentsApiFunction")
        .context("the template has no PaymentsApiFunction")?;
    let config = ApiConfig::from_lookup(|k| env.get(k).cloned())
        .context("PaymentsApiFunction's configuration")?;
    Ok(Arc::new(payment_core::edges::bootstrap::build_api_on(
        &config,
        crate::wire::dynamodb_client(sdk),
        clock,
    )))
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

/// One invocation of the API function: its answer's status, or `None` when the invocation was
/// killed (a crash, drawn as the processors' are) or outlived API Gateway's timeout. What it
/// sent to DynamoDB before it died lands all the same.
async fn invoke(w: &Arc<World>, key: &str, body: &str) -> Option<u16> {
    let api = Arc::clone(
        w.api
            .as_ref()
            .expect("the API is built when payments use it"),
    );
    let (key, body) = (key.to_owned(), body.to_owned());
    let limit = if w.draw() < w.opts.crash_rate {
        Duration::from_secs_f64((-(1.0 - w.draw()).ln() * 0.05).min(GATEWAY_TIMEOUT.as_secs_f64()))
    } else {
        GATEWAY_TIMEOUT
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
    let run = tokio::spawn(async move {
        let header = |name: &str| {
            name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
                .then(|| key.clone())
        };
        api.handle("POST", "/v1/payments", header, body.as_bytes())
            .await
    });
    let abort = run.abort_handle();
    {
        let mut stats = w.stats.lock().expect("stats");
        let peak = stats.peak_concurrency.entry("api".into()).or_default();
        *peak = (*peak).max(busy);
    }
    let answered = tokio::time::timeout(limit, run).await;
    w.api_in_flight
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    match answered {
        Ok(Ok(answer)) => Some(answer.status),
        _ => {
            abort.abort();
            w.stats.lock().expect("stats").api_killed += 1;
            None
        }
    }
}
