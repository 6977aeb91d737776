//! When a message that must come back is delivered again, and when the processor stops
//! giving it back: the receive budget.
//!
//! SQS moves a message to the dead-letter queue, silently, once it has been received more than
//! the queue's `maxReceiveCount` times. The processor never leaves that decision to SQS for a
//! message it could still explain: every path that hands a message back picks its delay here
//! ([`Redelivery`]), and on the last receive the budget allows ([`Budget::exhausted`]) the
//! processor dead-letters the message itself as `retries_exhausted` with the last error.
//! `maxReceiveCount` is then only the safety net for crashes (a process killed while it held
//! the message on its last receive).
//!
//! Transient failures are spread over the retry horizon ([`Budget::spread`]): the receives left
//! divide the time left until the horizon, so an outage as long as the horizon never exhausts
//! the budget, whatever the queue's `maxReceiveCount` (≥ 2) and visibility timeout.

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;

/// SQS keeps a message hidden at most 12 hours from its receipt; the delay stays under it.
pub const MAX_DELAY: Duration = Duration::from_secs(12 * 3600 - 60);

/// The first look at a live lease comes back at most this soon: most holders finish in
/// milliseconds and a look costs one conditional write.
pub const BUSY_RECHECK: Duration = Duration::from_secs(4);

/// Why a message comes back, which decides when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redelivery {
    /// A lost race (the record changed under the claim, the lease was taken over): look again
    /// in a second or two.
    Soon,
    /// Not before this epoch ms (a live lease's end, a record's `not_before`, the time a lookup
    /// can prove that no effect exists).
    At(i64),
    /// Another attempt holds a live lease ending at this epoch ms. The first delivery looks
    /// again within [`BUSY_RECHECK`]; later ones wait for the lease's end, so a dead holder's
    /// key is taken over after at most one lease and its copies do not burn the budget.
    Busy(i64),
    /// A transient failure (downstream, store, queue): exponential backoff on the receive count,
    /// stretched to spread the receives left over the retry horizon.
    Backoff,
    /// A transient failure after a call that may still land: the backoff, but not before the
    /// record's `not_before` (epoch ms), so the next delivery is not refused for it.
    BackoffAfter(i64),
}

/// What the receive budget of one delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// `ApproximateReceiveCount` of this delivery (1 for the first).
    pub receive_count: u32,
    /// The source queue's `maxReceiveCount`, when it has a redrive policy.
    pub max_receive_count: Option<u32>,
    /// Epoch ms of the message's first receipt (`ApproximateFirstReceiveTimestamp`).
    pub first_received_at_ms: Option<i64>,
}

impl Budget {
    /// The budget of a delivery from its SQS attributes and the queue's `maxReceiveCount`.
    pub fn of(msg: &SqsMessage, max_receive_count: Option<u32>) -> Self {
        let attr = |k: &str| msg.attributes.get(k).and_then(|v| v.parse::<i64>().ok());
        Self {
            receive_count: attr("ApproximateReceiveCount")
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
                .max(1),
            max_receive_count,
            first_received_at_ms: attr("ApproximateFirstReceiveTimestamp"),
        }
    }

    /// True on the last receive before SQS would move the message itself: the processor
    /// dead-letters it with a reason instead of handing it back.
    pub fn exhausted(&self) -> bool {
        self.max_receive_count
            .is_some_and(|max| self.receive_count >= max)
    }

    /// The least delay that spreads the receives left over what is left of `horizon` since the
    /// first receipt: `(horizon - elapsed) / receives left`. Zero without a redrive policy.
    pub fn spread(&self, horizon: Duration, now_ms: i64) -> Duration {
        let Some(max) = self.max_receive_count else {
            return Duration::ZERO;
        };
        let left = max.saturating_sub(self.receive_count);
        if left == 0 {
            return Duration::ZERO;
        }
        let elapsed = self
            .first_received_at_ms
            .map(|t| Duration::from_millis((now_ms - t).max(0) as u64))
            .unwrap_or_default();
        horizon.saturating_sub(elapsed) / left
    }
}

/// Backoff tunables, from [`crate::Settings`].
#[derive(Debug, Clone, Copy)]
pub struct BackoffPolicy {
    /// Delay after the first failed delivery; doubles per receive.
    pub base: Duration,
    /// Cap of the exponential part.
    pub max: Duration,
    /// The retry horizon: transient failures this long never exhaust the budget.
    pub horizon: Duration,
}

/// Visibility delay before the next delivery after a transient failure: exponential in the
/// receive count, capped, with full jitter in its upper half so a fleet does not retry in step.
pub fn redelivery_delay(receive_count: u32, base: Duration, max: Duration) -> Duration {
    let exp = receive_count.saturating_sub(1).min(20);
    let full = base.saturating_mul(1u32 << exp).min(max);
    let half = full / 2;
    half + half.mul_f64(fastrand::f64())
}

