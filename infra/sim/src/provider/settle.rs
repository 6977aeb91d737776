//! What the provider changes by itself when its time comes: a debit settling, a refund failing or
//! succeeding days later, a dispute's steps, each found through the books' due index rather
//! than by walking every object.

use std::collections::BTreeSet;

use super::{Books, Intent};

/// A debit that settles.
pub(super) const DUE_INTENT: u8 = 0;
/// A refund whose status changes.
pub(super) const DUE_REFUND: u8 = 1;
/// A dispute's next step.
pub(super) const DUE_DISPUTE: u8 = 2;
/// A failed debit's customer comes back and pays.
pub(super) const DUE_REPAY: u8 = 3;

/// Which failed debits their customers pay again. A debit that fails leaves its PaymentIntent
/// `requires_payment_method`, which is not final at Stripe: the customer may confirm it again
/// with another payment method (Stripe's "Payment status updates": a failed payment "returns
/// to `requires_payment_method`" and can be retried), so that a payment recorded declined is
/// charged days later. Drawn from the seed and the PaymentIntent's id, as disputes are.
#[derive(Debug, Clone)]
pub struct RepayPlan {
    /// The run's seed.
    pub seed: u64,
    /// The chance a failed debit's customer pays again.
    pub share: f64,
    /// The days after the failure they do, (from, to).
    pub days: (f64, f64),
    /// The days their new debit takes to settle (the provider's own).
    pub settle_days: f64,
}

impl Books {
    /// Takes out of [`Books::due`] what has come by `now_ms`.
    fn come(&mut self, now_ms: i64) -> BTreeSet<(i64, u8, String)> {
        let later = self
            .due
            .split_off(&(now_ms.saturating_add(1), 0, String::new()));
        let come = std::mem::replace(&mut self.due, later);
        crate::cost::visit(come.len());
        come
    }

    /// The ids of one kind among what has come, in id order.
    fn of(come: &BTreeSet<(i64, u8, String)>, what: u8) -> BTreeSet<String> {
        come.iter()
            .filter(|(_, w, _)| *w == what)
            .map(|(_, _, id)| id.clone())
            .collect()
    }

    /// Moves every debit whose day has come to `succeeded` (or, when `fails` says so, to
    /// `requires_payment_method`), and every refund whose day has come to what it becomes.
    pub fn settle(&mut self, now_ms: i64, fails: impl Fn(&Intent) -> bool) {
        let come = self.come(now_ms);
        let (intents, refunds, mut disputes) = (
            Self::of(&come, DUE_INTENT),
            Self::of(&come, DUE_REFUND),
            Self::of(&come, DUE_DISPUTE),
        );
        self.repay(now_ms, Self::of(&come, DUE_REPAY));
        let due: Vec<String> = intents
            .into_iter()
            .filter(|id| {
                self.intents.get(id).is_some_and(|i| {
                    i.status == "processing" && i.settles_ms.is_some_and(|s| s <= now_ms)
                })
            })
            .collect();
        for id in due {
            let Some(i) = self.intents.get_mut(&id) else {
                continue;
            };
            if !self.repaid.contains(&id) && fails(i) {
                i.status = "requires_payment_method".into();
                i.failure_code = Some("debit_not_authorized".into());
                self.plan_repay(&id, now_ms);
            } else {
                i.status = "succeeded".into();
                self.plan_dispute(&id, now_ms);
            }
            self.emit_intent(&id, now_ms);
        }
        // A dispute planned for a debit settled just now may open now too.
        disputes.extend(Self::of(&self.come(now_ms), DUE_DISPUTE));
        self.settle_refunds(now_ms, refunds);
        self.settle_disputes(now_ms, disputes);
    }
}

