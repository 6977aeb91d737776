//! The chaos checker: a seeded, reproducible run of several real processor processes that
//! crash at random failpoints and are restarted, against a provider that is slow, rate limits,
//! fails after committing, caches a `500`, drops connections and forgets keys. When the queue is
//! drained it checks, from the provider's ledger, the table and the DLQ (never from the
//! processor's counters), that every valid payment was charged at most once and recorded, and
//! that every message is accounted for.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

mod events;
mod fleet;

use fleet::Fleet;

use crate::check::{drain_dlq, scan_records, verify, Sent, Verdict};
use crate::load::{mixed_load, send_all};
use crate::sim::SimClient;
use lambda_local::esm::queue_depth;
use payctl::template::{provision, unique_stack_name, ProvisionOptions};

/// Chaos run settings.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The SAM template.
    pub template: PathBuf,
    /// Unique payments (copies, reuse and malformed bodies come on top).
    pub payments: usize,
    /// Seed of the load, the fault dice and the crash points.
    pub seed: u64,
    /// Processor processes running at once.
    pub instances: usize,
    /// Crash rate: each process is armed to crash at one seeded failpoint after a seeded
    /// number of passes averaging `1 / crash_rate`.
    pub crash_rate: f64,
    /// Probability of each provider fault per call.
    pub fault_rate: f64,
    /// Probability of an AWS fault (throttled, `500`, stalled, answer lost) per AWS call of
    /// the processor processes, through [`crate::aws_faults::FaultProxy`]; 0: none.
    pub aws_fault_rate: f64,
    /// Most messages queued at once (the emulator slows down with depth).
    pub max_depth: i64,
    /// Give up after this long.
    pub max_duration: Duration,
    /// The `payctl` binary the instances run (built with failpoints).
    pub exe: PathBuf,
}

/// What a run found.
#[derive(Debug)]
pub struct ChaosReport {
    /// The external checks.
    pub verdict: Verdict,
    /// Processes that crashed (and were restarted).
    pub crashes: u64,
    /// Messages sent.
    pub sent: usize,
    /// Wall time.
    pub elapsed: Duration,
}

/// Processor configuration of the chaos run: short leases and visibility so crashes are
/// recovered quickly, and the provider's key retention as short as the simulator's.
const VISIBILITY_SECONDS: i32 = 6;
const KEY_RETENTION_SECONDS: u64 = 30;

