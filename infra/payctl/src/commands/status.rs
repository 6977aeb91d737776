//! A payment's (or a refund's) record, dead letter and refunds, now and in time order.

use anyhow::{bail, Result};
use clap::Args;
use sqs_once::record::{DeadLetterMark, IdempotencyRecord};

/// What an id names in the idempotency table.
enum Found {
    /// A payment's record and dead-letter mark (one of them at least).
    Payment(Option<IdempotencyRecord>, Option<DeadLetterMark>),
    /// A refund's.
    Refund(Option<IdempotencyRecord>, Option<DeadLetterMark>),
    /// Neither.
    Nothing,
}

/// Looks `id` up as a payment, then as a refund, with a one-line error naming the table.
async fn find(sdk: &aws_config::SdkConfig, table: &str, id: &str) -> Result<Found> {
    payctl::aws::check_table(
        sdk,
        table,
        &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let (record, mark) = payment_core::payment_store(ddb.clone(), table)
        .record_and_mark(id)
        .await?;
    if record.is_some() || mark.is_some() {
        return Ok(Found::Payment(record, mark));
    }
    let (record, mark) = payctl::refunds::refund_store(&ddb, table)
        .record_and_mark(id)
        .await?;
    if record.is_some() || mark.is_some() {
        return Ok(Found::Refund(record, mark));
    }
    Ok(Found::Nothing)
}

/// The options of `payctl status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The payment's id (its Idempotency-Key), or a refund's id.
    pub payment_id: String,
    /// The idempotency table (the stack's IdempotencyTableName output).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    pub table: String,
    /// The whole record as JSON.
    #[arg(long)]
    pub json: bool,
    /// The payments table of the API (the stack's PaymentsTableName output): a payment the API
    /// accepted that the processor has not seen yet is found there.
    #[arg(long, env = "PAYMENTS_TABLE")]
    pub payments_table: Option<String>,
}

/// A payment the API accepted (its row in the payments table) that has no record yet: when,
/// and what it waits for.
async fn accepted_only(
    sdk: &aws_config::SdkConfig,
    payments_table: &str,
    idempotency_table: &str,
    id: &str,
) -> Result<Option<serde_json::Value>> {
    use payment_core::api::PaymentsStore;
    let store = payment_core::api::table::DynamoPayments::new(
        aws_sdk_dynamodb::Client::new(sdk),
        payments_table,
        idempotency_table,
    );
    let Some(p) = store.payment(id).await.map_err(|e| {
        anyhow::anyhow!(
            "reading {id} in the payments table {payments_table}: {}",
            e.0
        )
    })?
    else {
        return Ok(None);
    };
    let now_ms = sqs_once::runner::now_ms();
    // The row outlives the processor's record (twice its retention and a day): a row older
    // than that retention whose record is gone was processed or dead-lettered long ago.
    let retention_s = (p.expires_at_s - p.created - 86_400) / 2;
    if p.expires_at_s > 0 && retention_s > 0 && now_ms / 1000 > p.created + retention_s {
        return Ok(Some(serde_json::json!({
            "payment_id": p.id,
            "kind": "payment",
            "state": "record_expired",
            "accepted_at": payctl::time::utc(p.created * 1000),
            "accepted_ago": payctl::time::in_words(now_ms - p.created * 1000),
            "amount": p.amount,
            "currency": p.currency,
            "waiting_for": serde_json::Value::Null,
            "note": format!("accepted longer ago than the processor keeps its records ({}): what became of it is no longer in the idempotency table; payctl get answers from the API's row, and the provider's dashboard has the charge", payctl::time::in_words(retention_s * 1000)),
        })));
    }
    Ok(Some(serde_json::json!({
        "payment_id": p.id,
        "kind": "payment",
        "state": "accepted",
        "accepted_at": payctl::time::utc(p.created * 1000),
        "accepted_ago": payctl::time::in_words(now_ms - p.created * 1000),
        "amount": p.amount,
        "currency": p.currency,
        "waiting_for": "the outbox relay (the payments table's stream) to put it on the payments queue, then the processor; payctl get says pending meanwhile. Waiting for minutes: payctl outbox pending lists what the relay never sent, and payctl dlq show ID finds a message SQS dead-lettered before it was attempted (max_receives)",
    })))
}

