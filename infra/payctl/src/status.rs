//! `payctl status` and `payctl history`: a payment's record (and its dead-letter mark) as an
//! operator reads it, with times in UTC and only the fields that mean something in the
//! record's state.

use payment_core::PaymentOutcome;
use serde_json::{json, Value};
use sqs_once::record::{DeadLetterMark, IdempotencyRecord, RecordStatus};

use crate::time::utc;

/// The whole record and mark as JSON, each time as UTC next to its epoch value.
pub fn to_json(
    id: &str,
    record: Option<&IdempotencyRecord>,
    mark: Option<&DeadLetterMark>,
) -> Value {
    let time = |ms: Option<i64>| {
        ms.filter(|t| *t > 0)
            .map(|t| json!({"utc": utc(t), "epoch_ms": t}))
    };
    let record = record.map(|r| {
        let live = r.status == RecordStatus::InProgress;
        json!({
            "status": r.status.as_str(),
            "attempts": r.attempts,
            "first_attempt_at": time(Some(r.first_attempt_at_ms)),
            "completed_at": time(r.completed_at_ms),
            "lease_owner": if live { r.lease_owner.clone() } else { None },
            "lease_expires_at": if live { time(Some(r.lease_expires_at_ms)) } else { None },
            "not_before": time(r.not_before_ms),
            "unknown_outcome": r.unknown_outcome,
            "last_error": r.last_error,
            "outcome": r.outcome,
            "payload_hash": r.payload_hash,
            "expires_at": time(Some(r.expires_at_s * 1000)),
            "trace_id": trace_id(r),
        })
    });
    let mark = mark.map(|m| {
        json!({
            "error_code": m.error_code,
            "error_message": m.error_message,
            "dead_lettered_at": time(Some(m.at_ms)),
            "payload_hash": m.payload_hash,
        })
    });
    json!({"payment_id": id, "record": record, "dead_letter": mark})
}

/// The payment's trace id, from the record's `traceparent` (none when no claim was traced).
pub fn trace_id(r: &IdempotencyRecord) -> Option<&str> {
    r.traceparent
        .as_deref()
        .and_then(sqs_once::trace::trace_id_of)
}

/// The record for people: a headline and the fields of its state.
pub fn describe(
    id: &str,
    record: Option<&IdempotencyRecord>,
    mark: Option<&DeadLetterMark>,
) -> Vec<String> {
    let mut out = Vec::new();
    match record {
        None => out.push(format!(
            "payment {id}: no record (never claimed, or the record expired after IDEMPOTENCY_TTL)"
        )),
        Some(r) => {
            let outcome = r.outcome.as_ref().map(PaymentOutcome::from_outcome);
            let what = match (&outcome, r.status) {
                (Some(o), RecordStatus::Completed) => format!(
                    "{} ({} {} {}{})",
                    r.status.as_str(),
                    o.status,
                    o.amount,
                    o.currency,
                    o.provider_payment_id
                        .as_deref()
                        .map(|p| format!(", provider {p}"))
                        .unwrap_or_default()
                ),
                _ => r.status.as_str().to_owned(),
            };
            out.push(format!(
                "payment {id}: {what}, {} attempt{}",
                r.attempts,
                if r.attempts == 1 { "" } else { "s" }
            ));

            out.push(format!("  first attempt    {}", utc(r.first_attempt_at_ms)));
            if let Some(t) = r.completed_at_ms {
                out.push(format!("  completed        {}", utc(t)));
            }
            if let Some(o) = outcome.as_ref() {
                if let Some(code) = &o.decline_code {
                    out.push(format!("  decline code     {code}"));
                }
                if o.label() == Some(payment_core::payments::charge::labels::REQUIRES_ACTION) {
                    out.push(format!(
                        "  merchant must    {}",
                        payment_core::payments::charge::requires_action_hint(
                            o.provider_payment_id.as_deref()
                        )
                    ));
                } else if let Some(reason) = &o.reason {
                    out.push(format!("  provider said    {reason}"));
                }
            }
            if r.status == RecordStatus::InProgress {
                out.push(format!(
                    "  held by          {} until {}",
                    r.lease_owner.as_deref().unwrap_or("?"),
                    utc(r.lease_expires_at_ms)
                ));
            }
            if let Some(e) = &r.last_error {
                out.push(format!("  last error       {e}"));
            }
            if r.unknown_outcome {
                out.push("  outcome unknown  an earlier call may have charged; the next attempt looks it up first (payctl reconcile settles it now)".into());
            }
            if let Some(t) = r.not_before_ms {
                out.push(format!("  no claim before  {}", utc(t)));
            }
            out.push(format!("  record expires   {}", utc(r.expires_at_s * 1000)));
            if let Some(t) = trace_id(r) {
                // The traceparent's flags: a trace TracesSampleRatio left out has no spans.
                let sampled = r
                    .traceparent
                    .as_deref()
                    .and_then(|tp| tp.rsplit('-').next())
                    .and_then(|flags| u8::from_str_radix(flags, 16).ok())
                    .is_some_and(|flags| flags & 1 == 1);
                out.push(format!(
                    "  trace id         {t}{}",
                    if sampled {
                        ""
                    } else {
                        " (not sampled: no spans were recorded)"
                    }
                ));
            }
        }
    }
    if let Some(m) = mark {
        out.push(format!(
            "  dead-lettered    {} at {}: {}",
            m.error_code,
            utc(m.at_ms),
            m.error_message
        ));
        out.push(
            "                   (payctl dlq show with its source message id shows the dead letter)"
                .into(),
        );
    }
    out
}

