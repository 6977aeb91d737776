//! `payctl`: operate the payment processor locally or against AWS.
//!
//! Why one file of ~1,200 lines: clap's derive keeps every command's options, with their
//! `--help` text, in one enum (~460 lines), and each command's arm is a few calls into
//! `payment-infra`; the arms read as the command reference.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use payment_core::config::Config;
use payment_infra::{demo, esm, load, template};

#[derive(Parser)]
#[command(
    name = "payctl",
    version,
    about = "Send, process and inspect payments; provision and demo the local stack"
)]
struct Cli {
    /// AWS region (default: AWS_REGION, then the profile's).
    #[arg(long, global = true)]
    region: Option<String>,
    /// Named profile of ~/.aws/config and ~/.aws/credentials (default: AWS_PROFILE).
    #[arg(long, global = true)]
    profile: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// The processors `payctl run` can run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WorkKind {
    /// The payment processor (charges).
    Payments,
    /// The refund processor.
    Refunds,
}

impl WorkKind {
    /// The queue and dead-letter queue variables of this processor.
    fn vars(self) -> (&'static str, &'static str) {
        match self {
            WorkKind::Payments => ("PAYMENTS_QUEUE_URL", "DEAD_LETTER_QUEUE_URL"),
            WorkKind::Refunds => ("REFUNDS_QUEUE_URL", "REFUNDS_DEAD_LETTER_QUEUE_URL"),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Create the template's queues and tables on the endpoint (AWS_ENDPOINT_URL), or find and
    /// update them when they exist (safe to run again), and print them.
    Provision {
        /// The SAM template to read.
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        /// Prefix of every resource name.
        #[arg(long)]
        stack_name: String,
        /// Override the source queue's visibility timeout (seconds).
        #[arg(long)]
        visibility_timeout: Option<i32>,
        /// Template parameter, NAME=VALUE (repeatable).
        #[arg(long = "param")]
        params: Vec<String>,
        /// Allow creating resources in a real AWS account (no AWS_ENDPOINT_URL set). On AWS,
        /// deploy the stack with sam deploy instead.
        #[arg(long)]
        yes_real_aws: bool,
    },
    /// Print `export` lines for a second shell: the endpoint, credentials and provider of this
    /// one, and a local stack's tables and queues (provisioned if missing).
    Env {
        /// The SAM template the resources come from.
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        /// The stack's name (as given to provision).
        #[arg(long)]
        stack_name: String,
    },
    /// Send payments: one JSON body, a JSONL file (- for stdin), or generated valid payments.
    Send {
        /// The payments queue (the stack's PaymentsQueueUrl output).
        #[arg(long, env = "PAYMENTS_QUEUE_URL")]
        queue_url: String,
        /// One message body.
        #[arg(long, conflicts_with_all = ["file", "generate"])]
        body: Option<String>,
        /// A file with one body per line.
        #[arg(long, conflicts_with = "generate")]
        file: Option<PathBuf>,
        /// Generate this many valid payments.
        #[arg(long)]
        generate: Option<usize>,
        /// Payment id prefix of generated payments.
        #[arg(long, default_value = "pay")]
        prefix: String,
    },
    /// Send refunds of charged payments: one JSON body, or one refund built from the options.
    SendRefund {
        /// The refunds queue (the stack's RefundsQueueUrl output).
        #[arg(long, env = "REFUNDS_QUEUE_URL")]
        queue_url: String,
        /// One message body: {"refund_id", "payment_id", "amount"?, "reason"?}.
        #[arg(long, conflicts_with_all = ["payment_id", "refund_id", "amount", "reason"])]
        body: Option<String>,
        /// The payment to refund.
        #[arg(long, requires = "refund_id")]
        payment_id: Option<String>,
        /// The refund's id: its idempotency key (send it again to retry the same refund).
        #[arg(long)]
        refund_id: Option<String>,
        /// Minor units (default: what is left of the charge).
        #[arg(long)]
        amount: Option<i64>,
        /// duplicate, fraudulent or requested_by_customer.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Poll a queue like Lambda's SQS trigger and run a processor (configured from the
    /// function's environment variables) on each batch.
    Run {
        /// What to process: payments (default) or refunds.
        #[arg(long, value_enum, default_value_t = WorkKind::Payments)]
        work: WorkKind,
        /// The source queue (default: PAYMENTS_QUEUE_URL, or REFUNDS_QUEUE_URL with --work refunds).
        #[arg(long)]
        queue_url: Option<String>,
        /// The dead-letter queue (default: DEAD_LETTER_QUEUE_URL, or REFUNDS_DEAD_LETTER_QUEUE_URL
        /// with --work refunds).
        #[arg(long)]
        dead_letter_queue_url: Option<String>,
        /// Messages per invocation (Lambda's SQS trigger takes up to 10 per receive).
        #[arg(long, default_value_t = 10)]
        batch_size: i32,
        /// Batching window, seconds.
        #[arg(long, default_value_t = 0.0)]
        batching_window: f64,
        /// Visibility timeout of received messages, seconds (default: the queue's).
        #[arg(long)]
        visibility_timeout: Option<i32>,
        /// Function timeout, seconds: each invocation's deadline.
        #[arg(long, default_value_t = 60)]
        function_timeout: u64,
        /// Concurrent pollers, each running one batch at a time.
        #[arg(long, default_value_t = 1)]
        pollers: usize,
        /// Stop once the queue is drained.
        #[arg(long)]
        until_empty: bool,
        /// Fail if not drained within this many seconds.
        #[arg(long, default_value_t = 3600)]
        max_seconds: u64,
        /// Print a progress line every few seconds (the default on a terminal).
        #[arg(long)]
        progress: bool,
        /// Print the summary as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Send payments to a deployed stack and verify what its own event-source mapping and
    /// bootstrap made of them (make e2e-sam).
    E2eCheck {
        /// The payments queue (the stack's PaymentsQueueUrl output).
        #[arg(long)]
        queue_url: String,
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long)]
        dlq_url: String,
        /// The idempotency table (the stack's IdempotencyTableName output).
        #[arg(long)]
        table: String,
        /// The provider simulator the deployed function calls.
        #[arg(long, env = "PAYMENT_API_URL")]
        sim_url: String,
        /// Prefix of this run's payment ids.
        #[arg(long, default_value = "e2e")]
        prefix: String,
        /// The deployed payments API: send the load through it (default: straight to the queue).
        #[arg(long)]
        api_url: Option<String>,
        /// The deployed refunds queue (the stack's RefundsQueueUrl output): refunds of what was
        /// charged are sent there and checked too.
        #[arg(long, requires = "refunds_dlq_url")]
        refunds_queue_url: Option<String>,
        /// The refunds' dead-letter queue (the stack's RefundsDeadLetterQueueUrl output).
        #[arg(long, requires = "refunds_queue_url")]
        refunds_dlq_url: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        max_seconds: u64,
    },
    /// The benchmark: throughput, latency, calls per payment, CPU and memory, cold start, size.
    Bench {
        /// The SAM template the stacks are provisioned from.
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        /// Backlog size (10 % duplicates on top).
        #[arg(long, default_value_t = 2000)]
        payments: usize,
        /// Concurrent batches of the multi-batch run.
        #[arg(long, default_value_t = 4)]
        pollers: usize,
        /// Cold starts measured (the median is reported).
        #[arg(long, default_value_t = 20)]
        cold_start_runs: usize,
        /// ARCH=PATH of a release bootstrap (repeatable).
        #[arg(long = "bootstrap")]
        bootstraps: Vec<String>,
        /// The local stack measured against, named in the results (name and version).
        #[arg(long, env = "BENCH_EMULATOR", default_value = "an unnamed endpoint")]
        emulator: String,
        /// Where results.json, results.md and the PNG go.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Where the function processes' logs go.
        #[arg(long, default_value = ".local/run")]
        logs: PathBuf,
        /// The Powertools peer's bootstrap (infra/peer/bootstrap): the runs alternate with it
        /// and the results compare the two.
        #[arg(long, requires = "peer_python")]
        peer_bootstrap: Option<PathBuf>,
        /// The Python of the peer's virtualenv.
        #[arg(long, requires = "peer_bootstrap")]
        peer_python: Option<PathBuf>,
        /// The peer's name and versions, named in the results.
        #[arg(
            long,
            env = "BENCH_PEER",
            default_value = "Powertools for AWS Lambda (Python)"
        )]
        peer_description: String,
    },
    /// The dead-letter queue: list, redrive.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Check that the AWS endpoint (AWS_ENDPOINT_URL, or AWS itself) keeps what the protocol
    /// relies on: atomic conditional writes under concurrency, ALL_OLD on a refused write,
    /// consistent reads, visibility changes, receive counts, redrive, FIFO group blocking.
    /// Exits non-zero naming each failed check.
    Conformance,
    /// Settle unknown or stuck payments from what the provider holds: a charge found completes
    /// the record; nothing found is reported with whether the provider still remembers the key.
    /// Never charges. Needs PAYMENT_API_URL and the API key like the function.
    Reconcile {
        /// The payment to settle.
        #[arg(
            required_unless_present = "all_unknown",
            conflicts_with = "all_unknown"
        )]
        /// The payment's id (its Idempotency-Key).
        payment_id: Option<String>,
        /// Every record that is marked unknown, FAILED, or IN_PROGRESS past its lease.
        #[arg(long)]
        all_unknown: bool,
        /// The idempotency table (the stack's IdempotencyTableName output).
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        table: String,
        /// The provider's base URL (as the function's PAYMENT_API_URL).
        #[arg(long, env = "PAYMENT_API_URL")]
        payment_api_url: String,
        /// The provider key's secret (or PAYMENT_API_KEY for local use).
        #[arg(long, env = "PAYMENT_API_KEY_SECRET_ARN")]
        payment_api_key_secret_arn: Option<String>,
        /// How long the provider remembers an idempotency key, seconds.
        #[arg(long, env = "PROVIDER_KEY_RETENTION_SECONDS", default_value_t = 86_400)]
        key_retention_seconds: u64,
        /// How far the provider's search may lag its charges, seconds.
        #[arg(long, env = "PROVIDER_SEARCH_LAG_SECONDS", default_value_t = 60)]
        search_lag_seconds: u64,
        /// The Stripe-Version header of the lookups.
        #[arg(long, env = "STRIPE_API_VERSION", default_value = payment_core::stripe::DEFAULT_API_VERSION)]
        stripe_api_version: String,
    },
    /// Create a payment through the payments API (POST /v1/payments, SigV4-signed). Prints the
    /// API's answer; safe to run again with the same --idempotency-key.
    Pay {
        /// The API's base URL (the stack's PaymentsApiUrl output).
        #[arg(long, env = "PAYMENTS_API_URL")]
        api_url: String,
        /// Minor units (1999 is 19.99 USD).
        #[arg(long)]
        amount: i64,
        /// ISO 4217 code.
        #[arg(long)]
        currency: String,
        /// The provider's customer id.
        #[arg(long)]
        customer: String,
        /// A provider payment method id (never a card number).
        #[arg(long, default_value = "pm_card_visa")]
        payment_method: String,
        /// Free text shown on the provider's dashboard.
        #[arg(long)]
        description: Option<String>,
        /// The payment's id end to end; a random one when not given (printed).
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Check the provider account with the processors' own client: a customer, three charges
    /// with one key (one PaymentIntent), a refund, all read back. Test-mode keys only.
    Smoke {
        /// The environment variable that holds the test-mode secret key (sk_test_...).
        #[arg(long, default_value = "STRIPE_TEST_KEY")]
        stripe_key_env: String,
        /// The provider's base URL.
        #[arg(
            long,
            env = "PAYMENT_API_URL",
            default_value = "https://api.stripe.com"
        )]
        payment_api_url: String,
        /// The Stripe-Version header of every request.
        #[arg(long, env = "STRIPE_API_VERSION", default_value = payment_core::stripe::DEFAULT_API_VERSION)]
        stripe_api_version: String,
        /// Names the run's customer, payment and refund (default: smoke-<epoch ms>).
        #[arg(long)]
        run_id: Option<String>,
    },
    /// Read a payment through the payments API (GET /v1/payments/{id}).
    Get {
        /// The payment's id (its Idempotency-Key).
        payment_id: String,
        /// The payments API's base URL (the stack's PaymentsApiUrl output).
        #[arg(long, env = "PAYMENTS_API_URL")]
        api_url: String,
    },
    /// Serve the payments API locally (the same code as the payments-api Lambda).
    Api {
        #[command(subcommand)]
        command: ApiCommand,
    },
    /// Relay the payments table's outbox stream to the payments queue, as the outbox-relay
    /// Lambda's stream trigger does (local runs).
    Relay {
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// The payments queue (the stack's PaymentsQueueUrl output).
        #[arg(long, env = "PAYMENTS_QUEUE_URL")]
        queue_url: String,
        /// On a FIFO queue: message groups per customer or per payment.
        #[arg(long, env = "FIFO_GROUP_BY", default_value = "customer")]
        group_by: String,
    },
    /// Outbox entries the relay has not published (after RelayFailuresAlarm), and sending them
    /// again.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Print a payment's idempotency record (times in UTC) and its dead letter, if it has one.
    Status {
        /// The payment's id (its Idempotency-Key).
        payment_id: String,
        /// The idempotency table (the stack's IdempotencyTableName output).
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        table: String,
        /// The whole record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What happened to a payment, in time order, from its record and dead letter.
    History {
        /// The payment's id (its Idempotency-Key).
        payment_id: String,
        /// The idempotency table (the stack's IdempotencyTableName output).
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        table: String,
    },
    /// The chaos checker: several processor processes crashing at random failpoints against a
    /// faulty provider; exits non-zero on any double charge, loss or stuck record.
    Chaos {
        /// The SAM template the resources come from.
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        /// Unique payments in the load (copies, reused keys and bad bodies come on top).
        #[arg(long, default_value_t = 300)]
        payments: usize,
        /// Seed of the load and of the fault dice.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Processor processes running at once.
        #[arg(long, default_value_t = 3)]
        instances: usize,
        /// Crash rate: each process crashes at one seeded failpoint after ~1/rate passes.
        #[arg(long, default_value_t = 0.02)]
        crash_rate: f64,
        /// Probability of each provider fault per call.
        #[arg(long, default_value_t = 0.05)]
        fault_rate: f64,
        /// Probability of an AWS fault per AWS call of the processors (throttled, 500,
        /// stalled, answer lost after the call took effect), through a fault proxy.
        #[arg(long, default_value_t = 0.0)]
        aws_faults: f64,
        /// Most messages queued at once.
        #[arg(long, default_value_t = 300)]
        max_depth: i64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3000)]
        max_seconds: u64,
    },
    /// The local end-to-end run: provision, fault injection, mixed load, drain, verify.
    Demo {
        /// The SAM template the resources come from.
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        /// Unique payments in the load (copies, reused keys and bad bodies come on top).
        #[arg(long, default_value_t = 250)]
        payments: usize,
        /// Seed of the load and of the fault dice.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Concurrent pollers, each running one batch at a time.
        #[arg(long, default_value_t = 2)]
        pollers: usize,
        /// Probability of each provider fault per call.
        #[arg(long, default_value_t = 0.05)]
        fault_rate: f64,
        /// Send raw messages straight into the queue instead of through the payments API.
        #[arg(long)]
        direct: bool,
    },
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// List unpublished outbox entries older than --older-than seconds.
    Pending {
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// Leave younger entries to the live relay.
        #[arg(long, default_value_t = 60)]
        older_than: u64,
    },
    /// Send unpublished outbox entries older than --older-than seconds to the payments queue
    /// and mark them published (safe to repeat: the processor absorbs copies).
    Republish {
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// The payments queue (the stack's PaymentsQueueUrl output).
        #[arg(long, env = "PAYMENTS_QUEUE_URL")]
        queue_url: String,
        /// On a FIFO queue: message groups per customer or per payment.
        #[arg(long, env = "FIFO_GROUP_BY", default_value = "customer")]
        group_by: String,
        /// Leave entries younger than this many seconds to the live relay.
        #[arg(long, default_value_t = 60)]
        older_than: u64,
    },
}

