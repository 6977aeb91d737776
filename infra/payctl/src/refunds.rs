//! A payment after its charge as an operator reads it: each refund's amount (from the
//! payment's record, where the refund ledger keeps them) with its state and provider id (from
//! the refund's own record), the refunded total, its disputes, and the provider's events
//! applied.

use anyhow::Result;
use payment_core::api::view::{state_of, AfterCharge, RefundView};
use serde_json::{json, Value};
use sqs_once::record::{DeadLetterMark, IdempotencyRecord};

/// What happened to a payment after its charge (`None` when nothing did), as
/// `GET /v1/payments/{id}` reads it.
pub async fn of_payment(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    payment_id: &str,
) -> Result<Option<AfterCharge>> {
    Ok(payment_core::api::view::after_charge_of(ddb, table, payment_id).await?)
}

/// The refund processor's records in the idempotency table `table`.
pub fn refund_store(ddb: &aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    payment_core::refund_store(ddb.clone(), table)
}

/// A refund's state with its dead letter's code, as a line says it.
fn state_line(v: &RefundView) -> String {
    match &v.error_code {
        Some(code) => format!("{} {code}", v.state),
        None => v.state.clone(),
    }
}

/// The lines `payctl status` prints under a payment.
pub fn describe(after: &AfterCharge) -> Vec<String> {
    let mut out = Vec::new();
    if !after.refunds.is_empty() {
        out.push(format!(
            "  refunded         {} in {} refund(s)",
            after.refunded_amount,
            after.refunds.len()
        ));
    }
    for l in &after.refunds {
        out.push(format!(
            "    {}  {}  {}{}",
            l.refund_id,
            l.amount,
            state_line(l),
            l.provider_refund_id
                .as_deref()
                .map(|p| format!(", provider {p}"))
                .unwrap_or_default()
        ));
    }
    if !after.disputes.is_empty() {
        out.push(format!(
            "  disputed         {} held from refunds",
            after.disputed_amount
        ));
    }
    for d in &after.disputes {
        out.push(format!("    {}  {}  {}", d.dispute_id, d.amount, d.status));
    }
    if after.events_not_listed > 0 {
        out.push(format!(
            "  provider events  {} applied (payctl history lists the first {}; the record counts the rest)",
            after.events.len() as i64 + after.events_not_listed,
            after.events.len()
        ));
    } else if !after.events.is_empty() {
        out.push(format!(
            "  provider events  {} applied (payctl history lists them)",
            after.events.len()
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
    let state = match (state_of(record, mark).as_str(), mark) {
        ("dead_lettered", Some(m)) => format!("dead_lettered {}", m.error_code),
        (s, _) => s.to_owned(),
    };
    let mut out = vec![format!(
        "refund {id}: {state}{}",
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

/// What happened after the charge as `payctl status --json` writes it: as
/// `GET /v1/payments/{id}` does.
pub fn to_json(after: &AfterCharge) -> Value {
    let mut v = json!({});
    if !after.refunds.is_empty() {
        v["refunded_amount"] = json!(after.refunded_amount);
        v["refunds"] = json!(after.refunds);
    }
    if !after.disputes.is_empty() {
        v["disputed_amount"] = json!(after.disputed_amount);
        v["disputes"] = json!(after.disputes);
    }
    if !after.events.is_empty() {
        v["events"] = json!(after.events);
    }
    if after.events_not_listed > 0 {
        v["events_not_listed"] = json!(after.events_not_listed);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_line_reads_its_state_and_provider_id() {
        let refunds = AfterCharge {
            refunded_amount: 1500,
            refunds: vec![
                RefundView {
                    refund_id: "rf-1".into(),
                    amount: 500,
                    state: "succeeded".into(),
                    provider_refund_id: Some("re_1".into()),
                    error_code: None,
                },
                RefundView {
                    refund_id: "rf-2".into(),
                    amount: 1000,
                    state: "dead_lettered".into(),
                    provider_refund_id: None,
                    error_code: Some("outcome_unknown".into()),
                },
            ],
            disputed_amount: 700,
            disputes: vec![payment_core::api::view::DisputeView {
                dispute_id: "dp_1".into(),
                status: "needs_response".into(),
                amount: 700,
            }],
            events: Vec::new(),
            events_not_listed: 0,
        };
        let text = describe(&refunds).join("\n");
        assert!(
            text.contains("disputed         700 held from refunds"),
            "{text}"
        );
        assert!(text.contains("dp_1  700  needs_response"), "{text}");
        assert!(
            text.contains("refunded         1500 in 2 refund(s)"),
            "{text}"
        );
        assert!(
            text.contains("rf-1  500  succeeded, provider re_1"),
            "{text}"
        );
        assert!(
            text.contains("rf-2  1000  dead_lettered outcome_unknown"),
            "{text}"
        );
        let doc = to_json(&refunds);
        assert_eq!(doc["refunded_amount"], 1500);
        assert_eq!(doc["refunds"][0]["provider_refund_id"], "re_1");
        assert_eq!(doc["disputes"][0]["status"], "needs_response");
        assert!(doc.get("events").is_none(), "no events, no field");
        assert!(
            doc.get("events_not_listed").is_none(),
            "all listed, no field"
        );
        let more = to_json(&AfterCharge {
            events_not_listed: 7,
            ..refunds
        });
        assert_eq!(more["events_not_listed"], 7);
    }
}
