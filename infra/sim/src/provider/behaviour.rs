//! What the simulated provider does besides answering: latency, faults, rate, outages.

/// What the provider does besides answering: its latency, faults and rate.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Median latency, ms.
    pub latency_ms: f64,
    /// Chance of a `500` before anything is written.
    pub error_before_rate: f64,
    /// Chance of a `500` after the intent was written (stored under the key and replayed).
    pub error_after_rate: f64,
    /// Chance the answer is lost after the write (the client times out).
    pub lost_answer_rate: f64,
    /// Chance a write is refused `429` `lock_timeout` before it is executed: another request
    /// held its object (Stripe's `resource-specific` limit). Only that object waits; the
    /// account's rate is not the cause.
    pub lock_timeout_rate: f64,
    /// Requests per second the account allows (live mode: 100), shared with the merchant.
    pub account_rate: f64,
    /// Days a bank debit takes to settle.
    pub settle_days: f64,
    /// The provider goes down at this epoch ms: for its first hour it fails (every answer lost,
    /// half the requests executed), then it cannot be reached ...
    pub outage_from_ms: i64,
    /// ... until this one.
    pub outage_until_ms: i64,
    /// A provider that ignores `Idempotency-Key` (no real one does): the simulator's own
    /// check that its double-charge invariant fires.
    pub ignores_keys: bool,
    /// How much of its own time a refund's later change takes (1: days to weeks, as Stripe's
    /// bank refunds do). A sweep that shortens the refund window shortens this with it, so the
    /// provider's timeline still fits in the records' lifetimes and a seed reaches past them.
    pub timeline: f64,
}

/// A phase of an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Its first hour: requests time out, some executed.
    Failing,
    /// The rest: the connection fails, nothing is sent.
    Down,
}

impl Behaviour {
    /// The outage's phase at `now_ms`, if one runs.
    pub fn outage(&self, now_ms: i64) -> Option<Outage> {
        if !(self.outage_from_ms..self.outage_until_ms).contains(&now_ms) {
            None
        } else if now_ms < self.outage_from_ms + 3_600_000 {
            Some(Outage::Failing)
        } else {
            Some(Outage::Down)
        }
    }
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            latency_ms: 300.0,
            error_before_rate: 0.0,
            error_after_rate: 0.0,
            lost_answer_rate: 0.0,
            lock_timeout_rate: 0.005,
            account_rate: 100.0,
            settle_days: 4.0,
            outage_from_ms: 0,
            outage_until_ms: 0,
            ignores_keys: false,
            timeline: 1.0,
        }
    }
}
