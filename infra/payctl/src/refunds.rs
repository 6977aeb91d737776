//! A payment's refunds as an operator reads them: each refund's reserved amount (from the
//! payment's record, where the refund ledger keeps them) with its state and provider id (from
//! the refund's own record), and the refunded total.

use anyhow::Result;
use payment_core::refund_ledger::{DynamoRefundLedger, RefundLedger};
use serde_json::{json, Value};
use sqs_once::record::{DeadLetterMark, IdempotencyRecord, RecordStatus};

/// One refund of a payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundLine {
    /// The refund's id (its idempotency key).
    pub refund_id: String,
    /// The amount reserved for it, minor units.
    pub amount: i64,
    /// Where it stands: the provider's refund status (`succeeded`, `pending`, ...) once it
    /// answered, else `in progress`, `retrying`, or `dead-lettered CODE`.
    pub state: String,
    /// The provider's refund id, once known.
    pub provider_refund_id: Option<String>,
}

/// The refunds of a payment: the refunded total and each refund. `None` when the payment has
/// no refund.
pub async fn of_payment(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    payment_id: &str,
) -> Result<Option<(i64, Vec<RefundLine>)>> {
    let ledger = DynamoRefundLedger::new(ddb.clone(), table);
    let Some(p) = ledger.payment(payment_id).await? else {
        return Ok(None);
    };
    if !p.has_refunds || p.refunds.is_empty() {
        return Ok(None);
    }
    let store = refund_store(ddb, table);
    let mut lines = Vec::new();
    for (rid, amount) in &p.refunds {
        let (record, mark) = store.record_and_mark(rid).await?;
        lines.push(RefundLine {
            refund_id: rid.clone(),
            amount: *amount,
            state: state_of(record.as_ref(), mark.as_ref()),
            provider_refund_id: record
                .as_ref()
                .and_then(|r| r.outcome.as_ref())
                .and_then(|o| o.text("provider_refund_id"))
                .map(str::to_owned),
        });
    }
    Ok(Some((p.refunded, lines)))
}

/// The refund processor's records in the idempotency table `table`.
pub fn refund_store(ddb: &aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(ddb.clone(), table, payment_core::refund_keys())
}

/// Where a refund stands, from its record and dead-letter mark.
pub fn state_of(record: Option<&IdempotencyRecord>, mark: Option<&DeadLetterMark>) -> String {
    match (record, mark) {
        (Some(r), _) if r.status == RecordStatus::Completed => r
            .outcome
            .as_ref()
            .map(|o| match o.text("code") {
                Some(code) => format!("{} ({code})", o.status),
                None => o.status.clone(),
            })
            .unwrap_or_else(|| "completed".into()),
        (Some(r), _) if r.status == RecordStatus::InProgress => "in progress".into(),
        (_, Some(m)) => format!("dead-lettered {}", m.error_code),
        (Some(_), None) => "retrying".into(),
        (None, None) => "not started".into(),
    }
}

/// The lines `payctl status` prints under a payment.
pub fn describe(total: i64, lines: &[RefundLine]) -> Vec<String> {
    let mut out = vec![format!(
        "  refunded         {total} in {} refund(s)",
        lines.len()
    )];
    for l in lines {
        out.push(format!(
            "    {}  {}  {}{}",
            l.refund_id,
            l.amount,
            l.state,
            l.provider_refund_id
                .as_deref()
                .map(|p| format!(", provider {p}"))
                .unwrap_or_default()
        ));
    }
    out
}

/// A refund's record for people: what it refunds, where it stands, and why when it failed.
pub fn describe_refund(
    id: &str,
    record: Option<&IdempotencyRecord>,
    mark: Option<&DeadLetterMark>,
) -> Vec<String> {
    let outcome = record.and_then(|r| r.outcome.as_ref());
    let text = |k: &str| outcome.and_then(|o| o.text(k)).map(str::to_owned);
    let mut out = vec![format!(
        "refund {id}: {}{}",
        state_of(record, mark),
        match (outcome.and_then(|o| o.number("amount")), text("currency")) {
            (Some(a), Some(c)) => format!(" ({a} {c})"),
            _ => String::new(),
        }
    )];
    if let Some(p) = text("payment_id") {
        out.push(format!("  of payment       {p}"));
    }
    if let Some(p) = text("provider_refund_id") {
        out.push(format!("  provider refund  {p}"));
    }
    if let Some(reason) = text("reason") {
        out.push(format!("  why              {reason}"));
    }
    if let Some(r) = record {
        out.push(format!(
            "  first attempt    {}",
            crate::time::utc(r.first_attempt_at_ms)
        ));
        if let Some(t) = r.completed_at_ms {
            out.push(format!("  completed        {}", crate::time::utc(t)));
        }
        if let Some(e) = &r.last_error {
            out.push(format!("  last error       {e}"));
        }
        if r.unknown_outcome {
            out.push("  outcome unknown  an earlier call may have refunded; the next attempt looks it up first".into());
        }
    }
    if let Some(m) = mark {
        out.push(format!(
            "  dead-lettered    {} at {}: {}",
            m.error_code,
            crate::time::utc(m.at_ms),
            m.error_message
        ));
    }
    out
}

/// The refunds as `payctl status --json` writes them.
pub fn to_json(total: i64, lines: &[RefundLine]) -> Value {
    json!({
        "refunded_amount": total,
        "refunds": lines.iter().map(|l| json!({
            "refund_id": l.refund_id,
            "amount": l.amount,
            "state": l.state,
            "provider_refund_id": l.provider_refund_id,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_line_reads_its_state_and_provider_id() {
        let lines = vec![
            RefundLine {
                refund_id: "rf-1".into(),
                amount: 500,
                state: "succeeded".into(),
                provider_refund_id: Some("re_1".into()),
            },
            RefundLine {
                refund_id: "rf-2".into(),
                amount: 1000,
                state: "in progress".into(),
                provider_refund_id: None,
            },
        ];
        let text = describe(1500, &lines).join("\n");
        assert!(
            text.contains("refunded         1500 in 2 refund(s)"),
            "{text}"
        );
        assert!(
            text.contains("rf-1  500  succeeded, provider re_1"),
            "{text}"
        );
        assert!(text.contains("rf-2  1000  in progress"), "{text}");
        let doc = to_json(1500, &lines);
        assert_eq!(doc["refunded_amount"], 1500);
        assert_eq!(doc["refunds"][0]["provider_refund_id"], "re_1");
    }
}
