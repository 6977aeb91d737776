//! `payctl`: operate the payment processor, locally or against AWS.
//!
//! This file is the command tree and its dispatch; each command family lives in
//! `commands/` (its options, with their `--help` text, and what it does), over the `payctl`
//! library. The project's own proving ground (`make demo`, `make chaos`, `make bench`, the
//! deployed check) is the `proving` binary, not here.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod commands;

#[derive(Parser)]
#[command(
    name = "payctl",
    version,
    about = "Send, process and inspect payments and refunds; provision a local stack; settle what is unknown"
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

#[derive(Subcommand)]
enum Command {
    /// Create the template's queues and tables on the endpoint (AWS_ENDPOINT_URL), or find and
    /// update them when they exist (safe to run again), and print them.
    Provision(commands::stack::ProvisionArgs),
    /// Print `export` lines for the operator's shell: a deployed stack's tables, queues, API
    /// and provider settings from its CloudFormation outputs and parameters; or, on a local
    /// endpoint without such a stack, this shell's endpoint, credentials and provider and the
    /// provisioned stack's tables and queues.
    Env(commands::stack::EnvArgs),
    /// Connect a deployed stack to the provider: register its webhook endpoint at Stripe (the
    /// inbox's event types, the stack's pinned API version), write the endpoint's signing
    /// secret into the stack's WebhookSecretArn, and send a signed test event through to the
    /// inbox; for EventBridge delivery, check the partner source, bus and rule. Safe to run
    /// again.
    Connect(commands::stack::ConnectArgs),
    /// Check, reading only, what a live account needs before traffic: the region of the stack's
    /// secrets and topic, the Lambda concurrency quota against what the stack reserves, the
    /// provider key's mode and each permission the code uses (a harmless request each), the
    /// account's API version against the pinned one, the alarm topic and who it reaches, the
    /// webhook endpoint (or the partner bus). Each finding names its fix. Exits 0 when ready, 2
    /// when something needs fixing, 1 on an error.
    Preflight(commands::stack::PreflightArgs),
    /// Send payments: one JSON body, a JSONL file (- for stdin), or generated valid payments.
    Send(commands::send::SendArgs),
    /// Send refunds of charged payments: one JSON body, or one refund built from the options.
    SendRefund(commands::send::SendRefundArgs),
    /// Poll a queue like Lambda's SQS trigger and run a processor (configured from the
    /// function's environment variables) on each batch.
    Run(commands::run::RunArgs),
    /// Print a payment's idempotency record (times in UTC) and its dead letter, if it has one.
    Status(commands::status::StatusArgs),
    /// What happened to a payment, in time order, from its record and dead letter.
    History(commands::status::HistoryArgs),
    /// Whether the system keeps up: per queue what waits, is in flight and how old the oldest
    /// is; dead letters by code; records in progress, stalled and unknown; the events
    /// catch-up's place; the stack's alarms (--stack-name). Exits 0 when healthy, 2 when
    /// something needs a person, 1 on an error. --watch N reads again every N seconds.
    Health(commands::health::HealthArgs),
    /// The dead-letter queues: list, show (by message id, source message id or payment id),
    /// redrive.
    Dlq(commands::dlq::DlqArgs),
    /// Settle unknown or stuck payments and refunds from what the provider holds: a charge (or
    /// refund) found completes the record; nothing found is reported with what a redrive does.
    /// Never charges. Needs PROVIDER_API_URL and the API key like the function. Exits 0 when
    /// every payment is settled, 2 when one must be looked at again (held, not provable yet, or
    /// nothing at the provider), 1 on an error.
    Reconcile(commands::reconcile::ReconcileArgs),
    /// The provider's events: catch up on those the webhook endpoint missed.
    Events(commands::events::EventsArgs),
    /// Payments the processor has never seen (after RelayFailuresAlarm), and sending them
    /// again.
    Outbox(commands::outbox::OutboxArgs),
    /// Relay the payments table's outbox stream to the payments queue, as the outbox-relay
    /// Lambda's stream trigger does (local runs).
    Relay(commands::outbox::RelayArgs),
    /// Create a payment through the payments API (POST /v1/payments, SigV4-signed). Prints the
    /// API's answer; safe to run again with the same --idempotency-key.
    Pay(commands::api::PayArgs),
    /// Read a payment through the payments API (GET /v1/payments/{id}).
    Get(commands::api::GetArgs),
    /// Serve the payments API locally (the same code as the payments-api Lambda).
    Api(commands::api::ApiArgs),
    /// Check that the AWS endpoint (AWS_ENDPOINT_URL, or AWS itself) keeps what the protocol
    /// relies on, in 9 checks: atomic conditional writes under concurrency, ALL_OLD on a
    /// refused write, consistent reads, one winner among racing conditional puts of a payment,
    /// one stream INSERT image per committed put, all-or-nothing transactions, visibility
    /// changes with receive counts, redrive after maxReceiveCount, FIFO group blocking. Exits
    /// non-zero naming each failed check.
    Conformance,
    /// Check the provider account with the processors' own client: a customer, three charges
    /// with one key (one PaymentIntent), a refund, all read back. Test-mode keys only.
    Smoke(commands::checks::SmokeArgs),
}

