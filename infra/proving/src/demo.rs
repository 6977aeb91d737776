//! The local end-to-end run behind `make demo`: provision from `template.yaml`, switch on
//! provider faults, send a mixed load in two waves, drain it with the local event-source
//! mapping, and check the result against the provider's ledger, the table and the DLQ.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use payment_core::edges::config::{ApiConfig, RelayConfig};
use payment_core::Processor;
use serde_json::json;

use crate::api_load::{final_statuses, post_load, ApiRun};
use crate::check::{drain_dlq, scan_records, verify, Sent, Verdict};
use crate::load::{mixed_load, send_all};
use crate::sim::SimClient;
use lambda_local::esm::{self, EsmStats};
use payctl::client::ApiClient;
use payctl::template::{provision, unique_stack_name, ProvisionOptions, Stack};

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The SAM template to provision from.
    pub template: PathBuf,
    /// Unique payments in the load (copies, reuse and malformed bodies come on top).
    pub payments: usize,
    /// Seed of the load and of the fault dice.
    pub seed: u64,
    /// Concurrent pollers of the local event-source mapping.
    pub pollers: usize,
    /// Probability of each provider fault per call.
    pub fault_rate: f64,
    /// Send straight into the queue instead of through the payments API and its outbox.
    pub direct: bool,
}

pub use crate::functions::{
    config_for, drain_source, event_config_for, function_environment, refund_config_for,
};

async fn drain(
    processor: &Arc<Processor>,
    sqs: &aws_sdk_sqs::Client,
    stack: &Stack,
    pollers: usize,
) -> Result<EsmStats> {
    drain_source(processor.clone(), sqs, &stack.event_source, pollers).await
}

