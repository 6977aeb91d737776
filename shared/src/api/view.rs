//! A payment after its charge as people read it (`GET /v1/payments/{id}`, `payctl status`):
//! its refunds (each refund's amount from the payment's record, where the ledger keeps the
//! reservations and those given back, with its state and provider id from the refund's own
//! record, and the refunded total), its disputes and what they hold, and the provider's
//! events applied to it.

use serde::Serialize;
use sqs_once::record::{DeadLetterMark, IdempotencyRecord, RecordStatus, StoreError};

use crate::events::settlement::EventNote;

/// One refund of a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefundView {
    /// The refund's id (its idempotency key).
    pub refund_id: String,
    /// Its amount, minor units: reserved (counted in `refunded_amount`), or given back when
    /// the refund moved no money (`failed`, `canceled`, refused).
    pub amount: i64,
    /// Where it stands: the provider's refund status (`succeeded`, `pending`, `failed`, ...)
    /// once it answered, else `in_progress`, `retrying`, `dead_lettered` (see `error_code`) or
    /// `not_started`.
    pub state: String,
    /// The provider's refund id, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_refund_id: Option<String>,
    /// The dead letter's code, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

/// One dispute of a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DisputeView {
    /// `dp_...`.
    pub dispute_id: String,
    /// Its status as the last event applied said.
    pub status: String,
    /// Minor units.
    pub amount: i64,
}

/// One of the provider's events applied to the payment or its refunds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventView {
    /// `evt_...`.
    pub event_id: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Unix seconds the provider created it.
    pub created: i64,
    /// What it changed.
    pub change: String,
}

impl From<EventNote> for EventView {
    fn from(n: EventNote) -> Self {
        Self {
            event_id: n.event_id,
            kind: n.kind,
            created: n.created,
            change: n.change,
        }
    }
}

/// A payment after its charge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AfterCharge {
    /// The total reserved by its refunds, minor units.
    pub refunded_amount: i64,
    /// Each refund, by id.
    pub refunds: Vec<RefundView>,
    /// What its open and lost disputes hold, minor units: not refundable.
    pub disputed_amount: i64,
    /// Each dispute, by id.
    pub disputes: Vec<DisputeView>,
    /// The provider's events applied, oldest first: the first
    /// [`crate::events::settlement::MAX_EVENT_NOTES`] the record lists.
    pub events: Vec<EventView>,
    /// The events applied past those listed (counted only, so that the record stays within
    /// DynamoDB's item size).
    pub events_not_listed: i64,
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

/// The payment `payment_id` after its charge, from its record in the idempotency table
/// `table` (one read) and its refunds' records; `None` when nothing happened after it (no
/// refund, dispute or event).
pub async fn after_charge_of(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    payment_id: &str,
) -> Result<Option<AfterCharge>, StoreError> {
    let payments = crate::payments::payment_store(client.clone(), table);
    let out = client
        .get_item()
        .table_name(table)
        .key(
            payments.layout().attribute.clone(),
            payments.record_key(payment_id),
        )
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| {
            StoreError::Unavailable(aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string())
        })?;
    let Some(item) = out.item() else {
        return Ok(None);
    };
    let reserved = crate::refunds::ledger::reservations_of(item);
    let released = crate::refunds::ledger::released_of(item);
    let disputes = crate::events::settlement::disputes_of(item);
    let mut events = crate::events::settlement::events_of(item);
    if reserved.is_empty() && released.is_empty() && disputes.is_empty() && events.is_empty() {
        return Ok(None);
    }
    let store = crate::refunds::refund_store(client.clone(), table);
    let mut refunds = Vec::new();
    for (rid, amount) in reserved.iter().chain(released.iter()) {
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
    refunds.sort_by(|a, b| a.refund_id.cmp(&b.refund_id));
    events.sort_by_key(|e| e.created);
    Ok(Some(AfterCharge {
        refunded_amount: sqs_once::dynamo::get_n(item, "refunded_amount").unwrap_or(0),
        refunds,
        disputed_amount: sqs_once::dynamo::get_n(item, "disputed_amount").unwrap_or(0),
        disputes: disputes
            .into_iter()
            .map(|(dispute_id, (status, amount))| DisputeView {
                dispute_id,
                status,
                amount,
            })
            .collect(),
        events: events.into_iter().map(EventView::from).collect(),
        events_not_listed: sqs_once::dynamo::get_n(item, crate::events::settlement::UNLISTED)
            .unwrap_or(0),
    }))
}
