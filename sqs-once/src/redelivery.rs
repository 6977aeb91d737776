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
//! Transient failures follow a geometric schedule over the retry horizon ([`schedule`]): the
//! first wait is the base delay (seconds: one blip costs seconds), each later one `r` times the
//! one before, with `r` chosen so that the waits between a message's `maxReceiveCount`
//! deliveries add up to the horizon. Each delivery scales what is left of the schedule to the
//! time actually left ([`geometric_delay`]), so busy looks, slow attempts and jitter never
//! push the last delivery past the horizon nor pull it before: an outage as long as the horizon
//! never exhausts the budget, whatever the queue's `maxReceiveCount` (≥ 3) and visibility
//! timeout, as long as the waits fit under SQS's 12-hour cap.
//!
//! Why ~540 lines: ~270 of them are the unit tests of the schedule (every `maxReceiveCount` and
//! horizon), beside the arithmetic they check.

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;

use crate::queue::QueueLimits;

/// SQS keeps a message hidden at most 12 hours from its receipt; the delay stays under it.
pub const MAX_DELAY: Duration = Duration::from_secs(12 * 3600 - 60);

/// The shortest wait of a message handed back: a delivery that cannot come back at least this
/// long before the retention bound is dead-lettered instead.
pub const MIN_DELAY: Duration = Duration::from_secs(1);

/// The first look at a live lease comes back at most this soon: most holders finish in
/// milliseconds and a look costs one conditional write.
pub const BUSY_RECHECK: Duration = Duration::from_secs(4);

/// Why a message comes back, which decides when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redelivery {
    /// A lost race (the record changed under the claim, the lease was taken over): look again
    /// in a second or two.
    Soon,
    /// Never attempted in this delivery (a FIFO follower behind a failure, not started before
    /// the invocation deadline): in a second or two, like [`Redelivery::Soon`]; on the last
    /// receive the message is requeued as a fresh copy instead of being dead-lettered.
    NotAttempted,
    /// Never attempted: no slot of the downstream's pace before the invocation's cut-off
    /// ([`crate::pace`]); comes back when the pace has one (epoch ms). On the last receive it
    /// is requeued however often it was before: waiting for the pace is bounded by the record
    /// retention (an older message is dead-lettered `request_expired`), not by the receives.
    Paced(i64),
    /// Not before this epoch ms (a live lease's end, a record's `not_before`, the time a lookup
    /// can prove that no effect exists).
    At(i64),
    /// Another attempt holds a live lease ending at this epoch ms. The first delivery looks
    /// again within [`BUSY_RECHECK`]; later ones wait for the lease's end, so a dead holder's
    /// key is taken over after at most one lease and its copies do not burn the budget.
    Busy(i64),
    /// A transient failure (downstream, store, queue): the geometric schedule over the retry
    /// horizon ([`geometric_delay`]).
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
    /// Epoch ms by which a delivery must come back to finish (or dead-letter the message)
    /// before SQS deletes it by the queue's retention: `SentTimestamp` + retention − margin.
    /// `None` when the retention or the send time is not known.
    pub last_delivery_by_ms: Option<i64>,
}

impl Budget {
    /// The budget of a delivery from its SQS attributes and its queue's limits; `margin` is
    /// how long before the queue's retention ends the last delivery must come back.
    pub fn of(msg: &SqsMessage, limits: QueueLimits, margin: Duration) -> Self {
        let attr = |k: &str| msg.attributes.get(k).and_then(|v| v.parse::<i64>().ok());
        // Retention counts from this queue's send (a redriven copy is a new message), not
        // from the carried `first_sent_at`.
        let last_delivery_by_ms = match (limits.retention, attr("SentTimestamp")) {
            (Some(retention), Some(sent)) => Some(
                sent.saturating_add(
                    retention
                        .saturating_sub(margin)
                        .as_millis()
                        .min(i64::MAX as u128) as i64,
                ),
            ),
            _ => None,
        };
        Self {
            receive_count: attr("ApproximateReceiveCount")
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
                .max(1),
            max_receive_count: limits.max_receive_count,
            first_received_at_ms: attr("ApproximateFirstReceiveTimestamp"),
            last_delivery_by_ms,
        }
    }

    /// True on the last receive before SQS would move the message itself: the processor
    /// dead-letters it with a reason instead of handing it back.
    pub fn exhausted(&self) -> bool {
        self.max_receive_count
            .is_some_and(|max| self.receive_count >= max)
    }

