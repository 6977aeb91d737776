//! How long a claim's write takes, measured: the time a paced message's claim is given
//! between its booked slot and its first call.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The allowance until claims have been measured.
pub(crate) const UNMEASURED: Duration = Duration::from_secs(1);

/// The widest allowance, however slow the claims measured: wider, a slot booked at the latest
/// start would leave nothing of a short invocation to book in, and no claim would be made
/// that could measure a faster table again.
pub(crate) const MOST: Duration = Duration::from_secs(10);

/// How many of the latest claims the allowance is measured over.
pub(crate) const MEASURED: usize = 32;

/// How long a measurement counts: an instance that made no claim for this long (every message
/// handed back before its claim) measures afresh.
pub(crate) const KEPT: Duration = Duration::from_secs(600);

/// The time a claim's write takes, measured: the allowance between a booked slot and the first
/// call is the slowest of the latest [`MEASURED`] claims of the last [`KEPT`], doubled, plus
/// 100 ms, and at most [`MOST`] (a throttled table whose SDK retries take seconds widens it at
/// once; it narrows again as fast claims push the slow ones out, or as they age). A claim
/// slower than the allowance still ends well: the attempt finds too little of its lease left,
/// sends nothing, and is handed back as never attempted (`CallFailure::NotSent`).
#[derive(Debug, Default)]
pub(crate) struct ClaimTimes(Mutex<VecDeque<(Instant, Duration)>>);

impl ClaimTimes {
    /// One claim took `took`.
    pub(crate) fn record(&self, took: Duration) {
        if let Ok(mut v) = self.0.lock() {
            if v.len() == MEASURED {
                v.pop_front();
            }
            v.push_back((Instant::now(), took));
        }
    }

    /// The allowance a claim is given before a booked slot's call.
    pub(crate) fn allowance(&self) -> Duration {
        let now = Instant::now();
        let slowest = self.0.lock().ok().and_then(|mut v| {
            while v
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > KEPT)
            {
                v.pop_front();
            }
            v.iter().map(|(_, took)| *took).max()
        });
        match slowest {
            Some(slowest) => (slowest * 2 + Duration::from_millis(100)).min(MOST),
            None => UNMEASURED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_allowance_is_the_slowest_recent_claim_doubled() {
        let t = ClaimTimes::default();
        assert_eq!(t.allowance(), UNMEASURED, "nothing measured yet");
        t.record(Duration::from_millis(20));
        t.record(Duration::from_millis(2_000));
        assert_eq!(t.allowance(), Duration::from_millis(4_100));
        // The slow one is forgotten once as many fast ones came after it.
        for _ in 0..MEASURED - 1 {
            t.record(Duration::from_millis(20));
        }
        assert_eq!(t.allowance(), Duration::from_millis(4_100));
        t.record(Duration::from_millis(20));
        assert_eq!(t.allowance(), Duration::from_millis(140));
    }

    /// One very slow claim (a throttled table: 30 s of SDK retries) must not leave an instance
    /// where every paced message is handed back before its claim, so that no claim is ever
    /// measured again: the allowance is capped, and the measurement ages out.
    #[tokio::test(start_paused = true)]
    async fn one_slow_claim_never_holds_the_allowance_wide() {
        let t = ClaimTimes::default();
        t.record(Duration::from_secs(30));
        assert_eq!(t.allowance(), MOST, "capped");
        tokio::time::advance(KEPT - Duration::from_secs(1)).await;
        assert_eq!(t.allowance(), MOST, "still counts within its time");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            t.allowance(),
            UNMEASURED,
            "an instance that claimed nothing since measures afresh"
        );
    }
}
