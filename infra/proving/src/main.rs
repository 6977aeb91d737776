//! `proving`: the project's proving ground, as the Makefile runs it: the local end-to-end run
//! (`make demo`), the chaos checker (`make chaos`), the benchmark (`make bench`) and the check
//! of a deployed stack (`make e2e-sam`). None of it ships to users: the operator's tool is
//! `payctl`.
//!
//! Why ~500 lines: one section a command, each its options and the few lines that hand them to
//! the library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use proving::demo;

#[derive(Parser)]
#[command(
    name = "proving",
    about = "The project's proving ground: demo, chaos, bench, the deployed stack's check"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The local end-to-end run: provision, fault injection, mixed load, drain, verify.
    Demo(DemoArgs),
    /// The chaos checker: several processor processes crashing at random failpoints against a
    /// faulty provider; exits non-zero on any double charge, loss or stuck record.
    Chaos(ChaosArgs),
    /// The benchmark: throughput, latency, calls per payment, CPU and memory, cold start, size.
    Bench(BenchArgs),
    /// Send payments to a deployed stack and verify what its own event-source mapping and
    /// bootstrap made of them (make e2e-sam).
    E2eCheck(E2eCheckArgs),
    /// Flood the public events route with worst-case forged requests while a genuine signed
    /// delivery arrives every second; exits non-zero unless each is answered 200 in time.
    WebhookFlood(WebhookFloodArgs),
    /// What one request costs the public events route, genuine and forged (make bench's rows).
    WebhookCost {
        /// Requests of each kind.
        #[arg(long, default_value_t = 200)]
        runs: usize,
    },
    /// The whole stack's cost of a million payments, from a bench's results and the template.
    StackCost {
        #[arg(
            long,
            default_value = "bench/results/results.json",
            help = "The bench's results"
        )]
        results: std::path::PathBuf,
        #[arg(long, default_value = "template.yaml", help = "The SAM template")]
        template: std::path::PathBuf,
    },
}

/// The options of `proving webhook-flood`.
#[derive(Args)]
pub struct WebhookFloodArgs {
    /// How long the forgeries are sent, seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Concurrent clients sending forgeries back to back.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Each genuine delivery must be answered 200 within this, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub deadline_ms: u64,
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Cli::parse()).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<()> {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    match cli.command {
        Command::Demo(args) => demo(args, &sdk).await,
        Command::Chaos(args) => chaos(args, &sdk).await,
        Command::Bench(args) => bench(args, &sdk).await,
        Command::E2eCheck(args) => e2e_check(args, &sdk).await,
        Command::WebhookFlood(a) => {
            proving::webhook::flood_command(a.seconds, a.clients, a.deadline_ms).await
        }
        Command::StackCost { results, template } => {
            let table = proving::compare::stack_cost::table_from_files(&results, &template)?;
            print!("{table}");
            Ok(())
        }
        Command::WebhookCost { runs } => {
            let costs = proving::webhook::costs(runs).await?;
            print!("{}", proving::webhook::markdown(&costs));
            Ok(())
        }
    }
}

/// The options of `proving demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// The SAM template the resources come from.
    #[arg(long, default_value = "template.yaml")]
    pub template: PathBuf,
    /// Unique payments in the load (copies, reused keys and bad bodies come on top).
    #[arg(long, default_value_t = 250)]
    pub payments: usize,
    /// Seed of the load and of the fault dice.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Concurrent pollers, each running one batch at a time.
    #[arg(long, default_value_t = 2)]
    pub pollers: usize,
    /// Probability of each provider fault per call.
    #[arg(long, default_value_t = 0.05)]
    pub fault_rate: f64,
    /// Send raw messages straight into the queue instead of through the payments API.
    #[arg(long)]
    pub direct: bool,
    /// Where the run's traces go: a local OTLP receiver writes every span there, one JSON
    /// object a line (OpenTelemetry; docs/operate.md, "Traces").
    #[arg(long, default_value = ".local/run/traces.jsonl")]
    pub traces: PathBuf,
}

