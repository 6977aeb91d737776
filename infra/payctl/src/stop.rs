//! How the long-running commands (`payctl run`, `relay`, `api serve`) are stopped: Ctrl-C
//! (SIGINT) or a stop (SIGTERM: `kill`, systemd, a container's end). The first asks them to
//! finish what is in flight; a second stops them at once. They exit with the shell's status for
//! the signal (130, 143), after their summary.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGINT and SIGTERM, listened to from the start (a signal before the first `next` is kept).
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    /// Starts listening.
    pub fn listen() -> Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        })
    }

    /// The next signal, as the exit status a shell gives a process it ended (130, 143).
    pub async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => 130,
            _ = self.terminate.recv() => 143,
        }
    }
}
