//! The chaos run's processes: `payctl run` processes of one queue, each armed to crash at one
//! failpoint, restarted when they do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lambda_local::esm::queue_depth;
use tokio::process::{Child, Command};

/// Processor processes of one queue, each with one armed failpoint, restarted when they crash.
pub(super) struct Fleet {
    /// The `payctl` binary.
    pub(super) exe: PathBuf,
    /// Its `run` arguments (the work and its queues).
    pub(super) args: Vec<String>,
    /// The function's environment.
    pub(super) env: BTreeMap<String, String>,
    /// Where the processes' stderr goes.
    pub(super) log: std::fs::File,
    /// Its path, for messages.
    pub(super) log_path: String,
    /// The running processes.
    pub(super) children: Vec<Child>,
    /// Crashes so far (each restarted).
    pub(super) crashes: u64,
}

impl Fleet {
    fn spawn(&self, failpoints: &str) -> Result<Child> {
        Command::new(&self.exe)
            .arg("run")
            .args(&self.args)
            .args(["--function-timeout", "30", "--batching-window", "0.2"])
            .envs(&self.env)
            .env("FAILPOINTS", failpoints)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.log.try_clone()?)
            .kill_on_drop(true)
            .spawn()
            .context("starting a processor instance")
    }

    pub(super) fn start(&mut self, n: usize, arm: &mut impl FnMut() -> String) -> Result<()> {
        for _ in 0..n.max(1) {
            let child = self.spawn(&arm())?;
            self.children.push(child);
        }
        Ok(())
    }

    /// Restarts the processes that crashed; a process that exited on its own is an error.
    pub(super) fn supervise(&mut self, arm: &mut impl FnMut() -> String) -> Result<()> {
        for i in 0..self.children.len() {
            if let Some(status) = self.children[i].try_wait()? {
                if status.success() {
                    bail!(
                        "a processor instance exited on its own: see {}",
                        self.log_path
                    );
                }
                self.crashes += 1;
                self.children[i] = self.spawn(&arm())?;
            }
        }
        Ok(())
    }

    /// Waits until the queue is drained (nothing visible, in flight or delayed, twice in a
    /// row), restarting crashed processes meanwhile.
    pub(super) async fn drain(
        &mut self,
        sqs: &aws_sdk_sqs::Client,
        queue_url: &str,
        arm: &mut impl FnMut() -> String,
        deadline: (Instant, Duration, u64),
    ) -> Result<()> {
        let (started, max, seed) = deadline;
        let mut empty = 0;
        while empty < 2 {
            if started.elapsed() > max {
                bail!("not drained within {max:?} (seed {seed})");
            }
            self.supervise(arm)?;
            empty = if queue_depth(sqs, queue_url).await? == 0 {
                empty + 1
            } else {
                0
            };
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    pub(super) async fn stop(&mut self) {
        for c in self.children.iter_mut() {
            c.kill().await.ok();
        }
        self.children.clear();
    }
}
