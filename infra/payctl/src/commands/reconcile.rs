//! Settling unknown or stuck payments from what the provider holds.

use anyhow::{bail, Result};
use clap::Args;
use std::time::Duration;

/// The options of `payctl reconcile`.
#[derive(Args)]
pub struct ReconcileArgs {
    /// The payment to settle.
    #[arg(
        required_unless_present = "all_unknown",
        conflicts_with = "all_unknown"
    )]
    /// The payment's id (its Idempotency-Key), or a refund's id.
    pub payment_id: Option<String>,
    /// Every payment and refund record that is marked unknown, FAILED, or IN_PROGRESS past its
    /// lease.
    #[arg(long)]
    pub all_unknown: bool,
    /// The idempotency table (the stack's IdempotencyTableName output).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    pub table: String,
    #[command(flatten)]
    pub provider: super::ProviderArgs,
    /// How long the provider remembers an idempotency key, seconds.
    #[arg(long, env = "PROVIDER_KEY_RETENTION_SECONDS", default_value_t = 86_400)]
    pub key_retention_seconds: u64,
    /// How far the provider's search may lag its charges, seconds.
    #[arg(long, env = "PROVIDER_SEARCH_LAG_SECONDS", default_value_t = 60)]
    pub search_lag_seconds: u64,
    /// How long a settled charge or refund is kept from now, days (the stack's
    /// RefundWindowDays).
    #[arg(long, env = "REFUND_WINDOW_DAYS", default_value_t = 365)]
    pub refund_window_days: u64,
}

/// Runs `payctl reconcile`.
pub async fn reconcile(args: ReconcileArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let ReconcileArgs {
        payment_id,
        all_unknown,
        table,
        provider,
        key_retention_seconds,
        search_lag_seconds,
        refund_window_days,
    } = args;
    let refund_window = Duration::from_secs(refund_window_days * 86_400);
    use payctl::{reconcile, reconcile_refund};
    let provider = provider
        .client(sdk, "reconcile looks payments up at the provider")
        .await?;
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    payctl::aws::check_table(
        sdk,
        &table,
        &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    payctl::aws::announce(sdk, &format!("settling records of {table}")).await;
    let store = payment_core::payment_store(ddb.clone(), &table);
    // What to look at: (id, is it a refund).
    let ids: Vec<(String, bool)> = match (payment_id, all_unknown) {
        (Some(id), false) => vec![(id, false)],
        _ => {
            let mut ids: Vec<(String, bool)> = reconcile::unsettled_ids(&ddb, &table)
                .await?
                .into_iter()
                .map(|id| (id, false))
                .collect();
            ids.extend(
                reconcile_refund::unsettled_refund_ids(&ddb, &table)
                    .await?
                    .into_iter()
                    .map(|id| (id, true)),
            );
            ids
        }
    };
    let settings = reconcile::ReconcileSettings {
        key_retention: Duration::from_secs(key_retention_seconds),
        search_lag: Duration::from_secs(search_lag_seconds),
        refund_window,
    };
    if ids.is_empty() {
        println!("no unknown or stuck records in {table}");
    }
    let mut failed = 0;
    let mut open = 0;
    for (id, is_refund) in &ids {
        let now = sqs_once::runner::now_ms();
        let done = async {
            // An id given alone is a payment's, else a refund's.
            if !is_refund {
                let action = reconcile::reconcile_one(&store, &provider, id, settings).await?;
                if action != reconcile::Action::NoRecord || all_unknown {
                    return Ok::<_, anyhow::Error>((
                        action.is_final(),
                        reconcile::describe(id, &action, now),
                    ));
                }
            }
            let action =
                reconcile_refund::reconcile_refund(&ddb, &table, &provider, id, refund_window)
                    .await?;
            let line = match action {
                reconcile_refund::RefundAction::NoRecord => format!(
                    "{id}: no record in the table, as a payment or as a refund; nothing to settle"
                ),
                _ => reconcile_refund::describe(id, &action, now),
            };
            Ok((action.is_final(), line))
        }
        .await;
        match done {
            Ok((is_final, line)) => {
                if !is_final {
                    open += 1;
                }
                println!("{line}");
            }
            Err(e) => {
                failed += 1;
                println!("{id}: not settled: {e:#}");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} records could not be reconciled", ids.len());
    }
    if open > 0 {
        // Not an error, and not done: a script must not read it as settled.
        payctl::say!("{open} of {} records are not settled yet: the lines above say when to run again or what to do", ids.len());
        std::process::exit(2);
    }
    Ok(())
}
