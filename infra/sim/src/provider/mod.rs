//! Stripe, modelled behind the project's provider port ([`PaymentProvider`]): the wire client is
//! held to Stripe's own definitions by the contract test, so here the provider is its
//! behaviour, not its bytes.
//!
//! Modelled: PaymentIntents created and confirmed under an `Idempotency-Key`, by payment
//! method (a card that succeeds, one declined, one needing its customer, a bank debit that stays
//! `processing` and settles days later or fails); keys remembered 24 hours, a key reused with
//! other parameters refused, a key whose first request is still running answered `409`, a
//! stored `500` replayed; log-normal latency; `500`s before and after the write commits; an
//! answer lost after the commit (the client's timeout); `429` by the account's rate, and a
//! write's `429` `lock_timeout` about its object alone; the
//! listing a lookup reads; disputes ([`disputes`]). The books ([`Books`]) are the ground truth every invariant is
//! checked against.
//!
//! Why ~500 lines: the books' one struct and the charge path (keys, intents, faults) that every
//! other part of the model writes through; refunds, disputes, events and the listing are their
//! own files.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use payment_core::domain::PaymentRequest;
use payment_core::provider::{
    FailureKind, FoundPayment, PaymentQuery, ProviderError, ProviderResponse, RateLimit,
};
use sqs_once::clock::Clock;

mod behaviour;
pub mod client;
pub mod disputes;
pub mod events;
pub mod listing;
pub use behaviour::{Behaviour, Outage};
pub mod refunds;
pub mod settle;

/// The payment methods the simulated customers pay with, as the test mode names them.
pub mod methods {
    /// A card that is charged at once.
    pub const CARD: &str = "pm_card_visa";
    /// A card declined (`card_declined`, `generic_decline`).
    pub const DECLINED: &str = "pm_card_chargeDeclined";
    /// A card that needs its customer (`authentication_required`).
    pub const NEEDS_CUSTOMER: &str = "pm_card_authenticationRequired";
    /// A bank debit: `processing`, settled days later.
    pub const BANK_DEBIT: &str = "pm_usBankAccount_success";
    /// A bank debit that fails days later.
    pub const BANK_DEBIT_FAILS: &str = "pm_usBankAccount_failure";
}

/// One PaymentIntent.
#[derive(Debug, Clone)]
pub struct Intent {
    /// `pi_...`.
    pub id: String,
    /// `metadata[payment_id]`.
    pub payment_id: String,
    /// Minor units.
    pub amount: i64,
    /// Lowercase.
    pub currency: String,
    /// The customer.
    pub customer: String,
    /// Its status.
    pub status: String,
    /// When created, epoch ms.
    pub created_ms: i64,
    /// When a `processing` debit settles (or fails), epoch ms.
    pub settles_ms: Option<i64>,
    /// The last confirmation's failure code.
    pub failure_code: Option<String>,
}

/// What the provider remembers for a key: the request's parameters and its answer.
#[derive(Debug, Clone)]
struct Kept {
    params: String,
    answer: Result<ProviderResponse, ProviderError>,
    at_ms: i64,
    /// The first request with the key has not answered yet.
    running: bool,
}

/// The provider's state: its books.
#[derive(Debug, Default)]
pub struct Books {
    /// Intents by id.
    pub intents: BTreeMap<String, Intent>,
    /// Idempotency keys ...
    keys: BTreeMap<String, Kept>,
    /// ... and when each was kept, oldest first (forgotten 24 hours on).
    key_order: VecDeque<(i64, String)>,
    /// Requests answered.
    pub requests: u64,
    /// Requests refused `429`.
    pub refused: u64,
    /// Requests in the current second, and which second.
    second: (i64, f64),
    next_id: u64,
    /// Intent ids by payment id.
    by_payment: BTreeMap<String, Vec<String>>,
    /// Every moment a payment came to hold two live charges (succeeded, processing or
    /// authorised), as found when it happened.
    pub double_charges: Vec<String>,
    /// Refunds by id (`re_...`).
    pub refunds: BTreeMap<String, refunds::Refund>,
    /// Refund requests' keys (`refund:<refund_id>`): parameters, answer, when ...
    refund_keys: BTreeMap<String, refunds::KeptRefund>,
    /// ... and when each was kept, oldest first.
    refund_key_order: VecDeque<(i64, String)>,
    /// Refund ids (`re_...`) by PaymentIntent, and by the merchant's refund id.
    refunds_by_intent: BTreeMap<String, Vec<String>>,
    refunds_by_call: BTreeMap<String, Vec<String>>,
    /// What changes by itself later: (when, what, id), what being a debit, a refund or a
    /// dispute (`settle`), checked against the object when its time comes (a stale one does nothing).
    due: BTreeSet<(i64, u8, String)>,
    /// Every moment a refund went beyond its charge, or a refund id was refunded twice.
    pub refund_breaches: Vec<String>,
    /// Events not handed to the delivery yet.
    events: Vec<events::Event>,
    /// Every event of the last 30 days, oldest first, as `GET /v1/events` lists them.
    log: std::collections::VecDeque<listing::Logged>,
    /// Disputes by id (`dp_...`), those planned but not open yet among them.
    pub disputes: BTreeMap<String, disputes::Dispute>,
    /// Which charges are disputed, and when (none without one).
    pub dispute_plan: Option<disputes::DisputePlan>,
    /// PaymentIntents a refund's request failed about (429, 5xx, no answer): the checks' oracle.
    pub refund_trouble: BTreeSet<String>,
    /// The stack's webhook endpoint: when it was away (deleted, and registered again).
    pub endpoint: listing::Endpoint,
    /// Which failed debits their customers pay again, and when.
    pub repay_plan: Option<settle::RepayPlan>,
    /// The PaymentIntents confirmed again by their customer with another payment method
    /// (which settles: the debit that failed is not tried again).
    pub repaid: BTreeSet<String>,
}

