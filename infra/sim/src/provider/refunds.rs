//! Refunds at the simulated provider: created under `refund:<refund_id>`, never beyond what is
//! left of the charge (Stripe's `amount_too_large`, `charge_already_refunded`), only of a
//! charge that succeeded (`charge_not_refundable` otherwise); the lookups a refund's unknown
//! outcome and a held refund read. A refund of a bank debit is `pending` for 3 to 10 days and
//! then succeeds, or fails (one in twenty); a card's refund succeeds at once and one in fifty
//! fails 5 to 25 days later (a closed card account), as Stripe's refunds do: a failed refund's
//! amount is no longer refunded, and its `refund.updated` and `refund.failed` events say so.
//! A charge a chargeback holds is not refunded (`charge_disputed`).

use payment_core::provider::{FailureKind, FoundRefund, ProviderError, RefundCall, RefundResponse};

use std::collections::BTreeSet;

use serde_json::{json, Value as Json};

use super::{Books, Outage, Provider};

/// One refund the provider made.
#[derive(Debug, Clone)]
pub struct Refund {
    /// `re_...`.
    pub id: String,
    /// `metadata[refund_id]`.
    pub refund_id: String,
    /// The PaymentIntent refunded.
    pub payment_intent: String,
    /// Minor units.
    pub amount: i64,
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
    /// When its status changes next, and to what (epoch ms; `succeeded` or `failed`).
    pub changes: Option<(i64, String)>,
}

impl Books {
    /// The payment (`metadata[payment_id]`) of a PaymentIntent, empty when it has none here.
    pub(super) fn payment_of(&self, payment_intent: &str) -> String {
        self.intents
            .get(payment_intent)
            .map(|i| i.payment_id.clone())
            .unwrap_or_default()
    }

    /// Refunds whose time has come change their status, each change an event.
    pub(super) fn settle_refunds(&mut self, now_ms: i64, come: BTreeSet<String>) {
        let due: Vec<String> = come
            .into_iter()
            .filter(|id| {
                self.refunds
                    .get(id)
                    .is_some_and(|r| r.changes.as_ref().is_some_and(|(at, _)| *at <= now_ms))
            })
            .collect();
        for id in due {
            let Some(r) = self.refunds.get_mut(&id) else {
                continue;
            };
            let Some((_, status)) = r.changes.take() else {
                continue;
            };
            r.status = status;
            let r = r.clone();
            let pid = self.payment_of(&r.payment_intent);
            self.emit("refund.updated", refund_json(&r, &pid), now_ms);
            if r.status == "failed" {
                self.emit("refund.failed", refund_json(&r, &pid), now_ms);
            }
        }
    }
}

/// What the provider remembers for a refund's key.
#[derive(Debug, Clone)]
pub(super) struct KeptRefund {
    params: String,
    answer: Result<RefundResponse, ProviderError>,
    at_ms: i64,
}

impl Books {
    /// What is refunded of a PaymentIntent (refunds that did not fail).
    pub fn refunded(&self, payment_intent: &str) -> i64 {
        self.refunds_of(payment_intent)
            .filter(|r| {
                r.payment_intent == payment_intent && r.status != "failed" && r.status != "canceled"
            })
            .map(|r| r.amount)
            .sum()
    }

    /// Whether the provider holds a refund made under the merchant's refund id (any status).
    pub fn has_refund_for(&self, refund_id: &str) -> bool {
        self.refunds_by_call
            .get(refund_id)
            .is_some_and(|ids| !ids.is_empty())
    }

    /// A refund made under the merchant's refund id that moved or will move money (`succeeded`
    /// or `pending`), said as "re_… is succeeded".
    pub fn refund_made_for(&self, refund_id: &str) -> Option<String> {
        self.refunds_by_call
            .get(refund_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.refunds.get(id))
            .find(|r| matches!(r.status.as_str(), "succeeded" | "pending"))
            .map(|r| format!("{} is {}", r.id, r.status))
    }

