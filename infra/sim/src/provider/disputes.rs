//! Disputes at the simulated provider. A charge that succeeded is disputed with the run's
//! chance ([`DisputePlan`]; one in a hundred, 30 to 120 days after it, as Stripe's "How
//! disputes work" gives a cardholder's window), drawn from the seed and the PaymentIntent's id,
//! not from the run's order of events. One in five is an inquiry (`warning_needs_response`,
//! then `warning_under_review`, closed `warning_closed`: no money moves); the others are
//! chargebacks (`needs_response`, `under_review` once the merchant answers, days later, then
//! `won` or `lost` weeks after they opened). A third of the lost ones are appealed (API version
//! 2026-10-28's `appeal_needs_response` and `appeal_under_review`) and decided again weeks
//! later, won or lost. Each change is a `charge.dispute.created`, `.updated` or `.closed` event
//! with the dispute as it is then; half the disputes name only their charge
//! (`payment_intent: null`, as in Stripe's own example), so the inbox reads the charge for it.
//! While a chargeback holds the charge's amount, a refund of it is refused `charge_disputed`.

use std::collections::{BTreeSet, VecDeque};

use serde_json::{json, Value as Json};

use super::Books;

/// Which charges are disputed, and when.
#[derive(Debug, Clone)]
pub struct DisputePlan {
    /// The run's seed (what the draws are made from, with the intent's id).
    pub seed: u64,
    /// The chance a charge is disputed.
    pub share: f64,
    /// The days after the charge a dispute opens within, (from, to).
    pub open_days: (f64, f64),
}

/// One dispute.
#[derive(Debug, Clone)]
pub struct Dispute {
    /// `dp_...`.
    pub id: String,
    /// The disputed PaymentIntent.
    pub payment_intent: String,
    /// Its charge, `ch_...`.
    pub charge: String,
    /// Whether the dispute object names its PaymentIntent (else only its charge).
    pub names_intent: bool,
    /// Minor units.
    pub amount: i64,
    /// Lowercase.
    pub currency: String,
    /// Its status; empty until it opens.
    pub status: String,
    /// When it opens, epoch ms.
    pub opens_ms: i64,
    /// Its changes to come: when (epoch ms), and to what.
    pub steps: VecDeque<(i64, String)>,
    /// It went through an appeal.
    pub appealed: bool,
}

impl Dispute {
    /// Open: visible to reads and lists.
    pub fn opened(&self) -> bool {
        !self.status.is_empty()
    }
}

/// The charge of a PaymentIntent (one charge each here).
pub fn charge_of(payment_intent: &str) -> String {
    format!("ch_{}", payment_intent.trim_start_matches("pi_"))
}

/// A dispute's JSON as the API writes it (the fields the inbox reads, and a few more).
pub fn dispute_json(d: &Dispute) -> Json {
    json!({
        "id": d.id, "object": "dispute", "amount": d.amount, "currency": d.currency,
        "charge": d.charge,
        "payment_intent": if d.names_intent { Json::from(d.payment_intent.clone()) } else { Json::Null },
        "status": d.status, "created": d.opens_ms / 1000, "reason": "fraudulent",
        "is_charge_refundable": !holds(&d.status), "livemode": false, "metadata": {},
    })
}

/// A chargeback that holds the charge's amount (Stripe withdrew it and has not reinstated it):
/// refunds of it are refused. The provider's own rule, written here apart from the inbox's
/// `dispute_holds_amount` on purpose: the end's check compares the two.
pub fn holds(status: &str) -> bool {
    matches!(
        status,
        "needs_response"
            | "under_review"
            | "lost"
            | "appeal_needs_response"
            | "appeal_under_review"
    )
}

const DAY_MS: f64 = 86_400_000.0;