#[tokio::main]
async fn main() {
    // The provider's URL under its old name (PAYMENT_API_URL) is read, with a warning, where
    // the options read PROVIDER_API_URL; before any thread of ours reads the environment.
    if std::env::var_os("PROVIDER_API_URL").is_none() {
        if let Ok((url, Some(warning))) =
            payment_core::edges::config::provider_api_url(&|k| std::env::var(k).ok())
        {
            payctl::say!("payctl: {warning}");
            std::env::set_var("PROVIDER_API_URL", url);
        }
    }
    // One line, the cause chain included, never a backtrace: what an operator reads.
    if let Err(e) = run(Cli::parse()).await {
        payctl::say!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<()> {
    // FAILPOINTS=name=action;... (debug builds with the failpoints feature only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    payctl::aws::check_explicit(cli.profile.as_deref(), cli.region.as_deref())?;
    // Loaded before the log subscriber exists: an unset region is one line below, not the
    // SDK's warnings about the instance metadata service it tried instead.
    let sdk = payctl::aws::sdk_config(cli.region, cli.profile).await;
    if sdk.region().is_none() && !matches!(cli.command, Command::Smoke(_)) {
        anyhow::bail!("no AWS region is set: export AWS_REGION (us-east-1 for a local emulator; the local scripts write it to .local/env), pass --region, or give the profile a region");
    }
    if matches!(
        cli.command,
        Command::Run(_) | Command::Api(_) | Command::Relay(_)
    ) {
        payment_core::telemetry::init_timed();
    } else if matches!(cli.command, Command::Send(_) | Command::SendRefund(_)) {
        // A message sent starts its trace when the OTEL_* variables name a collector.
        payment_core::telemetry::init_traces();
    }
    let done = match cli.command {
        Command::Provision(args) => commands::stack::provision(args, &sdk).await,
        Command::Env(args) => commands::stack::env(args, &sdk).await,
        Command::Connect(args) => commands::stack::connect(args, &sdk).await,
        Command::Preflight(args) => commands::stack::preflight(args, &sdk).await,
        Command::Send(args) => commands::send::send(args, &sdk).await,
        Command::SendRefund(args) => commands::send::send_refund(args, &sdk).await,
        Command::Run(args) => commands::run::run(args, &sdk).await,
        Command::Status(args) => commands::status::status(args, &sdk).await,
        Command::History(args) => commands::status::history(args, &sdk).await,
        Command::Dlq(args) => commands::dlq::dlq(args, &sdk).await,
        Command::Health(args) => commands::health::health(args, &sdk).await,
        Command::Reconcile(args) => commands::reconcile::reconcile(args, &sdk).await,
        Command::Events(args) => commands::events::events(args, &sdk).await,
        Command::Outbox(args) => commands::outbox::outbox(args, &sdk).await,
        Command::Relay(args) => commands::outbox::relay(args, &sdk).await,
        Command::Pay(args) => commands::api::pay(args, &sdk).await,
        Command::Get(args) => commands::api::get(args, &sdk).await,
        Command::Api(args) => commands::api::api(args, &sdk).await,
        Command::Conformance => commands::checks::conformance(&sdk).await,
        Command::Smoke(args) => commands::checks::smoke(args).await,
    };
    // The last spans leave before the process does.
    payment_core::telemetry::traces::shutdown();
    done
}
