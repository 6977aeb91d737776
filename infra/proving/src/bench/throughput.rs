//! Throughput and latency of the shipped `bootstrap` (or the peer), one process per concurrent
//! batch behind a local Runtime API, and the concurrent-duplicate case.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sqs_once::runner::now_ms;

use super::setup::*;
use crate::compare::{self, Contender};
use crate::load::{payment_body, send_all};
use crate::wire_count::CountingRelay;
use lambda_local::esm::{self, EsmOptions, Function};
use lambda_local::runtime_api::FunctionProcess;
use payctl::template::teardown;

/// Drains a backlog of `n` payments with `pollers` processes of one contender's function; returns payments
/// per second, latency percentiles (send to acknowledged), the processes' CPU per 1000
/// payments and peak RSS, the billed duration, invocations and log bytes. Both contenders must
/// charge every payment exactly once. With `counted`, the processes reach the endpoint through
/// a [`CountingRelay`] and the result adds their calls on the wire, the mapping's SQS requests
/// and the largest item.
pub(super) async fn throughput(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
    pollers: usize,
    tag: &str,
    counted: bool,
    n: usize,
) -> Result<serde_json::Value> {
    let (name, stack) = bench_stack(sdk, opts, &format!("bench{tag}")).await?;
    let (program, mut env) = opts.function_under_test(who, &stack)?;
    let relay = if counted {
        let upstream = std::env::var("AWS_ENDPOINT_URL")
            .context("counting calls on the wire needs a local AWS_ENDPOINT_URL")?;
        let relay = CountingRelay::start(&upstream).await?;
        env.insert("AWS_ENDPOINT_URL".to_owned(), relay.url().to_owned());
        Some(relay)
    } else {
        None
    };
    let queue_calls = CallCounter::default();
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(sdk)
            .interceptor(queue_calls.clone())
            .build(),
    );
    let (functions, logs) = spawn_functions(opts, &name, who, &program, &env, pollers).await?;
    let bodies = backlog(&name, n);
    let sent_at = now_ms();
    send_all(&sqs, &stack.event_source.queue_url, &bodies).await?;
    let drain_started_ms = now_ms();
    let stats = esm::run(
        Function::Processes(functions.iter().map(FunctionProcess::api).collect()),
        sqs.clone(),
        esm_opts(&stack, pollers),
    )
    .await?;
    let (mut cpu_seconds, mut system_seconds, mut peak_rss_kib) = (0.0, 0.0, 0);
    for f in functions {
        let usage = f.stop().await?;
        cpu_seconds += usage.cpu_seconds;
        system_seconds += usage.system_seconds;
        peak_rss_kib = peak_rss_kib.max(usage.peak_rss_kib);
    }
    if stats.timeouts + stats.function_errors > 0 {
        bail!(
            "{}: {} invocations timed out and {} failed: see the logs in {}",
            who.label(),
            stats.timeouts,
            stats.function_errors,
            opts.log_dir.display()
        );
    }
    if stats.deleted() != bodies.len() as u64 {
        bail!(
            "{}: {} of {} messages were acknowledged",
            who.label(),
            stats.deleted(),
            bodies.len()
        );
    }
    let sim = simulator_of(&env)?;
    let ids: Vec<String> = (0..n).map(|i| payment_id(&name, i)).collect();
    compare::charged_once(&sim, &ids, who).await?;
    let mut latencies: Vec<f64> = stats
        .acked_at_ms
        .iter()
        .map(|t| (t - sent_at) as f64)
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    // Drain time: until the last message was acknowledged (not the poller's final empty looks).
    let last = stats
        .acked_at_ms
        .iter()
        .copied()
        .max()
        .unwrap_or(drain_started_ms);
    let elapsed = ((last - drain_started_ms) as f64 / 1000.0).max(1e-3);
    let log_bytes: u64 = logs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let mut result = json!({
        "function": who.label(),
        "pollers": pollers,
        "messages": bodies.len(),
        "payments": n,
        "seconds": elapsed,
        "payments_per_second": n as f64 / elapsed,
        "messages_per_second": bodies.len() as f64 / elapsed,
        "latency_ms": {"p50": percentile(&latencies, 0.5), "p95": percentile(&latencies, 0.95), "p99": percentile(&latencies, 0.99)},
        "latencies_ms": latencies,
        "function_processes": pollers,
        "cpu_ms_per_1000_payments": cpu_seconds * 1000.0 / n as f64 * 1000.0,
        "system_cpu_ms_per_1000_payments": system_seconds * 1000.0 / n as f64 * 1000.0,
        "peak_rss_kib": peak_rss_kib,
        "invocations": stats.invocations,
        "billed_ms": stats.billed_ms,
        "log_bytes": log_bytes,
    });
    if let Some(relay) = relay {
        let wire = compare::wire_per_payment(&relay.counts(), n);
        // What Lambda's poller and the producer send: a receive per invocation (batches of up
        // to 10), the batch sends and the batch deletes.
        let none = HashMap::new();
        let queue = queue_calls.since(&none, "AmazonSQS.SendMessageBatch")
            + queue_calls.since(&none, "AmazonSQS.DeleteMessageBatch")
            + stats.invocations;
        result["sqs_requests_per_payment"] =
            json!(queue as f64 / n as f64 + wire["function_sqs_calls"].as_f64().unwrap_or(0.0));
        result["wire"] = wire;
        result["largest_item_bytes"] = json!(
            compare::largest_item(
                &aws_sdk_dynamodb::Client::new(sdk),
                stack.function_var("IDEMPOTENCY_TABLE")?
            )
            .await?
        );
    }
    teardown(sdk, &stack).await?;
    Ok(result)
}