/// What happened to the payment, in time order, from the record's fields and the mark.
pub fn history(
    record: Option<&IdempotencyRecord>,
    mark: Option<&DeadLetterMark>,
) -> Vec<(i64, String)> {
    let mut events = Vec::new();
    if let Some(r) = record {
        events.push((r.first_attempt_at_ms, "first claimed".to_owned()));
        if r.attempts > 1 {
            let after = r
                .last_error
                .as_deref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default();
            events.push((
                r.first_attempt_at_ms,
                format!("claimed {} times in all{after}", r.attempts),
            ));
        }
        if let Some(t) = r.not_before_ms {
            events.push((
                t,
                "the last uncertain call could land at the provider until here".to_owned(),
            ));
        }
        match (r.status, &r.outcome, r.completed_at_ms) {
            (RecordStatus::Completed, Some(o), Some(t)) => {
                events.push((t, format!("completed: {}", o.status)))
            }
            (RecordStatus::InProgress, _, _) => events.push((
                r.lease_expires_at_ms,
                "held by an attempt whose lease ends here".to_owned(),
            )),
            (RecordStatus::Failed, _, _) => events.push((
                r.lease_expires_at_ms,
                format!(
                    "failed, to be retried{}",
                    if r.unknown_outcome {
                        " (outcome unknown)"
                    } else {
                        ""
                    }
                ),
            )),
            _ => {}
        }
    }
    if let Some(m) = mark {
        events.push((
            m.at_ms,
            format!("dead-lettered: {}: {}", m.error_code, m.error_message),
        ));
    }
    events.sort_by_key(|(t, _)| *t);
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: RecordStatus) -> IdempotencyRecord {
        IdempotencyRecord {
            traceparent: None,
            key: "p1".into(),
            status,
            payload_hash: "h".into(),
            lease_owner: Some("owner-1".into()),
            lease_expires_at_ms: 1_796_100_060_000,
            attempts: 2,
            outcome: (status == RecordStatus::Completed).then(|| {
                PaymentOutcome {
                    status: "succeeded".into(),
                    provider_payment_id: Some("pi_1".into()),
                    decline_code: None,
                    amount: 1999,
                    currency: "usd".into(),
                    reason: None,
                }
                .to_outcome()
            }),
            expires_at_s: 1_797_900_000,
            first_attempt_at_ms: 1_796_100_000_000,
            unknown_outcome: false,
            last_error: Some("provider 503".into()),
            completed_at_ms: (status == RecordStatus::Completed).then_some(1_796_100_030_000),
            not_before_ms: None,
        }
    }

    #[test]
    fn a_completed_record_reads_in_utc_without_its_old_lease() {
        let mut r = record(RecordStatus::Completed);
        r.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        let text = describe("p1", Some(&r), None).join("\n");
        assert!(
            text.contains("trace id         4bf92f3577b34da6a3ce929d0e0e4736"),
            "{text}"
        );
        assert!(
            text.contains("COMPLETED (succeeded 1999 usd, provider pi_1), 2 attempts"),
            "{text}"
        );
        assert!(
            text.contains("completed        2026-12-01T04:40:30.000Z"),
            "{text}"
        );
        assert!(
            !text.contains("owner-1"),
            "no lease owner on a completed record: {text}"
        );
        let j = to_json("p1", Some(&r), None);
        assert_eq!(
            j["record"]["completed_at"]["utc"],
            "2026-12-01T04:40:30.000Z"
        );
        assert!(j["record"]["lease_owner"].is_null());
        assert_eq!(j["record"]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        r.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".into());
        assert!(describe("p1", Some(&r), None)
            .join("\n")
            .contains("4bf92f3577b34da6a3ce929d0e0e4736 (not sampled"));
        let h = history(Some(&r), None);
        assert_eq!(h.first().map(|e| e.1.as_str()), Some("first claimed"));
        assert_eq!(h.last().map(|e| e.1.as_str()), Some("completed: succeeded"));
    }

    #[test]
    fn a_payment_that_needs_the_customer_says_what_the_merchant_must_do() {
        let mut r = record(RecordStatus::Completed);
        r.outcome = Some(
            PaymentOutcome {
                status: "requires_action".into(),
                provider_payment_id: Some("pi_3ds".into()),
                decline_code: Some("authentication_required".into()),
                amount: 1999,
                currency: "usd".into(),
                reason: None,
            }
            .to_outcome(),
        );
        let text = describe("p1", Some(&r), None).join("\n");
        assert!(
            text.contains("merchant must")
                && text.contains("on-session to confirm PaymentIntent pi_3ds"),
            "{text}"
        );
    }

    #[test]
    fn no_record_but_a_dead_letter_says_so() {
        let mark = DeadLetterMark {
            key: "p1".into(),
            payload_hash: "h".into(),
            error_code: "request_expired".into(),
            error_message: "too old".into(),
            at_ms: 1_796_100_000_000,
            expires_at_s: 0,
        };
        let text = describe("p1", None, Some(&mark)).join("\n");
        assert!(text.contains("no record"), "{text}");
        assert!(
            text.contains("dead-lettered    request_expired at 2026-12-01T04:40:00.000Z: too old"),
            "{text}"
        );
        let live = record(RecordStatus::InProgress);
        assert!(describe("p1", Some(&live), None)
            .join("\n")
            .contains("held by          owner-1"));
    }
}
