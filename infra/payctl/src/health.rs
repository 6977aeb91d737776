//! `payctl health`: whether the system is keeping up, in one view. Per queue what waits, what
//! is being processed and how old the oldest message is; the dead letters by code; the records
//! in progress and left unknown; the catch-up's place; and on AWS the stack's alarms.
//!
//! It only reads. The dead letters are read like `payctl dlq list` (each held a moment, then
//! released); the records from the table's sparse index `OpenRecords`, which holds only the
//! records that failed and are not completed (a reading costs one query a work, half a read
//! unit per 4 KB of them: about 1.5 read units when nothing is failing, whatever the table
//! holds), or, with `--scan-records`, by a scan of the whole table that reads only their
//! status fields (its cost grows with the table: a year of records). The oldest message's age comes from CloudWatch (`ApproximateAgeOfOldestMessage`,
//! which AWS publishes and local emulators do not); a local run shows the oldest dead letter's
//! age, read from the letters themselves.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

mod counts;
pub use counts::{RecordHealth, RecordsRead};

/// A queue the processors read.
#[derive(Debug, Clone, Serialize)]
pub struct QueueHealth {
    /// What it carries (`payments`, `refunds`, `provider events`).
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Messages waiting to be received.
    pub waiting: i64,
    /// Messages received and not yet deleted (being processed, or handed back with a delay).
    pub in_flight: i64,
    /// Messages delayed (sent with a delay).
    pub delayed: i64,
    /// The oldest message's age, seconds, when CloudWatch has it.
    pub oldest_age_s: Option<f64>,
}

/// A dead-letter queue.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterHealth {
    /// Whose dead letters (`payments`, ...).
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Letters read.
    pub total: usize,
    /// By `error_code` (`none` for a letter without one).
    pub by_code: BTreeMap<String, usize>,
    /// The oldest letter's age in the queue, seconds.
    pub oldest_age_s: Option<u64>,
    /// More than [`MAX_LETTERS`] letters: the counts are of the first ones read.
    pub capped: bool,
}

/// Letters read from each dead-letter queue at most.
pub const MAX_LETTERS: usize = 1000;

/// A CloudWatch alarm of the stack.
#[derive(Debug, Clone, Serialize)]
pub struct AlarmHealth {
    /// Its name.
    pub name: String,
    /// `OK`, `ALARM` or `INSUFFICIENT_DATA`.
    pub state: String,
}

/// The whole view.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    /// When it was read, UTC.
    pub at: String,
    /// The queues the processors read.
    pub queues: Vec<QueueHealth>,
    /// Their dead-letter queues.
    pub dead_letters: Vec<DeadLetterHealth>,
    /// The records by work (`payment`, `refund`, `event`), when the table was given.
    pub records: BTreeMap<String, RecordHealth>,
    /// How the records were read (`index`, `scan`) and what the reading cost, read units.
    pub records_read: Option<RecordsRead>,
    /// Where the catch-up of the provider's events stands, when the table was given.
    pub catch_up: Option<String>,
    /// Payments that hold refunds until they settle (the `refund_held` partition of the
    /// `OpenRecords` index), and the oldest one's age since its charge began, seconds.
    pub held_refunds: Option<(usize, Option<i64>)>,
    /// The stack's alarms (`None`: no stack name given; empty: the endpoint has none).
    pub alarms: Option<Vec<AlarmHealth>>,
    /// What needs a person, one line each; empty when healthy.
    pub attention: Vec<String>,
}

/// What to read.
#[derive(Debug, Clone, Default)]
pub struct HealthTargets {
    /// (name, URL) of each queue the processors read.
    pub queues: Vec<(String, String)>,
    /// (name, URL) of each dead-letter queue.
    pub dead_letter_queues: Vec<(String, String)>,
    /// The idempotency table.
    pub table: Option<String>,
    /// The stack whose alarms to read (their names start with it).
    pub stack_name: Option<String>,
    /// How often the scheduled catch-up runs (`EventsCatchUpMinutes`): a catch-up behind the
    /// provider's list by more than this and a quarter of an hour needs attention.
    pub catch_up_interval_s: i64,
    /// How long a payment that holds refunds may settle (`HeldRefundHorizonDays`).
    pub held_horizon_s: i64,
    /// Read the records by a scan of the whole table (every record counted, completed ones
    /// too; its cost grows with the table) instead of the `OpenRecords` index.
    pub scan_records: bool,
}