fn backoff(budget: &Budget, policy: &BackoffPolicy, now_ms: i64) -> Duration {
    redelivery_delay(budget.receive_count, policy.base, policy.max)
        .max(budget.spread(policy.horizon, now_ms))
}

/// The delay for a message handed back for `why`, at `now_ms`, within SQS's 12-hour cap.
pub fn delay_for(
    why: Redelivery,
    budget: &Budget,
    policy: &BackoffPolicy,
    now_ms: i64,
) -> Duration {
    let until = |t: i64| Duration::from_millis((t - now_ms).max(0) as u64);
    let d = match why {
        Redelivery::Soon => Duration::from_secs(2),
        Redelivery::At(t) => until(t) + Duration::from_secs(1),
        Redelivery::Busy(lease_end) if budget.receive_count <= 1 => {
            until(lease_end).min(BUSY_RECHECK) + Duration::from_secs(1)
        }
        Redelivery::Busy(lease_end) => until(lease_end) + Duration::from_secs(1),
        Redelivery::Backoff => backoff(budget, policy, now_ms),
        Redelivery::BackoffAfter(t) => {
            backoff(budget, policy, now_ms).max(until(t) + Duration::from_secs(1))
        }
    };
    d.min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(n: u32, max: Option<u32>, first: i64) -> Budget {
        Budget {
            receive_count: n,
            max_receive_count: max,
            first_received_at_ms: Some(first),
        }
    }

    const POLICY: BackoffPolicy = BackoffPolicy {
        base: Duration::from_secs(10),
        max: Duration::from_secs(900),
        horizon: Duration::from_secs(3600),
    };

    #[test]
    fn redelivery_delay_grows_and_is_capped() {
        let base = Duration::from_secs(10);
        let max = Duration::from_secs(900);
        for n in 1..=12u32 {
            let d = redelivery_delay(n, base, max);
            let full = (base * 2u32.pow(n - 1)).min(max);
            assert!(d >= full / 2 && d <= full, "n={n} d={d:?}");
        }
        assert!(redelivery_delay(50, base, max) <= max);
    }

    #[test]
    fn the_last_receive_is_the_processors_not_sqss() {
        assert!(!budget(4, Some(5), 0).exhausted());
        assert!(budget(5, Some(5), 0).exhausted());
        assert!(budget(7, Some(5), 0).exhausted());
        assert!(
            !budget(1_000, None, 0).exhausted(),
            "no redrive policy, no budget"
        );
    }

    /// Replays an outage: every delivery fails transiently until `outage` has passed. Returns
    /// the receive on which the work went through, or `None` if the budget ran out first.
    fn survive(outage: Duration, max: u32, busy_first: u32) -> Option<u32> {
        let first = 1_000_000i64;
        let mut now = first;
        for n in 1..=max {
            let b = budget(n, Some(max), first);
            if now - first >= outage.as_millis() as i64 {
                return Some(n);
            }
            if b.exhausted() {
                return None;
            }
            // The first receives may meet a dead holder's live lease of 60 s.
            let why = if n <= busy_first {
                Redelivery::Busy(first + 60_000)
            } else {
                Redelivery::Backoff
            };
            now += delay_for(why, &b, &POLICY, now).as_millis() as i64;
        }
        None
    }

    #[test]
    fn an_outage_as_long_as_the_horizon_exhausts_no_budget_of_three_or_more() {
        for max in [3, 4, 5, 10, 20] {
            assert!(
                survive(Duration::from_secs(3600), max, 0).is_some(),
                "maxReceiveCount {max}"
            );
            assert!(
                survive(Duration::from_secs(3600), max, 1).is_some(),
                "maxReceiveCount {max} after a busy look"
            );
        }
    }

    #[test]
    fn a_copy_looks_quickly_once_then_waits_for_the_lease_end() {
        let lease_end = 60_000;
        let first = delay_for(
            Redelivery::Busy(lease_end),
            &budget(1, Some(5), 0),
            &POLICY,
            0,
        );
        assert_eq!(first, BUSY_RECHECK + Duration::from_secs(1));
        let second = delay_for(
            Redelivery::Busy(lease_end),
            &budget(2, Some(5), 0),
            &POLICY,
            0,
        );
        assert_eq!(second, Duration::from_secs(61));
        let far = delay_for(
            Redelivery::At(i64::MAX / 2),
            &budget(2, Some(5), 0),
            &POLICY,
            0,
        );
        assert_eq!(far, MAX_DELAY, "capped below SQS's 12 hours");
    }
}