/// Runs the demo and prints its summary; returns the verdict (violations make the caller exit
/// non-zero).
pub async fn run(sdk: &aws_config::SdkConfig, opts: &DemoOptions) -> Result<Verdict> {
    let started = Instant::now();
    let run_id = unique_stack_name("demo");
    let stack = provision(
        sdk,
        &opts.template,
        &ProvisionOptions {
            stack_name: run_id.clone(),
            visibility_timeout: Some(10),
            ..Default::default()
        },
    )
    .await?;
    let dlq_url = stack.function_var("DEAD_LETTER_QUEUE_URL")?.to_owned();
    println!(
        "provisioned from {}: queue {}, DLQ {}, table {}",
        opts.template.display(),
        stack.event_source.queue_url,
        dlq_url,
        stack.function_var("IDEMPOTENCY_TABLE")?
    );

    let overrides: BTreeMap<String, String> = [
        ("LEASE_SECONDS", "8"),
        ("PAYMENT_API_TIMEOUT_SECONDS", "2"),
        ("REDELIVERY_BASE_DELAY_SECONDS", "1"),
        ("REDELIVERY_MAX_DELAY_SECONDS", "4"),
        // Retries spread over half a minute, not the template's hour: a demo ends in minutes.
        ("RETRY_HORIZON_SECONDS", "30"),
    ]
    .into_iter()
    .filter(|(k, _)| std::env::var(k).is_err())
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let config = config_for(&stack, &overrides)?;
    let sim = SimClient::new(&config.payment_api_url);
    let processor = payment_core::edges::bootstrap::build_processor(&config, sdk).await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let ddb = aws_sdk_dynamodb::Client::new(sdk);

    let r = opts.fault_rate;
    sim.add_faults(json!([
        {"prefix": run_id, "fault": "500_after_commit", "probability": r},
        {"prefix": run_id, "fault": "drop_after_commit", "probability": r},
        {"prefix": run_id, "fault": "429", "probability": r},
        {"prefix": run_id, "fault": "latency", "probability": r, "latency_ms": 300},
    ]))
    .await?;
    println!("provider faults on for {run_id}*: 500 after commit, dropped connection after commit, 429, 300 ms latency; each at {:.0}% of calls", r * 100.0);

    let (first, second) = mixed_load(&run_id, opts.payments, opts.seed);
    let mut sent: Vec<Sent> = Vec::new();
    let mut stats = EsmStats::default();
    let mut api_run = None;
    if opts.direct {
        for (wave, load) in [(1, &first), (2, &second)] {
            let bodies: Vec<String> = load.iter().map(|p| p.body.clone()).collect();
            let ids = send_all(&sqs, &stack.event_source.queue_url, &bodies).await?;
            println!(
                "wave {wave}: sent {} messages straight to the queue ({}); draining with {} pollers",
                load.len(),
                crate::load::kinds(load),
                opts.pollers
            );
            sent.extend(
                load.iter()
                    .cloned()
                    .zip(ids)
                    .map(|(planned, message_id)| Sent {
                        planned,
                        message_id,
                    }),
            );
            stats.merge(&drain(&processor, &sqs, &stack, opts.pollers).await?);
        }
    } else {
        // The payments API and the relay, from the template's own configuration of them.
        let api_config = ApiConfig::from_lookup(|k| {
            stack
                .var_of("PaymentsApiFunction", k)
                .ok()
                .map(str::to_owned)
        })?;
        let api = Arc::new(payment_core::edges::bootstrap::build_api(
            &api_config,
            ddb.clone(),
        ));
        let server = payctl::api::serve(api, None, "127.0.0.1:0").await?;
        let relay_config = RelayConfig::from_lookup(|k| {
            stack
                .var_of("OutboxRelayFunction", k)
                .ok()
                .map(str::to_owned)
        })?;
        let relay = Arc::new(payment_core::edges::bootstrap::build_relay(
            &relay_config,
            sdk,
        ));
        let mapping = payctl::relay::start(sdk, stack.payments_table()?, relay).await?;
        let client = ApiClient::new(server.url(), sdk)?;
        println!(
            "payments API on {} (outbox: {}, relayed from its stream to the queue)",
            server.url(),
            stack.payments_table()?
        );
        let mut answers = std::collections::HashMap::new();
        let mut run = ApiRun::default();
        for (wave, load, copies) in [(1, &first, 2), (2, &second, 1)] {
            let r = post_load(&client, load, copies, &mut answers).await?;
            println!(
                "wave {wave}: {} API requests for {} planned messages ({}): {} replays, {} refused; draining with {} pollers",
                r.requests,
                load.len(),
                crate::load::kinds(load),
                r.replays,
                r.refused,
                opts.pollers
            );
            run.merge(r);
            // Everything accepted so far must be on the queue before the drain can end.
            let accepted = run.sent.len() as u64;
            let waiting = Instant::now();
            while mapping
                .stats
                .handled
                .load(std::sync::atomic::Ordering::Relaxed)
                < accepted
            {
                if waiting.elapsed() > Duration::from_secs(120) {
                    anyhow::bail!(
                        "the relay did not publish {accepted} accepted payments within 120 s"
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stats.merge(&drain(&processor, &sqs, &stack, opts.pollers).await?);
        }
        let (statuses, wrong) = final_statuses(&client, &run.sent).await?;
        println!("GET /v1/payments/{{id}} statuses: {statuses:?}");
        run.violations.extend(wrong);
        sent = std::mem::take(&mut run.sent);
        api_run = Some(run);
    }

    let depth = esm::queue_depth(&sqs, &stack.event_source.queue_url).await?;
    let dlq = drain_dlq(&sqs, &dlq_url).await?;
    let records = scan_records(&ddb, stack.function_var("IDEMPOTENCY_TABLE")?).await?;
    let ledger = sim.ledger().await?;
    let mut verdict = verify(&sent, &ledger, &records, &dlq, depth);
    let calls = ledger.calls_under(&run_id);

    // Refunds of what was charged: whole, partial, racing for the same charge, and of payments
    // that were not charged; each message sent twice, through the refund processor.
    let refund_config = refund_config_for(&stack, &overrides)?;
    let refunder =
        payment_core::edges::bootstrap::build_refund_processor(&refund_config, sdk).await?;
    let refunds = crate::refund_check::plan(&run_id, &records, opts.payments / 10);
    let source = &stack.event_sources[payctl::template::REFUND_PROCESSOR];
    let bodies = crate::refund_check::bodies(&refunds);
    send_all(&sqs, &source.queue_url, &bodies).await?;
    println!(
        "refunds: sent {} messages ({} refunds, each twice) to {}; draining with {} pollers",
        bodies.len(),
        refunds.len(),
        source.queue_url,
        opts.pollers
    );
    let refund_stats = drain_source(refunder.clone(), &sqs, source, opts.pollers).await?;
    let refund_verdict = crate::refund_check::observe(
        sdk,
        &refund_config.idempotency_table,
        &refund_config.dead_letter_queue_url,
        &sim.ledger().await?,
        &refunds,
    )
    .await?;
    verdict
        .violations
        .extend(refund_verdict.violations.iter().cloned());

    // What the provider finishes later: bank debits, a refund that fails after pending, a
    // dispute, all settled through the provider's signed events.
    let events = crate::events_check::demo_phase(
        sdk,
        &stack,
        &overrides,
        processor.clone(),
        refunder,
        &run_id,
    )
    .await?;
    verdict
        .violations
        .extend(events.verdict.violations.iter().cloned());
    if let Some(run) = &api_run {
        verdict.violations.extend(run.violations.iter().cloned());
    }

    println!();
    println!("== summary (checked against the provider's ledger, the table and the DLQ) ==");
    if let Some(run) = &api_run {
        let mut l = run.latencies_ms.clone();
        l.sort_by(f64::total_cmp);
        let q = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        println!(
            "API requests:             {} ({} replays, {} refused as planned), p50 {:.1} ms, p99 {:.1} ms",
            run.requests, run.replays, run.refused, q(0.5), q(0.99)
        );
        println!(
            "payments accepted:        {} (each relayed to the queue by the outbox)",
            sent.len()
        );
    }
    verdict.print_counts(sent.len());
    println!("provider calls:           {calls} (retries with the same key included)");
    refund_verdict.print(bodies.len());
    let (refund_buckets, refund_sum) = crate::check::buckets(&refund_stats.summary);
    println!(
        "refund processor:         {} deliveries = {refund_buckets} + {} in batches that failed as a whole",
        refund_stats.received, refund_stats.in_failed_batches
    );
    events.print();
    let (payment_buckets, payment_sum) = crate::check::buckets(&stats.summary);
    println!(
        "local event source:       {} invocations, {} timeouts; {} deliveries = {payment_buckets} + {} in batches that failed as a whole",
        stats.invocations, stats.timeouts, stats.received, stats.in_failed_batches
    );
    for (what, received, sum) in [
        (
            "payments",
            stats.received,
            u64::from(payment_sum) + stats.in_failed_batches,
        ),
        (
            "refunds",
            refund_stats.received,
            u64::from(refund_sum) + refund_stats.in_failed_batches,
        ),
    ] {
        if received != sum {
            verdict.violations.push(format!(
                "the {what} processor received {received} deliveries and accounted for {sum}"
            ));
        }
    }
    println!(
        "took:                     {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if verdict.violations.is_empty() {
        println!("RESULT: OK: every payment charged at most once, every refund made at most once and within its charge, what the provider finished later settled once, nothing lost");
    } else {
        println!("RESULT: FAILED: {} violations", verdict.violations.len());
        verdict.print_violations(50);
    }
    sim.clear_faults().await.ok();
    Ok(verdict)
}
