//! The benchmark at the provider's real answer time: the simulator answers every `/v1` call
//! after a seeded log-normal time (Stripe-like by default: p50 350 ms, p99 1.5 s), and each
//! contender, on a fresh stack with the same batch size and concurrency, is measured on what a
//! user decides on:
//!
//! - a backlog drained by one process (one batch at a time): payments/s per concurrent batch,
//!   billed duration and invocations per payment, the function's log bytes (the cost at this
//!   latency is computed from it in [`crate::compare`]);
//! - an open-loop load below capacity: payments sent at a steady rate, whatever the function
//!   does, with `pollers` processes; the time from each send to its charge at the provider
//!   (the simulator's books), p50 and p99.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use sqs_once::runner::now_ms;

use super::setup::*;
use super::throughput::{spawn_functions, throughput};
use crate::compare::{self, Contender};
use crate::load::payment_body;
use crate::sim::SimClient;
use lambda_local::esm::{self, Function};
use lambda_local::runtime_api::FunctionProcess;
use payctl::template::teardown;

/// The simulator the benchmark runs against (`PROVIDER_API_URL`).
pub(super) fn simulator() -> Result<SimClient> {
    Ok(SimClient::new(&std::env::var("PROVIDER_API_URL").context(
        "the benchmark needs PROVIDER_API_URL: the provider simulator",
    )?))
}

/// Runs `measure` with the provider answering at `opts.latency`, and puts the provider back to
/// answering at once afterwards, whatever `measure` did.
pub(super) async fn at_latency<T>(
    opts: &BenchOptions,
    measure: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let sim = simulator()?;
    let (p50, p99) = opts.latency;
    sim.set_latency(p50, p99).await?;
    let result = measure.await;
    sim.set_latency(0.0, 0.0).await?;
    result
}

/// One contender at the provider's latency (the caller sets it): the drain by one process and
/// the open-loop load.
pub(super) async fn contender(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
) -> Result<serde_json::Value> {
    let tag = format!("lat{}", who.label());
    let drain = throughput(sdk, opts, who, 1, &tag, false, opts.latency_payments).await?;
    let open = open_loop(sdk, opts, who).await?;
    Ok(json!({"drain": slim(drain), "open_loop": open}))
}

/// A run's result without its per-message latencies.
fn slim(mut run: serde_json::Value) -> serde_json::Value {
    if let Some(o) = run.as_object_mut() {
        o.remove("latencies_ms");
    }
    run
}

/// `opts.open_loop_payments` payments sent one by one at `opts.open_loop_rate` per second on a
/// fixed schedule (an open loop: a slow function does not slow the sender), worked by
/// `opts.pollers` processes of the contender's function; send → charged at the provider.
async fn open_loop(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
) -> Result<serde_json::Value> {
    let (name, stack) = bench_stack(sdk, opts, &format!("benchopen{}", who.label())).await?;
    let (program, env) = opts.function_under_test(who, &stack)?;
    let sim = simulator_of(&env)?;
    let (functions, logs) = spawn_functions(opts, &name, who, &program, &env, opts.pollers).await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let queue = stack.event_source.queue_url.clone();
    let n = opts.open_loop_payments.max(1);
    let ids: Vec<String> = (0..n).map(|i| payment_id(&name, i)).collect();
    let send = |i: usize| {
        let (sqs, queue, body) = (
            sqs.clone(),
            queue.clone(),
            payment_body(&ids[i], 1000 + i as i64, "pm_card_visa"),
        );
        async move {
            let at = now_ms();
            sqs.send_message()
                .queue_url(queue)
                .message_body(body)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(&e)))
                .context("sending the open-loop load")?;
            Ok::<i64, anyhow::Error>(at)
        }
    };
    // The first payment is on the queue before the mapping starts, so that its pollers do
    // not find the queue empty and stop; the rest follow on their schedule.
    let started = Instant::now();
    let first = send(0).await?;
    let interval = Duration::from_secs_f64(1.0 / opts.open_loop_rate.max(0.01));
    let sender = {
        let sends: Vec<_> = (1..n).map(&send).collect();
        async move {
            let mut sent = vec![first];
            for (k, s) in sends.into_iter().enumerate() {
                tokio::time::sleep_until((started + interval * (k as u32 + 1)).into()).await;
                sent.push(s.await?);
            }
            Ok::<Vec<i64>, anyhow::Error>(sent)
        }
    };
    let mapping = esm::run(
        Function::Processes(functions.iter().map(FunctionProcess::api).collect()),
        sqs.clone(),
        esm_opts(&stack, opts.pollers),
    );
    let (sent, stats) = tokio::join!(sender, mapping);
    for f in functions {
        f.stop().await?;
    }
    let (sent, stats) = (sent?, stats?);
    if stats.deleted() != n as u64 {
        bail!(
            "{}: the open-loop run acknowledged {} of {n} payments (its pollers stopped early?)",
            who.label(),
            stats.deleted()
        );
    }
    compare::charged_once(&sim, &ids, who).await?;
    let ledger = sim.ledger().await?;
    let mut waits: Vec<f64> = ids
        .iter()
        .zip(&sent)
        .map(|(id, at)| {
            ledger
                .charged_at_ms
                .get(id)
                .and_then(|t| t.first())
                .map(|charged| (charged - at) as f64)
                .with_context(|| format!("{id} has no charge time in the provider's books"))
        })
        .collect::<Result<_>>()?;
    waits.sort_by(|a, b| a.total_cmp(b));
    let log_bytes: u64 = logs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    teardown(sdk, &stack).await?;
    Ok(json!({
        "payments": n,
        "rate_per_second": opts.open_loop_rate,
        "pollers": opts.pollers,
        "seconds": started.elapsed().as_secs_f64(),
        "send_to_charged_ms": {
            "p50": percentile(&waits, 0.5),
            "p99": percentile(&waits, 0.99),
            "max": waits.last().copied().unwrap_or(0.0),
        },
        "send_to_charged_all_ms": waits,
        "invocations": stats.invocations,
        "billed_ms": stats.billed_ms,
        "log_bytes": log_bytes,
    }))
}
