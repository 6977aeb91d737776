//! The provider's events: catching up on those the endpoint missed.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum EventsCommand {
    /// List the provider's events of a window (GET /v1/events, the types the inbox applies;
    /// Stripe keeps 30 days) and queue each to the provider-events queue, where the inbox
    /// applies those it has not applied yet: a window listed twice changes nothing.
    CatchUp {
        /// Where the window starts: 2026-12-01T00:00:00Z, unix seconds, or a span back from
        /// now (90m, 12h, 3d).
        #[arg(long)]
        since: String,
        /// Where it ends (default: now), in the same forms.
        #[arg(long)]
        until: Option<String>,
        /// The provider-events queue (the stack's ProviderEventsQueueUrl output).
        #[arg(long, env = "PROVIDER_EVENTS_QUEUE_URL")]
        queue_url: String,
        #[command(flatten)]
        provider: super::ProviderArgs,
        /// Print what was queued as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// The options of `payctl events`.
#[derive(Args)]
pub struct EventsArgs {
    #[command(subcommand)]
    pub command: EventsCommand,
}

/// Runs `payctl events`.
pub async fn events(args: EventsArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let EventsCommand::CatchUp {
        since,
        until,
        queue_url,
        provider,
        json,
    } = args.command;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let since_s = payctl::time::parse_point(&since, now).map_err(anyhow::Error::msg)?;
    let until_s = match until {
        Some(u) => payctl::time::parse_point(&u, now).map_err(anyhow::Error::msg)?,
        None => now,
    };
    if since_s > until_s {
        bail!("--since is after --until: nothing to list");
    }
    let client = provider
        .client(sdk, "the catch-up lists the provider's events")
        .await?;
    payctl::aws::check_queue(
        sdk,
        &queue_url,
        &format!("the provider-events queue {queue_url} (PROVIDER_EVENTS_QUEUE_URL)"),
    )
    .await?;
    payctl::aws::announce(
        sdk,
        &format!("queueing the provider's events to {queue_url}"),
    )
    .await;
    let queue = payment_core::event_receiver::SqsEventQueue::new(
        aws_sdk_sqs::Client::new(sdk),
        queue_url.clone(),
    );
    let report = payment_core::event_catch_up::catch_up(&client, &queue, since_s, until_s)
        .await
        .map_err(anyhow::Error::msg)
        .context(
            "the catch-up stopped; run it again over the same window (nothing is applied twice)",
        )?;
    if report.since_s > since_s {
        eprintln!(
            "the provider keeps events 30 days: the window starts at {} instead",
            payctl::time::utc(report.since_s * 1000)
        );
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    }
    eprintln!(
        "queued {} events created from {} to {}; `payctl run --work events` (or the event function) applies those not applied yet",
        report.queued,
        payctl::time::utc(report.since_s * 1000),
        payctl::time::utc(report.until_s * 1000)
    );
    Ok(())
}
