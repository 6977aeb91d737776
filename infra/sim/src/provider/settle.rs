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
            if fails(i) {
                i.status = "requires_payment_method".into();
                i.failure_code = Some("debit_not_authorized".into());
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
    /// What the provider will still change by itself for a payment (`metadata[payment_id]`):
    /// a debit to settle, a refund's later status, a dispute's next step (one planned and not
    /// open yet among them). `None` when nothing is to come, so its record may go.
    pub fn pending_for_payment(&self, payment_id: &str) -> Option<String> {
        for i in self.intents_of(payment_id) {
            if i.status == "processing" {
                return Some(format!("{} is processing", i.id));
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
