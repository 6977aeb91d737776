//! Running a processor on a queue as Lambda's SQS trigger would.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use lambda_local::esm;
use payment_core::edges::config::Config;
use std::time::Duration;

/// The processors `payctl run` can run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkKind {
    /// The payment processor (charges).
    Payments,
    /// The refund processor.
    Refunds,
    /// The events inbox (the provider's events, applied once each).
    Events,
}

impl WorkKind {
    /// The queue and dead-letter queue variables of this processor.
    fn vars(self) -> (&'static str, &'static str) {
        match self {
            WorkKind::Payments => ("PAYMENTS_QUEUE_URL", "DEAD_LETTER_QUEUE_URL"),
            WorkKind::Refunds => ("REFUNDS_QUEUE_URL", "REFUNDS_DEAD_LETTER_QUEUE_URL"),
            WorkKind::Events => (
                "PROVIDER_EVENTS_QUEUE_URL",
                "PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL",
            ),
        }
    }
}

/// The options of `payctl run`.
#[derive(Args)]
pub struct RunArgs {
    /// What to process: payments (default), refunds, or the provider's events.
    #[arg(long, value_enum, default_value_t = WorkKind::Payments)]
    pub work: WorkKind,
    /// The source queue (default: PAYMENTS_QUEUE_URL, REFUNDS_QUEUE_URL with --work refunds,
    /// PROVIDER_EVENTS_QUEUE_URL with --work events).
    #[arg(long)]
    pub queue_url: Option<String>,
    /// The dead-letter queue (default: DEAD_LETTER_QUEUE_URL, REFUNDS_DEAD_LETTER_QUEUE_URL with
    /// --work refunds, PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL with --work events).
    #[arg(long)]
    pub dead_letter_queue_url: Option<String>,
    /// Messages per invocation (Lambda's SQS trigger takes up to 10 per receive).
    #[arg(long, default_value_t = 10)]
    pub batch_size: i32,
    /// Batching window, seconds.
    #[arg(long, default_value_t = 0.0)]
    pub batching_window: f64,
    /// Visibility timeout of received messages, seconds (default: the queue's).
    #[arg(long)]
    pub visibility_timeout: Option<i32>,
    /// Function timeout, seconds: each invocation's deadline.
    #[arg(long, default_value_t = 60)]
    pub function_timeout: u64,
    /// Concurrent pollers, each running one batch at a time.
    #[arg(long, default_value_t = 1)]
    pub pollers: usize,
    /// Stop once the queue is drained: nothing waiting, in flight or delayed. A message handed
    /// back waits out its redelivery delay first (the progress line says when it comes back),
    /// for at most --max-seconds.
    #[arg(long)]
    pub until_empty: bool,
    /// Stop, and fail, when not drained within this many seconds (the error says when the
    /// next handed-back message comes back).
    #[arg(long, default_value_t = 3600)]
    pub max_seconds: u64,
    /// Print a progress line every few seconds (the default on a terminal).
    #[arg(long)]
    pub progress: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `payctl run`.
pub async fn run(args: RunArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let RunArgs {
        work,
        queue_url,
        dead_letter_queue_url,
        batch_size,
        batching_window,
        visibility_timeout,
        function_timeout,
        pollers,
        until_empty,
        max_seconds,
        progress,
        json,
    } = args;
    use payctl::run::RunSummary;
    use std::io::IsTerminal;
    let (queue_var, dlq_var) = work.vars();
    let from_env = |given: Option<String>, var: &str| {
        given
            .or_else(|| std::env::var(var).ok())
            .with_context(|| format!("give the queue with its option or set {var}"))
    };
    let queue_url = from_env(queue_url, queue_var)?;
    let mut config = Config::from_env()?;
    if dead_letter_queue_url.is_some() || work != WorkKind::Payments {
        config.dead_letter_queue_url = from_env(dead_letter_queue_url, dlq_var)?;
    }
    // The queue this run polls is the source whose retention bounds the retries.
    config.source_queue_url = Some(queue_url.clone());
    payctl::aws::check_processor_resources(
        sdk,
        &config.idempotency_table,
        &queue_url,
        &config.dead_letter_queue_url,
    )
    .await?;
    payctl::aws::announce(sdk, &format!("processing {queue_url}")).await;
    let processor: esm::Function = match work {
        WorkKind::Payments => payment_core::edges::bootstrap::build_processor(&config, sdk)
            .await?
            .into(),
        WorkKind::Refunds => payment_core::edges::bootstrap::build_refund_processor(&config, sdk)
            .await?
            .into(),
        WorkKind::Events => payment_core::edges::bootstrap::build_event_processor(&config, sdk)
            .await?
            .into(),
    };
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let stats = std::sync::Arc::new(tokio::sync::Mutex::new(esm::EsmStats::default()));
    let _progress = (progress || std::io::stderr().is_terminal()).then(|| {
        payctl::run::progress(
            stats.clone(),
            sqs.clone(),
            queue_url.clone(),
            Duration::from_secs(5),
        )
    });
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let run = esm::run_until(
        processor,
        sqs.clone(),
        esm::EsmOptions {
            queue_url: queue_url.clone(),
            batch_size,
            batching_window: Duration::from_secs_f64(batching_window.max(0.0)),
            visibility_timeout,
            function_timeout: Duration::from_secs(function_timeout),
            report_batch_item_failures: true,
            pollers,
            until_empty,
            max_duration: Duration::from_secs(max_seconds),
        },
        stats.clone(),
        stopping,
    );
    tokio::pin!(run);
    // Ctrl-C (SIGINT) and a stop (SIGTERM: kill, systemd, a container's end): the first stops
    // receiving and lets the batches in flight finish and be acknowledged within their
    // deadline; a second stops at once. Either way the summary, and the shell's exit status for
    // that signal (130, 143).
    let mut signals = payctl::stop::Signals::listen()?;
    let mut stopped_by = None;
    let ended = loop {
        let signal = tokio::select! {
            r = &mut run => break r,
            s = signals.next() => s,
        };
        if stopped_by.is_some() {
            let left = stats.lock().await.in_flight;
            // At most a second for the queue's timeout: stopping at once must not wait on AWS.
            let back = tokio::time::timeout(
                Duration::from_secs(1),
                payctl::run::back_after_visibility(&sqs, &queue_url, visibility_timeout),
            )
            .await
            .unwrap_or_else(|_| "after the queue's visibility timeout".to_owned());
            payctl::say!("stopped at once, {left} left in flight: they come back {back}");
            break Ok(());
        }
        stopped_by = Some(signal);
        let _ = stop.send(true);
        payctl::say!(
            "stopping: nothing more is received; what is in flight ({}) finishes within its deadline ({function_timeout} s at most). Again to stop at once.",
            stats.lock().await.in_flight
        );
    };
    let interrupted = stopped_by.is_some();
    let summary = RunSummary::of(&*stats.lock().await, interrupted);
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    payctl::say!("{}", summary.line());
    if let Err(e) = ended {
        let next = payctl::run::next_back(&*stats.lock().await, sqs_once::runner::now_ms());
        match next {
            Some(at) => bail!(
                "{e:#}: {} (a longer --max-seconds waits for it)",
                payctl::run::back_at(at, sqs_once::runner::now_ms())
            ),
            None => return Err(e),
        }
    }
    if let Some(status) = stopped_by {
        payment_core::telemetry::traces::shutdown();
        std::process::exit(status);
    }
    if summary.all_failed() {
        bail!(
            "nothing succeeded and {} deliveries failed: the log lines above say why",
            summary.received
        );
    }
    Ok(())
}
