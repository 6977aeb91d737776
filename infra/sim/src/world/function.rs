//! A function of the template as the simulator runs it.

use std::sync::Arc;

use anyhow::{Context, Result};
use payment_core::edges::config::Config;

use super::esm;

/// A function of the template: its configuration as its environment resolves, the queue its
/// event source reads, and the mapping's settings.
#[derive(Clone)]
pub(super) struct Function {
    /// Its configuration.
    pub(super) config: Config,
    /// Its source queue's name.
    pub(super) queue: String,
    /// Its dead-letter queue's name.
    pub(super) dlq: String,
    /// `BatchSize`.
    pub(super) batch: usize,
    /// `MaximumBatchingWindowInSeconds`, ms.
    pub(super) window_ms: i64,
    /// Its timeout, s.
    pub(super) timeout_s: i64,
    /// `MaximumConcurrency`.
    pub(super) concurrency: usize,
}

impl Function {
    /// The function `logical` of the provisioned stack.
    pub(super) fn of(stack: &payctl::template::Stack, logical: &str) -> Result<Function> {
        let mut env = stack
            .function_envs
            .get(logical)
            .with_context(|| format!("the template has no {logical}"))?
            .clone();
        env.extend(
            stack
                .deployed_pace
                .get(logical)
                .cloned()
                .unwrap_or_default(),
        );
        // The provider is reached through its port, not its wire client: no key is read.
        if env
            .get("PAYMENT_API_KEY_SECRET_ARN")
            .is_none_or(|v| v.trim().is_empty())
        {
            env.insert("PAYMENT_API_KEY".into(), "sk_test_simulator".into());
        }
        let config = Config::from_lookup(|k| env.get(k).cloned())
            .with_context(|| format!("{logical}'s configuration"))?;
        let name = |url: &str| url.rsplit('/').next().unwrap_or_default().to_owned();
        let queue = name(
            config
                .source_queue_url
                .as_deref()
                .context("SOURCE_QUEUE_URL")?,
        );
        let dlq = name(&config.dead_letter_queue_url);
        let source = stack.event_sources.get(logical);
        // Lambda refuses a mapping whose queue's visibility is shorter than the function's
        // timeout (CreateEventSourceMapping's InvalidParameterValueException): a message
        // outlives the invocation that received it, which the runner counts on.
        if let Some(s) = source {
            let visibility = config.settings.visibility_timeout.as_secs();
            anyhow::ensure!(
                visibility >= s.function_timeout_seconds.max(0) as u64,
                "InvalidParameterValueException: Queue visibility timeout: {visibility} seconds is less than Function timeout: {} seconds ({logical}'s event source mapping)",
                s.function_timeout_seconds
            );
        }
        Ok(Function {
            queue,
            dlq,
            batch: source.map_or(10, |s| s.batch_size.max(1) as usize),
            // Lambda takes no batching window on a FIFO queue's mapping (the simulator's FIFO
            // runs rename the template's queues; a deployable FIFO mapping has none).
            window_ms: source
                .filter(|s| !s.queue_url.ends_with(".fifo"))
                .map_or(0, |s| i64::from(s.batching_window_seconds.max(0)) * 1000),
            timeout_s: source.map_or(60, |s| s.function_timeout_seconds.max(1) as i64),
            concurrency: env
                .get("EVENT_SOURCE_MAX_CONCURRENCY")
                .and_then(|v| v.parse().ok())
                .unwrap_or(2),
            config,
        })
    }

    /// Its event source, with its init.
    pub(super) fn source<W: sqs_once::Work>(
        &self,
        init: Arc<dyn Fn() -> Arc<sqs_once::BatchRunner<W>> + Send + Sync>,
    ) -> esm::Source<W> {
        esm::Source {
            queue: self.queue.clone(),
            batch: self.batch,
            window_ms: self.window_ms,
            timeout_s: self.timeout_s,
            concurrency: self.concurrency,
            init,
        }
    }
}
