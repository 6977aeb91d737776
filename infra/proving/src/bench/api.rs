//! The payments API path: POST to charged through the table's stream, the relay and the
//! processor, and the API's own latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;

use super::setup::*;
use crate::compare;
use crate::demo::config_for;
use crate::load::payment_body;
use lambda_local::esm;
use payctl::template::teardown;

/// The payments API on the local stack: requests per second and latency of `POST` (a backlog
/// of fresh keys, eight clients at once), and the end-to-end latency from `POST` to a `GET`
/// that says `succeeded` (the API, the outbox stream, the relay, the queue, the processor and
/// the provider; five payments at a time). The API, relay and processor run in this process;
/// their AWS calls go to the emulator.
pub(super) async fn api_measurement(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
) -> Result<serde_json::Value> {
    use futures::stream::{self, StreamExt};
    use payment_core::edges::config::{ApiConfig, RelayConfig};
    let (name, stack) = bench_stack(sdk, opts, "bench-api").await?;
    let env_of = |function: &'static str| {
        let stack = &stack;
        move |k: &str| stack.var_of(function, k).ok().map(str::to_owned)
    };
    // Every DynamoDB write of the API, the relay and the processor is counted on the wire.
    let writes = CallCounter::default();
    let ddb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .interceptor(writes.clone())
            .build(),
    );
    let api = payment_core::edges::bootstrap::build_api(
        &ApiConfig::from_lookup(env_of("PaymentsApiFunction"))?,
        ddb.clone(),
    );
    let server = payctl::api::serve(Arc::new(api), None, "127.0.0.1:0").await?;
    let relay_config = RelayConfig::from_lookup(env_of("OutboxRelayFunction"))?;
    let relay = payment_core::edges::bootstrap::build_relay(&relay_config, sdk);
    let _mapping = payctl::relay::start(sdk, stack.payments_table()?, Arc::new(relay)).await?;
    let config = config_for(&stack, &bench_overrides())?;
    let processor = payment_core::edges::bootstrap::build_processor_with(
        &config,
        sdk,
        ddb.clone(),
        aws_sdk_sqs::Client::new(sdk),
    )
    .await?;
    let mut esm_options = esm_opts(&stack, opts.pollers);
    esm_options.until_empty = false;
    let consumer = tokio::spawn(esm::run(
        processor,
        aws_sdk_sqs::Client::new(sdk),
        esm_options,
    ));
    let client = payctl::client::ApiClient::new(server.url(), sdk)?;
    let body = |i: usize| {
        let b: serde_json::Value =
            serde_json::from_str(&payment_body("x", 1000 + i as i64, "pm_card_visa"))
                .unwrap_or_default();
        let mut b = b.as_object().cloned().unwrap_or_default();
        b.remove("payment_id");
        serde_json::Value::Object(b).to_string()
    };

    // End to end first, on an idle stack.
    let samples = (opts.payments / 10).clamp(10, 100);
    let client_ref = &client;
    let end_to_end: Vec<Result<f64>> = stream::iter(0..samples)
        .map(|i| {
            let key = format!("{name}-e2e-{i:04}");
            let b = body(i);
            async move {
                let t = Instant::now();
                let created = client_ref.create(&key, &b).await?;
                if created.status != 202 {
                    bail!("POST {key}: {} {}", created.status, created.body);
                }
                loop {
                    let got = client_ref.get(&key).await?.json()?;
                    match got["status"].as_str() {
                        Some("succeeded") => return Ok(t.elapsed().as_secs_f64() * 1e3),
                        Some("pending" | "processing") if t.elapsed() < Duration::from_secs(60) => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        other => bail!("{key} ended {other:?}: {got}"),
                    }
                }
            }
        })
        .buffer_unordered(5)
        .collect()
        .await;
    let mut e2e: Vec<f64> = end_to_end.into_iter().collect::<Result<_>>()?;
    e2e.sort_by(f64::total_cmp);
    // Write requests per payment, POST to succeeded; in units, each at most 1 KB (checked on
    // the tables' largest items).
    let write_requests = writes.write_requests() as f64 / samples as f64;
    let largest = compare::largest_item(&ddb, stack.payments_table()?)
        .await?
        .max(compare::largest_item(&ddb, stack.function_var("IDEMPOTENCY_TABLE")?).await?);
    let write_units = write_requests * (largest as f64 / 1024.0).ceil().max(1.0);

    // Then POST throughput with fresh keys.
    let requests = opts.payments.max(20);
    let started = Instant::now();
    let posted: Vec<Result<f64>> = stream::iter(0..requests)
        .map(|i| {
            let key = format!("{name}-rps-{i:05}");
            let b = body(i);
            async move {
                let t = Instant::now();
                let a = client_ref.create(&key, &b).await?;
                if a.status != 202 {
                    bail!("POST {key}: {} {}", a.status, a.body);
                }
                Ok(t.elapsed().as_secs_f64() * 1e3)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut lat: Vec<f64> = posted.into_iter().collect::<Result<_>>()?;
    lat.sort_by(f64::total_cmp);
    consumer.abort();
    teardown(sdk, &stack).await.ok();
    Ok(json!({
        "requests": requests,
        "clients": 8,
        "requests_per_second": requests as f64 / elapsed,
        "latency_ms": {"p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99)},
        "write_units_per_payment": write_units,
        "write_requests_per_payment": write_requests,
        "largest_item_bytes": largest,
        "post_to_succeeded_ms": {
            "samples": e2e.len(),
            "p50": percentile(&e2e, 0.5), "p95": percentile(&e2e, 0.95), "p99": percentile(&e2e, 0.99)
        },
    }))
}
