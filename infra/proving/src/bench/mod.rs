//! `make bench`: throughput, latency, calls per payment, CPU and memory per payment, cold start
//! and package size of the processor, measured against the local stack beside the Powertools
//! peer ([`crate::compare`]), printed as a table and written as JSON, Markdown and a PNG (the
//! latency histogram and the comparison's bars) under `bench/results/`.
//!
//! The throughput runs drive the shipped release `bootstrap` as Lambda does: one process per
//! concurrent batch behind a local Runtime API, fed by the local event-source mapping in this
//! process. The OS accounts those processes apart (CPU time from `wait4`, peak RSS from
//! `VmHWM`): the function's own, without the poller, the emulator or the simulator. AWS calls
//! per payment are counted on the wire by an SDK interceptor around the same processor code run in-process
//! (every attempt, retries included); provider calls by the simulator's ledger. The comparison
//! with the peer counts both function processes' calls through a relay
//! ([`crate::wire_count`]), so that a Python process is counted like the `bootstrap`.
//!
//! [`run`] is the run, in the order it measures; each measurement has its module
//! (`throughput`, `calls`, `api`, [`retries`], `rate`), over the stacks and options of `setup`,
//! and `report` writes the results. The peer's environment, the cost model, the comparison's
//! report and the chart are in [`crate::compare`].

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde_json::json;

use crate::compare::{self, Contender};
use payctl::template::{memory_size_mb, PROCESSOR};

mod api;
mod calls;
mod latency;
mod rate;
mod report;
pub mod retries;
mod setup;
mod throughput;

use api::*;
use calls::*;
use report::*;
use setup::*;
pub use setup::{bench_overrides, esm_opts, BenchOptions, CallCounter};
use throughput::*;

/// Requests of each kind the events route's rows time.
const WEBHOOK_RUNS: usize = 50;

