//! Checking a finished run from the outside: the provider's ledger, the idempotency table and
//! the dead-letter queue, never the processor's own counters.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, Result};
use sqs_once::record::{IdempotencyRecord, RecordStatus};

use crate::load::{Expect, Planned};
use crate::sim::Ledger;
pub use payctl::records::{scan_records, scan_records_of};

/// A message that was sent, with its SQS message id.
#[derive(Debug, Clone)]
pub struct Sent {
    /// What was sent and what it should end as.
    pub planned: Planned,
    /// The id SQS gave it, or for a payment accepted by the API (whose message the relay
    /// sent) [`OUTBOX_SENT`] followed by the payment id.
    pub message_id: String,
}

/// The message id prefix of a payment accepted by the API: its dead letters are found by the
/// payment id in their body.
pub const OUTBOX_SENT: &str = "outbox:";

/// A dead letter as read back from the DLQ.
#[derive(Debug, Clone)]
pub struct DeadLetterSeen {
    /// `error_code`, or `max_receives` for a message SQS moved after `maxReceiveCount`.
    pub error_code: String,
    /// `source_message_id` (or the message's own id when SQS moved it).
    pub source_message_id: String,
    /// The body.
    pub body: String,
}

/// Receives (and deletes) every message of the DLQ.
pub async fn drain_dlq(sqs: &aws_sdk_sqs::Client, dlq_url: &str) -> Result<Vec<DeadLetterSeen>> {
    let mut out = Vec::new();
    let mut empty = 0;
    while empty < 2 {
        let r = sqs
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(10)
            .wait_time_seconds(0)
            .message_attribute_names("All")
            .send()
            .await
            .context("reading the DLQ")?;
        if r.messages().is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        for m in r.messages() {
            let attr = |k: &str| {
                m.message_attributes()
                    .and_then(|a| a.get(k))
                    .and_then(|v| v.string_value())
                    .map(str::to_owned)
            };
            out.push(DeadLetterSeen {
                error_code: attr("error_code").unwrap_or_else(|| "max_receives".to_owned()),
                source_message_id: attr("source_message_id")
                    .unwrap_or_else(|| m.message_id().unwrap_or_default().to_owned()),
                body: m.body().unwrap_or_default().to_owned(),
            });
            sqs.delete_message()
                .queue_url(dlq_url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await
                .context("deleting from the DLQ")?;
        }
    }
    Ok(out)
}

/// Totals by currency, each in its own units: `1234.50 usd + 12000 jpy` (never one sum of
/// different currencies).
pub fn money(amounts: &BTreeMap<String, i64>) -> String {
    if amounts.is_empty() {
        return "nothing".into();
    }
    amounts
        .iter()
        .map(|(currency, minor)| payment_core::domain::limits::display(*minor, currency))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Every delivery of a drain in exactly one bucket: each label done, duplicates, dead letters,
/// handed back; and their sum, which is the deliveries received when nothing was lost.
pub fn buckets(summary: &sqs_once::BatchSummary) -> (String, u32) {
    let mut parts: Vec<(String, u32)> = summary
        .done
        .iter()
        .map(|(label, n)| (label.clone(), *n))
        .collect();
    parts.push(("duplicates".into(), summary.duplicates));
    parts.push(("dead-lettered".into(), summary.dead_lettered_total()));
    parts.push(("handed back".into(), summary.retried));
    let sum = parts.iter().map(|(_, n)| n).sum();
    let text = parts
        .iter()
        .map(|(l, n)| format!("{n} {l}"))
        .collect::<Vec<_>>()
        .join(" + ");
    (text, sum)
}

/// The verdict of a run.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Distinct valid payments that were charged (ledger).
    pub charged: usize,
    /// What they were charged, minor units by currency (ledger).
    pub charged_amounts: BTreeMap<String, i64>,
    /// Payments charged more than once (ledger). Must be 0.
    pub double_charged: usize,
    /// Declines recorded.
    pub declined: usize,
    /// Payments recorded as `requires_action` (the card needs the customer), none charged.
    pub requires_action: usize,
    /// Valid copies beyond the first of each payment: each suppressed, not charged.
    pub duplicates_suppressed: usize,
    /// DLQ messages by code.
    pub dead_lettered: BTreeMap<String, usize>,
    /// Messages accounted for: completed (their payment's record is `COMPLETED`) or in the DLQ
    /// with a reason. Equal to the messages sent when nothing is lost.
    pub accounted: usize,
    /// Of those, messages whose payment completed.
    pub accounted_completed: usize,
    /// Of those, messages found in the DLQ.
    pub accounted_dead_lettered: usize,
    /// Valid payments dead-lettered unsettled (`outcome_unknown`, `retries_exhausted`) whose
    /// record agrees with the provider: no charge, record not completed. Each is for
    /// `payctl reconcile` or a redrive; a charge the record does not show is a violation.
    pub unsettled_checked: usize,
    /// Everything that breaks exactly-once or loses a message.
    pub violations: Vec<String>,
}

impl Verdict {
    /// Prints the counts every run reports (the demo, the chaos checker, the e2e check).
    pub fn print_counts(&self, sent: usize) {
        println!("messages sent:            {sent}");
        println!(
            "messages accounted for:   {} = {} completed + {} dead-lettered",
            self.accounted, self.accounted_completed, self.accounted_dead_lettered
        );
        println!(
            "payments charged once:    {} ({})",
            self.charged,
            money(&self.charged_amounts)
        );
        println!("double charges:           {}", self.double_charged);
        println!("declined (recorded):      {}", self.declined);
        println!(
            "requires_action:          {} (the customer must authenticate; nothing charged)",
            self.requires_action
        );
        println!("duplicates suppressed:    {}", self.duplicates_suppressed);
        for (code, n) in &self.dead_lettered {
            println!("dead-lettered {code:<24} {n}");
        }
        println!(
            "unsettled, checked:       {} (dead-lettered outcome_unknown / retries_exhausted, no charge at the provider)",
            self.unsettled_checked
        );
    }

    /// Prints the first violations, one a line.
    pub fn print_violations(&self, most: usize) {
        for v in self.violations.iter().take(most) {
            println!("  - {v}");
        }
    }
}

/// Checks every sent message against the ledger, the table and the DLQ.
pub fn verify(
    sent: &[Sent],
    ledger: &Ledger,
    records: &HashMap<String, IdempotencyRecord>,
    dlq: &[DeadLetterSeen],
    queue_depth: i64,
) -> Verdict {
    let mut v = Verdict::default();
    // Payments dead-lettered unsettled: their record may stay FAILED, but it must agree with
    // the provider's ledger (checked below like every other payment).
    let unknown: HashSet<String> = dlq
        .iter()
        .filter(|d| {
            matches!(
                d.error_code.as_str(),
                "outcome_unknown" | "retries_exhausted"
            )
        })
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(&d.body).ok())
        .filter_map(|b| {
            b.get("payment_id")
                .and_then(|p| p.as_str())
                .map(str::to_owned)
        })
        .collect();
    let mut bad = |s: String| v.violations.push(s);
    if queue_depth != 0 {
        bad(format!(
            "the source queue still holds {queue_depth} messages"
        ));
    }
    let in_dlq: HashMap<&str, &DeadLetterSeen> = dlq
        .iter()
        .map(|d| (d.source_message_id.as_str(), d))
        .collect();
    let by_payment: HashMap<String, &DeadLetterSeen> = dlq
        .iter()
        .filter_map(|d| {
            let body = serde_json::from_str::<serde_json::Value>(&d.body).ok()?;
            Some((body.get("payment_id")?.as_str()?.to_owned(), d))
        })
        .collect();
    // Through the API the relay sent the message: its dead letter is found by its payment.
    let letter_of = |s: &Sent| match s.message_id.strip_prefix(OUTBOX_SENT) {
        Some(id) => by_payment.get(id).copied(),
        None => in_dlq.get(s.message_id.as_str()).copied(),
    };
    for d in dlq {
        *v.dead_lettered.entry(d.error_code.clone()).or_default() += 1;
    }
    // The first valid payload of each payment id decides what the payment is.
    let mut payments: BTreeMap<&str, &Planned> = BTreeMap::new();
    let mut valid_copies = 0usize;
    for s in sent {
        let p = &s.planned;
        match (&p.expect, &p.payment_id) {
            (Expect::Invalid(code), _) => match in_dlq.get(s.message_id.as_str()) {
                Some(d) if d.error_code == *code => {}
                Some(d) => bad(format!(
                    "message {} dead-lettered as {} instead of {code}",
                    s.message_id, d.error_code
                )),
                None => bad(format!(
                    "malformed message {} ({code}) is not in the DLQ: lost",
                    s.message_id
                )),
            },
            (Expect::KeyReused, _) => match in_dlq.get(s.message_id.as_str()) {
                Some(d) if d.error_code == "idempotency_key_reused" => {}
                Some(d) => bad(format!(
                    "key-reuse message {} dead-lettered as {}",
                    s.message_id, d.error_code
                )),
                None => bad(format!(
                    "key-reuse message {} is not in the DLQ: lost or charged",
                    s.message_id
                )),
            },
            (_, Some(id)) => {
                valid_copies += 1;
                payments.entry(id.as_str()).or_insert(p);
                // Every copy of a rejected payment ends in the DLQ with the reason (or as
                // outcome_unknown, when the provider replayed an error for its key and holds
                // no payment: a person decides).
                let letter = letter_of(s);
                if p.expect == Expect::ProviderRejected
                    && !matches!(
                        letter.map(|d| d.error_code.as_str()),
                        Some("provider_rejected") | Some("outcome_unknown")
                    )
                {
                    bad(format!(
                        "provider-rejected message {} is not in the DLQ as provider_rejected",
                        s.message_id
                    ));
                }
            }
            (_, None) => bad("a valid message without a payment id".to_owned()),
        }
    }
    v.duplicates_suppressed = valid_copies.saturating_sub(payments.len());
    for (id, p) in &payments {
        let charges = ledger.charges.get(*id).map(Vec::len).unwrap_or(0);
        if charges > 1 {
            v.double_charged += 1;
            bad(format!("payment {id} was charged {charges} times"));
        }
        let record = records.get(*id);
        if unknown.contains(*id) && record.is_none_or(|r| r.status != RecordStatus::Completed) {
            // Dead-lettered unsettled. Strict: a charge at the provider that the record does
            // not show is a payment the system lost track of.
            if charges > 0 {
                let booked = ledger
                    .charges
                    .get(*id)
                    .and_then(|c| c.first())
                    .map(|c| c.id.clone());
                bad(format!(
                    "payment {id} dead-lettered unsettled ({}) while the provider holds charge {booked:?} that its record does not show",
                    record.map(|r| r.status.as_str()).unwrap_or("no record")
                ));
            } else if record.is_none() {
                bad(format!(
                    "payment {id} dead-lettered unsettled has no record"
                ));
            } else {
                v.unsettled_checked += 1;
            }
            continue;
        }
        match record {
            None => bad(format!("payment {id} has no idempotency record: lost")),
            Some(r) if r.status != RecordStatus::Completed => bad(format!(
                "payment {id} ended {} ({:?})",
                r.status.as_str(),
                r.last_error
            )),
            Some(r) => {
                let o = payment_core::PaymentOutcome::from_outcome(
                    &r.outcome.clone().unwrap_or_default(),
                );
                match &p.expect {
                    Expect::Charged(status) => {
                        if charges != 1 {
                            bad(format!("payment {id} should be charged once, the provider booked {charges}"));
                        } else {
                            v.charged += 1;
                            if let Some(c) = ledger.charges.get(*id).and_then(|c| c.first()) {
                                *v.charged_amounts.entry(c.currency.clone()).or_default() +=
                                    c.amount;
                            }
                        }
                        let booked = ledger
                            .charges
                            .get(*id)
                            .and_then(|c| c.first())
                            .map(|c| c.id.clone());
                        if o.status != *status || o.provider_payment_id != booked {
                            bad(format!(
                                "payment {id}: record says {}/{:?}, provider booked {booked:?}",
                                o.status, o.provider_payment_id
                            ));
                        }
                    }
                    Expect::RequiresAction => {
                        if charges != 0
                            || o.status != "requires_action"
                            || o.provider_payment_id.is_none()
                        {
                            bad(format!(
                                "payment {id} should wait for the customer (requires_action with its PaymentIntent): record {}/{:?}, {charges} charges",
                                o.status, o.provider_payment_id
                            ));
                        } else {
                            v.requires_action += 1;
                        }
                    }
                    Expect::Declined => {
                        if charges != 0 || o.status != "declined" {
                            bad(format!(
                                "payment {id} should be declined: record {}, {charges} charges",
                                o.status
                            ));
                        } else {
                            v.declined += 1;
                        }
                    }
                    Expect::ProviderRejected if charges != 0 || o.status != "rejected" => {
                        bad(format!(
                            "payment {id} should be rejected: record {}, {charges} charges",
                            o.status
                        ));
                    }
                    _ => {}
                }
            }
        }
    }
    // Messages in = completed + dead-lettered, message by message.
    for s in sent {
        if letter_of(s).is_some() {
            v.accounted_dead_lettered += 1;
        } else if s
            .planned
            .payment_id
            .as_deref()
            .and_then(|id| records.get(id))
            .is_some_and(|r| r.status == RecordStatus::Completed)
            && !matches!(
                s.planned.expect,
                Expect::Invalid(_) | Expect::KeyReused | Expect::ProviderRejected
            )
        {
            v.accounted_completed += 1;
        } else {
            bad(format!(
                "message {} is neither completed nor dead-lettered",
                s.message_id
            ));
        }
    }
    v.accounted = v.accounted_completed + v.accounted_dead_lettered;
    // No charge without a record, and no record left in flight.
    let known: HashSet<&str> = payments.keys().copied().collect();
    for (key, charges) in &ledger.charges {
        if known.contains(key.as_str()) && !records.contains_key(key) && !charges.is_empty() {
            bad(format!("charge for {key} has no record"));
        }
    }
    for (id, r) in records {
        if known.contains(id.as_str())
            && r.status != RecordStatus::Completed
            && !unknown.contains(id)
        {
            bad(format!("record {id} left {}", r.status.as_str()));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_keeps_each_currency_in_its_own_units() {
        let amounts = BTreeMap::from([("jpy".to_owned(), 12_000), ("usd".to_owned(), 123_450)]);
        assert_eq!(money(&amounts), "12000 jpy + 1234.50 usd");
        assert_eq!(money(&BTreeMap::new()), "nothing");
    }

    #[test]
    fn every_delivery_is_in_one_bucket_and_the_buckets_add_up() {
        let mut s = sqs_once::BatchSummary::default();
        s.done.insert("charged".into(), 3);
        s.done.insert("declined".into(), 1);
        s.duplicates = 2;
        s.dead_lettered.insert("invalid_message".into(), 1);
        s.retried = 4;
        let (text, sum) = buckets(&s);
        assert_eq!(
            text,
            "3 charged + 1 declined + 2 duplicates + 1 dead-lettered + 4 handed back"
        );
        assert_eq!(sum, 11);
    }
}