/// Runs `payctl status`.
pub async fn status(args: StatusArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let StatusArgs {
        payment_id,
        table,
        json,
        payments_table,
    } = args;
    let (record, mark, refunds) = match find(sdk, &table, &payment_id).await? {
        Found::Payment(record, mark) => {
            let ddb = aws_sdk_dynamodb::Client::new(sdk);
            let refunds = payctl::refunds::of_payment(&ddb, &table, &payment_id).await?;
            (record, mark, refunds)
        }
        Found::Refund(record, mark) => {
            let r = (record.as_ref(), mark.as_ref());
            if json {
                let mut doc = payctl::status::to_json(&payment_id, r.0, r.1);
                doc["kind"] = "refund".into();
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                for line in payctl::refunds::describe_refund(&payment_id, r.0, r.1) {
                    println!("{line}");
                }
            }
            return Ok(());
        }
        Found::Nothing if payments_table.is_some() => {
            let payments_table = payments_table.as_deref().unwrap_or_default();
            match accepted_only(sdk, payments_table, &table, &payment_id).await? {
                Some(doc) if json => {
                    println!("{}", serde_json::to_string_pretty(&doc)?);
                    return Ok(());
                }
                Some(doc) => {
                    let now = match doc["note"].as_str() {
                        Some(note) => note.to_owned(),
                        None => format!(
                            "not processed yet: waiting for {}",
                            doc["waiting_for"].as_str().unwrap_or_default()
                        ),
                    };
                    println!(
                        "{payment_id}: accepted by the API at {} ({} ago), {} {}; {now}",
                        doc["accepted_at"].as_str().unwrap_or_default(),
                        doc["accepted_ago"].as_str().unwrap_or_default(),
                        doc["amount"],
                        doc["currency"].as_str().unwrap_or_default(),
                    );
                    return Ok(());
                }
                None => bail!("{payment_id} has no record and no dead letter in {table}, as a payment or as a refund, and no row in the payments table {payments_table}: never sent, expired after IDEMPOTENCY_TTL, or refused as invalid_json / invalid_payment / invalid_refund (payctl dlq list shows those)"),
            }
        }
        Found::Nothing => bail!("{payment_id} has no record and no dead letter in {table}, as a payment or as a refund: not processed yet, never sent, expired after IDEMPOTENCY_TTL, or refused as invalid_json / invalid_payment / invalid_refund (payctl dlq list shows those)"),
    };
    if json {
        let mut doc = payctl::status::to_json(&payment_id, record.as_ref(), mark.as_ref());
        doc["kind"] = "payment".into();
        let after = refunds.unwrap_or_default();
        // Always the refunds (none: 0 and []); disputes and events when there are any.
        doc["refunded_amount"] = after.refunded_amount.into();
        doc["refunds"] = serde_json::to_value(&after.refunds)?;
        let rest = payctl::refunds::to_json(&after);
        for field in ["disputed_amount", "disputes", "events", "events_not_listed"] {
            if let Some(v) = rest.get(field) {
                doc[field] = v.clone();
            }
        }
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for line in payctl::status::describe(&payment_id, record.as_ref(), mark.as_ref()) {
            println!("{line}");
        }
        if let Some(refunds) = &refunds {
            for line in payctl::refunds::describe(refunds) {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// The options of `payctl history`.
#[derive(Args)]
pub struct HistoryArgs {
    /// The payment's id (its Idempotency-Key), or a refund's id.
    pub payment_id: String,
    /// The idempotency table (the stack's IdempotencyTableName output).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    pub table: String,
}

/// Runs `payctl history`.
pub async fn history(args: HistoryArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let HistoryArgs { payment_id, table } = args;
    let (kind, record, mark) = match find(sdk, &table, &payment_id).await? {
        Found::Payment(r, m) => ("payment", r, m),
        Found::Refund(r, m) => ("refund", r, m),
        Found::Nothing => {
            bail!("{payment_id} has no record and no dead letter in {table}, as a payment or as a refund")
        }
    };
    payctl::say!("{kind} {payment_id}, in time order:");
    let mut events = payctl::status::history(record.as_ref(), mark.as_ref());
    if kind == "payment" {
        // Its refunds' events, each named, among the payment's own.
        let ddb = aws_sdk_dynamodb::Client::new(sdk);
        let after = payctl::refunds::of_payment(&ddb, &table, &payment_id)
            .await?
            .unwrap_or_default();
        let store = payctl::refunds::refund_store(&ddb, &table);
        for r in &after.refunds {
            let (record, mark) = store.record_and_mark(&r.refund_id).await?;
            for (at, what) in payctl::status::history(record.as_ref(), mark.as_ref()) {
                events.push((at, format!("refund {} ({}): {what}", r.refund_id, r.amount)));
            }
        }
        // The provider's events applied, at the time the provider created each.
        for e in &after.events {
            events.push((
                e.created * 1000,
                format!("provider event {} {}: {}", e.kind, e.event_id, e.change),
            ));
        }
        events.sort_by_key(|(at, _)| *at);
        if after.events_not_listed > 0 {
            // The record lists its first provider events and counts the rest (its size).
            events.push((
                i64::MAX,
                format!(
                    "and {} provider events applied after these, counted, not listed (the record lists the first {})",
                    after.events_not_listed,
                    payment_core::events::settlement::MAX_EVENT_NOTES
                ),
            ));
        }
    }
    for (at, what) in events {
        if at == i64::MAX {
            println!("{what}");
        } else {
            println!("{}  {what}", payctl::time::utc(at));
        }
    }
    Ok(())
}
