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
        /// Where an event the queue cannot take (larger than a message) is set aside with its
        /// reason, so the walk goes on (the stack's ProviderEventsDeadLetterQueueUrl output);
        /// without it, the catch-up stops before such an event and names it.
        #[arg(long, env = "PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL")]
        dlq_url: Option<String>,
        #[command(flatten)]
        provider: super::ProviderArgs,
        /// Print what was queued as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Show where the scheduled catch-up is (the last event it queued, whether it reached the
    /// newest), or set where its next run starts: after an event (`--set evt_...`), or from a
    /// time (`--since`). A set is conditional on the checkpoint read: a run that moved it
    /// meanwhile wins, and the command says so.
    Checkpoint {
        /// The idempotency table (the stack's IdempotencyTableName output).
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        table: String,
        /// The next run starts after this event (it looks the event up at the provider).
        #[arg(long, conflicts_with = "since")]
        set: Option<String>,
        /// The next run starts from this time: 2026-12-01T00:00:00Z, unix seconds, or a span
        /// back from now (90m, 12h, 3d); Stripe lists 30 days.
        #[arg(long)]
        since: Option<String>,
        #[command(flatten)]
        provider: super::ProviderArgs,
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
    let (since, until, queue_url, dlq_url, provider, json) = match args.command {
        EventsCommand::CatchUp {
            since,
            until,
            queue_url,
            dlq_url,
            provider,
            json,
        } => (since, until, queue_url, dlq_url, provider, json),
        EventsCommand::Checkpoint {
            table,
            set,
            since,
            provider,
        } => return checkpoint(sdk, &table, set, since, provider).await,
    };
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
    let mut queue = payment_core::events::queue::SqsEventQueue::new(
        aws_sdk_sqs::Client::new(sdk),
        queue_url.clone(),
    );
    if let Some(dlq) = dlq_url {
        payctl::aws::check_queue(
            sdk,
            &dlq,
            &format!(
                "the provider events' dead-letter queue {dlq} (PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL)"
            ),
        )
        .await?;
        queue = queue.with_dead_letters(dlq);
    }
    let report = payment_core::events::catch_up::catch_up(&client, &queue, since_s, until_s)
        .await
        .map_err(anyhow::Error::msg)
        .context(
            "the catch-up stopped; run it again over the same window (nothing is applied twice)",
        )?;
    if report.since_s > since_s {
        payctl::say!(
            "the provider keeps events 30 days: the window starts at {} instead",
            payctl::time::utc(report.since_s * 1000)
        );
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    }
    if report.set_aside > 0 {
        payctl::say!(
            "{} events the queue cannot take were set aside to the dead-letter queue with their reason (`payctl dlq list`; docs/operate.md, event_too_large)",
            report.set_aside
        );
    }
    payctl::say!(
        "queued {} events ({} pages) created from {} to {}; `payctl run --work events` (or the event function) applies those not applied yet",
        report.queued,
        report.pages,
        payctl::time::utc(report.since_s * 1000),
        payctl::time::utc(report.until_s * 1000)
    );
    Ok(())
}

/// `payctl events checkpoint`: shows the scheduled catch-up's place, or sets it.
async fn checkpoint(
    sdk: &aws_config::SdkConfig,
    table: &str,
    set: Option<String>,
    since: Option<String>,
    provider: super::ProviderArgs,
) -> Result<()> {
    use payment_core::events::catch_up::{Checkpoint, Position, EVENT_RETENTION_S};
    payctl::aws::check_table(
        sdk,
        table,
        &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    let checkpoint = Checkpoint::new(aws_sdk_dynamodb::Client::new(sdk), table);
    let read = checkpoint
        .read()
        .await
        .map_err(anyhow::Error::msg)
        .context("reading the catch-up's checkpoint")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let to = match (set, since) {
        (None, None) => {
            println!("{}", payctl::health::describe_checkpoint(&read, now));
            return Ok(());
        }
        (Some(id), _) => {
            let client = provider
                .client(sdk, "the checkpoint is set at an event the provider holds")
                .await?;
            let place = client
                .event_place(&id)
                .await
                .with_context(|| format!("looking event {id} up at the provider"))?;
            Position {
                checked_through_s: Some(place.created),
                last: Some(place),
                caught_up: false,
                version: read.version + 1,
                from_s: None,
                listing_all: read.listing_all.clone(),
            }
        }
        (None, Some(since)) => {
            let from = payctl::time::parse_point(&since, now).map_err(anyhow::Error::msg)?;
            if from < now - EVENT_RETENTION_S {
                bail!(
                    "the provider lists 30 days of events: --since must be after {}",
                    payctl::time::utc((now - EVENT_RETENTION_S) * 1000)
                );
            }
            Position {
                last: None,
                caught_up: false,
                version: read.version + 1,
                from_s: Some(from),
                checked_through_s: Some(from),
                listing_all: read.listing_all.clone(),
            }
        }
    };
    if !checkpoint
        .advance(&read, &to)
        .await
        .map_err(anyhow::Error::msg)
        .context("setting the catch-up's checkpoint")?
    {
        bail!("a catch-up run moved the checkpoint while it was set; nothing was changed: run the command again");
    }
    println!("set: {}", payctl::health::describe_checkpoint(&to, now));
    Ok(())
}