/// Reads the view.
pub async fn read(sdk: &aws_config::SdkConfig, targets: &HealthTargets) -> Result<Health> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let cloudwatch = aws_sdk_cloudwatch::Client::new(sdk);
    let now_ms = sqs_once::runner::now_ms();
    let mut health = Health {
        at: crate::time::utc(now_ms),
        queues: Vec::new(),
        dead_letters: Vec::new(),
        records: BTreeMap::new(),
        records_read: None,
        catch_up: None,
        held_refunds: None,
        alarms: None,
        attention: Vec::new(),
    };
    for (name, url) in &targets.queues {
        let [waiting, in_flight, delayed] = lambda_local::esm::queue_counts(&sqs, url)
            .await
            .with_context(|| format!("reading the {name} queue {url}"))?;
        health.queues.push(QueueHealth {
            name: name.clone(),
            url: url.clone(),
            waiting,
            in_flight,
            delayed,
            oldest_age_s: oldest_age(&cloudwatch, url).await,
        });
    }
    for (name, url) in &targets.dead_letter_queues {
        let letters = crate::dlq::list(&sqs, url, MAX_LETTERS + 1)
            .await
            .with_context(|| format!("reading the {name} dead-letter queue {url}"))?;
        let capped = letters.len() > MAX_LETTERS;
        let letters = &letters[..letters.len().min(MAX_LETTERS)];
        let mut by_code = BTreeMap::new();
        for l in letters {
            *by_code
                .entry(l.error_code.clone().unwrap_or_else(|| "none".into()))
                .or_default() += 1;
        }
        if !letters.is_empty() {
            health.attention.push(format!(
                "{name}: {} dead letters: read them with payctl dlq list, fix the cause, then payctl dlq redrive",
                letters.len()
            ));
        }
        health.dead_letters.push(DeadLetterHealth {
            name: name.clone(),
            url: url.clone(),
            total: letters.len(),
            by_code,
            oldest_age_s: letters.iter().map(|l| l.age.as_secs()).max(),
            capped,
        });
    }
    if let Some(table) = &targets.table {
        let (records, read) = if targets.scan_records {
            counts::scan(sdk, table, now_ms).await?
        } else {
            counts::open_records(sdk, table, now_ms).await?
        };
        health.records = records;
        health.records_read = Some(read);
        for (work, r) in &health.records {
            if r.unknown > 0 {
                health.attention.push(format!(
                    "{work} records: {} with an unknown outcome: the next delivery's lookup settles them; dead-lettered ones need payctl reconcile",
                    r.unknown
                ));
            }
        }
        let checkpoint = payment_core::events::catch_up::Checkpoint::new(
            aws_sdk_dynamodb::Client::new(sdk),
            table,
        );
        let read = checkpoint
            .read()
            .await
            .map_err(anyhow::Error::msg)
            .context("reading the catch-up's checkpoint")?;
        health.catch_up = Some(describe_checkpoint(&read, now_ms / 1000));
        let held = counts::held_refunds(sdk, table, now_ms).await?;
        if let (n, Some(oldest)) = held {
            if oldest > targets.held_horizon_s {
                health.attention.push(format!(
                    "held refunds: {n} payments hold refunds, the oldest settling for {}, past the horizon ({}): HeldRefundsOverdueAlarm in docs/operate.md",
                    crate::time::in_words(oldest * 1000),
                    crate::time::in_words(targets.held_horizon_s * 1000)
                ));
            }
        }
        health.held_refunds = Some(held);
        if let Some(lag) = read.lag_s(now_ms / 1000) {
            if lag > targets.catch_up_interval_s + 900 {
                health.attention.push(format!(
                    "events catch-up: {} behind the provider's list, more than a run's interval ({}): it cannot keep up, or its runs fail (EventsCatchUpLagAlarm in docs/operate.md)",
                    crate::time::in_words(lag * 1000),
                    crate::time::in_words(targets.catch_up_interval_s * 1000)
                ));
            }
        }
    }
    if let Some(stack) = &targets.stack_name {
        let alarms = alarms(&cloudwatch, stack).await?;
        for a in alarms.iter().filter(|a| a.state == "ALARM") {
            health
                .attention
                .push(format!("the alarm {} is firing: see the runbook", a.name));
        }
        health.alarms = Some(alarms);
    }
    Ok(health)
}

