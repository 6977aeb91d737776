//! `make bench`'s retry rows: how long one transient provider failure delays a payment, and
//! what an outage as long as the retry horizon costs, each measured on a fresh stack from the
//! template with one process of the function behind the local event-source mapping, at the
//! provider latency the benchmark is at when it runs them.
//!
//! - **One transient failure**: every provider call of the payment's first delivery answers
//!   `429` (this project's in-delivery retries included, each after its `Retry-After`; the
//!   peer makes one call), then the provider is well. The template's settings (`MaxReceiveCount`
//!   10, a one-hour horizon, the 3 s first wait, the queue's visibility timeout unless
//!   `--retry-visibility-timeout` sets another) decide when the message comes back. Measured for
//!   both contenders: send → charged (the provider's books), with its one charge.
//! - **An outage as long as the horizon**, scaled to fit a benchmark: the horizon set to
//!   [`OUTAGE_HORIZON`], the provider down for all of it but a few seconds. Measured: the
//!   dead letters (there must be none), the charge, the deliveries it took.

use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::json;
use sqs_once::runner::now_ms;

use super::setup::BenchOptions;
use crate::compare::Contender;
use crate::load::{payment_body, send_all};
use crate::sim::SimClient;
use lambda_local::esm::{self, EsmOptions, Function};
use lambda_local::runtime_api::FunctionProcess;
use payctl::template::{provision, teardown, unique_stack_name, ProvisionOptions, Stack};

/// The scaled outage's retry horizon.
pub const OUTAGE_HORIZON: Duration = Duration::from_secs(30);
/// How long the provider is down in the scaled outage: all of the horizon but its end.
pub const OUTAGE: Duration = Duration::from_secs(26);
/// Provider calls this project's processor makes in one delivery (`PROVIDER_MAX_ATTEMPTS`'s
/// default); the peer makes one.
const THIS_CALLS_PER_DELIVERY: u32 = 3;

/// One payment through one process of a contender's function on a fresh stack while `fault`
/// holds at the provider (cleared by `clear_after`, if given): seconds from send to
/// acknowledged, the deliveries, the provider's calls and charges, and the dead letters.
/// `horizon` sets this project's retry horizon.
async fn one_payment(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
    name: &str,
    horizon: Option<Duration>,
    fault: serde_json::Value,
    clear_after: Option<Duration>,
) -> Result<serde_json::Value> {
    let stack_name = unique_stack_name(name);
    let stack: Stack = provision(
        sdk,
        &opts.template,
        &ProvisionOptions {
            stack_name: stack_name.clone(),
            visibility_timeout: opts.retry_visibility_timeout,
            ..Default::default()
        },
    )
    .await?;
    let (program, mut env) = opts.function_under_test(who, &stack)?;
    if let Some(h) = horizon {
        env.insert("RETRY_HORIZON_SECONDS".into(), h.as_secs().to_string());
    }
    let Some(sim_url) = env.get("PROVIDER_API_URL") else {
        bail!("the function has no PROVIDER_API_URL");
    };
    let sim = SimClient::new(sim_url);
    let pid = format!("{stack_name}-p");
    let mut rule = fault;
    rule["prefix"] = json!(pid);
    sim.add_faults(json!([rule])).await?;
    std::fs::create_dir_all(&opts.log_dir)?;
    let log = std::fs::File::create(opts.log_dir.join(format!("bench-{name}.log")))?;
    let function = FunctionProcess::spawn(&program, &env, log).await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let visibility = visibility_timeout(&sqs, &stack.event_source.queue_url).await?;
    let sent_at = now_ms();
    send_all(
        &sqs,
        &stack.event_source.queue_url,
        &[payment_body(&pid, 1000, "pm_card_visa")],
    )
    .await?;
    let clearing = clear_after.map(|after| {
        let (sim, pid) = (sim.clone(), pid.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            sim.clear_faults_for(&pid).await
        })
    });
    let stats = esm::run(
        Function::Processes(vec![function.api()]),
        sqs.clone(),
        EsmOptions {
            max_duration: Duration::from_secs(180 + visibility),
            ..super::setup::esm_opts(&stack, 1)
        },
    )
    .await;
    function.stop().await?;
    if let Some(c) = clearing {
        c.await??;
    }
    sim.clear_faults_for(&pid).await?;
    let stats = stats?;
    let dlq = stack.var_of(payctl::template::PROCESSOR, "DEAD_LETTER_QUEUE_URL")?;
    let dead = crate::check::drain_dlq(&sqs, dlq).await?;
    let ledger = sim.ledger_for(&pid).await?;
    let charges = ledger.charges.get(&pid).map(Vec::len).unwrap_or(0);
    if charges != 1 || !dead.is_empty() {
        bail!(
            "{name}: {charges} charges and {} dead letters, where one charge and none were due",
            dead.len()
        );
    }
    let acked = stats.acked_at_ms.iter().copied().max().unwrap_or(sent_at);
    let charged = ledger
        .charged_at_ms
        .get(&pid)
        .and_then(|t| t.first().copied())
        .unwrap_or(acked);
    teardown(sdk, &stack).await?;
    Ok(json!({
        "seconds_until_charged": (charged - sent_at) as f64 / 1000.0,
        "seconds_until_charged_and_acknowledged": (acked - sent_at) as f64 / 1000.0,
        "deliveries": stats.received,
        "provider_calls": ledger.calls_for(&pid),
        "charges": charges,
        "dead_letters": dead.len(),
        "visibility_timeout_seconds": visibility,
    }))
}

