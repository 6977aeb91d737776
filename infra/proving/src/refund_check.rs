//! Refunds in the demo, the chaos checker and `make e2e-sam`: a plan of refunds of a run's
//! payments (whole, partial, racing for the same charge, of payments that were not charged),
//! and the check of what came of them against the provider's books, the payments' records and
//! the refunds' dead-letter queue.
//!
//! What must hold: no refund id is refunded twice; the refunds of a payment never add up to
//! more than its charge; the payment's ledger is the provider's books: its refunded total is
//! the sum of its reservations, and each reservation is a refund the provider made, of that
//! amount, unless the refund's outcome is unsettled (dead-lettered `outcome_unknown` or
//! `retries_exhausted`, for a person) — so no reservation is left that no refund holds, and
//! the total covers every refund the provider made (the limit can never be passed later);
//! every refund message ends as a completed record or a dead letter; a payment that was not
//! charged is never refunded; a refund of a payment still settling is held (its reservation
//! kept with its held entry, nothing refunded, nothing dead-lettered) or, once the payment
//! settled and the held refund was resumed, made once.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use payment_core::refund_keys;
use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
use payment_core::refunds::work::RefundRequest;
use payment_core::PaymentOutcome;
use sqs_once::record::{IdempotencyRecord, RecordStatus};

use crate::check::{drain_dlq, scan_records_of, DeadLetterSeen};
use crate::sim::Ledger;

/// What a planned refund must come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundExpect {
    /// Refunded once, of this amount.
    Refunded(i64),
    /// Races with another refund of its payment for more than is left: exactly one of the
    /// two is refunded, the other dead-lettered as `refund_exceeds_charge`.
    Raced,
    /// Its payment was not charged: `payment_not_refundable`, nothing refunded.
    NotRefundable,
    /// Its payment was still settling: held (nothing refunded, nothing dead-lettered), or
    /// made once if the payment settled and the refund was resumed before the check.
    Held,
}

/// One planned refund.
#[derive(Debug, Clone)]
pub struct PlannedRefund {
    /// The message body.
    pub body: String,
    /// Its refund id.
    pub refund_id: String,
    /// The payment it refunds.
    pub payment_id: String,
    /// What it must come to.
    pub expect: RefundExpect,
}

/// Refunds of the payments whose records are `records` (a run's, by payment id), at most
/// `max_payments` charged ones: a whole refund, two partial ones that fit, or two that race
/// for more than the charge, in turn; and up to three of payments that were not charged.
pub fn plan(
    prefix: &str,
    records: &HashMap<String, IdempotencyRecord>,
    max_payments: usize,
) -> Vec<PlannedRefund> {
    let mut ids: Vec<&String> = records.keys().filter(|k| k.starts_with(prefix)).collect();
    ids.sort();
    let mut out = Vec::new();
    let refund = |pid: &str, n: usize, amount: Option<i64>, expect| {
        let refund_id = format!("{pid}-refund-{n}");
        PlannedRefund {
            body: RefundRequest {
                refund_id: refund_id.clone(),
                payment_id: pid.to_owned(),
                amount,
                reason: Some("requested_by_customer".into()),
                contract_version: None,
            }
            .to_message_body(),
            refund_id,
            payment_id: pid.to_owned(),
            expect,
        }
    };
    let (mut charged, mut uncharged) = (0, 0);
    for pid in ids {
        let r = &records[pid];
        let o = r.outcome.as_ref().map(PaymentOutcome::from_outcome);
        match o {
            Some(o) if r.status == RecordStatus::Completed && o.status == "succeeded" => {
                if charged >= max_payments || o.amount < 5 {
                    continue;
                }
                match charged % 3 {
                    0 => out.push(refund(pid, 0, None, RefundExpect::Refunded(o.amount))),
                    1 => {
                        let part = o.amount * 2 / 5;
                        out.push(refund(pid, 0, Some(part), RefundExpect::Refunded(part)));
                        out.push(refund(pid, 1, Some(part), RefundExpect::Refunded(part)));
                    }
                    _ => {
                        let most = o.amount * 3 / 5;
                        out.push(refund(pid, 0, Some(most), RefundExpect::Raced));
                        out.push(refund(pid, 1, Some(most), RefundExpect::Raced));
                    }
                }
                charged += 1;
            }
            Some(o)
                if r.status == RecordStatus::Completed
                    && payment_core::provider::event::payment_settling(&o.status) =>
            {
                out.push(refund(pid, 0, None, RefundExpect::Held));
            }
            Some(_) if r.status == RecordStatus::Completed && uncharged < 3 => {
                out.push(refund(pid, 0, None, RefundExpect::NotRefundable));
                uncharged += 1;
            }
            _ => {}
        }
    }
    out
}

