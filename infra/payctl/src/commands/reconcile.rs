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
    /// The provider's base URL (as the function's PAYMENT_API_URL).
    #[arg(long, env = "PAYMENT_API_URL")]
    pub payment_api_url: String,
    /// The provider key's secret (or PAYMENT_API_KEY for local use).
    #[arg(long, env = "PAYMENT_API_KEY_SECRET_ARN")]
    pub payment_api_key_secret_arn: Option<String>,
    /// How long the provider remembers an idempotency key, seconds.
    #[arg(long, env = "PROVIDER_KEY_RETENTION_SECONDS", default_value_t = 86_400)]
    pub key_retention_seconds: u64,
    /// How far the provider's search may lag its charges, seconds.
    #[arg(long, env = "PROVIDER_SEARCH_LAG_SECONDS", default_value_t = 60)]
    pub search_lag_seconds: u64,
    /// The Stripe-Version header of the lookups.
    #[arg(long, env = "STRIPE_API_VERSION", default_value = payment_core::stripe::DEFAULT_API_VERSION)]
    pub stripe_api_version: String,
}

/// Runs `payctl reconcile`.
pub async fn reconcile(args: ReconcileArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let ReconcileArgs {
        payment_id,
        all_unknown,
        table,
        payment_api_url,
        payment_api_key_secret_arn,
        key_retention_seconds,
        search_lag_seconds,
        stripe_api_version,
    } = args;
    use payctl::{reconcile, reconcile_refund};
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
    let key = payment_core::bootstrap::resolve_api_key(&source, sdk).await?;
    let provider = payment_core::stripe::StripeClient::new(
        &payment_api_url,
        key,
        &stripe_api_version,
        Duration::from_secs(10),
    )?;
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
            let action = reconcile_refund::reconcile_refund(&ddb, &table, &provider, id).await?;
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
        eprintln!("{open} of {} records are not settled yet: the lines above say when to run again or what to do", ids.len());
        std::process::exit(2);
    }
    Ok(())
}
