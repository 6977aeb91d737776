//! A payment's record and dead letter, now and in time order.

use anyhow::{bail, Result};
use clap::Args;

/// A payment's record and dead-letter mark, with a one-line error naming the table.
async fn progress_of(
    sdk: &aws_config::SdkConfig,
    table: &str,
    payment_id: &str,
) -> Result<(
    Option<sqs_once::record::IdempotencyRecord>,
    Option<sqs_once::record::DeadLetterMark>,
)> {
    payctl::aws::check_table(
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

/// The options of `payctl status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The payment's id (its Idempotency-Key).
    pub payment_id: String,
    /// The idempotency table (the stack's IdempotencyTableName output).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    pub table: String,
    /// The whole record as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `payctl status`.
pub async fn status(args: StatusArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let StatusArgs {
        payment_id,
        table,
        json,
    } = args;
    let (record, mark) = progress_of(sdk, &table, &payment_id).await?;
    if json {
        let doc = payctl::status::to_json(&payment_id, record.as_ref(), mark.as_ref());
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for line in payctl::status::describe(&payment_id, record.as_ref(), mark.as_ref()) {
            println!("{line}");
        }
    }
    if record.is_none() && mark.is_none() {
        bail!("payment {payment_id} has no record and no dead letter in {table}: not processed yet, never sent, expired after IDEMPOTENCY_TTL, or refused as invalid_json / invalid_payment (payctl dlq list shows those)");
    }
    Ok(())
}

/// The options of `payctl history`.
#[derive(Args)]
pub struct HistoryArgs {
    /// The payment's id (its Idempotency-Key).
    pub payment_id: String,
    /// The idempotency table (the stack's IdempotencyTableName output).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    pub table: String,
}

/// Runs `payctl history`.
pub async fn history(args: HistoryArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let HistoryArgs { payment_id, table } = args;
    let (record, mark) = progress_of(sdk, &table, &payment_id).await?;
    let events = payctl::status::history(record.as_ref(), mark.as_ref());
    if events.is_empty() {
        bail!("payment {payment_id} has no record and no dead letter in {table}");
    }
    for (at, what) in events {
        println!("{}  {what}", payctl::time::utc(at));
    }
    Ok(())
}