/// Forgets the keys kept 24 hours or more before `now_ms` (Stripe's window), oldest first.
fn forget_keys<V>(
    keys: &mut BTreeMap<String, V>,
    order: &mut VecDeque<(i64, String)>,
    at_of: impl Fn(&V) -> i64,
    now_ms: i64,
) {
    while let Some((at, key)) = order.front() {
        if at + 24 * 3_600_000 > now_ms {
            break;
        }
        crate::cost::visit(1);
        // A key kept again later (a provider that ignores keys) stays for its later time.
        if keys.get(key).is_some_and(|v| at_of(v) == *at) {
            keys.remove(key);
        }
        order.pop_front();
    }
}

/// A draw in [0, 1) for one question (`what`) about one object, fixed by the run's seed and the
/// object's id, not by the order events happen in: a plan of what the provider will do to it
/// (a dispute, a customer paying again).
pub(super) fn draw(seed: u64, id: &str, what: &str) -> f64 {
    crate::fnv(format!("{seed}/{id}/{what}").as_bytes()) as f64 / u64::MAX as f64
}

/// True for an intent that moved money or will (`processing` settles by itself).
pub fn live(status: &str) -> bool {
    matches!(status, "succeeded" | "processing" | "requires_capture")
}

impl Books {
    /// The intents of a payment.
    pub fn intents_of(&self, payment_id: &str) -> Vec<&Intent> {
        self.by_payment
            .get(payment_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.intents.get(id))
            .collect()
    }

    fn add(&mut self, intent: Intent) {
        let pid = intent.payment_id.clone();
        let id = intent.id.clone();
        let is_live = live(&intent.status);
        if let Some(at) = intent.settles_ms {
            self.due.insert((at, settle::DUE_INTENT, id.clone()));
        }
        self.intents.insert(id.clone(), intent);
        let ids = self.by_payment.entry(pid.clone()).or_default();
        ids.push(id);
        if is_live {
            let n = ids
                .iter()
                .filter(|i| self.intents.get(*i).is_some_and(|x| live(&x.status)))
                .count();
            if n > 1 {
                self.double_charges
                    .push(format!("{pid} holds {n} live charges: {ids:?}"));
            }
        }
    }
}

/// The simulated provider, shared by every process of the run.
#[derive(Clone)]
pub struct Provider {
    /// Its books.
    pub books: Arc<Mutex<Books>>,
    /// Its behaviour.
    pub behaviour: Arc<Mutex<Behaviour>>,
    clock: Arc<dyn Clock>,
    rng: Arc<Mutex<fastrand::Rng>>,
    /// The client's timeout.
    timeout: Duration,
}

