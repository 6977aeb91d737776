//! The provider's rate: a backlog drained against a provider that limits the account as Stripe
//! does (the simulator's `/_sim/rate_limit`: past the account's rate or an endpoint's, `429`
//! with `Stripe-Rate-Limited-Reason: global-rate` or `endpoint-rate`), at the provider's answer
//! time, while the merchant's own traffic uses 30 % of the limit, for each contender, with the
//! template's concurrency (one function process per instance the event source may run).
//!
//! Three accounts, each with Stripe's limits (docs.stripe.com/rate-limits): the account's
//! requests a second and each endpoint's (25 unless Stripe raised it; the processor's charges all
//! go to `POST /v1/payment_intents`):
//!
//! - a sandbox: 25 in all, 25 an endpoint, the template's defaults;
//! - live mode: 100 in all, 25 an endpoint, `ProviderRequestsPerSecond` 35 (the payments' part,
//!   21 a second, within the endpoint's 25);
//! - an account whose limits Stripe raised (300 in all, 200 an endpoint) with
//!   `ProviderRequestsPerSecond` 180 and `MaximumConcurrency` 20: the payments' part is 108 a
//!   second, sized for the README's lowest capacity tier, 100 payments a second sustained.
//!
//! The processor's budget is its part of the stack's (the template's `PROVIDER_SHARE_PERCENT`);
//! the floor is the backlog ÷ that budget, for both contenders (the peer knows no budget: a
//! ratio under 1 is capacity taken from the merchant). The merchant's own traffic runs at 30 %
//! of the account's limit: one request in ten a checkout's `POST /v1/payment_intents`
//! (created, not confirmed), the rest reads of three other endpoints. Only the payment
//! processor runs: each row is the payments' part of the budget. What is measured:
//!
//! - drain time ÷ floor;
//! - the function's provider requests, and the share refused `429` (the simulator's counts
//!   less the merchant's own);
//! - provider requests per charge, claims per payment (the conditional write that takes a
//!   payment, counted on the wire), deliveries per payment;
//! - dead letters; no payment charged twice, every payment charged or dead-lettered (by id);
//! - the merchant's requests and how many of them were refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sqs_once::runner::now_ms;

use super::latency::{at_latency, simulator};
use super::setup::*;
use super::throughput::spawn_functions;
use crate::compare::Contender;
use crate::load::{payment_body, send_all};
use crate::wire_count::CountingRelay;
use lambda_local::esm::{self, EsmOptions, Function};
use lambda_local::runtime_api::FunctionProcess;
use payctl::template::{provision, teardown, unique_stack_name, ProvisionOptions, PROCESSOR};

/// An account's limits and the stack's settings for it.
struct Account {
    /// What the results call it.
    name: &'static str,
    /// Requests a second in all.
    limit: f64,
    /// Requests a second to each endpoint.
    endpoint_limit: f64,
    /// Template parameters other than their defaults.
    parameters: &'static [(&'static str, &'static str)],
    /// The capacity tier it checks (payments a second sustained), if any: its drain is held
    /// to that instead of the floor (at 2,000 payments, the last batches' tail is a tenth of
    /// a 20 s drain).
    tier: Option<f64>,
}

/// The accounts measured.
const ACCOUNTS: [Account; 3] = [
    Account {
        name: "sandbox",
        limit: 25.0,
        endpoint_limit: 25.0,
        parameters: &[],
        tier: None,
    },
    Account {
        name: "live",
        limit: 100.0,
        endpoint_limit: 25.0,
        parameters: &[("ProviderRequestsPerSecond", "35")],
        tier: None,
    },
    Account {
        name: "raised",
        limit: 300.0,
        endpoint_limit: 200.0,
        parameters: &[
            ("ProviderRequestsPerSecond", "180"),
            ("MaximumConcurrency", "20"),
        ],
        tier: Some(100.0),
    },
];

/// The merchant's own traffic, in turn: a checkout's first step (a PaymentIntent created, not
/// confirmed: the endpoint the processor charges through) and reads of three other endpoints.
const MERCHANT_REQUESTS: [(&str, &str); 10] = [
    ("POST", "/v1/payment_intents"),
    ("GET", "/v1/payment_intents/pi_merchant_"),
    ("GET", "/v1/charges/ch_merchant_"),
    ("GET", "/v1/refunds/re_merchant_"),
    ("GET", "/v1/payment_intents/pi_merchant_"),
    ("GET", "/v1/charges/ch_merchant_"),
    ("GET", "/v1/refunds/re_merchant_"),
    ("GET", "/v1/payment_intents/pi_merchant_"),
    ("GET", "/v1/charges/ch_merchant_"),
    ("GET", "/v1/refunds/re_merchant_"),
];