/// The message bodies of `plans`, each twice (a producer's retry), in plan order.
pub fn bodies(plans: &[PlannedRefund]) -> Vec<String> {
    plans
        .iter()
        .flat_map(|r| [r.body.clone(), r.body.clone()])
        .collect()
}

/// What came of the refunds.
#[derive(Debug, Default)]
pub struct RefundVerdict {
    /// Refunds the provider made for the planned refund ids.
    pub refunded: usize,
    /// What they returned, minor units by currency.
    pub amounts: BTreeMap<String, i64>,
    /// Dead letters by code.
    pub dead_lettered: BTreeMap<String, usize>,
    /// Reservations of refunds whose outcome is unsettled (dead-lettered `outcome_unknown` or
    /// `retries_exhausted`): they may differ from the provider's books until a person settles
    /// them.
    pub unsettled: usize,
    /// Refunds held for a payment still settling (reserved, nothing refunded yet).
    pub held: usize,
    /// Everything that went wrong.
    pub violations: Vec<String>,
}

impl RefundVerdict {
    /// The counts, for a run's summary.
    pub fn print(&self, sent: usize) {
        println!(
            "refund messages sent:     {sent} ({} refunds issued, returning {}; dead-lettered {:?})",
            self.refunded,
            crate::check::money(&self.amounts),
            self.dead_lettered
        );
        println!(
            "refund ledger:            every reservation is a refund the provider made, of its amount, but {} unsettled and {} held for a settling payment",
            self.unsettled, self.held
        );
    }
}

/// Reads the refunds' outcome (the provider's books, the refund records, the payments'
/// refunded totals, the refund DLQ, drained) and checks it against the plan.
pub async fn observe(
    sdk: &aws_config::SdkConfig,
    table: &str,
    dlq_url: &str,
    ledger: &Ledger,
    plans: &[PlannedRefund],
) -> Result<RefundVerdict> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let store = sqs_once::DynamoStore::new(ddb.clone(), table, refund_keys());
    let records = scan_records_of(&ddb, &store).await?;
    let payments = DynamoRefundLedger::new(ddb, table);
    let mut totals = HashMap::new();
    for p in plans {
        if !totals.contains_key(&p.payment_id) {
            let payment = payments.payment(&p.payment_id).await?;
            totals.insert(p.payment_id.clone(), payment);
        }
    }
    let dlq = drain_dlq(&aws_sdk_sqs::Client::new(sdk), dlq_url).await?;
    Ok(verify(plans, ledger, &records, &totals, &dlq))
}

