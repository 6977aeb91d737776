//! `make sim`: many seeds of the whole system on a simulated clock, each checked; a failing seed
//! prints the invariant, when, the trace's last lines and the command that replays it.
//!
//! Why ~500 lines: one argument, with its doc, for each dimension of a run a user may set by
//! hand (about 60 % of the file), and the replay command that names each one set.

use std::time::Instant;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Result;
use clap::Parser;
use simulator::world::{run, Options};

/// Runs seeds of the simulated system.
#[derive(Parser, Debug)]
struct Args {
    /// How many seeds, from `--first`.
    #[arg(long, env = "SEEDS", default_value_t = 20)]
    seeds: u64,
    /// The first seed.
    #[arg(long, env = "FIRST_SEED", default_value_t = 1)]
    first: u64,
    /// Simulated days per seed.
    #[arg(long, env = "DAYS", default_value_t = 30.0)]
    days: f64,
    /// Payments per seed.
    #[arg(long, env = "PAYMENTS", default_value_t = 10_000)]
    payments: usize,
    /// Chance an invocation is killed at a random moment.
    #[arg(long, env = "CRASH_RATE")]
    crash_rate: Option<f64>,
    /// Chance of each AWS fault (500, throttle, lost answer) per request.
    #[arg(long, env = "AWS_FAULT_RATE")]
    aws_fault_rate: Option<f64>,
    /// Chance of each provider fault (500 before or after the write, lost answer) per request.
    #[arg(long, env = "PROVIDER_FAULT_RATE")]
    provider_fault_rate: Option<f64>,
    /// Write the failing (or only) seed's whole trace to this file.
    #[arg(long, env = "TRACE")]
    trace: Option<std::path::PathBuf>,
    /// Put a mutation back (the simulator's teeth): one of `simulator::world::MUTATIONS`.
    #[arg(long, env = "MUTATION")]
    mutation: Option<String>,
    /// FIFO queues.
    #[arg(long, env = "FIFO")]
    fifo: bool,
    /// The source queue's visibility timeout, seconds (else the template's).
    #[arg(long, env = "VISIBILITY_TIMEOUT")]
    visibility_timeout: Option<i32>,
    /// `maxReceiveCount` (else the template's).
    #[arg(long, env = "MAX_RECEIVE_COUNT")]
    max_receive_count: Option<i32>,
    /// The provider down from this day ...
    #[arg(long, env = "PROVIDER_OUTAGE_DAY")]
    provider_outage_day: Option<f64>,
    /// ... for this many hours.
    #[arg(long, env = "PROVIDER_OUTAGE_HOURS", default_value_t = 30.0)]
    provider_outage_hours: f64,
    /// DynamoDB down from this day ...
    #[arg(long, env = "DYNAMODB_OUTAGE_DAY")]
    dynamodb_outage_day: Option<f64>,
    /// ... for this many hours.
    #[arg(long, env = "DYNAMODB_OUTAGE_HOURS", default_value_t = 3.0)]
    dynamodb_outage_hours: f64,
    /// SQS down from this day ...
    #[arg(long, env = "SQS_OUTAGE_DAY")]
    sqs_outage_day: Option<f64>,
    /// ... for this many hours.
    #[arg(long, env = "SQS_OUTAGE_HOURS", default_value_t = 3.0)]
    sqs_outage_hours: f64,
    /// The webhook route down (every delivery fails) from this day ...
    #[arg(long, env = "WEBHOOK_OUTAGE_DAY")]
    webhook_outage_day: Option<f64>,
    /// ... for this many hours (past Stripe's three days of retries: only the catch-up finds
    /// what it missed).
    #[arg(long, env = "WEBHOOK_OUTAGE_HOURS", default_value_t = 96.0)]
    webhook_outage_hours: f64,
    /// The chance a charge is disputed.
    #[arg(long, env = "DISPUTE_SHARE", default_value_t = 0.01)]
    dispute_share: f64,
    /// The days after a charge its dispute opens within, FROM,TO: 30,120 is a cardholder's
    /// window at Stripe; a shorter one lets a month's run see disputes open, close and be
    /// appealed (make sim's default: 1,20).
    #[arg(long, env = "DISPUTE_DAYS", default_value = "30,120", value_parser = day_range)]
    dispute_days: (f64, f64),
    /// The payments arrive over this many seconds from the start (a backlog: 0, all at once),
    /// not over the first third of the run.
    #[arg(long, env = "ARRIVAL_SECONDS")]
    arrival_seconds: Option<f64>,
    /// Each payment sent by a client of its own at its arrival (for loads of hundreds a
    /// second), not one after another by one producer.
    #[arg(long, env = "PARALLEL_CLIENTS")]
    parallel_clients: bool,
    /// The share of charges the merchant refunds.
    #[arg(long, env = "REFUND_SHARE", default_value_t = 0.1)]
    refund_share: f64,
    /// The share of payments carrying shoppers' text (any Unicode; a fifth of it what no
    /// door may take: U+FFFE/U+FFFF, a control character, a card number).
    #[arg(long, env = "SHOPPER_TEXT_SHARE", default_value_t = 0.05)]
    shopper_text_share: f64,
    /// The share of the provider's events an insider forges onto the events queue (a final
    /// state the provider never reached, under a new id).
    #[arg(long, env = "FORGED_EVENT_SHARE", default_value_t = 0.02)]
    forged_event_share: f64,
    /// The provider account's limit, requests a second (Stripe's live default: 100).
    #[arg(long, env = "PROVIDER_ACCOUNT_RATE", default_value_t = 100.0)]
    account_rate: f64,
    /// The share of payments sent through the payments API and its outbox relay, not
    /// straight to the queue.
    #[arg(long, env = "API_SHARE", default_value_t = 0.0)]
    api_share: f64,
    /// Print, after each seed, what docs/performance.md's Capacity table claims for this tier
    /// (100, 1000 or 10000 payments a second) beside what the run measured.
    #[arg(long, env = "CLAIMS", value_parser = ["100", "1000", "10000"])]
    claims: Option<String>,
    /// Each seed draws its own configuration from its seed where none is set here
    /// (`simulator::world::sweep`): the refund window, late refunds, the crash rate, the
    /// provider's faults, the stack's rate, nightly refunds.
    #[arg(long, env = "SWEEP")]
    sweep: bool,
    /// The share of refunds the merchant sends once more when their record expires.
    #[arg(long, env = "LATE_REFUND_SHARE")]
    late_refund_share: Option<f64>,
    /// Whether the merchant sends its refunds in a nightly batch (true) or as they come.
    #[arg(long, env = "NIGHTLY_REFUNDS")]
    nightly_refunds: Option<bool>,
    /// The share of failed debits whose customer pays again days later.
    #[arg(long, env = "REPAY_SHARE")]
    repay_share: Option<f64>,
    /// A template parameter, NAME=VALUE (repeated; PARAMETERS="A=1 B=2").
    #[arg(long = "parameter", env = "PARAMETERS", value_delimiter = ' ', value_parser = parameter)]
    parameters: Vec<(String, String)>,
}

