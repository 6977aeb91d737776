//! The runner's tunables.

use std::time::Duration;

/// Tunables of the protocol. Defaults suit the SAM template; tests shorten the times.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a claim holds the record before another attempt may take it over.
    pub lease: Duration,
    /// Record retention: also the oldest message that is executed (an older one is
    /// dead-lettered as `request_expired`, since its record may have expired).
    pub record_ttl: Duration,
    /// Messages processed at once per batch.
    pub max_concurrency: usize,
    /// Calls of [`crate::Work::execute`] per delivery before the message is handed back.
    pub call_attempts: usize,
    /// First delay between calls within one delivery (exponential, with jitter).
    pub call_retry_delay: Duration,
    /// Visibility delay after the first failed delivery: the first term of the geometric
    /// schedule over [`Settings::retry_horizon`] ([`crate::redelivery::schedule`]); without a
    /// receive budget or a horizon, the base of a doubling per `ApproximateReceiveCount`.
    pub redelivery_base_delay: Duration,
    /// Cap of the doubling (only without a receive budget or a horizon).
    pub redelivery_max_delay: Duration,
    /// Leases end at most this long after the invocation deadline, so a timed-out attempt's
    /// record can be taken over by the next delivery.
    pub deadline_margin: Duration,
    /// The source queue's visibility timeout: what a heartbeat extends a message's visibility
    /// by, and a third of it is the beat.
    pub visibility_timeout: Duration,
    /// Unfinished messages are reported this long before the invocation deadline, so the
    /// response reaches Lambda in time.
    pub deadline_safety: Duration,
    /// Slack subtracted from [`crate::Work::key_retention`]: at least the longest attempt
    /// (lease + call timeout + processing allowance) plus clock skew.
    pub key_retention_margin: Duration,
    /// How long the downstream may still act on a call after the client gave up on it. A
    /// call is sent only while the lease outlasts the call timeout plus this, and a `FAILED`
    /// record after an ambiguous call refuses claims until its last send plus both
    /// (`not_before`).
    pub processing_allowance: Duration,
    /// How long the downstream's lookup may lag behind its effects: a lookup that finds
    /// nothing proves no effect only this long after the last call could have landed.
    pub search_lag: Duration,
    /// Transient failures this long never exhaust a message's receive budget: the
    /// the geometric redelivery schedule lands the last receive at it.
    pub retry_horizon: Duration,
    /// The source queue's `maxReceiveCount` when its redrive policy cannot be read; the
    /// queue's own policy wins when it can be.
    pub max_receive_count: Option<u32>,
    /// How long before the queue's `MessageRetentionPeriod` ends (counted from the message's
    /// `SentTimestamp`) its last delivery must come back: at least what one delivery can take
    /// (the function's timeout), so that it can still dead-letter the message with a reason
    /// before SQS deletes it without one.
    pub retention_margin: Duration,
}

/// A source queue whose limits the settings do not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QueueMismatch(pub String);

impl Settings {
    /// Refuses a source queue whose retention ends before the retry horizon plus the retention
    /// margin: its messages would be deleted by SQS, with no dead letter, while transient
    /// failures still had time to heal. (At run time the processor dead-letters a message
    /// before its queue's retention whatever the settings; this check makes the configuration
    /// say so at init instead of cutting every long outage short.)
    pub fn check_queue(&self, limits: &crate::queue::QueueLimits) -> Result<(), QueueMismatch> {
        if let Some(retention) = limits.retention {
            if self.retry_horizon + self.retention_margin > retention {
                return Err(QueueMismatch(format!(
                    "the retry horizon ({} s) plus the retention margin ({} s) does not end \
                     before the queue's MessageRetentionPeriod ({} s): lower \
                     RETRY_HORIZON_SECONDS to at most {} s or raise the queue's retention",
                    self.retry_horizon.as_secs(),
                    self.retention_margin.as_secs(),
                    retention.as_secs(),
                    retention.saturating_sub(self.retention_margin).as_secs()
                )));
            }
        }
        Ok(())
    }
}

impl Settings {
    /// One heartbeat schedule for the lease and the visibility: a third of the shorter.
    pub fn heartbeat_interval(&self) -> Duration {
        (self.lease.min(self.visibility_timeout) / 3).max(Duration::from_millis(100))
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            record_ttl: Duration::from_secs(DEFAULT_TTL_SECONDS),
            max_concurrency: 10,
            call_attempts: 3,
            call_retry_delay: Duration::from_millis(200),
            redelivery_base_delay: Duration::from_secs(3),
            redelivery_max_delay: Duration::from_secs(900),
            deadline_margin: Duration::from_secs(5),
            visibility_timeout: Duration::from_secs(390),
            deadline_safety: Duration::from_millis(500),
            key_retention_margin: Duration::from_secs(300),
            processing_allowance: Duration::from_secs(5),
            search_lag: Duration::from_secs(60),
            retry_horizon: Duration::from_secs(3600),
            max_receive_count: None,
            retention_margin: Duration::from_secs(390),
        }
    }
}

/// Default record retention: SQS's default message retention (4 days) + a 14-day dead-letter
/// queue + 3 days of margin.
pub const DEFAULT_TTL_SECONDS: u64 = 21 * 24 * 3600;
/// Clock skew allowed between SQS's `SentTimestamp` and this host, epoch ms.
pub(crate) const CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::QueueLimits;

    #[test]
    fn a_horizon_that_outlives_the_queues_retention_is_refused() {
        let settings = Settings {
            retry_horizon: Duration::from_secs(345_600),
            retention_margin: Duration::from_secs(390),
            ..Settings::default()
        };
        let four_days = QueueLimits {
            max_receive_count: Some(10),
            retention: Some(Duration::from_secs(345_600)),
        };
        let e = settings.check_queue(&four_days).unwrap_err();
        assert!(e.0.contains("at most 345210 s"), "{e}");
        let fits = Settings {
            retry_horizon: Duration::from_secs(259_200),
            ..settings.clone()
        };
        assert_eq!(fits.check_queue(&four_days), Ok(()));
        assert_eq!(
            settings.check_queue(&QueueLimits::default()),
            Ok(()),
            "no retention known: nothing to refuse"
        );
    }
}