impl Books {
    /// Draws whether the intent that just succeeded will be disputed, and its whole course.
    pub(super) fn plan_dispute(&mut self, intent_id: &str, now_ms: i64) {
        let Some(plan) = self.dispute_plan.clone() else {
            return;
        };
        let draw = |what: &str| super::draw(plan.seed, intent_id, what);
        if draw("disputed") >= plan.share {
            return;
        }
        let Some(i) = self.intents.get(intent_id) else {
            return;
        };
        let (from, to) = plan.open_days;
        let opens = now_ms + ((from + (to - from) * draw("opens")) * DAY_MS) as i64;
        // A window shorter than a cardholder's 120 days compresses the dispute's own course
        // by as much.
        let scale = (to / 120.0).clamp(0.0, 1.0) * DAY_MS;
        let days = |d: f64| (d * scale) as i64;
        let review = opens + days(2.0 + 5.0 * draw("review"));
        let decided = opens + days(14.0 + 46.0 * draw("decided"));
        let mut steps = VecDeque::new();
        if draw("inquiry") < 0.2 {
            steps.extend([
                (opens, "warning_needs_response".to_owned()),
                (review, "warning_under_review".to_owned()),
                (decided, "warning_closed".to_owned()),
            ]);
        } else {
            let won = draw("won") < 0.4;
            steps.extend([
                (opens, "needs_response".to_owned()),
                (review, "under_review".to_owned()),
                (decided, if won { "won" } else { "lost" }.to_owned()),
            ]);
            if !won && draw("appealed") < 1.0 / 3.0 {
                let appealed = decided + days(1.0 + 6.0 * draw("appeal"));
                let answered = appealed + days(2.0 + 5.0 * draw("answered"));
                let again = appealed + days(14.0 + 30.0 * draw("again"));
                steps.extend([
                    (appealed, "appeal_needs_response".to_owned()),
                    (answered, "appeal_under_review".to_owned()),
                    (
                        again,
                        if draw("won again") < 0.5 {
                            "won"
                        } else {
                            "lost"
                        }
                        .to_owned(),
                    ),
                ]);
            }
        }
        let (amount, currency) = (i.amount, i.currency.clone());
        self.next_id += 1;
        let id = format!("dp_sim{:08}", self.next_id);
        for (at, _) in &steps {
            self.due
                .insert((*at, super::settle::DUE_DISPUTE, id.clone()));
        }
        self.disputes.insert(
            id.clone(),
            Dispute {
                id,
                payment_intent: intent_id.to_owned(),
                charge: charge_of(intent_id),
                names_intent: draw("names intent") < 0.5,
                amount,
                currency,
                status: String::new(),
                opens_ms: opens,
                steps,
                appealed: false,
            },
        );
    }

    /// Disputes whose next change has come take it, each change an event. A dispute opens
    /// only on a charge not refunded whole, for what is left of it.
    pub(super) fn settle_disputes(&mut self, now_ms: i64, come: BTreeSet<String>) {
        let due: Vec<String> = come
            .into_iter()
            .filter(|id| {
                self.disputes
                    .get(id)
                    .is_some_and(|d| d.steps.front().is_some_and(|(at, _)| *at <= now_ms))
            })
            .collect();
        for id in due {
            // What is left of the charge, for one that opens now.
            let left = match self.disputes.get(&id) {
                Some(d) if !d.opened() => Some(
                    self.intents
                        .get(&d.payment_intent)
                        .map_or(0, |i| i.amount - self.refunded(&i.id)),
                ),
                Some(_) => None,
                None => continue,
            };
            if left.is_some_and(|l| l <= 0) {
                self.disputes.remove(&id);
                continue;
            }
            let Some(d) = self.disputes.get_mut(&id) else {
                continue;
            };
            let Some((_, status)) = d.steps.pop_front() else {
                continue;
            };
            let kind = if let Some(left) = left {
                d.amount = left;
                "charge.dispute.created"
            } else if matches!(status.as_str(), "won" | "lost" | "warning_closed") {
                "charge.dispute.closed"
            } else {
                "charge.dispute.updated"
            };
            d.appealed |= status.starts_with("appeal_");
            d.status = status;
            // Its next step comes at its own time (a step due now as well waits for the next
            // settlement, one step each).
            if let Some((at, _)) = d.steps.front() {
                self.due.insert((
                    (*at).max(now_ms + 1),
                    super::settle::DUE_DISPUTE,
                    id.clone(),
                ));
            }
            let d = &self.disputes[&id];
            let object = dispute_json(d);
            self.emit(kind, object, now_ms);
        }
    }

    /// The chargeback holding a PaymentIntent's charge, if one does.
    pub fn charged_back(&self, payment_intent: &str) -> Option<&Dispute> {
        self.disputes
            .values()
            .find(|d| d.payment_intent == payment_intent && holds(&d.status))
    }
}