/// Runs every measurement, prints the table, writes the results.
pub async fn run(sdk: &aws_config::SdkConfig, opts: &BenchOptions) -> Result<serde_json::Value> {
    std::fs::create_dir_all(&opts.out_dir)?;
    let contenders: &[Contender] = if opts.peer.is_some() {
        &[Contender::This, Contender::Peer]
    } else {
        &[Contender::This]
    };
    if opts.only_rate {
        let rows = rate::measure(sdk, opts, contenders).await?;
        let md = rate_markdown(&rows);
        std::fs::write(
            opts.out_dir.join("provider-rate.json"),
            serde_json::to_string_pretty(&rows)?,
        )?;
        std::fs::write(opts.out_dir.join("provider-rate.md"), &md)?;
        println!("{md}");
        return Ok(rows);
    }
    println!(
        "benchmark: {} payments (+10% duplicates), 1 and {} concurrent batches",
        opts.payments, opts.pollers
    );
    // At each concurrency: the stack alone, then this, the peer, this, the peer, then the
    // stack alone again. The ceiling is the better of the two stack-alone runs, so that neither
    // noise nor the emulator's drift lowers it; each contender keeps the better of its two.
    let mut best = BTreeMap::new();
    let mut capacity = BTreeMap::new();
    for (pollers, tag) in [(1, "a"), (opts.pollers, "b")] {
        let before = emulator_capacity(sdk, opts, pollers).await?;
        let mut first = Vec::new();
        for round in 0..2 {
            for &who in contenders {
                let tag = format!("{tag}{}", who.label());
                let run = throughput(sdk, opts, who, pollers, &tag, false, opts.payments).await?;
                if round == 0 {
                    first.push(run);
                } else {
                    let a = first.remove(0);
                    best.insert((who.label(), pollers), best_of(a, run));
                }
            }
        }
        let after = emulator_capacity(sdk, opts, pollers).await?;
        capacity.insert(pollers, if before.0 >= after.0 { before } else { after });
    }
    let (one, many) = (
        best[&("this", 1)].clone(),
        best[&("this", opts.pollers)].clone(),
    );
    let (cap_one, floor_one) = capacity[&1];
    let (cap_many, floor_many) = capacity[&opts.pollers];
    let calls = calls_per_payment(sdk, opts).await?;
    let api = api_measurement(sdk, opts).await?;
    let webhook = crate::webhook::costs(WEBHOOK_RUNS).await?;
    let mut sizes = BTreeMap::new();
    for (arch, path) in &opts.bootstraps {
        sizes.insert(
            arch.clone(),
            std::fs::metadata(path)
                .with_context(|| format!("{}", path.display()))?
                .len(),
        );
    }
    let cold_env = BTreeMap::from(
        [
            ("IDEMPOTENCY_TABLE", "bench"),
            (
                "DEAD_LETTER_QUEUE_URL",
                "http://127.0.0.1:9/000000000000/dlq",
            ),
            ("PROVIDER_API_URL", "http://127.0.0.1:9"),
            ("PAYMENT_API_KEY", "sk_test_bench"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let this_cold = cold_start(opts.host_bootstrap()?, &cold_env, opts.cold_start_runs).await?;
    let cold = BTreeMap::from([(HOST_ARCH, this_cold)]);
    let traces = traced(sdk, opts, &cold_env, this_cold).await?;
    let rss = [&one, &many]
        .iter()
        .filter_map(|t| t["peak_rss_kib"].as_i64())
        .max()
        .unwrap_or(0);
    // At the provider's real answer time: each contender's drain and open-loop load, and
    // meanwhile the retry rows (the peer's waits out the queue's visibility timeout).
    let (retries, at_latency) = latency::at_latency(opts, async {
        let contenders_at_latency = async {
            let mut runs = serde_json::Map::new();
            for &who in contenders {
                runs.insert(
                    who.label().to_owned(),
                    latency::contender(sdk, opts, who).await?,
                );
            }
            Ok::<_, anyhow::Error>(runs)
        };
        let (retries, runs) = tokio::join!(retries::measure(sdk, opts), contenders_at_latency);
        Ok((retries?, runs?))
    })
    .await?;
    // Against a provider that limits the account's rate, with the merchant's traffic beside:
    // alone, since the limit is the whole simulator's.
    let provider_rate = rate::measure(sdk, opts, contenders).await?;
    let at_latency = json!({
        "p50_ms": opts.latency.0,
        "p99_ms": opts.latency.1,
        "open_loop_rate_per_second": opts.open_loop_rate,
        "contenders": at_latency,
    });
    let mut result = json!({
        "run": run_facts(opts),
        "retries": retries,
        "at_latency": at_latency,
        "provider_rate": provider_rate,
        "payments": opts.payments,
        "throughput": [one, many],
        "stack_capacity_per_second": {"1": cap_one, opts.pollers.to_string(): cap_many},
        "bare_calls_cpu_ms_per_payment": {"1": floor_one, opts.pollers.to_string(): floor_many},
        "calls_per_payment": calls,
        "cold_start_ms_median": cold,
        "bootstrap_bytes": sizes,
        "peak_rss_kib": rss,
        "api": api,
        "webhook": webhook,
        "traces": traces,
    });
    let mut ratios = Vec::new();
    if let Some(peer) = &opts.peer {
        let mut peer_env = cold_env.clone();
        peer_env.insert("PEER_PYTHON".to_owned(), peer.python.display().to_string());
        let peer_cold = cold_start(&peer.bootstrap, &peer_env, opts.cold_start_runs).await?;
        let mut counted = BTreeMap::new();
        let mut duplicate = BTreeMap::new();
        for &who in contenders {
            counted.insert(
                who.label(),
                throughput(
                    sdk,
                    opts,
                    who,
                    opts.pollers,
                    &format!("calls{}", who.label()),
                    true,
                    opts.payments,
                )
                .await?,
            );
            duplicate.insert(who.label(), concurrent_duplicate(sdk, opts, who).await?);
        }
        let memory_mb = memory_size_mb(&opts.template, PROCESSOR)?;
        let comparison = compare::comparison(&compare::Measured {
            peer: peer.description.clone(),
            pollers: opts.pollers,
            best: &best,
            counted: &counted,
            duplicate: &duplicate,
            cold_ms: (this_cold, peer_cold),
            floor_ms: (floor_one, floor_many),
            memory_mb,
            at_latency: &result["at_latency"],
            retries: &result["retries"],
            api: &result["api"],
        });
        ratios = compare::ratios(&comparison);
        result["comparison"] = comparison;
        result["peer_throughput"] = json!([
            best[&("peer", 1)].clone(),
            best[&("peer", opts.pollers)].clone()
        ]);
    }
    let series: Vec<(String, Vec<f64>)> = contenders
        .iter()
        .map(|who| {
            let waits = result["at_latency"]["contenders"][who.label()]["open_loop"]
                ["send_to_charged_all_ms"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
                .unwrap_or_default();
            (compare::display_name(*who).to_owned(), waits)
        })
        .collect();
    compare::chart(&series, &ratios, &opts.out_dir.join("bench.png"))?;
    let mut slim = result.clone();
    for who in contenders {
        if let Some(o) = slim["at_latency"]["contenders"][who.label()]["open_loop"].as_object_mut()
        {
            o.remove("send_to_charged_all_ms");
        }
    }
    for key in ["throughput", "peer_throughput"] {
        for t in slim[key].as_array_mut().into_iter().flatten() {
            t.as_object_mut().map(|o| o.remove("latencies_ms"));
        }
    }
    // What a million payments cost the whole stack, from what this run measured.
    let stack_cost = if slim["comparison"].is_null() {
        None
    } else {
        let columns = compare::stack_cost::columns(&slim, &opts.template)?;
        slim["stack_cost"] = json!(columns);
        Some(compare::stack_cost::markdown(&columns))
    };
    std::fs::write(
        opts.out_dir.join("results.json"),
        serde_json::to_string_pretty(&slim)?,
    )?;
    let mut md = markdown(&slim, opts);
    if let Some(table) = stack_cost {
        md.push_str("\nCost of a million payments for the whole stack (webhook shape, card payments; `proving stack-cost`, docs/performance.md):\n\n");
        md.push_str(&table);
    }
    std::fs::write(opts.out_dir.join("results.md"), &md)?;
    println!("{md}");
    Ok(slim)
}

/// The cost of traces: the one-batch drain, traces off and on in turn (twice each, the better
/// of each kept), the function exporting every span to a local OTLP receiver when on (every
/// payment sampled, flushed before each invocation answers); and the cold start with the
/// exporter configured, beside `cold_off`. The bootstrap is the same binary either way: what
/// exporting adds to its size is compiled in.
async fn traced(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    cold_env: &BTreeMap<String, String>,
    cold_off: f64,
) -> Result<serde_json::Value> {
    let receiver = crate::otlp::OtlpReceiver::start("127.0.0.1:0", None).await?;
    let on_opts = BenchOptions {
        traces_endpoint: Some(receiver.endpoint()),
        ..opts.clone()
    };
    let drain = |opts, tag| throughput(sdk, opts, Contender::This, 1, tag, false, opts.payments);
    let (mut offs, mut ons, mut spans) = (Vec::new(), Vec::new(), 0);
    for _ in 0..2 {
        offs.push(drain(opts, "untraced").await?);
        let before = receiver.spans().len();
        ons.push(drain(&on_opts, "traced").await?);
        spans = receiver.spans().len() - before;
    }
    let off = &best_of(offs.remove(0), offs.remove(0));
    let on = best_of(ons.remove(0), ons.remove(0));
    let mut cold_env = cold_env.clone();
    cold_env.insert(
        "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
        receiver.endpoint(),
    );
    let cold_on = cold_start(opts.host_bootstrap()?, &cold_env, opts.cold_start_runs).await?;
    let per_payment = |run: &serde_json::Value, key: &str| {
        run[key].as_f64().unwrap_or(0.0) / run["payments"].as_f64().unwrap_or(1.0).max(1.0)
    };
    Ok(json!({
        "payments": opts.payments,
        "spans_per_payment": spans as f64 / opts.payments.max(1) as f64,
        "cpu_ms_per_payment": {
            "off": off["cpu_ms_per_1000_payments"].as_f64().unwrap_or(0.0) / 1000.0,
            "on": on["cpu_ms_per_1000_payments"].as_f64().unwrap_or(0.0) / 1000.0,
        },
        "billed_ms_per_payment": {
            "off": per_payment(off, "billed_ms"),
            "on": per_payment(&on, "billed_ms"),
        },
        "payments_per_second": {
            "off": off["payments_per_second"],
            "on": on["payments_per_second"],
        },
        "peak_rss_kib": {"off": off["peak_rss_kib"], "on": on["peak_rss_kib"]},
        "cold_start_ms_median": {"off": cold_off, "on": cold_on},
    }))
}