fn parameter(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?}: a template parameter is NAME=VALUE"))
}

fn day_range(text: &str) -> Result<(f64, f64), String> {
    let bad = || format!("{text:?}: days FROM,TO (30,120), FROM at most TO");
    let (from, to) = text.split_once(',').ok_or_else(bad)?;
    let (from, to): (f64, f64) = (
        from.trim().parse().map_err(|_| bad())?,
        to.trim().parse().map_err(|_| bad())?,
    );
    (0.0 <= from && from <= to)
        .then_some((from, to))
        .ok_or_else(bad)
}

/// The command that replays `seed` as it ran.
fn replay(args: &Args, seed: u64) -> String {
    let mut vars = vec![
        format!("FIRST_SEED={seed}"),
        "SEEDS=1".into(),
        format!("DAYS={}", args.days),
        format!("PAYMENTS={}", args.payments),
    ];
    let mut put = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            vars.push(format!("{name}={v}"));
        }
    };
    put("MUTATION", args.mutation.clone());
    put("SWEEP", args.sweep.then(|| "true".into()));
    put(
        "LATE_REFUND_SHARE",
        args.late_refund_share.map(|r| r.to_string()),
    );
    put(
        "NIGHTLY_REFUNDS",
        args.nightly_refunds.map(|b| b.to_string()),
    );
    put("REPAY_SHARE", args.repay_share.map(|r| r.to_string()));
    put("DISPUTE_SHARE", Some(args.dispute_share.to_string()));
    put(
        "DISPUTE_DAYS",
        Some(format!("{},{}", args.dispute_days.0, args.dispute_days.1)),
    );
    put("CRASH_RATE", args.crash_rate.map(|r| r.to_string()));
    put("AWS_FAULT_RATE", args.aws_fault_rate.map(|r| r.to_string()));
    put(
        "PROVIDER_FAULT_RATE",
        args.provider_fault_rate.map(|r| r.to_string()),
    );
    put("FIFO", args.fifo.then(|| "true".into()));
    put(
        "PARALLEL_CLIENTS",
        args.parallel_clients.then(|| "true".into()),
    );
    put(
        "ARRIVAL_SECONDS",
        args.arrival_seconds.map(|v| v.to_string()),
    );
    put(
        "REFUND_SHARE",
        (args.refund_share != 0.1).then(|| args.refund_share.to_string()),
    );
    put(
        "SHOPPER_TEXT_SHARE",
        (args.shopper_text_share != 0.05).then(|| args.shopper_text_share.to_string()),
    );
    put(
        "FORGED_EVENT_SHARE",
        (args.forged_event_share != 0.02).then(|| args.forged_event_share.to_string()),
    );
    put(
        "PROVIDER_ACCOUNT_RATE",
        (args.account_rate != 100.0).then(|| args.account_rate.to_string()),
    );
    put(
        "API_SHARE",
        (args.api_share > 0.0).then(|| args.api_share.to_string()),
    );
    put(
        "VISIBILITY_TIMEOUT",
        args.visibility_timeout.map(|v| v.to_string()),
    );
    put(
        "MAX_RECEIVE_COUNT",
        args.max_receive_count.map(|v| v.to_string()),
    );
    for (name, day, hours) in [
        (
            "PROVIDER",
            args.provider_outage_day,
            args.provider_outage_hours,
        ),
        (
            "DYNAMODB",
            args.dynamodb_outage_day,
            args.dynamodb_outage_hours,
        ),
        ("SQS", args.sqs_outage_day, args.sqs_outage_hours),
        (
            "WEBHOOK",
            args.webhook_outage_day,
            args.webhook_outage_hours,
        ),
    ] {
        if let Some(d) = day {
            put(&format!("{name}_OUTAGE_DAY"), Some(d.to_string()));
            put(&format!("{name}_OUTAGE_HOURS"), Some(hours.to_string()));
        }
    }
    if !args.parameters.is_empty() {
        let p: Vec<String> = args
            .parameters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        put("PARAMETERS", Some(format!("'{}'", p.join(" "))));
    }
    format!("make sim {} TRACE=sim-{seed}.trace", vars.join(" "))
}

