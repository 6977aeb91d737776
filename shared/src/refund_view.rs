//! A payment's refunds as people read them (`GET /v1/payments/{id}`, `payctl status`): each
//! refund's reserved amount from the payment's record, with its state and provider id from the
//! refund's own record, and the refunded total.

use serde::Serialize;
use sqs_once::record::{DeadLetterMark, IdempotencyRecord, RecordStatus, StoreError};

use crate::refund_ledger::{DynamoRefundLedger, RefundLedger};

/// One refund of a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefundView {
    /// The refund's id (its idempotency key).
    pub refund_id: String,
    /// The amount reserved for it, minor units.
    pub amount: i64,
    /// Where it stands: the provider's refund status (`succeeded`, `pending`, ...) once it
    /// answered, else `in_progress`, `retrying`, `dead_lettered` (see `error_code`) or
    /// `not_started`.
    pub state: String,
    /// The provider's refund id, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_refund_id: Option<String>,
    /// The dead letter's code, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

/// A payment's refunds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Refunds {
    /// The total reserved by its refunds, minor units.
    pub refunded_amount: i64,
    /// Each refund, by id.
    pub refunds: Vec<RefundView>,
}

/// Where a refund stands, from its record and dead-letter mark.
pub fn state_of(record: Option<&IdempotencyRecord>, mark: Option<&DeadLetterMark>) -> String {
    match (record, mark) {
        (Some(r), _) if r.status == RecordStatus::Completed => r
            .outcome
            .as_ref()
            .map(|o| o.status.clone())
            .unwrap_or_else(|| "completed".into()),
        (Some(r), _) if r.status == RecordStatus::InProgress => "in_progress".into(),
        (_, Some(_)) => "dead_lettered".into(),
        (Some(_), None) => "retrying".into(),
        (None, None) => "not_started".into(),
    }
}

/// The refunds of a payment in the idempotency table `table`; `None` when it has none.
pub async fn refunds_of(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    payment_id: &str,
) -> Result<Option<Refunds>, StoreError> {
    let ledger = DynamoRefundLedger::new(client.clone(), table);
    let Some(p) = ledger.payment(payment_id).await? else {
        return Ok(None);
    };
    if p.refunds.is_empty() {
        return Ok(None);
    }
    let store = crate::refund_store(client.clone(), table);
    let mut refunds = Vec::new();
    for (rid, amount) in &p.refunds {
        let (record, mark) = store.record_and_mark(rid).await?;
        refunds.push(RefundView {
            refund_id: rid.clone(),
            amount: *amount,
            state: state_of(record.as_ref(), mark.as_ref()),
            provider_refund_id: record
                .as_ref()
                .and_then(|r| r.outcome.as_ref())
                .and_then(|o| o.text("provider_refund_id"))
                .map(str::to_owned),
            error_code: mark.map(|m| m.error_code),
        });
    }
    Ok(Some(Refunds {
        refunded_amount: p.refunded,
        refunds,
    }))
}