impl Books {
    /// Draws whether the customer of a debit that failed just now pays again, and when.
    fn plan_repay(&mut self, intent_id: &str, now_ms: i64) {
        let Some(plan) = self.repay_plan.clone() else {
            return;
        };
        let draw = |what: &str| super::draw(plan.seed, intent_id, what);
        if draw("repaid") >= plan.share {
            return;
        }
        let (from, to) = plan.days;
        let at = now_ms + ((from + (to - from) * draw("repays")) * 86_400_000.0) as i64;
        self.due.insert((at, DUE_REPAY, intent_id.to_owned()));
    }

    /// The customers whose time has come confirm their PaymentIntent again with a payment
    /// method that works: a debit again (`processing`, settling as the first would have).
    fn repay(&mut self, now_ms: i64, ids: BTreeSet<String>) {
        let Some(settle_ms) = self
            .repay_plan
            .as_ref()
            .map(|p| (p.settle_days * 86_400_000.0) as i64)
        else {
            return;
        };
        for id in ids {
            let Some(i) = self
                .intents
                .get_mut(&id)
                .filter(|i| i.status == "requires_payment_method")
            else {
                continue;
            };
            i.status = "processing".into();
            i.failure_code = None;
            let at = now_ms + settle_ms;
            i.settles_ms = Some(at);
            self.repaid.insert(id.clone());
            self.due.insert((at, DUE_INTENT, id.clone()));
            self.emit_intent(&id, now_ms);
        }
    }

    /// What the provider will still change by itself for a payment (`metadata[payment_id]`):
    /// a debit to settle, a refund's later status, a dispute's next step (one planned and not
    /// open yet among them). `None` when nothing is to come, so its record may go.
    pub fn pending_for_payment(&self, payment_id: &str) -> Option<String> {
        for i in self.intents_of(payment_id) {
            if i.status == "processing" {
                return Some(format!("{} is processing", i.id));
            }
            if let Some((at, ..)) = self
                .due
                .iter()
                .find(|(_, what, id)| *what == DUE_REPAY && *id == i.id)
            {
                return Some(format!(
                    "{} failed and its customer pays it again at {at}",
                    i.id
                ));
            }
            if let Some(r) = self.refunds_of(&i.id).find(|r| r.changes.is_some()) {
                return Some(format!(
                    "its refund {} is {} and changes later",
                    r.id, r.status
                ));
            }
            if let Some(d) = self
                .disputes
                .values()
                .find(|d| d.payment_intent == i.id && !d.steps.is_empty())
            {
                return Some(format!(
                    "its dispute {} is {} with steps to come",
                    d.id,
                    if d.status.is_empty() {
                        "planned"
                    } else {
                        &d.status
                    }
                ));
            }
        }
        None
    }

    /// What the provider will still change by itself for a refund (`metadata[refund_id]`): a
    /// status it moves to later (`pending` to `succeeded` or `failed`, `succeeded` to `failed`).
    pub fn pending_for_refund(&self, refund_id: &str) -> Option<String> {
        self.refunds_by_call
            .get(refund_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.refunds.get(id))
            .find(|r| r.changes.is_some())
            .map(|r| format!("{} is {} and changes later", r.id, r.status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debit_settled_now_opens_the_dispute_planned_for_now_in_the_same_settlement() {
        let mut books = Books {
            dispute_plan: Some(super::super::disputes::DisputePlan {
                seed: 1,
                share: 1.0,
                open_days: (0.0, 0.0),
            }),
            ..Books::default()
        };
        books.add(Intent {
            id: "pi_1".into(),
            payment_id: "p-1".into(),
            amount: 1_000,
            currency: "usd".into(),
            customer: "cus_1".into(),
            status: "processing".into(),
            created_ms: 0,
            settles_ms: Some(500),
            failure_code: None,
        });
        books.settle(1_000, |_| false);
        assert_eq!(books.intents["pi_1"].status, "succeeded");
        let opened: Vec<&str> = books
            .disputes
            .values()
            .filter(|d| d.opened())
            .map(|d| d.payment_intent.as_str())
            .collect();
        assert_eq!(opened, ["pi_1"], "{:?}", books.disputes);
    }
}