/// The options of one seed.
fn options(args: &Args, seed: u64) -> Result<Options> {
    let mut opts = Options::new(seed, args.payments, args.days);
    if let Some(r) = args.crash_rate {
        opts.crash_rate = r;
    }
    if let Some(r) = args.aws_fault_rate {
        opts.aws.error_rate = r;
        opts.aws.throttle_rate = r;
        opts.aws.lost_answer_rate = r;
        opts.aws.stall_rate = r / 4.0;
    }
    if let Some(r) = args.provider_fault_rate {
        opts.provider.error_before_rate = r;
        opts.provider.error_after_rate = r;
        opts.provider.lost_answer_rate = r;
    }
    opts.keep_trace = args.trace.is_some();
    if let Some(m) = &args.mutation {
        if !simulator::world::MUTATIONS.iter().any(|(n, _)| n == m) {
            anyhow::bail!(
                "no mutation {m}: the mutations are {:?}",
                simulator::world::MUTATIONS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
            );
        }
        opts.mutation = Some(m.clone());
    }
    opts.fifo = args.fifo;
    opts.visibility_timeout = args.visibility_timeout;
    opts.max_receive_count = args.max_receive_count;
    opts.provider_outage = args
        .provider_outage_day
        .map(|d| (d, args.provider_outage_hours));
    opts.dynamo_outage = args
        .dynamodb_outage_day
        .map(|d| (d, args.dynamodb_outage_hours));
    opts.sqs_outage = args.sqs_outage_day.map(|d| (d, args.sqs_outage_hours));
    opts.webhook_outage = args
        .webhook_outage_day
        .map(|d| (d, args.webhook_outage_hours));
    opts.parameters.extend(args.parameters.iter().cloned());
    opts.disputes = (args.dispute_share, args.dispute_days);
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.api_share),
        "API_SHARE is a share of the payments, from 0 to 1"
    );
    opts.api_share = args.api_share;
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.shopper_text_share),
        "SHOPPER_TEXT_SHARE is a share of the payments, from 0 to 1"
    );
    opts.shopper_text_share = args.shopper_text_share;
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.forged_event_share),
        "FORGED_EVENT_SHARE is a share of the events, from 0 to 1"
    );
    opts.forged_event_share = args.forged_event_share;
    if let Some(a) = args.arrival_seconds {
        anyhow::ensure!(
            a >= 0.0 && a <= args.days * 86_400.0,
            "ARRIVAL_SECONDS is within the run"
        );
        opts.arrival_days = a / 86_400.0;
    }
    // The mappings stop at DAYS; the producers send duplicates and reused ids up to two
    // hours after a payment's arrival, which would land in a queue nothing reads: a run
    // outlasts its last arrival by those two hours and ten minutes to process them.
    anyhow::ensure!(
        args.days * 86_400.0 >= opts.arrival_days * 86_400.0 + 7_800.0,
        "DAYS must outlast the last arrival by two hours and ten minutes (the producers' late duplicates, then their processing): {} days with arrivals over {:.0} s",
        args.days,
        opts.arrival_days * 86_400.0
    );
    opts.refund_share = args.refund_share;
    opts.parallel_clients = args.parallel_clients;
    opts.provider.account_rate = args.account_rate;
    if let Some(r) = args.late_refund_share {
        anyhow::ensure!(
            (0.0..=1.0).contains(&r),
            "LATE_REFUND_SHARE is a share of the refunds, from 0 to 1"
        );
        opts.late_refund_share = r;
    }
    if let Some(b) = args.nightly_refunds {
        opts.nightly_refunds = b;
    }
    if let Some(r) = args.repay_share {
        anyhow::ensure!(
            (0.0..=1.0).contains(&r),
            "REPAY_SHARE is a share of the failed debits, from 0 to 1"
        );
        opts.repay_share = r;
    }
    Ok(opts)
}

