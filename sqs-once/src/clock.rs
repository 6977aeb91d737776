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

    /// Anchors a clock at a given epoch time instead of the wall clock: a run that must be
    /// the same each time (the simulator's) reads no host time at all.
    pub fn starting_at(base_ms: i64) -> Self {
        Self {
            base_ms,
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

/// The wall clock moved ahead by an offset that can be advanced while it is shared: a
/// compressed calendar (months of a provider's late events in one run) drives every process's
/// leases, deadlines and lifetimes through it.
#[derive(Debug, Default)]
pub struct ShiftedClock {
    /// Milliseconds added to the wall clock.
    offset_ms: std::sync::atomic::AtomicI64,
}

impl ShiftedClock {
    /// The wall clock, not moved yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock ahead by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        self.offset_ms
            .fetch_add(by.as_millis() as i64, std::sync::atomic::Ordering::SeqCst);
    }

    /// How far ahead of the wall clock it is, ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Clock for ShiftedClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.offset_ms()
    }
}