/// `count` processes of a contender's function, each writing its output to a log file of its
/// own under the log directory; returns them and their log files.
pub(super) async fn spawn_functions(
    opts: &BenchOptions,
    name: &str,
    who: Contender,
    program: &Path,
    env: &BTreeMap<String, String>,
    count: usize,
) -> Result<(Vec<FunctionProcess>, Vec<PathBuf>)> {
    std::fs::create_dir_all(&opts.log_dir)?;
    let (mut functions, mut logs) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        let path = opts
            .log_dir
            .join(format!("bench-{name}-{}-{i}.log", who.label()));
        let log = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
        functions.push(FunctionProcess::spawn(program, env, log).await?);
        logs.push(path);
    }
    Ok((functions, logs))
}

/// Two copies of one payment in two concurrent batches (one function process each), the
/// provider answering in 2 s: how long until both copies are acknowledged, and how many
/// provider calls and charges the payment got.
pub(super) async fn concurrent_duplicate(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
) -> Result<serde_json::Value> {
    let (name, stack) = bench_stack(sdk, opts, &format!("benchdup{}", who.label())).await?;
    let (program, env) = opts.function_under_test(who, &stack)?;
    let sim = simulator_of(&env)?;
    let pid = format!("{name}-dup");
    sim.add_faults(json!([{"prefix": pid, "fault": "latency", "latency_ms": 2000}]))
        .await?;
    let (functions, _) = spawn_functions(opts, &name, who, &program, &env, 2).await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let body = payment_body(&pid, 1000, "pm_card_visa");
    let sent_at = now_ms();
    send_all(&sqs, &stack.event_source.queue_url, &[body.clone(), body]).await?;
    let stats = esm::run(
        Function::Processes(functions.iter().map(FunctionProcess::api).collect()),
        sqs,
        EsmOptions {
            batch_size: 1,
            max_duration: Duration::from_secs(180),
            ..esm_opts(&stack, 2)
        },
    )
    .await;
    for f in functions {
        f.stop().await?;
    }
    sim.clear_faults_for(&pid).await?;
    let stats = stats?;
    let ledger = sim.ledger_for(&pid).await?;
    if stats.deleted() != 2 {
        bail!(
            "{}: {} of 2 copies acknowledged",
            who.label(),
            stats.deleted()
        );
    }
    let last = stats.acked_at_ms.iter().copied().max().unwrap_or(sent_at);
    teardown(sdk, &stack).await?;
    Ok(json!({
        "seconds_until_both_acknowledged": (last - sent_at) as f64 / 1000.0,
        "provider_calls": ledger.calls_for(&pid),
        "charges": ledger.charges.get(&pid).map(Vec::len).unwrap_or(0),
        "invocations": stats.invocations,
    }))
}