/// The queue's visibility timeout, seconds: how long a message the function handed back
/// without a delay of its own stays away.
async fn visibility_timeout(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Result<u64> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let out = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::VisibilityTimeout)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(&e)))?;
    out.attributes()
        .and_then(|a| a.get(&QueueAttributeName::VisibilityTimeout))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{queue_url} has no VisibilityTimeout"))
}

/// The retry rows, at once: one transient failure of each contender (every provider call of
/// the payment's first delivery answers `429`: this project's three in-delivery attempts, the
/// peer's one call), and this project's outage as long as its horizon.
pub async fn measure(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
) -> Result<serde_json::Value> {
    let blip = one_payment(
        sdk,
        opts,
        Contender::This,
        "benchblip",
        None,
        json!({"fault": "429", "times": THIS_CALLS_PER_DELIVERY}),
        None,
    );
    let outage = one_payment(
        sdk,
        opts,
        Contender::This,
        "benchoutage",
        Some(OUTAGE_HORIZON),
        json!({"fault": "down"}),
        Some(OUTAGE),
    );
    let peer = async {
        match opts.peer {
            Some(_) => one_payment(
                sdk,
                opts,
                Contender::Peer,
                "benchblippeer",
                None,
                json!({"fault": "429", "times": 1}),
                None,
            )
            .await
            .map(Some),
            None => Ok(None),
        }
    };
    let (blip, outage, peer) = tokio::join!(blip, outage, peer);
    Ok(json!({
        "one_transient_failure": blip?,
        "peer_one_transient_failure": peer?,
        "outage": {
            "horizon_seconds": OUTAGE_HORIZON.as_secs(),
            "down_seconds": OUTAGE.as_secs(),
            "run": outage?,
        },
    }))
}

/// The rows of the results' table.
pub fn markdown(r: &serde_json::Value) -> String {
    let blip = &r["one_transient_failure"];
    let outage = &r["outage"];
    let run = &outage["run"];
    let blip_s = blip["seconds_until_charged"].as_f64().unwrap_or(f64::NAN);
    format!(
        "| one transient provider failure (429 on every call of the first delivery; template settings, queue visibility timeout {} s) → charged after | {:.1} s, {} deliveries, {} charge, {} dead letters (goal ≤ 10 s: {}) |\n\
         | an outage as long as the retry horizon (scaled: horizon {} s, provider down {} s) → dead-lettered | {} ({} deliveries, {} charge, charged after {:.1} s) |\n",
        blip["visibility_timeout_seconds"],
        blip_s,
        blip["deliveries"],
        blip["charges"],
        blip["dead_letters"],
        if blip_s <= 10.0 { "met" } else { "NOT met" },
        outage["horizon_seconds"],
        outage["down_seconds"],
        run["dead_letters"],
        run["deliveries"],
        run["charges"],
        run["seconds_until_charged"].as_f64().unwrap_or(f64::NAN),
    )
}