impl Provider {
    /// A provider with empty books.
    pub fn new(seed: u64, clock: Arc<dyn Clock>, timeout: Duration) -> Self {
        Self {
            books: Arc::new(Mutex::new(Books::default())),
            behaviour: Arc::new(Mutex::new(Behaviour::default())),
            clock,
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))),
            timeout,
        }
    }

    fn draw(&self) -> f64 {
        self.rng.lock().expect("rng").f64()
    }

    fn latency(&self, median_ms: f64) -> Duration {
        let (u1, u2) = (self.draw().max(1e-12), self.draw());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        Duration::from_micros((median_ms * (0.6 * z).exp() * 1000.0) as u64)
            .min(Duration::from_secs(60))
    }

    /// Counts a request against the account's rate; `false` when it is over.
    fn admit(&self, rate: f64) -> bool {
        let now = self.clock.now_ms();
        let mut b = self.books.lock().expect("books");
        b.requests += 1;
        let second = now.div_euclid(1000);
        if b.second.0 != second {
            b.second = (second, 0.0);
        }
        b.second.1 += 1.0;
        if b.second.1 > rate {
            b.refused += 1;
            return false;
        }
        true
    }

    fn error(kind: FailureKind, message: &str) -> ProviderError {
        ProviderError::new(kind, message)
    }
}

fn params_of(r: &PaymentRequest) -> String {
    format!(
        "{}|{}|{}|{}|{}",
        r.payment_id, r.money.amount, r.money.currency, r.customer_id, r.payment_method
    )
}

impl Provider {
    /// Creates and confirms a payment, as `POST /v1/payment_intents` with `confirm=true`.
    pub async fn create_payment(
        &self,
        request: &PaymentRequest,
    ) -> Result<ProviderResponse, ProviderError> {
        let b = self.behaviour.lock().expect("behaviour").clone();
        let (there, back) = (
            self.latency(b.latency_ms / 2.0),
            self.latency(b.latency_ms / 2.0),
        );
        let outage = b.outage(self.clock.now_ms());
        if there + back > self.timeout || outage == Some(Outage::Failing) {
            // The request may still arrive and be executed; the client gave up.
            tokio::time::sleep(self.timeout).await;
            if self.draw() < 0.5 {
                let _ = self.execute(request, &b);
                self.release(request);
            }
            return Err(Self::error(
                FailureKind::Timeout,
                "no answer within the client's timeout",
            ));
        }
        tokio::time::sleep(there).await;
        let answer = if outage.is_some() {
            Err(Self::error(
                FailureKind::Connect,
                "the provider cannot be reached",
            ))
        } else if !self.admit(b.account_rate) {
            let mut e = Self::error(FailureKind::RateLimited, "429: too many requests");
            e.rate_limit = Some(RateLimit::Account);
            Err(e)
        } else if self.draw() < b.lock_timeout_rate {
            let mut e = Self::error(
                FailureKind::RateLimited,
                "429 lock_timeout: another request holds this object",
            );
            e.rate_limit = Some(RateLimit::Object);
            Err(e)
        } else if self.draw() < b.error_before_rate {
            Err(Self::error(
                FailureKind::ServerError,
                "500 before any write",
            ))
        } else {
            self.execute(request, &b)
        };
        let lost = answer.is_ok() && self.draw() < b.lost_answer_rate;
        // The key is held while the request runs: a second request with it meanwhile is 409.
        tokio::time::sleep(back / 2).await;
        self.release(request);
        tokio::time::sleep(back - back / 2).await;
        if lost {
            tokio::time::sleep(self.timeout.saturating_sub(there + back)).await;
            return Err(Self::error(FailureKind::Timeout, "the answer was lost"));
        }
        answer
    }

    /// A read's latency, outage and rate.
    pub(super) async fn reachable(&self) -> Result<(), ProviderError> {
        let b = self.behaviour.lock().expect("behaviour").clone();
        match b.outage(self.clock.now_ms()) {
            Some(Outage::Down) => {
                return Err(Self::error(
                    FailureKind::Connect,
                    "the provider cannot be reached",
                ))
            }
            Some(Outage::Failing) => {
                tokio::time::sleep(self.timeout).await;
                return Err(Self::error(
                    FailureKind::Timeout,
                    "no answer within the client's timeout",
                ));
            }
            None => {}
        }
        tokio::time::sleep(self.latency(b.latency_ms)).await;
        if !self.admit(b.account_rate) {
            let mut e = Self::error(FailureKind::RateLimited, "429: too many requests");
            e.rate_limit = Some(RateLimit::Account);
            return Err(e);
        }
        // A read fails as a write does: a 500, or its answer lost (the client times out).
        if self.draw() < b.error_before_rate {
            return Err(Self::error(FailureKind::ServerError, "500 on a read"));
        }
        if self.draw() < b.lost_answer_rate {
            tokio::time::sleep(self.timeout.saturating_sub(self.latency(b.latency_ms))).await;
            return Err(Self::error(FailureKind::Timeout, "a read's answer lost"));
        }
        Ok(())
    }