/// The queue's `ApproximateAgeOfOldestMessage` over the last ten minutes (the newest minute's
/// maximum), when CloudWatch has it.
async fn oldest_age(cloudwatch: &aws_sdk_cloudwatch::Client, url: &str) -> Option<f64> {
    let name = url.rsplit('/').next()?;
    let now = std::time::SystemTime::now();
    let out = cloudwatch
        .get_metric_statistics()
        .namespace("AWS/SQS")
        .metric_name("ApproximateAgeOfOldestMessage")
        .dimensions(
            aws_sdk_cloudwatch::types::Dimension::builder()
                .name("QueueName")
                .value(name)
                .build(),
        )
        .start_time((now - std::time::Duration::from_secs(600)).into())
        .end_time(now.into())
        .period(60)
        .statistics(aws_sdk_cloudwatch::types::Statistic::Maximum)
        .send()
        .await
        .ok()?;
    out.datapoints()
        .iter()
        .filter_map(|d| Some((d.timestamp()?.secs(), d.maximum()?)))
        .max_by_key(|(at, _)| *at)
        .map(|(_, age)| age)
}

/// The stack's alarms: those whose name starts with the stack's name (CloudFormation names an
/// alarm `<stack>-<LogicalId>-<suffix>`).
async fn alarms(cloudwatch: &aws_sdk_cloudwatch::Client, stack: &str) -> Result<Vec<AlarmHealth>> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = cloudwatch
            .describe_alarms()
            .alarm_name_prefix(format!("{stack}-"))
            .set_next_token(token.take())
            .send()
            .await
            .map_err(|e| anyhow::anyhow!(lambda_local::faults::sdk_error_line(&e)))
            .with_context(|| format!("reading the alarms of the stack {stack}"))?;
        for a in page.metric_alarms() {
            out.push(AlarmHealth {
                name: a.alarm_name().unwrap_or_default().to_owned(),
                state: a
                    .state_value()
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_default(),
            });
        }
        match page.next_token() {
            Some(t) => token = Some(t.to_owned()),
            None => return Ok(out),
        }
    }
}

/// Where the catch-up stands, for people.
pub fn describe_checkpoint(p: &payment_core::events::catch_up::Position, now_s: i64) -> String {
    let mut place = describe_place(p, now_s);
    if let Some(why) = &p.listing_all {
        place.push_str(&format!(
            "; the runs list every event, not only the undelivered, until two that found the webhook fit at their start reach the newest: {why}"
        ));
    }
    match p.lag_s(now_s) {
        Some(lag) => format!(
            "{place}; the list was checked through {} ({} behind)",
            crate::time::utc(p.checked_through_s.unwrap_or_default() * 1000),
            crate::time::in_words(lag * 1000)
        ),
        None => place,
    }
}

fn describe_place(p: &payment_core::events::catch_up::Position, now_s: i64) -> String {
    match (&p.last, p.from_s) {
        (Some(last), _) => format!(
            "the catch-up queued through {} (created {}, {} ago); {}",
            last.id,
            crate::time::utc(last.created * 1000),
            crate::time::in_words((now_s - last.created) * 1000),
            if p.caught_up {
                "it had reached the newest event: the next run starts 15 minutes before it"
            } else {
                "it stopped before the newest event: the next run goes on from it"
            }
        ),
        (None, Some(from)) => format!(
            "the next run starts from {} (set by hand, or by a run that found the webhook unfit)",
            crate::time::utc(from * 1000)
        ),
        (None, None) => "no run yet: the first run lists the last 3 days".to_owned(),
    }
}

