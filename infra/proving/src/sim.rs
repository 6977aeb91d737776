//! Client of the provider simulator's control API (`infra/provider-sim/simulator.py`): fault
//! rules and the ledger of charges per idempotency key, the ground truth of every check.

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// One charge as the simulator booked it.
#[derive(Debug, Clone, Deserialize)]
pub struct Charge {
    /// The PaymentIntent id.
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// Lowercase ISO code.
    #[serde(default)]
    pub currency: String,
    /// `succeeded`: the simulator books only what moved money as a charge.
    pub status: String,
}

/// One refund as the simulator booked it.
#[derive(Debug, Clone, Deserialize)]
pub struct Refund {
    /// The refund's id (`re_...`).
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// Lowercase ISO code.
    #[serde(default)]
    pub currency: String,
    /// The PaymentIntent refunded.
    pub payment_intent: String,
    /// `succeeded`, `pending`, or `failed` / `canceled` (no money moved).
    #[serde(default)]
    pub status: String,
}

/// The webhook deliveries of one event.
#[derive(Debug, Clone, Deserialize)]
pub struct Delivery {
    /// Attempts made.
    pub attempts: u32,
    /// One was answered 2xx.
    pub delivered: bool,
    /// The status of each attempt (0: no answer).
    pub statuses: Vec<u16>,
}

impl Refund {
    /// False for a refund the provider failed or canceled: it returned nothing.
    pub fn moved_money(&self) -> bool {
        !matches!(self.status.as_str(), "failed" | "canceled")
    }
}

/// The simulator's books.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Ledger {
    /// Refunds per refund id: more than one is a double refund.
    #[serde(default)]
    pub refunds: HashMap<String, Vec<Refund>>,
    /// `POST /v1/refunds` calls per refund id.
    #[serde(default)]
    pub refund_calls: HashMap<String, u64>,
    /// Charges per idempotency key: more than one is a double charge.
    pub charges: HashMap<String, Vec<Charge>>,
    /// When each of a key's charges was booked, epoch ms.
    #[serde(default)]
    pub charged_at_ms: HashMap<String, Vec<i64>>,
    /// Declines per key (`authentication_required` off-session among them).
    pub declines: HashMap<String, Vec<Value>>,
    /// PaymentIntents waiting for the customer (`requires_action`, on-session only), per key.
    #[serde(default)]
    pub actions: HashMap<String, Vec<Charge>>,
    /// `POST /v1/payment_intents` calls per key.
    pub calls: HashMap<String, u64>,
    /// Disputes by the disputed PaymentIntent.
    #[serde(default)]
    pub disputes: HashMap<String, Value>,
}

impl Ledger {
    /// `POST /v1/payment_intents` calls for one key.
    pub fn calls_for(&self, key: &str) -> u64 {
        self.calls.get(key).copied().unwrap_or(0)
    }

    /// What the provider's refunds of `refund_id` returned to the customer: the failed and
    /// canceled ones returned nothing.
    pub fn refunded(&self, refund_id: &str) -> i64 {
        self.refunds
            .get(refund_id)
            .into_iter()
            .flatten()
            .filter(|r| r.moved_money())
            .map(|r| r.amount)
            .sum()
    }

    /// `POST /v1/payment_intents` calls for every key starting with `prefix` (one run's).
    pub fn calls_under(&self, prefix: &str) -> u64 {
        self.calls
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The control API.
/// What the simulator's limiter let through and refused (`GET /_sim/rate_limit`).
#[derive(Debug, Clone, Deserialize)]
pub struct RateCounts {
    /// Requests let through.
    pub allowed: u64,
    /// Requests refused `429`.
    pub refused: u64,
    /// The refused by `Stripe-Rate-Limited-Reason`.
    pub refused_by_reason: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone)]
pub struct SimClient {
    /// Base URL, e.g. `http://127.0.0.1:12111`.
    base: String,
    /// Plain HTTP client.
    http: reqwest::Client,
}

impl SimClient {
    /// Wraps the simulator's base URL.
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// Adds fault rules (see the simulator's doc for their shape).
    pub async fn add_faults(&self, rules: Value) -> Result<()> {
        self.http
            .post(format!("{}/_sim/faults", self.base))
            .json(&serde_json::json!({ "rules": rules }))
            .send()
            .await
            .context("contacting the provider simulator")?
            .error_for_status()?;
        Ok(())
    }

    /// Removes every fault rule.
    pub async fn clear_faults(&self) -> Result<()> {
        self.http
            .delete(format!("{}/_sim/faults", self.base))
            .send()
            .await
            .context("contacting the provider simulator")?
            .error_for_status()?;
        Ok(())
    }

    /// Switches off the rules with exactly this prefix (other tests' rules stay).
    pub async fn clear_faults_for(&self, prefix: &str) -> Result<()> {
        self.http
            .delete(format!(
                "{}/_sim/faults?prefix={}",
                self.base,
                encode(prefix)
            ))
            .send()
            .await
            .context("contacting the provider simulator")?
            .error_for_status()?;
        Ok(())
    }

