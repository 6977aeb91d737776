//! API Gateway's throttles, as the simulator meets them: the events route's (its
//! `ProviderEventsRateLimit` and `ProviderEventsBurstLimit`) and the payments API's routes'
//! (the stage's default route settings).

use super::EPOCH_MS;

/// API Gateway's throttle: a token bucket its rate refills, its burst bounds.
pub(super) struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at_ms: i64,
}

impl Bucket {
    pub(super) fn new((rate, burst): (f64, f64)) -> Self {
        Self {
            rate,
            burst: burst.max(1.0),
            tokens: burst.max(1.0),
            at_ms: EPOCH_MS,
        }
    }

    /// Whether a request at `now_ms` passes (else API Gateway answers it `429`).
    pub(super) fn admits(&mut self, now_ms: i64) -> bool {
        self.tokens = (self.tokens + (now_ms - self.at_ms).max(0) as f64 / 1000.0 * self.rate)
            .min(self.burst);
        self.at_ms = self.at_ms.max(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