/// The merchant's own traffic, as a share of the account's limit.
const FOREGROUND_SHARE: f64 = 0.3;

/// The goals this project's rows are held to.
pub(super) const GOAL_DRAIN_OVER_FLOOR: f64 = 1.1;
/// The smallest backlog the goals are judged on.
pub(super) const GOALS_FROM_PAYMENTS: u64 = 1000;
pub(super) const GOAL_REFUSED_SHARE: f64 = 0.02;
pub(super) const GOAL_PER_PAYMENT: f64 = 1.05;

/// The request that takes a payment, among a contender's DynamoDB writes: this project's claim
/// is the conditional `UpdateItem` that adds an attempt; the peer's (Powertools' persistence
/// layer) is its `PutItem` of the `INPROGRESS` record.
fn claims_of(who: Contender) -> crate::wire_count::Classify {
    match who {
        Contender::This => |op, body| {
            (op.ends_with(".UpdateItem")
                && body
                    .windows(b"ADD attempts :one".len())
                    .any(|w| w == b"ADD attempts :one"))
            .then_some("claim")
        },
        Contender::Peer => |op, _| op.ends_with(".PutItem").then_some("claim"),
    }
}

/// Every account, each contender: the rows. The simulator answers at `opts.latency` and is put
/// back to no limit and no latency afterwards, whatever happened.
pub(super) async fn measure(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    contenders: &[Contender],
) -> Result<Value> {
    let sim = simulator()?;
    let runs = at_latency(opts, async {
        let mut runs = Vec::new();
        if let Some(unknown) = opts
            .rate_accounts
            .iter()
            .find(|a| !ACCOUNTS.iter().any(|k| k.name == a.as_str()))
        {
            bail!("no account {unknown:?} among the provider-rate rows' (sandbox, live, raised)");
        }
        let chosen = ACCOUNTS.iter().filter(|a| {
            opts.rate_accounts.is_empty() || opts.rate_accounts.iter().any(|n| n == a.name)
        });
        for account in chosen {
            for &who in contenders {
                runs.push(drain(sdk, opts, who, account).await?);
            }
        }
        Ok(runs)
    })
    .await;
    sim.set_rate_limit(0.0, 0.0).await?;
    Ok(json!({
        "payments": opts.rate_payments,
        "foreground_share_of_limit": FOREGROUND_SHARE,
        "latency_ms": {"p50": opts.latency.0, "p99": opts.latency.1},
        "runs": runs?,
    }))
}

/// The merchant's own traffic: `per_second` requests ([`MERCHANT_REQUESTS`] in turn) sent on a
/// fixed schedule until `stop`, whatever the answers; returns (sent, refused `429`). Any other
/// failure is an error: every request must reach the account's limiter, or the function's
/// requests (the simulator's counts less these) would be miscounted.
async fn merchant(
    base: String,
    key: String,
    tag: String,
    per_second: f64,
    stop: Arc<AtomicBool>,
) -> Result<(u64, u64)> {
    let http = reqwest::Client::new();
    let interval = Duration::from_secs_f64(1.0 / per_second);
    let started = tokio::time::Instant::now();
    let mut requests = tokio::task::JoinSet::new();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until(started + interval * sent as u32).await;
        let (method, path) = MERCHANT_REQUESTS[sent as usize % MERCHANT_REQUESTS.len()];
        let request = if method == "POST" {
            http.post(format!("{base}{path}"))
                .header("Idempotency-Key", format!("{tag}-checkout-{sent}"))
                .form(&[("amount", "1000"), ("currency", "usd")])
        } else {
            http.get(format!("{base}{path}{sent}"))
        }
        .bearer_auth(&key)
        .send();
        requests.spawn(async move {
            let answer = request.await.context("the merchant's request")?;
            let status = answer.status().as_u16();
            let body = answer.text().await.unwrap_or_default();
            Ok::<_, anyhow::Error>((status, body))
        });
        sent += 1;
    }
    let mut refused = 0;
    while let Some(answer) = requests.join_next().await {
        match answer?? {
            (429, _) => refused += 1,
            // What the merchant reads does not exist: the account's answer all the same (an
            // unknown URL's 404 would have skipped the limiter, and fails the run).
            (200, _) => {}
            (404, body) if body.contains("resource_missing") => {}
            (status, body) => bail!("the merchant's request was answered {status}: {body}"),
        }
    }
    Ok((sent, refused))
}

