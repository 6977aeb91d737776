//! `payctl reconcile` for refunds: a refund's record left unsettled (`FAILED`, or
//! `IN_PROGRESS` past its lease) is settled from the refunds the provider holds for its
//! payment's PaymentIntent (a list: no search lag), with the same conditional write as a
//! payment's. A refund the provider holds as failed or canceled is settled here too, as
//! `refund_failed`, and its reservation given back in the same transaction, conditional on the
//! record being unheld and the reservation being the one read: a redrive of its message could
//! not do it within the provider's key retention (its call would replay the refund's first
//! answer, `pending`). Never refunds anything.

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use payment_core::provider::RefundProvider;
use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
use sqs_once::record::{IdempotencyRecord, IdempotencyStore, Outcome, RecordStatus, StoreError};
use sqs_once::runner::now_ms;

/// What reconcile did with one refund.
#[derive(Debug, Clone, PartialEq)]
pub enum RefundAction {
    /// The table has no record for the refund id.
    NoRecord,
    /// Already `COMPLETED`: nothing to settle.
    AlreadyCompleted(Outcome),
    /// A processor holds it, or an earlier call may still land, until this epoch ms.
    Held(i64),
    /// No payment holds a reservation for it: it never reached the provider.
    NoReservation,
    /// The record now holds the refund the provider holds.
    Settled(Outcome),
    /// The provider holds it as failed or canceled: settled as `refund_failed`, and what the
    /// payment held for it given back.
    FailedAtProvider {
        /// The provider's refund id.
        provider_refund_id: String,
        /// `failed` or `canceled`.
        status: String,
        /// The amount given back to the payment (`None`: it held none any more).
        released: Option<i64>,
    },
    /// The provider holds no refund for it: none was made.
    NothingAtProvider {
        /// The payment whose reservation it holds.
        payment_id: String,
    },
}

impl RefundAction {
    /// Settled (or already): nothing left for a later run or an operator.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            RefundAction::AlreadyCompleted(_)
                | RefundAction::Settled(_)
                | RefundAction::FailedAtProvider { .. }
        )
    }
}

/// The payment whose record holds a reservation for `refund_id`.
async fn reserving_payment(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    refund_id: &str,
) -> Result<Option<String>> {
    let prefix = payment_core::payment_keys().record_prefix;
    let mut start: Option<std::collections::HashMap<String, AttributeValue>> = None;
    loop {
        let out = ddb
            .scan()
            .table_name(table)
            .filter_expression("begins_with(pk, :p) AND attribute_exists(refunds.#r)")
            .expression_attribute_names("#r", refund_id)
            .expression_attribute_values(":p", AttributeValue::S(prefix.clone()))
            .projection_expression("pk")
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .context("scanning the idempotency table for the refund's payment")?;
        if let Some(pk) = out
            .items()
            .iter()
            .find_map(|i| i.get("pk").and_then(|v| v.as_s().ok()))
        {
            return Ok(pk.strip_prefix(&prefix).map(str::to_owned));
        }
        match out.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Ok(None),
        }
    }
}