    /// True once half the receives are spent (with a `maxReceiveCount` of 3, one is left;
    /// of 2 or less, on the last: there this is [`Budget::exhausted`]): a message never
    /// attempted is copied afresh now, keeping the rest for what it cannot plan for (a crash
    /// of the invocation that holds it, a duplicate SQS delivers later with this receive
    /// count, and a crash or a duplicate of that one).
    pub fn half_spent(&self) -> bool {
        self.max_receive_count.is_some_and(|max| {
            let spare = if max > 3 { max / 2 } else { u32::from(max > 2) };
            self.receive_count + spare >= max
        })
    }

    /// True when no delivery could come back at `now_ms` or later and still finish before the
    /// queue's retention deletes the message ([`Budget::last_delivery_by_ms`]): the processor
    /// dead-letters it with a reason now, since SQS would drop it without one.
    pub fn out_of_retention(&self, now_ms: i64) -> bool {
        self.last_delivery_by_ms
            .is_some_and(|by| now_ms + MIN_DELAY.as_millis() as i64 > by)
    }

    /// Time since the first receipt (zero when SQS did not say).
    fn elapsed(&self, now_ms: i64) -> Duration {
        self.first_received_at_ms
            .map(|t| Duration::from_millis((now_ms - t).max(0) as u64))
            .unwrap_or_default()
    }

    /// Time left until [`Budget::last_delivery_by_ms`] (`None`: no bound known).
    fn retention_left(&self, now_ms: i64) -> Option<Duration> {
        self.last_delivery_by_ms
            .map(|by| Duration::from_millis((by - now_ms).max(0) as u64))
    }
}

