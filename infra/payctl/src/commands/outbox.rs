//! The outbox (each payment row's message, relayed from the table's stream): relay it locally,
//! list and republish the rows the processor has never seen.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum OutboxCommand {
    /// List payments older than --older-than seconds that the processor has never seen.
    Pending {
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// The processor's idempotency table (the stack's IdempotencyTableName output).
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        records_table: String,
        /// Leave younger entries to the live relay.
        #[arg(long, default_value_t = 60)]
        older_than: u64,
    },
    /// Send the payments older than --older-than seconds that the processor has never seen to
    /// the payments queue (safe to repeat: the processor absorbs copies).
    Republish {
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// The processor's idempotency table (the stack's IdempotencyTableName output).
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        records_table: String,
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

/// The unseen rows created before `before_ms`, and how many younger ones there are.
async fn split_by_age(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    records_table: &str,
    before_ms: i64,
) -> Result<(Vec<payment_core::payments::outbox::OutboxEntry>, usize)> {
    let all = payctl::republish::unseen(ddb, table, records_table, i64::MAX).await?;
    let (old, young): (Vec<_>, Vec<_>) = all.into_iter().partition(|e| e.created_at < before_ms);
    Ok((old, young.len()))
}

/// What a listing left to the live relay, said so that an empty answer is never a puzzle.
fn left_to_relay(younger: usize, older_than: u64) -> String {
    match younger {
        0 => String::new(),
        n => format!("; {n} younger than {older_than} s left to the live relay (--older-than 0 includes them)"),
    }
}

/// The options of `payctl relay`.
#[derive(Args)]
pub struct RelayArgs {
    /// The payments table (the stack's PaymentsTableName output).
    #[arg(long, env = "PAYMENTS_TABLE")]
    pub table: String,
    /// The payments queue (the stack's PaymentsQueueUrl output).
    #[arg(long, env = "PAYMENTS_QUEUE_URL")]
    pub queue_url: String,
    /// On a FIFO queue: message groups per customer or per payment.
    #[arg(long, env = "FIFO_GROUP_BY", default_value = "customer")]
    pub group_by: String,
}

/// Runs `payctl relay`.
pub async fn relay(args: RelayArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let RelayArgs {
        table,
        queue_url,
        group_by,
    } = args;
    let relay = std::sync::Arc::new(payctl::relay::relay_for(&queue_url, &group_by, sdk)?);
    payctl::aws::announce(sdk, &format!("relaying the outbox of {table}")).await;
    let mut signals = payctl::stop::Signals::listen()?;
    let mapping = payctl::relay::start(sdk, &table, relay).await?;
    payctl::say!("relaying the outbox of {table} to {queue_url} until stopped (Ctrl-C)");
    let status = signals.next().await;
    let stats = mapping.stats.clone();
    payctl::say!("stopping: the entries being sent are finished first. Again to stop at once.");
    let relayed = |s: &lambda_local::stream::StreamStats| {
        s.handled.load(std::sync::atomic::Ordering::Relaxed)
    };
    tokio::select! {
        stopped = mapping.stop() => {
            stopped?;
            payctl::say!("stopped; payments relayed to the queue: {}", relayed(&stats));
        }
        _ = signals.next() => payctl::say!(
            "stopped at once; payments relayed to the queue: {}; a send that was under way is sent again by the next relay (it reads the stream from its start, and the processor charges each payment once)",
            relayed(&stats)
        ),
    }
    std::process::exit(status);
}

/// The options of `payctl outbox`.
#[derive(Args)]
pub struct OutboxArgs {
    #[command(subcommand)]
    pub command: OutboxCommand,
}

/// Runs `payctl outbox`.
pub async fn outbox(args: OutboxArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let OutboxArgs { command } = args;
    use payctl::republish;
    let (OutboxCommand::Pending {
        table,
        records_table,
        ..
    }
    | OutboxCommand::Republish {
        table,
        records_table,
        ..
    }) = &command;
    payctl::aws::check_table(
        sdk,
        table,
        &format!("the payments table {table} (PAYMENTS_TABLE)"),
    )
    .await?;
    payctl::aws::check_table(
        sdk,
        records_table,
        &format!("the idempotency table {records_table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let before = |secs: u64| sqs_once::runner::now_ms() - secs as i64 * 1000;
    match command {
        OutboxCommand::Pending {
            table,
            records_table,
            older_than,
        } => {
            let (entries, younger) =
                split_by_age(&ddb, &table, &records_table, before(older_than)).await?;
            let now = sqs_once::runner::now_ms();
            for e in &entries {
                println!(
                    "{}\tcreated {} ({} s ago)\tcustomer {}",
                    e.payment_id,
                    payctl::time::utc(e.created_at),
                    (now - e.created_at).max(0) / 1000,
                    e.customer_id
                );
            }
            println!(
                "{} payments older than {older_than} s in {table} that the processor has never seen{}",
                entries.len(),
                left_to_relay(younger, older_than)
            );
        }
        OutboxCommand::Republish {
            table,
            records_table,
            queue_url,
            group_by,
            older_than,
        } => {
            payctl::aws::announce(sdk, &format!("republishing the outbox of {table}")).await;
            let relay = payctl::relay::relay_for(&queue_url, &group_by, sdk)?;
            let (entries, younger) =
                split_by_age(&ddb, &table, &records_table, before(older_than)).await?;
            let report = republish::republish(&relay, &entries).await;
            println!(
                "republished {} of {} payments older than {older_than} s that the processor has never seen to {queue_url}{}",
                report.sent,
                entries.len(),
                left_to_relay(younger, older_than)
            );
            if !report.errors.is_empty() {
                bail!("republishing stopped: {}", report.errors.join("; "));
            }
        }
    }
    Ok(())
}