/// Runs `proving demo`.
pub async fn demo(args: DemoArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let DemoArgs {
        template,
        payments,
        seed,
        pollers,
        fault_rate,
        direct,
        traces,
    } = args;
    // The run's spans go to a receiver of its own, as a function's go to a collector.
    let receiver = proving::otlp::export_this_process(&traces, "demo").await?;
    let verdict = demo::run(
        sdk,
        &demo::DemoOptions {
            template,
            payments,
            seed,
            pollers,
            fault_rate,
            direct,
        },
    )
    .await?;
    let flushed = tokio::task::spawn_blocking(payment_core::telemetry::traces::shutdown);
    flushed.await?;
    for line in proving::otlp::summary(&receiver.spans(), &traces) {
        println!("{line}");
    }
    if !verdict.violations.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// The options of `proving chaos`.
#[derive(Args)]
pub struct ChaosArgs {
    /// The SAM template the resources come from.
    #[arg(long, default_value = "template.yaml")]
    pub template: PathBuf,
    /// Unique payments in the load (copies, reused keys and bad bodies come on top).
    #[arg(long, default_value_t = 300)]
    pub payments: usize,
    /// Seed of the load and of the fault dice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Processor processes running at once.
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    /// Crash rate: each process crashes at one seeded failpoint after ~1/rate passes.
    #[arg(long, default_value_t = 0.02)]
    pub crash_rate: f64,
    /// Probability of each provider fault per call.
    #[arg(long, default_value_t = 0.05)]
    pub fault_rate: f64,
    /// Probability of an AWS fault per AWS call of the processors (throttled, 500,
    /// stalled, answer lost after the call took effect), through a fault proxy.
    #[arg(long, default_value_t = 0.0)]
    pub aws_faults: f64,
    /// Most messages queued at once.
    #[arg(long, default_value_t = 300)]
    pub max_depth: i64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3000)]
    pub max_seconds: u64,
}

/// Runs `proving chaos`.
pub async fn chaos(args: ChaosArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let ChaosArgs {
        template,
        payments,
        seed,
        instances,
        crash_rate,
        fault_rate,
        aws_faults,
        max_depth,
        max_seconds,
    } = args;
    let report = proving::chaos::run(
        sdk,
        &proving::chaos::ChaosOptions {
            template,
            payments,
            seed,
            instances,
            crash_rate,
            fault_rate,
            aws_fault_rate: aws_faults,
            max_depth,
            max_duration: Duration::from_secs(max_seconds),
            exe: payctl_beside_me()?,
        },
    )
    .await?;
    if !report.verdict.violations.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// The options of `proving bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The SAM template the stacks are provisioned from.
    #[arg(long, default_value = "template.yaml")]
    pub template: PathBuf,
    /// Backlog size (10 % duplicates on top).
    #[arg(long, default_value_t = 2000)]
    pub payments: usize,
    /// Concurrent batches of the multi-batch run.
    #[arg(long, default_value_t = 4)]
    pub pollers: usize,
    /// Cold starts measured (the median is reported).
    #[arg(long, default_value_t = 20)]
    pub cold_start_runs: usize,
    /// The provider's answer time in the realistic runs, P50_MS,P99_MS of a log-normal
    /// (Stripe-like by default).
    #[arg(long, default_value = "350,1500", value_parser = parse_latency)]
    pub latency: (f64, f64),
    /// Backlog drained by one process at that latency (10 % duplicates on top).
    #[arg(long, default_value_t = 200)]
    pub latency_payments: usize,
    /// Payments of the open-loop load at that latency.
    #[arg(long, default_value_t = 120)]
    pub open_loop_payments: usize,
    /// The open-loop load's arrival rate, payments per second.
    #[arg(long, default_value_t = 4.0)]
    pub open_loop_rate: f64,
    /// The payments queue's visibility timeout in the retry rows, seconds (default: the
    /// template's).
    #[arg(long)]
    pub retry_visibility_timeout: Option<i32>,
    /// Backlog drained against the provider limited to 25, 100 and 300 requests a second
    /// (sandbox, live mode, raised limits), with the merchant's own traffic beside it (no
    /// duplicates).
    #[arg(long, default_value_t = 2000)]
    pub rate_payments: usize,
    /// Only the provider-rate rows (written to provider-rate.json and .md beside the results).
    #[arg(long)]
    pub only_rate: bool,
    /// The accounts of the provider-rate rows (repeatable: sandbox, live, raised; default all).
    #[arg(long = "rate-account")]
    pub rate_accounts: Vec<String>,
    /// ARCH=PATH of a release bootstrap (repeatable).
    #[arg(long = "bootstrap")]
    pub bootstraps: Vec<String>,
    /// The local stack measured against, named in the results (name and version).
    #[arg(long, env = "BENCH_EMULATOR", default_value = "an unnamed endpoint")]
    pub emulator: String,
    /// Where results.json, results.md and the PNG go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Where the function processes' logs go.
    #[arg(long, default_value = ".local/run")]
    pub logs: PathBuf,
    /// The Powertools peer's bootstrap (infra/peer/bootstrap): the runs alternate with it
    /// and the results compare the two.
    #[arg(long, requires = "peer_python")]
    pub peer_bootstrap: Option<PathBuf>,
    /// The Python of the peer's virtualenv.
    #[arg(long, requires = "peer_bootstrap")]
    pub peer_python: Option<PathBuf>,
    /// The peer's name and versions, named in the results.
    #[arg(
        long,
        env = "BENCH_PEER",
        default_value = "Powertools for AWS Lambda (Python)"
    )]
    pub peer_description: String,
}