/// One contender drains `opts.rate_payments` payments against `account`'s limits, the stack
/// provisioned with its `ProviderRequestsPerSecond`.
async fn drain(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
    account: &Account,
) -> Result<Value> {
    let name = unique_stack_name(&format!("rate{}", who.label()));
    let mut provision_opts = ProvisionOptions {
        stack_name: name.clone(),
        visibility_timeout: Some(30),
        ..Default::default()
    };
    for (k, v) in account.parameters {
        provision_opts
            .parameters
            .insert(k.to_string(), v.to_string());
    }
    let stack = provision(sdk, &opts.template, &provision_opts).await?;
    // The stack goes whatever the run ends in.
    let run = drain_on(sdk, opts, who, account, &name, &stack).await;
    let gone = teardown(sdk, &stack).await;
    let run = run?;
    gone?;
    Ok(run)
}

/// [`drain`] on its provisioned stack.
async fn drain_on(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
    account: &Account,
    name: &str,
    stack: &payctl::template::Stack,
) -> Result<Value> {
    let limit = account.limit;
    let pace = stack
        .deployed_pace
        .get(PROCESSOR)
        .context("the template gives the processor no provider pace")?
        .clone();
    let number = |k: &str| -> Result<f64> {
        pace.get(k)
            .with_context(|| format!("the template gives the processor no {k}"))?
            .parse()
            .with_context(|| format!("the processor's {k}"))
    };
    let instances = number("EVENT_SOURCE_MAX_CONCURRENCY")? as usize;
    let budget =
        number("PROVIDER_REQUESTS_PER_SECOND")? * number("PROVIDER_SHARE_PERCENT")? / 100.0;
    let (program, mut env) = opts.function_under_test(who, stack)?;
    if who == Contender::This {
        env.extend(pace.clone());
    }
    let upstream = std::env::var("AWS_ENDPOINT_URL")
        .context("counting claims on the wire needs a local AWS_ENDPOINT_URL")?;
    let relay = CountingRelay::start_classified(&upstream, claims_of(who)).await?;
    env.insert("AWS_ENDPOINT_URL".to_owned(), relay.url().to_owned());
    let sim = simulator_of(&env)?;
    let (functions, _) = spawn_functions(opts, name, who, &program, &env, instances).await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let n = opts.rate_payments.max(1);
    let ids: Vec<String> = (0..n).map(|i| payment_id(name, i)).collect();
    let bodies: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| payment_body(id, 1000 + i as i64, "pm_card_visa"))
        .collect();
    send_all(&sqs, &stack.event_source.queue_url, &bodies).await?;

    sim.set_rate_limit(limit, account.endpoint_limit).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let foreground = tokio::spawn(merchant(
        env.get("PROVIDER_API_URL").cloned().unwrap_or_default(),
        env.get("PAYMENT_API_KEY").cloned().unwrap_or_default(),
        name.to_owned(),
        limit * FOREGROUND_SHARE,
        stop.clone(),
    ));
    let started_ms = now_ms();
    let stats = esm::run(
        Function::Processes(functions.iter().map(FunctionProcess::api).collect()),
        sqs.clone(),
        EsmOptions {
            max_duration: Duration::from_secs(1800),
            ..esm_opts(stack, instances)
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for f in functions {
        f.stop().await?;
    }
    let merchant_answers = foreground.await;
    let counts = sim.rate_counts().await;
    sim.set_rate_limit(0.0, 0.0).await?;
    let (stats, (merchant_sent, merchant_refused), counts) = (stats?, merchant_answers??, counts?);
    // An invocation that failed (Powertools' batch processor raises when every record of a
    // batch failed) hands its whole batch back: counted, not a failure of the run; what it
    // means for the money is checked here.
    let ledger = sim.ledger().await?;
    let charges = |id: &String| ledger.charges.get(id).map(Vec::len).unwrap_or(0);
    if let Some(twice) = ids.iter().find(|id| charges(id) > 1) {
        bail!(
            "{}: {twice} was charged {} times",
            who.label(),
            charges(twice)
        );
    }
    let dead = crate::check::drain_dlq(
        &sqs,
        stack
            .queues
            .get("PaymentsDeadLetterQueue")
            .context("the template has no PaymentsDeadLetterQueue")?,
    )
    .await?
    .into_iter()
    .map(|letter| {
        serde_json::from_str::<Value>(&letter.body)
            .ok()
            .and_then(|v| v["payment_id"].as_str().map(str::to_owned))
            .with_context(|| format!("a dead letter without a payment_id: {}", letter.body))
    })
    .collect::<Result<std::collections::BTreeSet<String>>>()?;
    let lost: Vec<&String> = ids
        .iter()
        .filter(|id| charges(id) == 0 && !dead.contains(*id))
        .collect();
    if !lost.is_empty() {
        bail!(
            "{}: {} of {n} payments neither charged nor dead-lettered: {:?}",
            who.label(),
            lost.len(),
            &lost[..lost.len().min(5)]
        );
    }
    let charged = ids.iter().filter(|id| charges(id) == 1).count();
    let charged_and_dead = ids
        .iter()
        .filter(|id| charges(id) == 1 && dead.contains(*id))
        .count();
    // The rate between the tenth and the ninetieth percentile of the charges: the drain's pace
    // without its start and its last batches (each instance's last batch ends on its own).
    let mut charged_at: Vec<i64> = ids
        .iter()
        .filter_map(|id| {
            ledger
                .charged_at_ms
                .get(id)
                .and_then(|t| t.first().copied())
        })
        .collect();
    charged_at.sort_unstable();
    let sustained = match (
        charged_at.get(charged_at.len() / 10),
        charged_at.get(charged_at.len() * 9 / 10),
    ) {
        (Some(a), Some(b)) if b > a => {
            (charged_at.len() * 8 / 10) as f64 / ((b - a) as f64 / 1000.0)
        }
        _ => 0.0,
    };
    let mut wire = relay.counts();
    let claims = wire.remove("claim").map(|c| c.calls).unwrap_or(0);
    if (claims as usize) < charged {
        bail!(
            "{}: {claims} claims counted for {charged} charges: the claim classifier no longer matches the function's claim",
            who.label()
        );
    }
    let last = stats
        .acked_at_ms
        .iter()
        .copied()
        .max()
        .unwrap_or(started_ms);
    let seconds = ((last - started_ms) as f64 / 1000.0).max(1e-3);
    // The function's requests: what the limiter saw, less the merchant's (each of which
    // reached it: any other answer failed the run).
    let requests = (counts.allowed + counts.refused).saturating_sub(merchant_sent);
    let function_refused = counts.refused.saturating_sub(merchant_refused);
    let floor = n as f64 / budget;
    println!(
        "provider rate, {}, {}: {n} payments in {seconds:.1} s (floor {floor:.1} s), {requests} requests, {function_refused} refused, {claims} claims, {} dead letters; the merchant's {merchant_sent} requests, {merchant_refused} refused; refused by reason {:?}",
        who.label(),
        account.name,
        dead.len(),
        counts.refused_by_reason
    );
    Ok(json!({
        "function": who.label(),
        "account": account.name,
        "tier_payments_per_second": account.tier,
        "limit_per_second": limit,
        "endpoint_limit_per_second": account.endpoint_limit,
        "provider_requests_per_second": number("PROVIDER_REQUESTS_PER_SECOND")?,
        "share_percent": number("PROVIDER_SHARE_PERCENT")?,
        "budget_per_second": budget,
        "instances": instances,
        "payments": n,
        "seconds": seconds,
        "floor_seconds": floor,
        "drain_over_floor": seconds / floor,
        "sustained_payments_per_second": sustained,
        "provider_requests": requests,
        "refused": function_refused,
        "refused_by_reason_all": counts.refused_by_reason,
        "refused_share": function_refused as f64 / (requests.max(1)) as f64,
        "provider_requests_per_charge": requests as f64 / charged.max(1) as f64,
        "claims_per_payment": claims as f64 / n as f64,
        "deliveries_per_payment": stats.received as f64 / n as f64,
        "invocations": stats.invocations,
        "function_errors": stats.function_errors,
        "timeouts": stats.timeouts,
        "billed_ms_per_payment": stats.billed_ms as f64 / n as f64,
        "wire_per_payment": crate::compare::wire_per_payment(&wire, n),
        "charged": charged,
        "dead_letters": dead.len(),
        "charged_and_dead_lettered": charged_and_dead,
        "merchant": {
            "per_second": limit * FOREGROUND_SHARE,
            "requests": merchant_sent,
            "refused": merchant_refused,
        },
    }))
}