/// The planned waits between the `deliveries` of a message that fails every time: `first`,
/// `first·r`, `first·r²`, … (each under SQS's 12-hour cap, [`MAX_DELAY`]), with the ratio
/// `r ≥ 1` found so that they add up to `horizon`. `deliveries − 1` waits; none for fewer than
/// two deliveries. When `first` alone is longer than the horizon allows, the waits are even.
/// When even waits of 12 hours cannot reach the horizon, every wait after the first is 12 hours
/// (the configuration should refuse such a horizon).
pub fn schedule(first: Duration, deliveries: u32, horizon: Duration) -> Vec<Duration> {
    let waits = deliveries.saturating_sub(1) as usize;
    if waits == 0 {
        return Vec::new();
    }
    let (first_s, horizon_s, cap) = (
        first.as_secs_f64(),
        horizon.as_secs_f64(),
        MAX_DELAY.as_secs_f64(),
    );
    let plan = |r: f64| -> Vec<f64> {
        let mut w = first_s.min(cap);
        (0..waits)
            .map(|_| {
                let this = w;
                w = (w * r).min(cap);
                this
            })
            .collect()
    };
    let total = |r: f64| plan(r).iter().sum::<f64>();
    let to_durations = |v: Vec<f64>| v.into_iter().map(Duration::from_secs_f64).collect();
    if first_s <= 0.0 || total(1.0) >= horizon_s {
        // The horizon is too short for `first` at every wait: even waits fill it.
        return to_durations(vec![horizon_s / waits as f64; waits]);
    }
    // The total grows with r (strictly until every wait is capped): bisection finds it.
    let (mut lo, mut hi) = (1.0f64, 2.0f64);
    while total(hi) < horizon_s && hi < 1e9 {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if total(mid) < horizon_s {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    to_durations(plan(hi))
}

/// The wait after a transient failure on `budget`'s delivery, by the geometric [`schedule`]:
/// this delivery's planned wait, scaled by the time actually left until the horizon over the
/// planned waits still to come, so the last delivery lands at the horizon whatever happened
/// before. Jittered down by up to a fifth, but for the last wait, which lands on the horizon.
pub fn geometric_delay(budget: &Budget, policy: &BackoffPolicy, now_ms: i64) -> Option<Duration> {
    let max = budget.max_receive_count?;
    if policy.horizon.is_zero() || budget.receive_count >= max {
        return None;
    }
    let plan = schedule(policy.base, max, policy.horizon);
    let i = (budget.receive_count as usize).saturating_sub(1);
    let planned = plan.get(i)?.as_secs_f64();
    let still: f64 = plan[i..].iter().map(Duration::as_secs_f64).sum();
    // The horizon, or the queue's retention when it ends first (a backlog before the first
    // receive, a horizon as long as the retention): the last delivery lands at the earlier.
    let mut left = policy.horizon.saturating_sub(budget.elapsed(now_ms));
    if let Some(r) = budget.retention_left(now_ms) {
        left = left.min(r);
    }
    let left = left.as_secs_f64();
    let mut wait = if still > 0.0 {
        planned * left / still
    } else {
        0.0
    };
    if i + 1 < plan.len() {
        wait *= 0.8 + 0.2 * fastrand::f64();
    }
    Some(Duration::from_secs_f64(wait.min(MAX_DELAY.as_secs_f64())))
}

/// Backoff tunables, from [`crate::Settings`].
#[derive(Debug, Clone, Copy)]
pub struct BackoffPolicy {
    /// The first wait after a transient failure: the geometric schedule's first term (and
    /// the base of the doubling when the queue has no budget or the horizon is zero).
    pub base: Duration,
    /// Cap of the doubling (used only without a budget or a horizon).
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

/// The geometric schedule when the queue has a budget and the horizon is set; else the
/// doubling from the base, capped.
fn backoff(budget: &Budget, policy: &BackoffPolicy, now_ms: i64) -> Duration {
    geometric_delay(budget, policy, now_ms)
        .unwrap_or_else(|| redelivery_delay(budget.receive_count, policy.base, policy.max))
}

/// The delay for a message handed back for `why`, at `now_ms`, within SQS's 12-hour cap and
/// never past the queue's retention bound ([`Budget::last_delivery_by_ms`]).
pub fn delay_for(
    why: Redelivery,
    budget: &Budget,
    policy: &BackoffPolicy,
    now_ms: i64,
) -> Duration {
    let until = |t: i64| Duration::from_millis((t - now_ms).max(0) as u64);
    let d = match why {
        Redelivery::Soon | Redelivery::NotAttempted => Duration::from_secs(2),
        Redelivery::Paced(t) => until(t).max(Duration::from_secs(1)),
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
    let d = d.min(MAX_DELAY);
    match budget.retention_left(now_ms) {
        Some(left) => d.min(left),
        None => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(n: u32, max: Option<u32>, first: i64) -> Budget {
        Budget {
            receive_count: n,
            max_receive_count: max,
            first_received_at_ms: Some(first),
            last_delivery_by_ms: None,
        }
    }

    const POLICY: BackoffPolicy = BackoffPolicy {
        base: Duration::from_secs(3),
        max: Duration::from_secs(900),
        horizon: Duration::from_secs(3600),
    };

    #[test]
    fn the_schedule_starts_within_seconds_grows_geometrically_and_fills_the_horizon() {
        let first = Duration::from_secs(3);
        for max in 3..=20u32 {
            for horizon_s in [60u64, 600, 3_600, 86_400, 4 * 86_400] {
                let horizon = Duration::from_secs(horizon_s);
                let plan = schedule(first, max, horizon);
                assert_eq!(plan.len(), max as usize - 1);
                let total: f64 = plan.iter().map(Duration::as_secs_f64).sum();
                let reachable = 3.0 + (max as f64 - 2.0) * MAX_DELAY.as_secs_f64();
                let want = (horizon_s as f64).min(reachable);
                assert!(
                    (total - want).abs() <= want * 1e-6 + 1e-3,
                    "max {max}, horizon {horizon_s}: waits add up to {total}"
                );
                if first.as_secs_f64() * (max as f64 - 1.0) < horizon_s as f64 {
                    assert!(
                        plan[0] <= first,
                        "the first wait is the base: {:?}",
                        plan[0]
                    );
                }
                assert!(
                    plan.windows(2).all(|w| w[1] >= w[0]),
                    "never shrinks: {plan:?}"
                );
                assert!(plan.iter().all(|w| *w <= MAX_DELAY));
            }
        }
        // The arithmetic of the README: 10 deliveries over an hour from 3 s.
        let plan = schedule(first, 10, Duration::from_secs(3_600));
        let r = plan[1].as_secs_f64() / plan[0].as_secs_f64();
        assert!((2.1..2.3).contains(&r), "ratio {r}");
        assert!(plan[8] > Duration::from_secs(1_800), "{plan:?}");
        assert!(schedule(first, 1, Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn one_transient_failure_comes_back_within_the_base_delay() {
        for max in [3, 5, 10, 20] {
            let d = delay_for(Redelivery::Backoff, &budget(1, Some(max), 0), &POLICY, 0);
            assert!(
                d <= Duration::from_secs(3) && d >= Duration::from_millis(2_400),
                "{d:?}"
            );
        }
    }

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
        for max in 3..=20 {
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
    fn the_last_delivery_lands_at_the_horizon_not_before_nor_after() {
        for max in 3..=20u32 {
            // Busy looks take deliveries of their own; one backoff wait at least is left.
            for busy_first in (0..=2).filter(|b| b + 2 <= max) {
                let first = 1_000_000i64;
                let mut now = first;
                for n in 1..max {
                    let why = if n <= busy_first {
                        Redelivery::Busy(first + 60_000)
                    } else {
                        Redelivery::Backoff
                    };
                    // Each attempt itself takes a few seconds.
                    now += 2_000;
                    now += delay_for(why, &budget(n, Some(max), first), &POLICY, now).as_millis()
                        as i64;
                }
                let at = (now - first) as f64 / 1000.0;
                assert!(
                    (3_599.0..=3_601.0).contains(&at),
                    "max {max}, {busy_first} busy looks: delivery {max} at {at} s"
                );
            }
        }
    }

    #[test]
    fn the_budget_reads_the_retention_from_this_queues_send() {
        let mut m = SqsMessage::default();
        m.attributes
            .insert("SentTimestamp".into(), "1000000".into());
        m.attributes
            .insert("ApproximateReceiveCount".into(), "2".into());
        let limits = QueueLimits {
            max_receive_count: Some(5),
            retention: Some(Duration::from_secs(60)),
        };
        let b = Budget::of(&m, limits, Duration::from_secs(15));
        assert_eq!(b.last_delivery_by_ms, Some(1_000_000 + 45_000));
        assert!(!b.out_of_retention(1_000_000 + 44_000));
        assert!(b.out_of_retention(1_000_000 + 44_500), "no second left");
        let unknown = Budget::of(&m, QueueLimits::default(), Duration::from_secs(15));
        assert_eq!(unknown.last_delivery_by_ms, None);
        assert!(!unknown.out_of_retention(i64::MAX / 2));
    }

    /// Replays an endless outage on a queue whose retention ends before the horizon: a
    /// backlog held the message before its first receive. Returns the times of the deliveries
    /// and when the message was dead-lettered (`None`: handed back past the budget).
    fn replay_to_retention(
        backlog: Duration,
        retention: Duration,
        margin: Duration,
        max: u32,
    ) -> (Vec<i64>, Option<i64>) {
        let sent = 1_000_000i64;
        let first = sent + backlog.as_millis() as i64;
        let mut now = first;
        let mut deliveries = Vec::new();
        for n in 1..=max {
            deliveries.push(now);
            let b = Budget {
                receive_count: n,
                max_receive_count: Some(max),
                first_received_at_ms: Some(first),
                last_delivery_by_ms: Some(sent + (retention - margin).as_millis() as i64),
            };
            now += 2_000; // the attempt
            if b.exhausted() || b.out_of_retention(now) {
                return (deliveries, Some(now));
            }
            now += delay_for(Redelivery::Backoff, &b, &POLICY, now).as_millis() as i64;
        }
        (deliveries, None)
    }

    #[test]
    fn a_message_is_dead_lettered_before_its_queue_would_delete_it() {
        let (retention, margin) = (Duration::from_secs(3_600), Duration::from_secs(390));
        let sent = 1_000_000i64;
        let deleted_at = sent + retention.as_millis() as i64;
        for max in [3, 5, 10, 20] {
            // Half the retention spent in a backlog; the one-hour horizon would end after it.
            for backlog_s in [0u64, 600, 1_800, 3_000] {
                let (deliveries, dead_at) =
                    replay_to_retention(Duration::from_secs(backlog_s), retention, margin, max);
                let dead_at = dead_at.expect("dead-lettered, never handed back past the budget");
                assert!(
                    dead_at < deleted_at,
                    "max {max}, backlog {backlog_s} s: dead-lettered at {dead_at}, SQS deletes at {deleted_at}"
                );
                assert!(
                    deliveries
                        .iter()
                        .all(|t| *t <= sent + (retention - margin).as_millis() as i64),
                    "max {max}, backlog {backlog_s} s: a delivery after the margin: {deliveries:?}"
                );
            }
        }
        // A 60-second retention with a 15-second margin: the deliveries before 45 s, then the
        // dead letter.
        let (deliveries, dead_at) = replay_to_retention(
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(15),
            10,
        );
        assert!(deliveries.len() >= 2, "{deliveries:?}");
        assert!(dead_at.unwrap() < sent + 60_000);
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