    /// Lists a payment's intents (the customer's list, filtered by `metadata[payment_id]`).
    pub async fn find_payments(
        &self,
        query: &PaymentQuery,
    ) -> Result<Vec<FoundPayment>, ProviderError> {
        self.reachable().await?;
        let books = self.books.lock().expect("books");
        let from_ms = query.created_from_s.map_or(i64::MIN, |s| s * 1000);
        Ok(books
            .intents
            .values()
            .filter(|i| i.payment_id == query.payment_id.as_str() && i.created_ms >= from_ms)
            .filter(|i| query.customer.as_deref().is_none_or(|c| c == i.customer))
            .map(|i| FoundPayment {
                provider_payment_id: i.id.clone(),
                status: i.status.clone(),
                payment_id: Some(i.payment_id.clone()),
                amount: Some(i.amount),
                currency: Some(i.currency.clone()),
                failure_code: i.failure_code.clone(),
            })
            .collect())
    }
}

impl Provider {
    /// The request with this key has finished running.
    fn release(&self, r: &PaymentRequest) {
        if let Some(k) = self
            .books
            .lock()
            .expect("books")
            .keys
            .get_mut(r.payment_id.as_str())
        {
            k.running = false;
        }
    }

    /// Executes a create-and-confirm under its key, as the provider's API does.
    fn execute(
        &self,
        r: &PaymentRequest,
        b: &Behaviour,
    ) -> Result<ProviderResponse, ProviderError> {
        let now = self.clock.now_ms();
        let key = r.payment_id.as_str().to_owned();
        let params = params_of(r);
        let error_after = self.draw() < b.error_after_rate;
        let mut books = self.books.lock().expect("books");
        let Books {
            keys, key_order, ..
        } = &mut *books;
        if crate::cost::on("provider_walks_keys") {
            crate::cost::visit(keys.len());
            keys.retain(|_, k| k.at_ms + 24 * 3_600_000 > now);
        }
        forget_keys(keys, key_order, |k| k.at_ms, now);
        if let Some(k) = books.keys.get(&key).filter(|_| !b.ignores_keys) {
            if k.params != params {
                return Ok(ProviderResponse::KeyReused {
                    message: "Keys for idempotent requests can only be used with the same parameters they were first used with".into(),
                });
            }
            if k.running {
                return Err(Self::error(
                    FailureKind::KeyInUse,
                    "409: a request with this key is in flight",
                ));
            }
            return match k.answer.clone() {
                Ok(ProviderResponse::Charged {
                    provider_payment_id,
                    status,
                    ..
                }) => Ok(ProviderResponse::Charged {
                    provider_payment_id,
                    status,
                    replayed: true,
                }),
                Err(mut e) => {
                    e.replayed = true;
                    Err(e)
                }
                other => other,
            };
        }
        books.next_id += 1;
        let id = format!("pi_sim{:08}", books.next_id);
        let (status, failure, answer) = match r.payment_method.as_str() {
            methods::DECLINED => (
                "requires_payment_method",
                Some("generic_decline"),
                ProviderResponse::Declined {
                    provider_payment_id: Some(id.clone()),
                    decline_code: Some("generic_decline".into()),
                },
            ),
            methods::NEEDS_CUSTOMER => (
                "requires_payment_method",
                Some("authentication_required"),
                ProviderResponse::NeedsAuthentication {
                    provider_payment_id: Some(id.clone()),
                },
            ),
            methods::BANK_DEBIT | methods::BANK_DEBIT_FAILS => (
                "processing",
                None,
                ProviderResponse::Charged {
                    provider_payment_id: id.clone(),
                    status: "processing".into(),
                    replayed: false,
                },
            ),
            _ => (
                "succeeded",
                None,
                ProviderResponse::Charged {
                    provider_payment_id: id.clone(),
                    status: "succeeded".into(),
                    replayed: false,
                },
            ),
        };
        let settles_ms =
            (status == "processing").then(|| now + (b.settle_days * 86_400_000.0) as i64);
        books.add(Intent {
            id: id.clone(),
            payment_id: key.clone(),
            amount: r.money.amount,
            currency: r.money.currency.clone(),
            customer: r.customer_id.clone(),
            status: status.into(),
            created_ms: now,
            settles_ms,
            failure_code: failure.map(str::to_owned),
        });
        if status == "succeeded" {
            books.plan_dispute(&id, now);
        }
        books.emit_intent(&id, now);
        let answer = if error_after {
            Err(Self::error(FailureKind::ServerError, "500 after the write"))
        } else {
            Ok(answer)
        };
        books.key_order.push_back((now, key.clone()));
        books.keys.insert(
            key,
            Kept {
                params,
                answer: answer.clone(),
                at_ms: now,
                running: true,
            },
        );
        answer
    }
}
