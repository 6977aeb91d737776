//! One sweep, not tuned scenarios: each seed of `make sim` draws its own configuration from its
//! seed, so that what a tooth's scenario once chose by hand is a point the ordinary sweep
//! reaches. A dimension set by hand (an argument, `PARAMETERS`) is not drawn.
//!
//! Drawn so far (issue 65's item 3 names more):
//! - the refund window: the template's (365 days) in half the seeds; in the others 20 to 22
//!   days, just over `IdempotencyTtlDays` (set to its least, 19 days) so that records live the
//!   window as they do at 365, with the provider's own timeline shortened with it (a debit's
//!   settlement, a refund's later change, and the days a dispute opens within,
//!   `DISPUTE_DAYS`, and so its course), so that a 30-day seed reaches past the refund window
//!   as a year of a live account does;
//! - the merchant sending a refund once more when its record expires (30 to 90 % of them);
//! - the rate at which invocations are killed (1 to 6 in 100), and the provider's faults (a 500
//!   before or after its write, an answer lost: each 0.5 to 4 in 100);
//! - the stack's share of the account's rate (`ProviderRequestsPerSecond`): the template's 20
//!   in two seeds of three, else 1.5 to 5 (1.5: the least the refund function's init
//!   accepts), where one instance of the refund function (its 20 %, divided among
//!   `MaximumConcurrency` 10) sends a request every 10 to 33 s;
//! - refunds in a nightly batch (half the seeds): a burst on the refunds queue, its messages
//!   sharing each instance's pace (`NIGHTLY_REFUNDS=true` or `false` sets it by hand);
//! - the webhook endpoint deleted and registered again (a third of the seeds): once, between
//!   two of the catch-up's hourly runs, for 10 to 30 minutes; the events made meanwhile are
//!   never sent;
//! - the customers of failed debits who pay them again, 1 to 8 days on (10 to 60 % of them): a
//!   payment recorded declined is charged after all (`REPAY_SHARE` sets it by hand);
//! - users' own queues (a quarter of the seeds: visibility 60 to 180 s, the least Lambda maps to
//!   the template's functions, with `maxReceiveCount` 2 to 5), FIFO queues (a sixth);
//! - Stripe's events through EventBridge (a fifth), or both ways (a fifth);
//! - an outage (a quarter): the provider 6 to 30 hours, DynamoDB 1 to 6, SQS 1 to 4, or the
//!   webhook's route 24 to 96 (past Stripe's three days of retries), from day 1 to 20.

use super::Options;