fn age(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) => crate::time::in_words((s * 1000.0) as i64),
        None => "-".into(),
    }
}

impl Health {
    /// The view for people: a table per part, then what needs attention.
    pub fn text(&self) -> String {
        let mut out = format!("health at {}\n\n", self.at);
        out += &format!(
            "{:<18} {:>8} {:>10} {:>8}  oldest\n",
            "queue", "waiting", "in flight", "delayed"
        );
        for q in &self.queues {
            out += &format!(
                "{:<18} {:>8} {:>10} {:>8}  {}\n",
                q.name,
                q.waiting,
                q.in_flight,
                q.delayed,
                age(q.oldest_age_s)
            );
        }
        if self.queues.iter().any(|q| q.oldest_age_s.is_none()) {
            out += "(oldest: CloudWatch's ApproximateAgeOfOldestMessage; - where the endpoint publishes none)\n";
        }
        out += "\ndead letters\n";
        for d in &self.dead_letters {
            let codes = d
                .by_code
                .iter()
                .map(|(c, n)| format!("{c} {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            out += &format!(
                "  {:<16} {}{}{}\n",
                d.name,
                if d.capped {
                    format!("more than {MAX_LETTERS}")
                } else {
                    d.total.to_string()
                },
                if codes.is_empty() {
                    String::new()
                } else {
                    format!(": {codes}")
                },
                d.oldest_age_s
                    .map(|s| format!("; oldest {}", crate::time::in_words(s as i64 * 1000)))
                    .unwrap_or_default()
            );
        }
        if !self.records.is_empty() {
            if let Some(read) = &self.records_read {
                out += &match read.how.as_str() {
                    "index" => format!(
                        "\nrecords that failed and are not completed (the OpenRecords index: {} items, {:.1} read units; --scan-records counts every record)\n",
                        read.items, read.read_units
                    ),
                    _ => format!(
                        "\nrecords (a scan of the whole table: {} items, {:.1} read units)\n",
                        read.items, read.read_units
                    ),
                };
            }
            out += "                 completed  in progress  stalled  failed  unknown  oldest unfinished\n";
            for (work, r) in &self.records {
                out += &format!(
                    "  {:<14} {:>9} {:>12} {:>8} {:>7} {:>8}  {}\n",
                    work,
                    r.completed
                        .map_or_else(|| "-".to_owned(), |c| c.to_string()),
                    r.in_progress,
                    r.stalled,
                    r.failed,
                    r.unknown,
                    age(r.oldest_unfinished_s.map(|s| s as f64))
                );
            }
        }
        if let Some(c) = &self.catch_up {
            out += &format!("\nevents catch-up: {c}\n");
        }
        match self.held_refunds {
            Some((0, _)) => {
                out += "held refunds: none (no payment holds a refund until it settles)\n"
            }
            Some((n, oldest)) => {
                out += &format!(
                "held refunds: {n} payments hold refunds until they settle; the oldest since {}\n",
                age(oldest.map(|s| s as f64))
            )
            }
            None => {}
        }
        match &self.alarms {
            None => out += "\nalarms: give --stack-name to read the stack's alarms\n",
            Some(a) if a.is_empty() => {
                out += "\nalarms: none on this endpoint (payctl provision creates none; sam deploy does)\n"
            }
            Some(a) => {
                out += "\nalarms\n";
                for alarm in a {
                    out += &format!("  {:<60} {}\n", alarm.name, alarm.state);
                }
            }
        }
        if self.attention.is_empty() {
            out += "\nhealthy: no dead letters, no unknown outcome, no alarm firing\n";
        } else {
            out += "\nneeds attention:\n";
            for a in &self.attention {
                out += &format!("  - {a}\n");
            }
        }
        out
    }
}