    /// Reads a JSON answer of the simulator.
    async fn read<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        Ok(self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .context("contacting the provider simulator")?
            .error_for_status()?
            .json()
            .await?)
    }

    /// Posts a JSON body to a control route.
    async fn control(&self, path: &str, body: &Value) -> Result<()> {
        self.control_answer(path, body).await.map(|_: Value| ())
    }

    async fn control_answer(&self, path: &str, body: &Value) -> Result<Value> {
        Ok(self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .context("contacting the provider simulator")?
            .error_for_status()?
            .json()
            .await
            .unwrap_or(Value::Null))
    }

    /// Every `/v1` answer after a seeded log-normal time with these quantiles (0, 0: at once).
    pub async fn set_latency(&self, p50_ms: f64, p99_ms: f64) -> Result<()> {
        self.control(
            "/_sim/latency",
            &serde_json::json!({ "p50_ms": p50_ms, "p99_ms": p99_ms }),
        )
        .await
    }

    /// The account's rate limits, as Stripe's: at most `per_second` `/v1` requests a second
    /// in all and `endpoint_per_second` to each endpoint, the rest answered `429` (0: no
    /// limit). Starts its counts afresh.
    pub async fn set_rate_limit(&self, per_second: f64, endpoint_per_second: f64) -> Result<()> {
        self.control(
            "/_sim/rate_limit",
            &serde_json::json!({ "per_second": per_second, "endpoint_per_second": endpoint_per_second }),
        )
        .await
    }

    /// The `/v1` requests let through and refused since the limits were last set, and the
    /// refused by reason (`global-rate`, `endpoint-rate`).
    pub async fn rate_counts(&self) -> Result<RateCounts> {
        self.read("/_sim/rate_limit").await
    }

    /// The account's default API version, which the events made from now on are rendered in.
    pub async fn set_account_version(&self, version: &str) -> Result<()> {
        self.control(
            "/_sim/account",
            &serde_json::json!({ "api_version": version }),
        )
        .await
    }

    /// The cardholder disputes the charge of `payment_intent` (charged before): the dispute's
    /// id.
    pub async fn open_dispute(&self, payment_intent: &str) -> Result<String> {
        let out: Value = self
            .control_answer(
                "/_sim/disputes/open",
                &serde_json::json!({ "payment_intent": payment_intent }),
            )
            .await?;
        out["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("the simulator opened no dispute: {out}"))
    }

    /// Closes a dispute as the card network decided it (`won` or lost).
    pub async fn close_dispute(&self, dispute_id: &str, won: bool) -> Result<()> {
        let path = format!("/_sim/disputes/{}/close", encode(dispute_id));
        self.control(&path, &serde_json::json!({ "won": won }))
            .await
    }

    /// Sets the webhook endpoint and its delivery faults (see the simulator's `events.py`).
    pub async fn webhook(&self, settings: Value) -> Result<()> {
        self.control("/_sim/webhook", &settings).await
    }

    /// Where the simulator sends its events (`None`: nowhere): an endpoint set by
    /// [`Self::webhook`] or registered through Stripe's API.
    pub async fn registered_endpoint(&self) -> Result<Option<String>> {
        let settings: Value = self
            .http
            .post(format!("{}/_sim/webhook", self.base))
            .json(&serde_json::json!({}))
            .send()
            .await
            .context("contacting the provider simulator")?
            .error_for_status()?
            .json()
            .await?;
        Ok(settings["url"].as_str().map(str::to_owned))
    }

    /// Adds the account's other traffic: `count` events of `kind` made evenly over
    /// `[since_s, until_s]`, delivered to every endpoint (`POST /_sim/events/history`).
    pub async fn event_history(
        &self,
        count: usize,
        since_s: i64,
        until_s: i64,
        kind: &str,
    ) -> Result<()> {
        self.control(
            "/_sim/events/history",
            &serde_json::json!({"count": count, "since": since_s, "until": until_s, "type": kind}),
        )
        .await
    }

    /// Marks events as having failed every delivery attempt (`POST /_sim/events/undelivered`):
    /// an outage longer than the provider retries.
    pub async fn undelivered(&self, ids: &[String]) -> Result<()> {
        self.control(
            "/_sim/events/undelivered",
            &serde_json::json!({ "ids": ids }),
        )
        .await
    }

    /// Per event id: how many delivery attempts, and whether one was acknowledged.
    pub async fn deliveries(&self) -> Result<HashMap<String, Delivery>> {
        self.read("/_sim/deliveries").await
    }

    /// The whole ledger.
    pub async fn ledger(&self) -> Result<Ledger> {
        self.ledger_query("").await
    }

    /// The ledger of one key.
    pub async fn ledger_for(&self, key: &str) -> Result<Ledger> {
        let q: String = key
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        self.ledger_query(&format!("?key={q}")).await
    }

    async fn ledger_query(&self, query: &str) -> Result<Ledger> {
        self.read(&format!("/_sim/ledger{query}")).await
    }
}