pub async fn run(sdk: &aws_config::SdkConfig, opts: &ChaosOptions) -> Result<ChaosReport> {
    let started = Instant::now();
    let run_id = unique_stack_name(&format!("chaos{}-", opts.seed));
    let stack = provision(
        sdk,
        &opts.template,
        &ProvisionOptions {
            stack_name: run_id.clone(),
            visibility_timeout: Some(VISIBILITY_SECONDS),
            // Crashes and faults make some messages come back many times; the checker wants
            // the processor's own reasons, not SQS's receive limit.
            max_receive_count: Some(1000),
            ..Default::default()
        },
    )
    .await?;
    let queue_url = stack.event_source.queue_url.clone();
    let dlq_url = stack.function_var("DEAD_LETTER_QUEUE_URL")?.to_owned();
    let table = stack.function_var("IDEMPOTENCY_TABLE")?.to_owned();
    let sim_url = std::env::var("PROVIDER_API_URL")
        .context("PROVIDER_API_URL (the provider simulator) is not set")?;
    let sim = SimClient::new(&sim_url);

    let mut env = stack.function_env.clone();
    for (k, v) in [
        ("LEASE_SECONDS", "8"),
        ("PAYMENT_API_TIMEOUT_SECONDS", "5"),
        ("REDELIVERY_BASE_DELAY_SECONDS", "1"),
        ("REDELIVERY_MAX_DELAY_SECONDS", "4"),
        ("RETRY_HORIZON_SECONDS", "20"),
        // The simulator answers at once and its search shows a charge as soon as it is made.
        ("PROVIDER_PROCESSING_ALLOWANCE_SECONDS", "1"),
        ("PROVIDER_SEARCH_LAG_SECONDS", "2"),
        // The least margin the configuration accepts (8 + 5 + 1 + 60 s of skew): longer than
        // the simulator's 30 s retention, so every unknown outcome is looked up first.
        ("PROVIDER_KEY_RETENTION_MARGIN_SECONDS", "74"),
        ("MAX_CONCURRENCY", "10"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    env.insert(
        "PROVIDER_KEY_RETENTION_SECONDS".into(),
        KEY_RETENTION_SECONDS.to_string(),
    );
    env.insert("PROVIDER_API_URL".into(), sim_url.clone());
    env.insert(
        "PAYMENT_API_KEY".into(),
        std::env::var("PAYMENT_API_KEY").unwrap_or_else(|_| "sk_test_local".into()),
    );

    // The processes reach AWS through the fault proxy; the checks below do not.
    let proxy = if opts.aws_fault_rate > 0.0 {
        let upstream = std::env::var("AWS_ENDPOINT_URL")
            .context("AWS faults need the local endpoint in AWS_ENDPOINT_URL")?;
        let proxy =
            crate::aws_faults::FaultProxy::start(&upstream, opts.aws_fault_rate, opts.seed).await?;
        env.insert("AWS_ENDPOINT_URL".into(), proxy.url.clone());
        Some(proxy)
    } else {
        None
    };
    let r = opts.fault_rate;
    sim.add_faults(json!([
        {"prefix": run_id, "fault": "forget_after", "latency_ms": KEY_RETENTION_SECONDS * 1000},
        {"prefix": run_id, "fault": "latency", "probability": r / 5.0, "latency_ms": (VISIBILITY_SECONDS as u64 + 2) * 1000},
        {"prefix": run_id, "fault": "429", "probability": r},
        {"prefix": run_id, "fault": "500_after_commit", "probability": r},
        {"prefix": run_id, "fault": "cached_500", "probability": r / 5.0},
        {"prefix": run_id, "fault": "drop_after_commit", "probability": r},
    ]))
    .await?;
    // Each process gets one armed failpoint, chosen by the seed: it crashes the process (abort)
    // after a seeded number of passes, so the crash schedule replays with the seed.
    let mut dice = fastrand::Rng::with_seed(opts.seed);
    let mean_passes = (1.0 / opts.crash_rate.max(1e-6)).round() as u64;
    let mut arm = move || {
        let point = [
            "after_claim",
            "after_execute",
            "after_complete",
            "in_heartbeat",
        ][dice.usize(0..4)];
        let passes = dice.u64(0..=2 * mean_passes);
        let passes = if point == "in_heartbeat" {
            passes / 20
        } else {
            passes
        };
        format!("{point}={passes}*off->return")
    };
    let pct = opts.crash_rate * 100.0;
    println!("chaos {run_id}: seed {}, {} payments, {} instances, a crash every ~{:.0} failpoint passes per process, provider faults {:.0}% each, AWS faults {:.0}% of calls", opts.seed, opts.payments, opts.instances, 100.0 / pct.max(1e-9), r * 100.0, opts.aws_fault_rate * 100.0);

    std::fs::create_dir_all(".local/run").ok();
    let log_path = format!(".local/run/{run_id}.log");
    let log = std::fs::File::create(&log_path).context("creating the instances' log")?;
    let mut fleet = Fleet {
        exe: opts.exe.clone(),
        args: vec!["--queue-url".into(), queue_url.clone()],
        env: env.clone(),
        log,
        log_path,
        children: Vec::new(),
        crashes: 0,
    };
    fleet.start(opts.instances, &mut arm)?;
    let deadline = (started, opts.max_duration, opts.seed);

    let sqs = aws_sdk_sqs::Client::new(sdk);
    let (first, second) = mixed_load(&run_id, opts.payments, opts.seed);
    let mut sent: Vec<Sent> = Vec::new();
    for (wave, load) in [(1, &first), (2, &second)] {
        println!(
            "wave {wave}: {} messages ({})",
            load.len(),
            crate::load::kinds(load)
        );
        for chunk in load.chunks(100) {
            while queue_depth(&sqs, &queue_url).await? > opts.max_depth {
                fleet.supervise(&mut arm)?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let bodies: Vec<String> = chunk.iter().map(|p| p.body.clone()).collect();
            let ids = send_all(&sqs, &queue_url, &bodies).await?;
            sent.extend(
                chunk
                    .iter()
                    .cloned()
                    .zip(ids)
                    .map(|(planned, message_id)| Sent {
                        planned,
                        message_id,
                    }),
            );
            fleet.supervise(&mut arm)?;
        }
        fleet.drain(&sqs, &queue_url, &mut arm, deadline).await?;
    }
    fleet.stop().await;

    let depth = queue_depth(&sqs, &queue_url).await?;
    let dlq = drain_dlq(&sqs, &dlq_url).await?;
    let records = scan_records(&aws_sdk_dynamodb::Client::new(sdk), &table).await?;
    let ledger = sim.ledger().await?;
    let mut verdict = verify(&sent, &ledger, &records, &dlq, depth);

    // Refunds of what was charged, by refund processes that crash the same way: whole,
    // partial and racing refunds, each message twice.
    let refunds_source = &stack.event_sources[payctl::template::REFUND_PROCESSOR];
    let refund_dlq = stack
        .var_of(payctl::template::REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")?
        .to_owned();
    let plans = crate::refund_check::plan(&run_id, &records, opts.payments / 10);
    let bodies = crate::refund_check::bodies(&plans);
    println!(
        "refunds: {} messages ({} refunds, each twice)",
        bodies.len(),
        plans.len()
    );
    fleet.args = vec![
        "--work".into(),
        "refunds".into(),
        "--queue-url".into(),
        refunds_source.queue_url.clone(),
        "--dead-letter-queue-url".into(),
        refund_dlq.clone(),
    ];
    fleet.start(opts.instances, &mut arm)?;
    send_all(&sqs, &refunds_source.queue_url, &bodies).await?;
    fleet
        .drain(&sqs, &refunds_source.queue_url, &mut arm, deadline)
        .await?;
    fleet.stop().await;
    let refunds =
        crate::refund_check::observe(sdk, &table, &refund_dlq, &sim.ledger().await?, &plans)
            .await?;
    refunds.print(bodies.len());
    verdict.violations.extend(refunds.violations);

    // What the provider finishes later, under the same crashes: bank debits, refunds that fail
    // after pending, disputes; their events delivered by the simulator (duplicates, out of
    // order) and applied by event processes that crash the same way.
    let scenarios: Vec<String> = (0..(opts.payments / 100).clamp(1, 5))
        .map(|i| format!("{run_id}-s{i}"))
        .collect();
    let events = events::events_phase(
        sdk, &stack, &sim, &mut fleet, &mut arm, &scenarios, opts, deadline,
    )
    .await?;
    verdict.violations.extend(events);
    sim.clear_faults_for(&run_id).await.ok();
    if let Some(proxy) = &proxy {
        println!("{}", proxy.counts.summary());
        if proxy.counts.total() == 0 {
            verdict
                .violations
                .push("AWS faults were asked for and none was injected".into());
        }
    }
    let report = ChaosReport {
        verdict,
        crashes: fleet.crashes,
        sent: sent.len(),
        elapsed: started.elapsed(),
    };
    print_report(&report, opts.seed);
    Ok(report)
}

fn print_report(r: &ChaosReport, seed: u64) {
    let v = &r.verdict;
    println!();
    println!("== chaos check (from the provider's ledger, the table and the DLQ) ==");
    v.print_counts(r.sent);
    println!("processes crashed:        {} (each restarted)", r.crashes);
    println!("took:                     {:.1} s", r.elapsed.as_secs_f64());
    if v.violations.is_empty() {
        println!("CHAOS OK (seed {seed}): every valid payment charged exactly once and recorded, every refund made at most once and within its charge, nothing lost, nothing left in progress");
    } else {
        println!(
            "CHAOS FAILED (seed {seed}, replay with --seed {seed}): {} violations",
            v.violations.len()
        );
        v.print_violations(50);
    }
}