    /// The refunds of a PaymentIntent, in id order.
    pub(super) fn refunds_of<'a>(
        &'a self,
        payment_intent: &str,
    ) -> impl Iterator<Item = &'a Refund> + 'a {
        self.refunds_by_intent
            .get(payment_intent)
            .into_iter()
            .flatten()
            .filter_map(|id| self.refunds.get(id))
            .inspect(|_| crate::cost::visit(1))
    }

    /// Books a refund: by id, by PaymentIntent, by the merchant's refund id, and when it
    /// changes by itself.
    fn add_refund(&mut self, r: Refund) {
        if let Some((at, _)) = &r.changes {
            self.due
                .insert((*at, super::settle::DUE_REFUND, r.id.clone()));
        }
        for (index, by) in [
            (&mut self.refunds_by_intent, &r.payment_intent),
            (&mut self.refunds_by_call, &r.refund_id),
        ] {
            let ids = index.entry(by.clone()).or_default();
            // Ids are made in increasing order: the list stays sorted, as the map's is.
            ids.push(r.id.clone());
        }
        self.refunds.insert(r.id.clone(), r);
    }
}

impl Provider {
    /// `POST /v1/refunds` with its key.
    pub async fn create_refund(&self, call: &RefundCall) -> Result<RefundResponse, ProviderError> {
        let b = self.behaviour.lock().expect("behaviour").clone();
        let (there, back) = (
            self.latency(b.latency_ms / 2.0),
            self.latency(b.latency_ms / 2.0),
        );
        match b.outage(self.clock.now_ms()) {
            Some(Outage::Down) => {
                return Err(ProviderError::new(
                    FailureKind::Connect,
                    "the provider cannot be reached",
                ))
            }
            Some(Outage::Failing) => {
                tokio::time::sleep(self.timeout).await;
                if self.draw() < 0.5 {
                    let _ = self.refund_now(call);
                }
                return Err(ProviderError::new(
                    FailureKind::Timeout,
                    "no answer within the client's timeout",
                ));
            }
            None => {}
        }
        tokio::time::sleep(there).await;
        let answer = if !self.admit(b.account_rate) {
            let mut e = ProviderError::new(FailureKind::RateLimited, "429: too many requests");
            e.rate_limit = Some(payment_core::provider::RateLimit::Account);
            Err(e)
        } else if self.draw() < b.lock_timeout_rate {
            let mut e = ProviderError::new(
                FailureKind::RateLimited,
                "429 lock_timeout: another request holds this object",
            );
            e.rate_limit = Some(payment_core::provider::RateLimit::Object);
            Err(e)
        } else if self.draw() < b.error_before_rate {
            Err(ProviderError::new(
                FailureKind::ServerError,
                "500 before any write",
            ))
        } else {
            self.refund_now(call)
        };
        let lost = answer.is_ok() && self.draw() < b.lost_answer_rate;
        tokio::time::sleep(back).await;
        if lost {
            tokio::time::sleep(self.timeout.saturating_sub(there + back)).await;
            return Err(ProviderError::new(
                FailureKind::Timeout,
                "the answer was lost",
            ));
        }
        answer
    }