/// What a seed drew, applied to `opts`; `explicit` says which dimensions were set by hand
/// (template parameters set by hand are those `opts` holds already). The return is one line
/// for the seed's report.
pub fn draw(opts: &mut Options, explicit: &Explicit) -> String {
    let mut rng = fastrand::Rng::with_seed(opts.seed ^ 0x5eed_5eed_5eed_5eed);
    let mut drawn = Vec::new();
    // Every draw is made whether or not it is used, so one dimension set by hand leaves the
    // others' draws as they were.
    let (short, window_days) = (rng.f64() < 0.5, rng.u32(20..=22));
    let (late, crash, provider) = (rng.f64(), rng.f64(), rng.f64());
    if !opts.parameters.contains_key("RefundWindowDays") && short {
        let w = f64::from(window_days);
        opts.parameters
            .insert("RefundWindowDays".into(), window_days.to_string());
        // Records live at least this long whatever the window (the queues' retention, 4 and
        // 14 days, bounds it from below): its least, so that records expire within the run.
        if !opts.parameters.contains_key("IdempotencyTtlDays") {
            opts.parameters
                .insert("IdempotencyTtlDays".into(), "19".into());
        }
        if !opts.parameters.contains_key("HeldRefundHorizonDays") {
            opts.parameters.insert(
                "HeldRefundHorizonDays".into(),
                (window_days - 1).to_string(),
            );
        }
        // The provider's timeline in the proportion of 30 days to the window: a bank debit
        // settles and a refund changes well within it.
        let scale = w / 30.0;
        opts.provider.timeline = scale;
        opts.provider.settle_days *= scale;
        opts.disputes.1 = (0.05 * w, 0.4 * w);
        drawn.push(format!("refund window {window_days} days"));
    }
    if !explicit.late_refunds {
        opts.late_refund_share = 0.3 + 0.6 * late;
        drawn.push(format!(
            "{:.0} % of refunds sent again late",
            100.0 * opts.late_refund_share
        ));
    }
    if !explicit.crash_rate {
        opts.crash_rate = 0.01 + 0.05 * crash;
        drawn.push(format!("crash rate {:.3}", opts.crash_rate));
    }
    if !explicit.provider_faults {
        let r = 0.005 + 0.035 * provider;
        opts.provider.error_before_rate = r;
        opts.provider.error_after_rate = r;
        opts.provider.lost_answer_rate = r;
        drawn.push(format!("provider faults {r:.3}"));
    }
    // Drawn after the others, so that adding them left the earlier draws as they were.
    let (low_pace, pace, nightly) = (rng.f64() < 1.0 / 3.0, rng.f64(), rng.f64() < 0.5);
    if !opts.parameters.contains_key("ProviderRequestsPerSecond") && low_pace {
        let rate = 1.5 + 3.5 * pace;
        opts.parameters
            .insert("ProviderRequestsPerSecond".into(), format!("{rate:.2}"));
        drawn.push(format!("{rate:.2} provider requests a second"));
    }
    if !explicit.nightly_refunds && nightly {
        opts.nightly_refunds = true;
        drawn.push("refunds in a nightly batch".into());
    }
    // The webhook endpoint deleted and registered again between two of the catch-up's hourly
    // runs (from 10 to 20 minutes past an hour, for 10 to 30 minutes), as an operator who
    // re-creates it to change its types or its URL would.
    if let (Some((window, when)), true) =
        (between_two_runs(&mut rng), opts.endpoint_gaps.is_empty())
    {
        opts.endpoint_gaps = vec![window];
        drawn.push(format!("the webhook endpoint away {when}"));
    }
    // The customers of failed debits who pay them again (a tenth to six tenths of them).
    let repay = rng.f64();
    if !explicit.repay_share {
        opts.repay_share = 0.1 + 0.5 * repay;
        drawn.push(format!(
            "{:.0} % of failed debits paid again",
            100.0 * opts.repay_share
        ));
    }
    // Users' own queues: in a quarter of the seeds the shortest visibility Lambda maps to these
    // functions and more (60 to 180 s) with a small maxReceiveCount (2 to 5); in a sixth FIFO
    // queues (a customer's payments one group).
    let (own, visibility, receives, fifo) = (
        rng.f64() < 0.25,
        rng.i32(60..=180),
        rng.i32(2..=5),
        rng.f64() < 1.0 / 6.0,
    );
    if !explicit.queues {
        if own {
            opts.visibility_timeout = Some(visibility);
            opts.max_receive_count = Some(receives);
            drawn.push(format!(
                "users' own queues: visibility {visibility} s, maxReceiveCount {receives}"
            ));
        }
        if fifo {
            opts.fifo = true;
            drawn.push("FIFO queues".into());
        }
    }
    // Stripe's events through EventBridge in a fifth of the seeds, both ways in another fifth
    // (not with FIFO queues: a rule into a FIFO queue needs a message group the template does not
    // give, and EventBridge refuses the target, as the simulator's model does).
    let delivery = rng.f64();
    if !opts.parameters.contains_key("ProviderEventsDelivery") && delivery < 0.4 && !opts.fifo {
        let shape = if delivery < 0.2 {
            "eventbridge"
        } else {
            "both"
        };
        opts.parameters
            .insert("ProviderEventsDelivery".into(), shape.into());
        drawn.push(format!("events delivered by {shape}"));
    }
    // An outage in a quarter of the seeds, of one service: the provider (6 to 30 hours),
    // DynamoDB (1 to 6), SQS (1 to 4) or the webhook's route (24 to 96: past Stripe's retries).
    let (outage, which, day, length) = (
        rng.f64() < 0.25,
        rng.u32(0..4),
        1.0 + 19.0 * rng.f64(),
        rng.f64(),
    );
    if !explicit.outages && outage {
        let (name, hours) = match which {
            0 => ("the provider", 6.0 + 24.0 * length),
            1 => ("DynamoDB", 1.0 + 5.0 * length),
            2 => ("SQS", 1.0 + 3.0 * length),
            _ => ("the webhook's route", 24.0 + 72.0 * length),
        };
        let window = Some((day, hours));
        match which {
            0 => opts.provider_outage = window,
            1 => opts.dynamo_outage = window,
            2 => opts.sqs_outage = window,
            _ => opts.webhook_outage = window,
        }
        drawn.push(format!("{name} down on day {day:.1} for {hours:.0} hours"));
    }
    // The webhook endpoint disabled and enabled again between two of the catch-up's hourly runs
    // (a third of the seeds; 10 to 30 minutes), as an operator pausing it, or Stripe disabling
    // it, would: the same endpoint, its `created` unchanged.
    if let (Some((window, when)), true) = (
        between_two_runs(&mut rng),
        opts.endpoint_disabled.is_empty(),
    ) {
        opts.endpoint_disabled = vec![window];
        drawn.push(format!("the webhook endpoint disabled {when}"));
    }
    drawn.join(", ")
}

/// In a third of the seeds, a window between two of the catch-up's hourly runs: on a day from 1
/// to 24, from 10 to 20 minutes past an hour, for 10 to 30 minutes (epoch ms, from and until),
/// and the words that say when. Every draw is made either way.
fn between_two_runs(rng: &mut fastrand::Rng) -> Option<((i64, i64), String)> {
    let (drawn, day, hour, from_min, minutes) = (
        rng.f64() < 1.0 / 3.0,
        rng.u32(1..=24),
        rng.u32(0..24),
        rng.u32(10..=20),
        rng.u32(10..=30),
    );
    let from = super::EPOCH_MS
        + i64::from(day) * 86_400_000
        + i64::from(hour) * 3_600_000
        + i64::from(from_min) * 60_000;
    drawn.then(|| {
        (
            (from, from + i64::from(minutes) * 60_000),
            format!("on day {day} from {hour:02}:{from_min:02} for {minutes} minutes"),
        )
    })
}

/// The dimensions set by hand, which the sweep leaves as they are.
#[derive(Debug, Default)]
pub struct Explicit {
    /// `LATE_REFUND_SHARE` given.
    pub late_refunds: bool,
    /// `CRASH_RATE` given.
    pub crash_rate: bool,
    /// `PROVIDER_FAULT_RATE` given.
    pub provider_faults: bool,
    /// `NIGHTLY_REFUNDS` given.
    pub nightly_refunds: bool,
    /// `REPAY_SHARE` given.
    pub repay_share: bool,
    /// `FIFO`, `VISIBILITY_TIMEOUT` or `MAX_RECEIVE_COUNT` given.
    pub queues: bool,
    /// An outage's day given (`PROVIDER_OUTAGE_DAY`, `DYNAMODB_OUTAGE_DAY`, ...).
    pub outages: bool,
}