/// `P50_MS,P99_MS`: a log-normal answer time the simulator can draw (p99 ≥ p50 ≥ 0).
fn parse_latency(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: give P50_MS,P99_MS"))?;
    let (p50, p99): (f64, f64) = (
        a.trim().parse().map_err(|e| format!("{a:?}: {e}"))?,
        b.trim().parse().map_err(|e| format!("{b:?}: {e}"))?,
    );
    if !(p50 >= 0.0 && p99 >= p50) {
        return Err(format!("{s:?}: p99 must be at least p50, both at least 0"));
    }
    Ok((p50, p99))
}

/// Runs `proving bench`.
pub async fn bench(args: BenchArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let BenchArgs {
        template,
        payments,
        pollers,
        cold_start_runs,
        latency,
        latency_payments,
        open_loop_payments,
        open_loop_rate,
        retry_visibility_timeout,
        rate_payments,
        only_rate,
        rate_accounts,
        bootstraps,
        emulator,
        out,
        logs,
        peer_bootstrap,
        peer_python,
        peer_description,
    } = args;
    let bootstraps = bootstraps
        .iter()
        .map(|b| {
            b.split_once('=')
                .map(|(a, p)| (a.to_owned(), PathBuf::from(p)))
                .context("--bootstrap takes ARCH=PATH")
        })
        .collect::<Result<Vec<_>>>()?;
    proving::bench::run(
        sdk,
        &proving::bench::BenchOptions {
            template,
            payments,
            pollers,
            cold_start_runs,
            bootstraps,
            emulator,
            out_dir: out,
            log_dir: logs,
            latency,
            latency_payments,
            open_loop_payments,
            open_loop_rate,
            retry_visibility_timeout,
            rate_payments,
            only_rate,
            rate_accounts,
            traces_endpoint: None,
            peer: peer_bootstrap.zip(peer_python).map(|(bootstrap, python)| {
                proving::compare::PeerOptions {
                    bootstrap,
                    python,
                    description: peer_description,
                }
            }),
        },
    )
    .await?;
    Ok(())
}