/// The check itself (see the module's docs).
pub fn verify(
    plans: &[PlannedRefund],
    ledger: &Ledger,
    records: &HashMap<String, IdempotencyRecord>,
    payments: &HashMap<String, Option<payment_core::refunds::ledger::RefundablePayment>>,
    dlq: &[DeadLetterSeen],
) -> RefundVerdict {
    let mut v = RefundVerdict::default();
    let mut dead: HashMap<String, Vec<String>> = HashMap::new();
    for d in dlq {
        if let Ok(r) = RefundRequest::parse(&d.body) {
            dead.entry(r.refund_id)
                .or_default()
                .push(d.error_code.clone());
        }
        *v.dead_lettered.entry(d.error_code.clone()).or_default() += 1;
    }
    let mut refunded_per_payment: BTreeMap<&str, (i64, usize)> = BTreeMap::new();
    let mut raced: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for p in plans {
        let booked = ledger
            .refunds
            .get(&p.refund_id)
            .cloned()
            .unwrap_or_default();
        if booked.len() > 1 {
            v.violations.push(format!(
                "refund {} was refunded {} times by the provider",
                p.refund_id,
                booked.len()
            ));
        }
        // What moved money: a refund the provider failed or canceled returned nothing.
        let amount: i64 = booked
            .iter()
            .filter(|r| r.moved_money())
            .map(|r| r.amount)
            .sum();
        v.refunded += booked.len();
        for r in booked.iter().filter(|r| r.moved_money()) {
            *v.amounts.entry(r.currency.clone()).or_default() += r.amount;
        }
        let e = refunded_per_payment.entry(&p.payment_id).or_default();
        e.0 += amount;
        e.1 += booked.len();
        let completed = records
            .get(&p.refund_id)
            .is_some_and(|r| r.status == RecordStatus::Completed);
        let codes = dead.get(&p.refund_id).cloned().unwrap_or_default();
        if !completed && codes.is_empty() {
            v.violations.push(format!(
                "refund {} is lost: no completed record and no dead letter",
                p.refund_id
            ));
        }
        match &p.expect {
            RefundExpect::Refunded(a) => {
                if booked.len() != 1 || amount != *a {
                    v.violations.push(format!(
                        "refund {} should be one refund of {a}, the provider booked {amount} in {}",
                        p.refund_id,
                        booked.len()
                    ));
                }
            }
            RefundExpect::NotRefundable => {
                if !booked.is_empty() || !codes.iter().any(|c| c == "payment_not_refundable") {
                    v.violations.push(format!(
                        "refund {} of an uncharged payment: {} refunds, dead letters {codes:?}",
                        p.refund_id,
                        booked.len()
                    ));
                }
            }
            RefundExpect::Held => {
                if booked.len() > 1 || !codes.is_empty() {
                    v.violations.push(format!(
                        "refund {} of a settling payment: {} refunds, dead letters {codes:?} (held, or made once)",
                        p.refund_id,
                        booked.len()
                    ));
                }
            }
            RefundExpect::Raced => {
                let r = raced.entry(&p.payment_id).or_default();
                r.0 += booked.len();
                r.1 += usize::from(codes.iter().any(|c| c == "refund_exceeds_charge"));
            }
        }
    }
    for (pid, (won, refused)) in raced {
        if won != 1 || refused != 1 {
            v.violations.push(format!(
                "two refunds raced for payment {pid}: {won} refunded and {refused} refused, not one each"
            ));
        }
    }
    for (pid, (amount, count)) in refunded_per_payment {
        let Some(Some(p)) = payments.get(pid) else {
            if count > 0 {
                v.violations
                    .push(format!("payment {pid} has refunds but no record"));
            }
            continue;
        };
        let charged = p.outcome.as_ref().map(|o| o.amount).unwrap_or(0);
        if amount > charged {
            v.violations.push(format!(
                "payment {pid} was refunded {amount}, more than its charge of {charged}"
            ));
        }
        // The ledger is the provider's books: each reservation is a refund the provider made
        // and did not fail (of that amount), or one whose outcome is still unsettled
        // (dead-lettered outcome_unknown / retries_exhausted, for a person: it may have
        // happened). A refund the provider failed holds no reservation.
        let reserved: i64 = p.refunds.values().sum();
        if reserved != p.refunded {
            v.violations.push(format!(
                "payment {pid}'s refunded_amount {} is not the sum of its reservations {reserved}",
                p.refunded
            ));
        }
        for (rid, held) in &p.refunds {
            let made = ledger.refunded(rid);
            let unsettled = dead.get(rid).is_some_and(|codes| {
                codes
                    .iter()
                    .any(|c| c == "outcome_unknown" || c == "retries_exhausted")
            });
            // Held for a payment still settling: nothing refunded yet, its entry kept.
            if made == 0 && p.held.contains_key(rid) {
                v.held += 1;
                continue;
            }
            if made != *held && !unsettled {
                v.violations.push(format!(
                    "payment {pid} holds a reservation of {held} for refund {rid}, which the provider refunded {made}: a reservation no refund holds"
                ));
            }
            if unsettled {
                v.unsettled += 1;
            }
        }
        if p.refunded < amount {
            v.violations.push(format!(
                "payment {pid}'s record counts {} refunded, less than the provider's {amount}",
                p.refunded
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use payment_core::refunds::ledger::RefundablePayment;
    use payment_core::PaymentOutcome;

    fn charged(refunds: &[(&str, i64)]) -> RefundablePayment {
        RefundablePayment {
            traceparent: None,
            status: RecordStatus::Completed,
            outcome: Some(PaymentOutcome {
                status: "succeeded".into(),
                provider_payment_id: Some("pi_1".into()),
                decline_code: None,
                amount: 1000,
                currency: "usd".into(),
                reason: None,
            }),
            refunded: refunds.iter().map(|(_, a)| a).sum(),
            refunds: refunds.iter().map(|(r, a)| (r.to_string(), *a)).collect(),
            has_refunds: !refunds.is_empty(),
            disputed: 0,
            expires_at_s: 0,
            held: Default::default(),
            has_held: false,
            refunds_made: refunds.len() as i64,
            counts_refunds: false,
        }
    }

    fn booked(rid: &str, amount: i64) -> (String, Vec<crate::sim::Refund>) {
        (
            rid.to_owned(),
            vec![crate::sim::Refund {
                status: "succeeded".into(),
                id: format!("re_{rid}"),
                amount,
                currency: "usd".into(),
                payment_intent: "pi_1".into(),
            }],
        )
    }

    #[test]
    fn a_reservation_that_no_refund_holds_is_a_violation_unless_unsettled() {
        let plan = |rid: &str| PlannedRefund {
            body: String::new(),
            refund_id: rid.into(),
            payment_id: "p1".into(),
            expect: RefundExpect::Refunded(300),
        };
        let plans = [plan("r1"), plan("r2")];
        let ledger = Ledger {
            refunds: [booked("r1", 300), booked("r2", 300)].into_iter().collect(),
            ..Default::default()
        };
        let done = |rid: &str| {
            (
                rid.to_owned(),
                IdempotencyRecord {
                    traceparent: None,
                    key: rid.into(),
                    status: RecordStatus::Completed,
                    payload_hash: String::new(),
                    lease_owner: None,
                    lease_expires_at_ms: 0,
                    attempts: 1,
                    outcome: None,
                    expires_at_s: 0,
                    first_attempt_at_ms: 0,
                    unknown_outcome: false,
                    last_error: None,
                    completed_at_ms: None,
                    not_before_ms: None,
                },
            )
        };
        let records: HashMap<_, _> = [done("r1"), done("r2")].into_iter().collect();
        let check = |p: RefundablePayment, dlq: &[DeadLetterSeen]| {
            let payments = HashMap::from([("p1".to_owned(), Some(p))]);
            verify(&plans, &ledger, &records, &payments, dlq).violations
        };
        assert!(check(charged(&[("r1", 300), ("r2", 300)]), &[]).is_empty());
        // A third reservation that the provider never refunded: the ledger drifted.
        let drift = check(charged(&[("r1", 300), ("r2", 300), ("r3", 200)]), &[]);
        assert_eq!(drift.len(), 1, "{drift:?}");
        assert!(
            drift[0].contains("a reservation no refund holds"),
            "{drift:?}"
        );
        // ... unless r3 is dead-lettered unsettled, for a person.
        let unknown = DeadLetterSeen {
            error_code: "outcome_unknown".into(),
            source_message_id: "m3".into(),
            body: RefundRequest {
                refund_id: "r3".into(),
                payment_id: "p1".into(),
                amount: Some(200),
                reason: None,
                contract_version: None,
            }
            .to_message_body(),
        };
        assert!(check(
            charged(&[("r1", 300), ("r2", 300), ("r3", 200)]),
            &[unknown]
        )
        .is_empty());
        // A total that is not its reservations' sum.
        let mut off = charged(&[("r1", 300), ("r2", 300)]);
        off.refunded = 500;
        assert!(!check(off, &[]).is_empty());
        // A refund the provider failed, still counted: the customer got nothing back.
        let mut failed_ledger = ledger.clone();
        failed_ledger.refunds.get_mut("r2").unwrap()[0].status = "failed".into();
        let payments =
            HashMap::from([("p1".to_owned(), Some(charged(&[("r1", 300), ("r2", 300)])))]);
        let counted = verify(&plans, &failed_ledger, &records, &payments, &[]).violations;
        assert!(
            counted
                .iter()
                .any(|v| v.contains("refund r2") && v.contains("no refund holds")),
            "{counted:?}"
        );
        // ... and given back, it holds nothing.
        let payments = HashMap::from([("p1".to_owned(), Some(charged(&[("r1", 300)])))]);
        let released = verify(&plans, &failed_ledger, &records, &payments, &[]).violations;
        assert!(
            released.iter().all(|v| !v.contains("no refund holds")),
            "{released:?}"
        );
        // A third reservation held for a payment still settling, its entry kept: held, not a
        // drift; the same reservation without its entry is one no refund holds.
        let mut settling = charged(&[("r1", 300), ("r2", 300), ("r3", 200)]);
        settling.held.insert("r3".into(), "{}".into());
        let payments = HashMap::from([("p1".to_owned(), Some(settling))]);
        let v = verify(&plans, &ledger, &records, &payments, &[]);
        assert!(v.violations.is_empty() && v.held == 1, "{:?}", v.violations);
    }
}