#[derive(Subcommand)]
enum ApiCommand {
    /// Serve POST/GET /v1/payments on a local address until stopped.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        address: String,
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// The processor's idempotency table, read for GET's status.
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        idempotency_table: String,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// List dead letters, one JSON line each: error_code, error_message, payment_id,
    /// source_message_id, first_sent_at, age, receive count (as SQS counts it), every attribute
    /// and the body.
    List {
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
        dlq_url: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Show one dead letter, by its message id or its source_message_id.
    Show {
        /// The dead letter's message id, or its source_message_id.
        id: String,
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
        dlq_url: String,
    },
    /// Move dead letters back to the source queue (after fixing the cause).
    Redrive {
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
        dlq_url: String,
        /// The queue to move them back to (default: the one queue whose redrive policy names
        /// this DLQ, asked of SQS); refused unless its redrive policy names this DLQ.
        #[arg(long)]
        queue_url: Option<String>,
        /// Only this error_code (max_receives: moved by SQS after maxReceiveCount).
        #[arg(long)]
        error_code: Option<String>,
        /// At most this many messages.
        #[arg(long)]
        max: Option<usize>,
        /// Move the codes that are never redriven too (invalid_json, invalid_payment,
        /// idempotency_key_reused, provider_rejected, request_expired).
        #[arg(long)]
        force: bool,
    },
}

#[tokio::main]
async fn main() {
    // One line, the cause chain included, never a backtrace: what an operator reads.
    if let Err(e) = run(Cli::parse()).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<()> {
    // FAILPOINTS=name=action;... (debug builds with the failpoints feature only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    if matches!(
        cli.command,
        Command::Run { .. } | Command::Api { .. } | Command::Relay { .. }
    ) {
        payment_core::telemetry::init_timed();
    }
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = cli.region.clone() {
        loader = loader.region(aws_config::Region::new(region));
    }
    if let Some(profile) = cli.profile.clone() {
        loader = loader.profile_name(profile);
    }
    let sdk = loader.load().await;
    match cli.command {
        Command::Provision {
            template,
            stack_name,
            visibility_timeout,
            params,
            yes_real_aws,
        } => {
            let local =
                std::env::var("AWS_ENDPOINT_URL").is_ok_and(|u| !u.contains("amazonaws.com"));
            if !local && !yes_real_aws {
                bail!(
                    "provision would create queues and tables in the AWS account of your credentials ({}): set AWS_ENDPOINT_URL for a local emulator, deploy to AWS with sam deploy, or pass --yes-real-aws",
                    payment_infra::operate::endpoint(&sdk)
                );
            }
            let mut parameters = std::collections::HashMap::new();
            for p in params {
                let (k, v) = p.split_once('=').context("--param takes NAME=VALUE")?;
                parameters.insert(k.to_owned(), v.to_owned());
            }
            let stack = template::provision(
                &sdk,
                &template,
                &template::ProvisionOptions {
                    stack_name,
                    parameters,
                    visibility_timeout,
                    max_receive_count: None,
                    fifo: false,
                },
            )
            .await?;
            for (resource, done) in &stack.report {
                eprintln!("{done:<8} {resource}");
            }
            // A local run takes the provider from its own environment, not the template's default.
            let mut function_env = stack.function_env.clone();
            for var in ["PAYMENT_API_URL", "PAYMENT_API_KEY_SECRET_ARN"] {
                match std::env::var(var) {
                    Ok(v) if local => {
                        function_env.insert(var.to_owned(), v);
                    }
                    _ if local => {
                        function_env.remove(var);
                    }
                    _ => {}
                }
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "queues": stack.queues, "tables": stack.tables, "function_env": function_env,
                    "event_source": {"queue_url": stack.event_source.queue_url, "batch_size": stack.event_source.batch_size,
                        "batching_window_seconds": stack.event_source.batching_window_seconds,
                        "function_timeout_seconds": stack.event_source.function_timeout_seconds},
                }))?
            );
        }
        Command::Env {
            template,
            stack_name,
        } => {
            if std::env::var("AWS_ENDPOINT_URL").is_err() {
                bail!("payctl env is for a local stack: set AWS_ENDPOINT_URL (source .local/env), or read a deployed stack's outputs with aws cloudformation describe-stacks");
            }
            let stack = template::provision(
                &sdk,
                &template,
                &template::ProvisionOptions {
                    stack_name,
                    ..Default::default()
                },
            )
            .await?;
            let mut vars: Vec<(String, String)> = [
                "AWS_ENDPOINT_URL",
                "AWS_REGION",
                "AWS_DEFAULT_REGION",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "PAYMENT_API_URL",
                "PAYMENT_API_KEY",
            ]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
            .collect();
            vars.push((
                "IDEMPOTENCY_TABLE".into(),
                stack.function_var("IDEMPOTENCY_TABLE")?.to_owned(),
            ));
            vars.push((
                "DEAD_LETTER_QUEUE_URL".into(),
                stack.function_var("DEAD_LETTER_QUEUE_URL")?.to_owned(),
            ));
            vars.push((
                "PAYMENTS_QUEUE_URL".into(),
                stack.event_source.queue_url.clone(),
            ));
            vars.push(("PAYMENTS_TABLE".into(), stack.payments_table()?.to_owned()));
            if let Some(refunds) = stack.event_sources.get(template::REFUND_PROCESSOR) {
                vars.push(("REFUNDS_QUEUE_URL".into(), refunds.queue_url.clone()));
                vars.push((
                    "REFUNDS_DEAD_LETTER_QUEUE_URL".into(),
                    stack
                        .var_of(template::REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")?
                        .to_owned(),
                ));
            }
            for (k, v) in vars {
                println!("export {k}='{}'", v.replace('\'', "'\\''"));
            }
        }
        Command::Send {
            queue_url,
            body,
            file,
            generate,
            prefix,
        } => {
            payment_infra::operate::check_queue(
                &sdk,
                &queue_url,
                &format!("the payments queue {queue_url} (PAYMENTS_QUEUE_URL)"),
            )
            .await?;
            let bodies: Vec<String> = if let Some(b) = body {
                vec![b]
            } else if let Some(f) = file {
                let reader: Box<dyn BufRead> = if f.as_os_str() == "-" {
                    Box::new(std::io::stdin().lock())
                } else {
                    Box::new(std::io::BufReader::new(
                        std::fs::File::open(&f)
                            .with_context(|| format!("opening {}", f.display()))?,
                    ))
                };
                reader
                    .lines()
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .filter(|l| !l.trim().is_empty())
                    .collect()
            } else if let Some(n) = generate {
                (0..n)
                    .map(|i| {
                        load::payment_body(
                            &format!("{prefix}-{i:06}"),
                            1000 + i as i64,
                            "pm_card_visa",
                        )
                    })
                    .collect()
            } else {
                bail!("give --body, --file or --generate");
            };
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            let ids = load::send_all(&sqs, &queue_url, &bodies).await?;
            println!("sent {} messages", ids.len());
        }
        Command::SendRefund {
            queue_url,
            body,
            payment_id,
            refund_id,
            amount,
            reason,
        } => {
            let body = match (body, payment_id, refund_id) {
                (Some(b), _, _) => b,
                (None, Some(payment_id), Some(refund_id)) => payment_core::refund::RefundRequest {
                    refund_id,
                    payment_id,
                    amount,
                    reason,
                }
                .to_message_body(),
                _ => bail!("give --body, or --payment-id with --refund-id"),
            };
            // A refund the processor would refuse is refused here, with the same reason.
            payment_core::refund::RefundRequest::parse(&body)
                .map_err(|e| anyhow::anyhow!("{}: {}", e.code, e.message))?;
            payment_infra::operate::check_queue(
                &sdk,
                &queue_url,
                &format!("the refunds queue {queue_url} (REFUNDS_QUEUE_URL)"),
            )
            .await?;
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            let ids = load::send_all(&sqs, &queue_url, &[body]).await?;
            println!("sent {} refund message(s)", ids.len());
        }
        Command::Run {
            work,
            queue_url,
            dead_letter_queue_url,
            batch_size,
            batching_window,
            visibility_timeout,
            function_timeout,
            pollers,
            until_empty,
            max_seconds,
            progress,
            json,
        } => {
            use payment_infra::operate::{self, RunSummary};
            use std::io::IsTerminal;
            let (queue_var, dlq_var) = work.vars();
            let from_env = |given: Option<String>, var: &str| {
                given
                    .or_else(|| std::env::var(var).ok())
                    .with_context(|| format!("give the queue with its option or set {var}"))
            };
            let queue_url = from_env(queue_url, queue_var)?;
            let mut config = Config::from_env()?;
            if dead_letter_queue_url.is_some() || work == WorkKind::Refunds {
                config.dead_letter_queue_url = from_env(dead_letter_queue_url, dlq_var)?;
            }
            operate::check_processor_resources(
                &sdk,
                &config.idempotency_table,
                &queue_url,
                &config.dead_letter_queue_url,
            )
            .await?;
            let processor: esm::Function = match work {
                WorkKind::Payments => payment_core::bootstrap::build_processor(&config, &sdk)
                    .await?
                    .into(),
                WorkKind::Refunds => payment_core::bootstrap::build_refund_processor(&config, &sdk)
                    .await?
                    .into(),
            };
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            let stats = std::sync::Arc::new(tokio::sync::Mutex::new(esm::EsmStats::default()));
            let _progress = (progress || std::io::stderr().is_terminal()).then(|| {
                operate::progress(
                    stats.clone(),
                    sqs.clone(),
                    queue_url.clone(),
                    Duration::from_secs(5),
                )
            });
            let run = esm::run_observed(
                processor,
                sqs,
                esm::EsmOptions {
                    queue_url,
                    batch_size,
                    batching_window: Duration::from_secs_f64(batching_window.max(0.0)),
                    visibility_timeout,
                    function_timeout: Duration::from_secs(function_timeout),
                    report_batch_item_failures: true,
                    pollers,
                    until_empty,
                    max_duration: Duration::from_secs(max_seconds),
                },
                stats.clone(),
            );
            let (ended, interrupted) = tokio::select! {
                r = run => (r, false),
                _ = tokio::signal::ctrl_c() => (Ok(()), true),
            };
            let summary = RunSummary::of(&*stats.lock().await, interrupted);
            if json {
                println!("{}", serde_json::to_string(&summary)?);
            }
            eprintln!("{}", summary.line());
            ended?;
            if interrupted {
                std::process::exit(130);
            }
            if summary.all_failed() {
                bail!(
                    "nothing succeeded and {} deliveries failed: the log lines above say why",
                    summary.received
                );
            }
        }
        Command::E2eCheck {
            queue_url,
            dlq_url,
            table,
            sim_url,
            prefix,
            api_url,
            refunds_queue_url,
            refunds_dlq_url,
            max_seconds,
        } => {
            let verdict = payment_infra::e2e::run(
                &sdk,
                &payment_infra::e2e::E2eOptions {
                    queue_url,
                    dlq_url,
                    table,
                    sim_url,
                    prefix,
                    max_duration: Duration::from_secs(max_seconds),
                    api_url,
                    refunds: refunds_queue_url.zip(refunds_dlq_url),
                },
            )
            .await?;
            if !verdict.violations.is_empty() {
                std::process::exit(1);
            }
        }
        Command::Bench {
            template,
            payments,
            pollers,
            cold_start_runs,
            bootstraps,
            emulator,
            out,
            logs,
            peer_bootstrap,
            peer_python,
            peer_description,
        } => {
            let bootstraps = bootstraps
                .iter()
                .map(|b| {
                    b.split_once('=')
                        .map(|(a, p)| (a.to_owned(), PathBuf::from(p)))
                        .context("--bootstrap takes ARCH=PATH")
                })
                .collect::<Result<Vec<_>>>()?;
            payment_infra::bench::run(
                &sdk,
                &payment_infra::bench::BenchOptions {
                    template,
                    payments,
                    pollers,
                    cold_start_runs,
                    bootstraps,
                    emulator,
                    out_dir: out,
                    log_dir: logs,
                    peer: peer_bootstrap.zip(peer_python).map(|(bootstrap, python)| {
                        payment_infra::compare::PeerOptions {
                            bootstrap,
                            python,
                            description: peer_description,
                        }
                    }),
                },
            )
            .await?;
        }
        Command::Dlq { command } => {
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            let (DlqCommand::List { dlq_url, .. }
            | DlqCommand::Show { dlq_url, .. }
            | DlqCommand::Redrive { dlq_url, .. }) = &command;
            payment_infra::operate::check_queue(
                &sdk,
                dlq_url,
                &format!("the dead-letter queue {dlq_url} (DEAD_LETTER_QUEUE_URL)"),
            )
            .await?;
            if let DlqCommand::Redrive {
                queue_url: Some(queue_url),
                ..
            } = &command
            {
                payment_infra::operate::check_queue(
                    &sdk,
                    queue_url,
                    &format!("the source queue {queue_url} (--queue-url)"),
                )
                .await?;
            }
            match command {
                DlqCommand::List { dlq_url, max } => {
                    let letters = payment_infra::dlq::list(&sqs, &dlq_url, max).await?;
                    for l in &letters {
                        println!("{}", l.to_json());
                    }
                    eprintln!(
                        "{} dead letters (listing receives each one: its receive_count grew by one)",
                        letters.len()
                    );
                }
                DlqCommand::Show { id, dlq_url } => {
                    let letter = payment_infra::dlq::show(&sqs, &dlq_url, &id).await?;
                    println!("{}", serde_json::to_string_pretty(&letter.to_json())?);
                }
                DlqCommand::Redrive {
                    dlq_url,
                    queue_url,
                    error_code,
                    max,
                    force,
                } => {
                    // A given queue is checked by the redrive itself; without one, ask SQS.
                    let queue_url = match queue_url {
                        Some(q) => q,
                        None => payment_infra::dlq::home_queue(&sqs, &dlq_url, None).await?,
                    };
                    println!("redriving {dlq_url} to {queue_url}");
                    let report = payment_infra::dlq::redrive(
                        &sqs,
                        &payment_infra::dlq::RedriveOptions {
                            dlq_url,
                            queue_url,
                            error_code,
                            max,
                            force,
                        },
                    )
                    .await?;
                    println!("moved {} messages back ({})", report.moved, report.method);
                    if report.method == "StartMessageMoveTask" {
                        println!("SQS's move task sets a new SentTimestamp: a message SQS moved by itself (max_receives) has no first_sent_at, so its age starts again; the processor's own dead letters keep their first_sent_at");
                    }
                    for (code, n) in &report.kept {
                        println!(
                            "kept {n} {code} in the DLQ: {} (--force moves them)",
                            payment_infra::dlq::never_redriven(code).unwrap_or_default()
                        );
                    }
                }
            }
        }
        Command::Conformance => {
            let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| "AWS".into());
            let results = payment_infra::conformance::run(&sdk).await;
            payment_infra::conformance::report(&endpoint, &results)?;
        }
        Command::Reconcile {
            payment_id,
            all_unknown,
            table,
            payment_api_url,
            payment_api_key_secret_arn,
            key_retention_seconds,
            search_lag_seconds,
            stripe_api_version,
        } => {
            use payment_infra::reconcile;
            if !payment_core::stripe::is_api_version(&stripe_api_version) {
                bail!("--stripe-api-version must be a Stripe API version such as {} (YYYY-MM-DD[.name]), got {stripe_api_version:?}", payment_core::stripe::DEFAULT_API_VERSION);
            }
            let source = match (payment_api_key_secret_arn, std::env::var("PAYMENT_API_KEY")) {
                (Some(arn), _) if !arn.trim().is_empty() => {
                    payment_core::config::ApiKeySource::SecretArn(arn)
                }
                (_, Ok(key)) if !key.trim().is_empty() => {
                    payment_core::config::ApiKeySource::Plain(key.into())
                }
                _ => bail!("set PAYMENT_API_KEY_SECRET_ARN (or PAYMENT_API_KEY for local use): reconcile looks payments up at the provider"),
            };
            let key = payment_core::bootstrap::resolve_api_key(&source, &sdk).await?;
            let provider = payment_core::stripe::StripeClient::new(
                &payment_api_url,
                key,
                &stripe_api_version,
                Duration::from_secs(10),
            )?;
            let ddb = aws_sdk_dynamodb::Client::new(&sdk);
            payment_infra::operate::check_table(
                &sdk,
                &table,
                &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
            )
            .await?;
            let store = payment_core::payment_store(ddb.clone(), &table);
            let ids = match (payment_id, all_unknown) {
                (Some(id), false) => vec![id],
                _ => reconcile::unsettled_ids(&ddb, &table).await?,
            };
            let settings = reconcile::ReconcileSettings {
                key_retention: Duration::from_secs(key_retention_seconds),
                search_lag: Duration::from_secs(search_lag_seconds),
            };
            if ids.is_empty() {
                println!("no unknown or stuck records in {table}");
            }
            let mut failed = 0;
            for id in &ids {
                match reconcile::reconcile_one(&store, &provider, id, settings).await {
                    Ok(action) => println!(
                        "{}",
                        reconcile::describe(id, &action, sqs_once::runner::now_ms())
                    ),
                    Err(e) => {
                        failed += 1;
                        println!("{id}: not settled: {e:#}");
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} payments could not be reconciled", ids.len());
            }
        }
        Command::Pay {
            api_url,
            amount,
            currency,
            customer,
            payment_method,
            description,
            idempotency_key,
        } => {
            let key =
                idempotency_key.unwrap_or_else(|| format!("pay_{}", uuid::Uuid::new_v4().simple()));
            let mut body = serde_json::json!({
                "amount": amount, "currency": currency, "customer_id": customer,
                "payment_method": payment_method,
            });
            if let Some(d) = description {
                body["description"] = d.into();
            }
            let client = payment_infra::client::ApiClient::new(&api_url, &sdk)?;
            let answer = client.create(&key, &body.to_string()).await?;
            print_answer(&answer, Some(&key))?;
        }
        Command::Smoke {
            stripe_key_env,
            payment_api_url,
            stripe_api_version,
            run_id,
        } => {
            let key = match std::env::var(&stripe_key_env) {
                Ok(k) if !k.trim().is_empty() => secrecy::SecretString::from(k.trim().to_owned()),
                _ => bail!("set {stripe_key_env} to a Stripe test-mode secret key (sk_test_...), or name another variable with --stripe-key-env"),
            };
            let client = payment_infra::smoke::client(&payment_api_url, key, &stripe_api_version)?;
            let run_id = run_id.unwrap_or_else(|| format!("smoke-{}", sqs_once::runner::now_ms()));
            payment_infra::smoke::run(&client, &run_id).await?;
        }
        Command::Get {
            payment_id,
            api_url,
        } => {
            let client = payment_infra::client::ApiClient::new(&api_url, &sdk)?;
            let answer = client.get(&payment_id).await?;
            print_answer(&answer, None)?;
        }
        Command::Api {
            command:
                ApiCommand::Serve {
                    address,
                    table,
                    idempotency_table,
                },
        } => {
            let config = payment_core::config::ApiConfig::from_lookup(|k| match k {
                "PAYMENTS_TABLE" => Some(table.clone()),
                "IDEMPOTENCY_TABLE" => Some(idempotency_table.clone()),
                other => std::env::var(other).ok(),
            })?;
            let api =
                payment_core::bootstrap::build_api(&config, aws_sdk_dynamodb::Client::new(&sdk));
            let server =
                payment_infra::local_api::LocalApi::start(std::sync::Arc::new(api), &address)
                    .await?;
            eprintln!("payments API on {} (PAYMENTS_API_URL)", server.url());
            server.wait().await?;
        }
        Command::Relay {
            table,
            queue_url,
            group_by,
        } => {
            let relay = std::sync::Arc::new(relay_for(&table, &queue_url, &group_by, &sdk)?);
            let _mapping = payment_infra::stream::start(&sdk, &table, relay).await?;
            eprintln!("relaying the outbox of {table} to {queue_url} until stopped");
            tokio::signal::ctrl_c().await?;
        }
        Command::Outbox { command } => {
            use payment_infra::republish;
            let (OutboxCommand::Pending { table, .. } | OutboxCommand::Republish { table, .. }) =
                &command;
            payment_infra::operate::check_table(
                &sdk,
                table,
                &format!("the payments table {table} (PAYMENTS_TABLE)"),
            )
            .await?;
            let ddb = aws_sdk_dynamodb::Client::new(&sdk);
            let before = |secs: u64| sqs_once::runner::now_ms() - secs as i64 * 1000;
            match command {
                OutboxCommand::Pending { table, older_than } => {
                    let entries = republish::unpublished(&ddb, &table, before(older_than)).await?;
                    for e in &entries {
                        println!(
                            "{}\tcreated_at {}\tcustomer {}",
                            e.payment_id, e.created_at, e.customer_id
                        );
                    }
                    println!(
                        "{} unpublished outbox entries older than {older_than} s in {table}",
                        entries.len()
                    );
                }
                OutboxCommand::Republish {
                    table,
                    queue_url,
                    group_by,
                    older_than,
                } => {
                    let relay = relay_for(&table, &queue_url, &group_by, &sdk)?;
                    let entries = republish::unpublished(&ddb, &table, before(older_than)).await?;
                    let report = republish::republish(&relay, &entries).await;
                    println!(
                        "republished {} of {} unpublished outbox entries to {queue_url} ({} marked published)",
                        report.sent,
                        entries.len(),
                        report.marked
                    );
                    if !report.errors.is_empty() {
                        bail!("republishing stopped: {}", report.errors.join("; "));
                    }
                }
            }
        }
        Command::Status {
            payment_id,
            table,
            json,
        } => {
            let (record, mark) = progress_of(&sdk, &table, &payment_id).await?;
            if json {
                let doc =
                    payment_infra::status::to_json(&payment_id, record.as_ref(), mark.as_ref());
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                for line in
                    payment_infra::status::describe(&payment_id, record.as_ref(), mark.as_ref())
                {
                    println!("{line}");
                }
            }
            if record.is_none() && mark.is_none() {
                bail!("payment {payment_id} has no record and no dead letter in {table}: not processed yet, never sent, expired after IDEMPOTENCY_TTL, or refused as invalid_json / invalid_payment (payctl dlq list shows those)");
            }
        }
        Command::History { payment_id, table } => {
            let (record, mark) = progress_of(&sdk, &table, &payment_id).await?;
            let events = payment_infra::status::history(record.as_ref(), mark.as_ref());
            if events.is_empty() {
                bail!("payment {payment_id} has no record and no dead letter in {table}");
            }
            for (at, what) in events {
                println!("{}  {what}", payment_infra::operate::utc(at));
            }
        }
        Command::Chaos {
            template,
            payments,
            seed,
            instances,
            crash_rate,
            fault_rate,
            aws_faults,
            max_depth,
            max_seconds,
        } => {
            let report = payment_infra::chaos::run(
                &sdk,
                &payment_infra::chaos::ChaosOptions {
                    template,
                    payments,
                    seed,
                    instances,
                    crash_rate,
                    fault_rate,
                    aws_fault_rate: aws_faults,
                    max_depth,
                    max_duration: Duration::from_secs(max_seconds),
                    exe: std::env::current_exe().context("locating payctl")?,
                },
            )
            .await?;
            if !report.verdict.violations.is_empty() {
                std::process::exit(1);
            }
        }
        Command::Demo {
            template,
            payments,
            seed,
            pollers,
            fault_rate,
            direct,
        } => {
            let verdict = demo::run(
                &sdk,
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
            if !verdict.violations.is_empty() {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

/// Prints an API answer (the body, pretty) and fails on an error status.
fn print_answer(answer: &payment_infra::client::Answer, key: Option<&str>) -> Result<()> {
    let body = answer.json()?;
    println!("{}", serde_json::to_string_pretty(&body)?);
    if answer.replayed {
        eprintln!("(replayed: the API already held this Idempotency-Key; nothing new was created)");
    }
    if answer.status >= 400 {
        let retry = match (answer.status >= 500, key) {
            (true, Some(k)) => format!("; retry with --idempotency-key {k}"),
            _ => String::new(),
        };
        bail!("the API answered {}{retry}", answer.status);
    }
    Ok(())
}

/// The outbox relay for a table, a queue and a FIFO group rule (validated like the Lambda's
/// environment).
fn relay_for(
    table: &str,
    queue_url: &str,
    group_by: &str,
    sdk: &aws_config::SdkConfig,
) -> Result<payment_core::outbox::Relay> {
    let config = payment_core::config::RelayConfig::from_lookup(|k| match k {
        "PAYMENTS_TABLE" => Some(table.to_owned()),
        "PAYMENTS_QUEUE_URL" => Some(queue_url.to_owned()),
        "FIFO_GROUP_BY" => Some(group_by.to_owned()),
        _ => None,
    })?;
    Ok(payment_core::bootstrap::build_relay(&config, sdk))
}

/// A payment's record and dead-letter mark, with a one-line error naming the table.
async fn progress_of(
    sdk: &aws_config::SdkConfig,
    table: &str,
    payment_id: &str,
) -> Result<(
    Option<sqs_once::record::IdempotencyRecord>,
    Option<sqs_once::record::DeadLetterMark>,
)> {
    payment_infra::operate::check_table(
        sdk,
        table,
        &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    Ok(payment_core::payment_store(ddb, table)
        .record_and_mark(payment_id)
        .await?)
}