/// The options of `proving e2e-check`.
#[derive(Args)]
pub struct E2eCheckArgs {
    /// The payments queue (the stack's PaymentsQueueUrl output).
    #[arg(long)]
    pub queue_url: String,
    /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
    #[arg(long)]
    pub dlq_url: String,
    /// The idempotency table (the stack's IdempotencyTableName output).
    #[arg(long)]
    pub table: String,
    /// The provider simulator the deployed function calls.
    #[arg(long, env = "PROVIDER_API_URL")]
    pub sim_url: String,
    /// Prefix of this run's payment ids.
    #[arg(long, default_value = "e2e")]
    pub prefix: String,
    /// The deployed payments API: send the load through it (default: straight to the queue).
    #[arg(long)]
    pub api_url: Option<String>,
    /// The deployed refunds queue (the stack's RefundsQueueUrl output): refunds of what was
    /// charged are sent there and checked too.
    #[arg(long, requires = "refunds_dlq_url")]
    pub refunds_queue_url: Option<String>,
    /// The refunds' dead-letter queue (the stack's RefundsDeadLetterQueueUrl output).
    #[arg(long, requires = "refunds_queue_url")]
    pub refunds_dlq_url: Option<String>,
    /// The deployed provider-events endpoint (the stack's ProviderEventsUrl output): the
    /// simulator delivers its events there, and a scenario of payments the provider finishes
    /// later is checked settled through them. Needs the refunds queue too.
    #[arg(long, requires_all = ["events_dlq_url", "refunds_queue_url"], conflicts_with = "events_bus")]
    pub events_url: Option<String>,
    /// The endpoint's signing secret, for a simulator told where to deliver; without it the
    /// endpoint must be registered at the simulator already (`payctl connect`), which then
    /// delivers with the secret it issued.
    #[arg(long, requires = "events_url")]
    pub events_secret: Option<String>,
    /// Instead of the endpoint: the deployed partner event bus (the stack's StripeEventBusName
    /// output, ProviderEventsDelivery=eventbridge); the simulator's events are published on it
    /// as Stripe's EventBridge destination does, under --events-source.
    #[arg(long, requires_all = ["events_source", "events_dlq_url", "refunds_queue_url"])]
    pub events_bus: Option<String>,
    /// The partner event source the bus is on (the stack's StripeEventSourceName).
    #[arg(long, requires = "events_bus")]
    pub events_source: Option<String>,
    /// The provider events' dead-letter queue (the stack's ProviderEventsDeadLetterQueueUrl).
    #[arg(long)]
    pub events_dlq_url: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub max_seconds: u64,
}

/// Runs `proving e2e-check`.
pub async fn e2e_check(args: E2eCheckArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let E2eCheckArgs {
        queue_url,
        dlq_url,
        table,
        sim_url,
        prefix,
        api_url,
        refunds_queue_url,
        refunds_dlq_url,
        events_url,
        events_secret,
        events_bus,
        events_source,
        events_dlq_url,
        max_seconds,
    } = args;
    let delivery = match (events_url, events_bus) {
        (Some(url), _) => Some(proving::e2e::Delivery::Webhook {
            url,
            secret: events_secret,
        }),
        (None, Some(bus)) => Some(proving::e2e::Delivery::EventBridge {
            bus,
            source: events_source.unwrap_or_default(),
        }),
        (None, None) => None,
    };
    let verdict = proving::e2e::run(
        sdk,
        &proving::e2e::E2eOptions {
            queue_url,
            dlq_url,
            table,
            sim_url,
            prefix,
            max_duration: Duration::from_secs(max_seconds),
            api_url,
            refunds: refunds_queue_url.zip(refunds_dlq_url),
            events: delivery.map(|delivery| proving::e2e::E2eEvents {
                delivery,
                dlq_url: events_dlq_url.unwrap_or_default(),
            }),
        },
    )
    .await?;
    if !verdict.violations.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// The `payctl` binary of the same build (the chaos checker's processes are `payctl run`).
fn payctl_beside_me() -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .context("locating proving")?
        .with_file_name(format!("payctl{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        exe.is_file(),
        "{} is missing: build it with the same profile (cargo build --bin payctl)",
        exe.display()
    );
    Ok(exe)
}