/// The threads seeds run on: one each, as many as the machine's cores (`SIM_THREADS` says
/// otherwise).
fn threads() -> usize {
    std::env::var("SIM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let seeds: Vec<u64> = (args.first..args.first + args.seeds).collect();
    let mut all = Vec::new();
    let mut drawn = std::collections::BTreeMap::new();
    for &seed in &seeds {
        let mut opts = options(&args, seed)?;
        if args.sweep {
            let explicit = simulator::world::sweep::Explicit {
                late_refunds: args.late_refund_share.is_some(),
                crash_rate: args.crash_rate.is_some(),
                provider_faults: args.provider_fault_rate.is_some(),
                nightly_refunds: args.nightly_refunds.is_some(),
                repay_share: args.repay_share.is_some(),
                queues: args.fifo
                    || args.visibility_timeout.is_some()
                    || args.max_receive_count.is_some(),
                outages: args.provider_outage_day.is_some()
                    || args.dynamodb_outage_day.is_some()
                    || args.sqs_outage_day.is_some()
                    || args.webhook_outage_day.is_some(),
            };
            drawn.insert(seed, simulator::world::sweep::draw(&mut opts, &explicit));
        }
        all.push((seed, opts));
    }
    let threads = threads().min(seeds.len()).max(1);
    let started = Instant::now();
    // Seeds are taken in order by whichever thread is free; each runs on its own thread's
    // runtime, as alone. Their lines are printed in seed order.
    let queue = std::sync::Mutex::new(all.into_iter());
    let (done, results) = std::sync::mpsc::channel();
    let mut failed = Vec::new();
    let (mut sim_days, mut core_s, mut payments) = (0.0, 0.0, 0usize);
    std::thread::scope(|scope| -> Result<()> {
        for _ in 0..threads {
            let (queue, done) = (&queue, done.clone());
            scope.spawn(move || loop {
                let Some((seed, opts)) = queue.lock().expect("seeds").next() else {
                    break;
                };
                let t0 = Instant::now();
                let report = run(opts);
                let _ = done.send((seed, report, t0.elapsed().as_secs_f64()));
            });
        }
        drop(done);
        let mut waiting = std::collections::BTreeMap::new();
        let mut next = args.first;
        for (seed, report, took) in results {
            waiting.insert(seed, (report?, took));
            while let Some((report, took)) = waiting.remove(&next) {
                let seed = next;
                next += 1;
                sim_days += report.days;
                core_s += took;
                payments += report.payments;
                println!(
                    "seed {seed}: {:.1} days, {} payments, {} charged, dead letters {:?}, {} invocations ({} cold, {} killed), {} AWS requests, provider {} ({} refused), refunds {} sent {} made ({} failed later), disputes {} ({} appealed), {} events ({} never delivered, {} through EventBridge), catch-up runs {:?} (ok, failed, killed) lag at most {} s, API {} requests ({} throttled, {} killed, {} timed out at the gateway, {} answered 202), relay {} invocations ({} records given up, {} trimmed), {} republished, {} records expired; {:.1} payments processed a second (99 % in {:.0} s), DynamoDB write units a second {:.0} (peak {}), most invocations at once {:?}, {} webhook deliveries throttled, {} events forged, the models visited {:.2} elements a request, digest {:016x}; {took:.1} s ({:.1} simulated days/s)",
                    report.days,
                    report.payments,
                    report.charged,
                    report.dead_letters,
                    report.invocations,
                    report.cold_starts,
                    report.killed,
                    report.aws_requests,
                    report.provider_requests,
                    report.provider_refused,
                    report.refunds_sent,
                    report.refunds_made,
                    report.refunds_failed,
                    report.disputes,
                    report.disputes_appealed,
                    report.events,
                    report.events_undelivered,
                    report.events_bridged,
                    report.catch_up_runs,
                    report.catch_up_worst_lag_s,
                    report.api_requests,
                    report.api_throttled,
                    report.api_killed,
                    report.api_gateway_timeouts,
                    report.api_accepted,
                    report.relay_invocations,
                    report.relay_given_up,
                    report.relay_trimmed,
                    report.republished,
                    report.expired_records,
                    report.charged_per_second,
                    report.charging_span_s,
                    report.write_units_mean,
                    report.write_units_peak,
                    report.peak_concurrency,
                    report.events_throttled,
                    report.events_forged,
                    report.model_visits as f64
                        / (report.aws_requests + report.provider_requests).max(1) as f64,
                    report.digest,
                    report.days / took.max(1e-9),
                );
                if let Some(d) = drawn.get(&seed).filter(|d| !d.is_empty()) {
                    println!("  drawn: {d}");
                }
                if let Some(tier) = &args.claims {
                    println!(
                        "  docs/performance.md's Capacity, the {tier} payments a second tier:"
                    );
                    for line in simulator::world::claims(
                        tier,
                        &args.parameters,
                        args.arrival_seconds,
                        &report,
                    ) {
                        println!("{line}");
                    }
                }
                if let Some(path) = &args.trace {
                    std::fs::write(path, report.trace.join("\n"))?;
                }
                if !report.violations.is_empty() {
                    for v in &report.violations {
                        println!(
                            "  VIOLATED {} at {:.3} days: {}",
                            v.invariant,
                            v.at_ms as f64 / 86_400_000.0,
                            v.detail
                        );
                    }
                    println!("  last events:");
                    for line in report.trace.iter().rev().take(20).rev() {
                        println!("    {line}");
                    }
                    println!("  replay: {}", replay(&args, seed));
                    failed.push(seed);
                }
            }
        }
        Ok(())
    })?;
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{} seeds, {} failed {:?}; {sim_days:.0} simulated days in {wall:.1} s on {threads} threads ({:.1} days/s): {:.2} seeds per core-minute, {:.0} payments simulated per core-second, {:.0} simulated seconds per real second",
        args.seeds,
        failed.len(),
        failed,
        sim_days / wall.max(1e-9),
        args.seeds as f64 / (core_s / 60.0).max(1e-9),
        payments as f64 / core_s.max(1e-9),
        sim_days * 86_400.0 / wall.max(1e-9),
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