    fn refund_now(&self, call: &RefundCall) -> Result<RefundResponse, ProviderError> {
        let now = self.clock.now_ms();
        // Drawn before the books are taken: whether it fails, and after how long.
        let (fails, after) = (self.draw(), self.draw());
        let timeline = self.behaviour.lock().expect("behaviour").timeline;
        let key = format!("refund:{}", call.refund_id);
        let params = format!("{}|{}|{}", call.payment_intent, call.amount, call.refund_id);
        let mut books = self.books.lock().expect("books");
        let Books {
            refund_keys,
            refund_key_order,
            ..
        } = &mut *books;
        super::forget_keys(refund_keys, refund_key_order, |k| k.at_ms, now);
        if let Some(k) = books.refund_keys.get(&key) {
            if k.params != params {
                return Ok(RefundResponse::KeyReused {
                    message: "Keys for idempotent requests can only be used with the same parameters they were first used with".into(),
                });
            }
            return k.answer.clone();
        }
        let charge = books.intents.get(&call.payment_intent).cloned();
        let answer = match charge {
            None => Ok(RefundResponse::Rejected {
                code: "resource_missing".into(),
                message: format!("No such payment_intent: '{}'", call.payment_intent),
            }),
            Some(pi) if pi.status != "succeeded" => Ok(RefundResponse::Rejected {
                code: "charge_not_refundable".into(),
                message: format!(
                    "This PaymentIntent ({}) does not have a successful charge to refund.",
                    pi.id
                ),
            }),
            Some(pi) if books.charged_back(&pi.id).is_some() => Ok(RefundResponse::Rejected {
                code: "charge_disputed".into(),
                message: format!(
                    "The charge you're attempting to refund ({}) has been charged back.",
                    super::disputes::charge_of(&pi.id)
                ),
            }),
            Some(pi) => {
                let left = pi.amount - books.refunded(&pi.id);
                if left <= 0 {
                    Ok(RefundResponse::Rejected {
                        code: "charge_already_refunded".into(),
                        message: format!("Charge for {} has already been refunded.", pi.id),
                    })
                } else if call.amount > left {
                    Ok(RefundResponse::Rejected {
                        code: "amount_too_large".into(),
                        message: format!("Refund amount ({}) is greater than unrefunded amount on charge ({left})", call.amount),
                    })
                } else {
                    books.next_id += 1;
                    let id = format!("re_sim{:08}", books.next_id);
                    if books
                        .refunds_by_call
                        .get(&call.refund_id)
                        .into_iter()
                        .flatten()
                        .filter_map(|id| books.refunds.get(id))
                        .any(|r| r.status != "failed")
                    {
                        books.refund_breaches.push(format!(
                            "refund {} made twice at the provider",
                            call.refund_id
                        ));
                    }
                    let day = 86_400_000.0 * timeline;
                    let (status, changes) = if pi.settles_ms.is_some() {
                        // A bank debit's refund: pending for days, then succeeded or failed.
                        let then = if fails < 0.05 { "failed" } else { "succeeded" };
                        let at = now + ((3.0 + 7.0 * after) * day) as i64;
                        ("pending", Some((at, then.to_owned())))
                    } else if fails < 0.02 {
                        let at = now + ((5.0 + 20.0 * after) * day) as i64;
                        ("succeeded", Some((at, "failed".to_owned())))
                    } else {
                        ("succeeded", None)
                    };
                    books.add_refund(Refund {
                        id: id.clone(),
                        refund_id: call.refund_id.clone(),
                        payment_intent: pi.id.clone(),
                        amount: call.amount,
                        status: status.into(),
                        changes,
                    });
                    let object = refund_json(&books.refunds[&id], &pi.payment_id);
                    books.emit("refund.created", object, now);
                    Ok(RefundResponse::Refunded {
                        provider_refund_id: id,
                        status: status.into(),
                    })
                }
            }
        };
        books.refund_key_order.push_back((now, key.clone()));
        books.refund_keys.insert(
            key,
            KeptRefund {
                params,
                answer: answer.clone(),
                at_ms: now,
            },
        );
        answer
    }

    /// `GET /v1/refunds?payment_intent=...`.
    pub async fn find_refunds(
        &self,
        payment_intent: &str,
    ) -> Result<Vec<FoundRefund>, ProviderError> {
        self.reachable().await?;
        let books = self.books.lock().expect("books");
        Ok(books
            .refunds_of(payment_intent)
            .map(|r| FoundRefund {
                provider_refund_id: r.id.clone(),
                status: r.status.clone(),
                amount: r.amount,
                refund_id: Some(r.refund_id.clone()),
            })
            .collect())
    }

    /// `GET /v1/payment_intents/:id`, its status in the record's words.
    pub async fn payment_status(
        &self,
        payment_intent: &str,
    ) -> Result<Option<String>, ProviderError> {
        self.reachable().await?;
        let books = self.books.lock().expect("books");
        Ok(books
            .intents
            .get(payment_intent)
            .and_then(|i| payment_core::provider::event::payment_status(Some(&i.status))))
    }
}

/// A refund's JSON as the API writes it.
pub fn refund_json(r: &Refund, payment_id: &str) -> Json {
    json!({
        "id": r.id, "object": "refund", "amount": r.amount, "status": r.status,
        "payment_intent": r.payment_intent,
        "metadata": {"refund_id": r.refund_id, "payment_id": payment_id},
    })
}
