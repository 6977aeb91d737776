//! Time, injected: leases and deadlines are epoch milliseconds compared across workers, and
//! tests drive them with tokio's paused time.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of epoch milliseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The host's wall clock (production).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// Epoch time that advances with tokio's clock: anchored to the wall clock when created, then
/// moved by `tokio::time::Instant`, so `tokio::time::pause()` and `advance()` drive it.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    /// Wall-clock epoch ms at creation.
    base_ms: i64,
    /// tokio's instant at creation.
    base: tokio::time::Instant,
}

impl TokioClock {
    /// Anchors a clock at the current wall time.
    pub fn new() -> Self {
        Self {
            base_ms: SystemClock.now_ms(),
            base: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.base_ms + self.base.elapsed().as_millis() as i64
    }
}

/// The production clock, shared.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}
