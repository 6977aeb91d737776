//! How the proving ground configures and runs the template's functions locally: each
//! function's configuration as the deployed one gets it (the template's environment with the
//! stack's resources), and an SQS event source drained by the local event-source mapping.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use lambda_local::esm::{self, EsmOptions, EsmStats};
use payctl::template::Stack;
use payment_core::edges::config::Config;

/// Builds the processor's configuration the way the deployed function gets it: the template's
/// environment, with the stack's resources, and the process environment for everything else
/// (provider URL and key, tunables).
pub fn config_for(stack: &Stack, overrides: &BTreeMap<String, String>) -> Result<Config> {
    Ok(function_environment(stack, overrides)?.0)
}

/// The refund processor's configuration: [`config_for`] with the refund function's own
/// dead-letter queue.
pub fn refund_config_for(stack: &Stack, overrides: &BTreeMap<String, String>) -> Result<Config> {
    function_config_for(stack, payctl::template::REFUND_PROCESSOR, overrides)
}

/// The event processor's configuration: [`config_for`] with the event function's own
/// dead-letter queue, source queue and provider-events queue.
pub fn event_config_for(stack: &Stack, overrides: &BTreeMap<String, String>) -> Result<Config> {
    let mut config = function_config_for(stack, payctl::template::EVENT_PROCESSOR, overrides)?;
    config.provider_events_queue_url = Some(
        stack
            .var_of(
                payctl::template::EVENT_PROCESSOR,
                "PROVIDER_EVENTS_QUEUE_URL",
            )?
            .to_owned(),
    );
    // A settled payment's held refunds go to the stack's refunds queue.
    config.refunds_queue_url = stack
        .var_of(payctl::template::EVENT_PROCESSOR, "REFUNDS_QUEUE_URL")
        .ok()
        .map(str::to_owned);
    // What its scheduled catch-up lists follows the template's delivery shape.
    if let Ok(delivery) = stack.var_of(
        payctl::template::EVENT_PROCESSOR,
        "PROVIDER_EVENTS_DELIVERY",
    ) {
        config.catch_up_lists = if delivery == "eventbridge" {
            payment_core::events::catch_up::Listed::All
        } else {
            payment_core::events::catch_up::Listed::Undelivered
        };
    }
    Ok(config)
}

/// [`config_for`] with another SQS function's own dead-letter queue (and source queue).
fn function_config_for(
    stack: &Stack,
    function: &str,
    overrides: &BTreeMap<String, String>,
) -> Result<Config> {
    let mut config = config_for(stack, overrides)?;
    config.dead_letter_queue_url = stack.var_of(function, "DEAD_LETTER_QUEUE_URL")?.to_owned();
    if config.source_queue_url.is_some() {
        config.source_queue_url = Some(stack.var_of(function, "SOURCE_QUEUE_URL")?.to_owned());
    }
    Ok(config)
}

/// The configuration of [`config_for`] and the environment variables it was read from: exactly
/// what a `bootstrap` process needs to be given to run with the same configuration.
pub fn function_environment(
    stack: &Stack,
    overrides: &BTreeMap<String, String>,
) -> Result<(Config, BTreeMap<String, String>)> {
    let resource_vars = [
        "IDEMPOTENCY_TABLE",
        "DEAD_LETTER_QUEUE_URL",
        "SOURCE_QUEUE_URL",
    ];
    // The provider's pace is the deployment's: a local process stands for every instance at
    // once and the simulator has no limit unless told, so it is paced only when asked.
    let deployed_only = payment_core::edges::config::PACE_VARS;
    let read = std::cell::RefCell::new(BTreeMap::new());
    let config = Config::from_lookup(|k| {
        let v = if let Some(v) = overrides.get(k) {
            Some(v.clone())
        } else if resource_vars.contains(&k) {
            stack.function_env.get(k).cloned()
        } else if deployed_only.contains(&k) {
            std::env::var(k).ok()
        } else {
            std::env::var(k)
                .ok()
                .or_else(|| stack.function_env.get(k).cloned())
        };
        if let Some(v) = &v {
            read.borrow_mut().insert(k.to_owned(), v.clone());
        }
        v
    })?;
    Ok((config, read.into_inner()))
}

/// Drains one SQS event source with the local event-source mapping.
pub async fn drain_source(
    function: impl Into<esm::Function>,
    sqs: &aws_sdk_sqs::Client,
    source: &payctl::template::EventSource,
    pollers: usize,
) -> Result<EsmStats> {
    esm::run(
        function,
        sqs.clone(),
        EsmOptions {
            queue_url: source.queue_url.clone(),
            batch_size: source.batch_size,
            batching_window: Duration::from_millis(200),
            visibility_timeout: None,
            function_timeout: Duration::from_secs(source.function_timeout_seconds as u64),
            report_batch_item_failures: source.report_batch_item_failures,
            pollers,
            until_empty: true,
            max_duration: Duration::from_secs(900),
        },
    )
    .await
}