/// Reconciles one refund.
pub async fn reconcile_refund(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    provider: &dyn RefundProvider,
    refund_id: &str,
    refund_window: std::time::Duration,
) -> Result<RefundAction> {
    let refunds = crate::refunds::refund_store(ddb, table);
    let Some(record) = refunds.get(refund_id).await? else {
        return Ok(RefundAction::NoRecord);
    };
    if let Some(held) = unsettleable(&record, now_ms())? {
        return Ok(held);
    }
    let Some(payment_id) = reserving_payment(ddb, table, refund_id).await? else {
        return Ok(RefundAction::NoReservation);
    };
    let payment = DynamoRefundLedger::new(ddb.clone(), table)
        .payment(&payment_id)
        .await?
        .with_context(|| format!("the payment {payment_id} of refund {refund_id} has no record"))?;
    let charge = payment
        .outcome
        .as_ref()
        .filter(|o| o.is_charge())
        .with_context(|| {
            format!("the payment {payment_id} of refund {refund_id} holds no charge")
        })?;
    let intent = charge
        .provider_payment_id
        .clone()
        .context("the payment's charge has no PaymentIntent id")?;
    let found = provider
        .find_refunds(&intent)
        .await
        .with_context(|| format!("listing the refunds of {intent} at the provider"))?;
    let Some(f) = found
        .into_iter()
        .find(|f| f.refund_id.as_deref() == Some(refund_id))
    else {
        return Ok(RefundAction::NothingAtProvider { payment_id });
    };
    let now = now_ms();
    let keep = (now / 1000 + refund_window.as_secs() as i64)
        .max(record.expires_at_s)
        .max(payment.expires_at_s);
    if matches!(f.status.as_str(), "failed" | "canceled") {
        let held = payment.refunds.get(refund_id).copied();
        let outcome = Outcome::new("rejected")
            .with_text("code", "refund_failed")
            .with_text(
                "reason",
                format!(
                    "the provider holds refund {} as {}: no money moved (settled by payctl reconcile)",
                    f.provider_refund_id, f.status
                ),
            )
            .with_text("provider_refund_id", &f.provider_refund_id)
            .with_text("payment_id", &payment_id);
        let ledger = DynamoRefundLedger::new(ddb.clone(), table);
        if ledger
            .settle_failed(refund_id, &payment_id, held, &outcome, now, keep)
            .await?
        {
            return Ok(RefundAction::FailedAtProvider {
                provider_refund_id: f.provider_refund_id,
                status: f.status,
                released: held,
            });
        }
        // A processor claimed it, or the reservation moved, between the reads and the write.
        return match refunds.get(refund_id).await? {
            Some(r) => Ok(
                unsettleable(&r, now_ms())?.unwrap_or(RefundAction::Held(r.lease_expires_at_ms))
            ),
            None => Ok(RefundAction::NoRecord),
        };
    }
    let outcome = Outcome::new(f.status)
        .with_text("provider_refund_id", f.provider_refund_id)
        .with_text("payment_id", &payment_id)
        .with_number("amount", f.amount)
        .with_text("currency", &charge.currency);
    // A refund the provider holds can still fail for weeks: kept as a completion keeps it.
    match refunds.settle(refund_id, &outcome, now, Some(keep)).await {
        Ok(()) => Ok(RefundAction::Settled(outcome)),
        // A processor claimed it between the read and the write: it will finish it.
        Err(StoreError::LeaseLost) => match refunds.get(refund_id).await? {
            Some(r) => Ok(
                unsettleable(&r, now_ms())?.unwrap_or(RefundAction::Held(r.lease_expires_at_ms))
            ),
            None => Ok(RefundAction::NoRecord),
        },
        Err(e) => Err(e.into()),
    }
}

/// What a record that reconcile must leave alone is, or `None` when it may be settled.
fn unsettleable(record: &IdempotencyRecord, now: i64) -> Result<Option<RefundAction>> {
    Ok(match record.status {
        RecordStatus::Completed => Some(RefundAction::AlreadyCompleted(
            record
                .outcome
                .clone()
                .context("a COMPLETED record without an outcome")?,
        )),
        RecordStatus::InProgress if record.lease_expires_at_ms >= now => {
            Some(RefundAction::Held(record.lease_expires_at_ms))
        }
        _ => record
            .not_before_ms
            .filter(|t| *t >= now)
            .map(RefundAction::Held),
    })
}

/// One line an operator reads: what was done, and what to do next.
pub fn describe(refund_id: &str, action: &RefundAction, now: i64) -> String {
    match action {
        RefundAction::NoRecord => format!("refund {refund_id}: no record in the table; nothing to settle"),
        RefundAction::AlreadyCompleted(o) => {
            format!("refund {refund_id}: already COMPLETED ({}); nothing to do", o.status)
        }
        RefundAction::Held(until) => format!(
            "refund {refund_id}: left alone: a processor holds it or an earlier call may still land, for {} s more",
            ((until - now).max(0) as u64).div_ceil(1000)
        ),
        RefundAction::NoReservation => format!(
            "refund {refund_id}: no payment holds a reservation for it, so it never reached the provider; a redrive of its message processes it"
        ),
        RefundAction::Settled(o) => format!(
            "refund {refund_id}: settled from the provider: COMPLETED, {} {}; a redrive of its message is acknowledged as a duplicate",
            o.status,
            o.text("provider_refund_id").unwrap_or("-")
        ),
        RefundAction::FailedAtProvider {
            provider_refund_id,
            status,
            released,
        } => format!(
            "refund {refund_id}: the provider holds {provider_refund_id} as {status}: no money moved; settled as refund_failed{}; send a new refund_id to refund again (its dead letters, and the refund's events, change nothing more when redriven)",
            released.map_or_else(
                || ", the payment held nothing for it any more".to_owned(),
                |a| format!(", {a} given back to the payment")
            )
        ),
        RefundAction::NothingAtProvider { payment_id } => format!(
            "refund {refund_id}: the provider holds no refund of payment {payment_id} for it (none was made); record left unsettled: a redrive of its message refunds it once (a call the provider answered with an error it replays for the key, for 24 h, ends unknown again: then redrive after that)"
        ),
    }
}

/// The refund ids `--all-unknown` covers: every refund record that
/// [`crate::reconcile::needs_reconciling`].
pub async fn unsettled_refund_ids(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<Vec<String>> {
    crate::reconcile::unsettled_keys(ddb, &crate::refunds::refund_store(ddb, table)).await
}
