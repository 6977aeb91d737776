//! `payctl health`: queues, dead letters, records, the catch-up and the alarms in one view.

use anyhow::Result;
use clap::Args;

/// The options of `payctl health` (each queue and the table as `payctl env` exports them; a
/// part whose variable is not set is left out).
#[derive(Args)]
pub struct HealthArgs {
    /// The payments queue.
    #[arg(long, env = "PAYMENTS_QUEUE_URL")]
    pub payments_queue_url: Option<String>,
    /// The refunds queue.
    #[arg(long, env = "REFUNDS_QUEUE_URL")]
    pub refunds_queue_url: Option<String>,
    /// The provider events queue.
    #[arg(long, env = "PROVIDER_EVENTS_QUEUE_URL")]
    pub provider_events_queue_url: Option<String>,
    /// The payments' dead-letter queue.
    #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
    pub dead_letter_queue_url: Option<String>,
    /// The refunds' dead-letter queue.
    #[arg(long, env = "REFUNDS_DEAD_LETTER_QUEUE_URL")]
    pub refunds_dead_letter_queue_url: Option<String>,
    /// The provider events' dead-letter queue.
    #[arg(long, env = "PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL")]
    pub provider_events_dead_letter_queue_url: Option<String>,
    /// The idempotency table (records, the catch-up's checkpoint).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    pub table: Option<String>,
    /// The stack whose CloudWatch alarms to read (on AWS: the sam deploy stack name).
    #[arg(long)]
    pub stack_name: Option<String>,
    /// How often the scheduled catch-up runs (the stack's EventsCatchUpMinutes): a catch-up
    /// behind the provider's list by more than this and a quarter of an hour needs attention.
    #[arg(long, env = "EVENTS_CATCH_UP_MINUTES", default_value_t = 60)]
    pub catch_up_minutes: i64,
    /// How long a payment that holds refunds may settle (the stack's HeldRefundHorizonDays):
    /// one settling longer needs attention.
    #[arg(long, env = "HELD_REFUND_HORIZON_DAYS", default_value_t = 30)]
    pub held_refund_horizon_days: i64,
    /// Count every record by a scan of the whole idempotency table (completed ones too; its
    /// cost grows with the table, a year of records), instead of reading the failed and
    /// unfinished ones from the table's OpenRecords index.
    #[arg(long)]
    pub scan_records: bool,
    /// Read again every this many seconds until stopped.
    #[arg(long, value_name = "SECONDS")]
    pub watch: Option<u64>,
    /// One JSON object a reading on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `payctl health`: exits 0 when healthy, 2 when something needs a person (dead letters,
/// an unknown outcome, a catch-up behind, an alarm firing), 1 on an error.
pub async fn health(args: HealthArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let pair = |name: &str, url: &Option<String>| url.clone().map(|u| (name.to_owned(), u));
    let targets = payctl::health::HealthTargets {
        queues: [
            pair("payments", &args.payments_queue_url),
            pair("refunds", &args.refunds_queue_url),
            pair("provider events", &args.provider_events_queue_url),
        ]
        .into_iter()
        .flatten()
        .collect(),
        dead_letter_queues: [
            pair("payments", &args.dead_letter_queue_url),
            pair("refunds", &args.refunds_dead_letter_queue_url),
            pair(
                "provider events",
                &args.provider_events_dead_letter_queue_url,
            ),
        ]
        .into_iter()
        .flatten()
        .collect(),
        table: args.table.clone(),
        stack_name: args.stack_name.clone(),
        catch_up_interval_s: args.catch_up_minutes.max(1) * 60,
        held_horizon_s: args.held_refund_horizon_days.max(1) * 86_400,
        scan_records: args.scan_records,
    };
    if targets.queues.is_empty() && targets.dead_letter_queues.is_empty() && targets.table.is_none()
    {
        anyhow::bail!("nothing to read: set the stack's variables (eval \"$(payctl env --stack-name NAME)\" locally) or pass --payments-queue-url, --table and the others");
    }
    loop {
        let h = payctl::health::read(sdk, &targets).await?;
        if args.json {
            println!("{}", serde_json::to_string(&h)?);
        } else {
            print!("{}", h.text());
        }
        match args.watch {
            Some(seconds) => {
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(seconds.max(1))) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
                if !args.json {
                    println!();
                }
            }
            None if h.attention.is_empty() => return Ok(()),
            None => std::process::exit(2),
        }
    }
}
