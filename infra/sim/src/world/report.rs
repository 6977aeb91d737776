//! What a run did and found.

use std::collections::BTreeMap;

/// An invariant that did not hold.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which invariant.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
    /// Simulated time, ms since the run's start.
    pub at_ms: i64,
}

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The digest of every request, answer and provider write, in order: the same seed and
    /// commit give the same digest.
    pub digest: u64,
    /// The elements the models visited ([`crate::cost`]).
    pub model_visits: u64,
    /// What did not hold.
    pub violations: Vec<Violation>,
    /// Simulated days run.
    pub days: f64,
    /// Payments sent (distinct ids).
    pub payments: usize,
    /// Payments charged at the provider (distinct ids).
    pub charged: usize,
    /// Dead letters, by code.
    pub dead_letters: BTreeMap<String, usize>,
    /// Payments the API accepted whose message the queue refused, set aside by the relay.
    pub relay_set_aside: usize,
    /// Provider events the operator found dead-lettered (each counted once), by code
    /// (`max_receives`: moved by SQS, without one).
    pub event_dead_letters: BTreeMap<String, usize>,
    /// Invocations of the processor, cold starts among them, and those killed.
    pub invocations: u64,
    /// Cold starts.
    pub cold_starts: u64,
    /// Invocations killed (a crash or the deadline).
    pub killed: u64,
    /// AWS requests answered.
    pub aws_requests: u64,
    /// Provider requests, and those refused `429`.
    pub provider_requests: u64,
    /// Provider requests refused by its rate.
    pub provider_refused: u64,
    /// Records deleted by time to live.
    pub expired_records: usize,
    /// Refunds the merchant sent (refund ids), and those the provider made.
    pub refunds_sent: usize,
    /// Refunds the provider made.
    pub refunds_made: usize,
    /// Of those, the ones that failed later (a debit's pending refund, a closed card).
    pub refunds_failed: usize,
    /// Disputes opened (inquiries and chargebacks), and those of them appealed after a loss.
    pub disputes: usize,
    /// Disputes appealed after a loss.
    pub disputes_appealed: usize,
    /// AWS requests refused by an outage.
    pub aws_outage_refusals: u64,
    /// Events the provider emitted.
    pub events: u64,
    /// Events whose deliveries all failed (the webhook route down past Stripe's retries), or
    /// that EventBridge could not send to its target within its retries.
    pub events_undelivered: u64,
    /// Events EventBridge sent to its target (`ProviderEventsDelivery` `eventbridge`, `both`).
    pub events_bridged: u64,
    /// Scheduled catch-up invocations that succeeded, failed, and were killed.
    pub catch_up_runs: (usize, usize, usize),
    /// The catch-up's longest lag after a run, s.
    pub catch_up_worst_lag_s: i64,
    /// `POST /v1/payments` requests the API's clients sent (retries included).
    pub api_requests: u64,
    /// API requests answered `429` (the stage's throttle, or the function's reserved
    /// concurrency taken).
    pub api_throttled: u64,
    /// API invocations ended before they answered (a crash, the function's timeout).
    pub api_killed: u64,
    /// API requests API Gateway answered `504`: the invocation outlived the integration's
    /// timeout (and ran on).
    pub api_gateway_timeouts: u64,
    /// The API's `202` answers (an idempotent replay's among them).
    pub api_accepted: u64,
    /// Invocations of the outbox relay.
    pub relay_invocations: u64,
    /// Stream records the relay's mapping gave up on (to its on-failure destination).
    pub relay_given_up: u64,
    /// Stream records trimmed (24 hours) before the relay's mapping read them: any change of
    /// the table, the filter's or not (the mapping's iterator falls behind on all alike).
    pub relay_trimmed: u64,
    /// A relay alarm (iterator age over a minute, a batch given up) waits for the operator.
    pub relay_alarm: bool,
    /// Payment rows the operator sent again (`payctl outbox republish`).
    pub republished: u64,
    /// The most invocations of each function at once (by its queue; the API's as `api`).
    pub peak_concurrency: BTreeMap<String, usize>,
    /// Webhook deliveries the events route refused `429` (its `ProviderEventsRateLimit` and
    /// `ProviderEventsBurstLimit`), each retried by the provider later.
    pub events_throttled: u64,
    /// Events an insider forged onto the events queue ([`crate::world::Options::forged_event_share`]).
    pub events_forged: u64,
    /// DynamoDB write units a second: the busiest second's, and the mean over
    /// [`Report::charging_span_s`].
    pub write_units_peak: u64,
    /// See [`Report::write_units_peak`].
    pub write_units_mean: f64,
    /// Payments processed a second (each one's first request to the provider): 99 % of them
    /// over [`Report::charging_span_s`].
    pub charged_per_second: f64,
    /// Seconds from the first payment's arrival until 99 % of the payments were processed.
    pub charging_span_s: f64,
    /// The last lines of the trace (or all of it with `keep_trace`).
    pub trace: Vec<String>,
}

/// The capacity figures of a run: payments processed a second (99 % of them, from the first
/// arrival), the DynamoDB write units a second over that span and at the busiest second.
pub(super) fn capacity(
    report: &mut Report,
    books: &crate::provider::Books,
    write_units: &BTreeMap<i64, u64>,
    first: Option<i64>,
) {
    // Payments processed (each one's first intent at the provider) a second: 99 % of them
    // over the time from the first payment's arrival until 99 % were (a straggler, retried
    // minutes later, says nothing of the rate).
    let mut firsts: BTreeMap<&str, i64> = BTreeMap::new();
    for i in books.intents.values() {
        let t = firsts.entry(i.payment_id.as_str()).or_insert(i.created_ms);
        *t = (*t).min(i.created_ms);
    }
    let mut times: Vec<i64> = firsts.into_values().collect();
    times.sort_unstable();
    if let (Some(from), false) = (first, times.is_empty()) {
        let n99 = (times.len() * 99).div_ceil(100).max(1);
        let p99 = times[n99 - 1];
        let span_s = ((p99 - from) as f64 / 1000.0).max(1.0);
        report.charging_span_s = span_s;
        report.charged_per_second = n99 as f64 / span_s;
        let units: u64 = write_units
            .range(from / 1000..=p99 / 1000)
            .map(|(_, u)| *u)
            .sum();
        // Whole seconds summed, whole seconds divided by.
        report.write_units_mean = units as f64 / (p99 / 1000 - from / 1000 + 1) as f64;
    }
    report.write_units_peak = write_units.values().copied().max().unwrap_or(0);
}

/// What docs/performance.md's Capacity table claims for a tier, beside what a run measured: one
/// line a figure, `holds` or `DOES NOT HOLD`. The claims are the table's, per stack (the 10,000
/// tier is two stacks of 5,000 a second, each the 1,000 column's settings times five).
pub fn claims(
    tier: &str,
    parameters: &[(String, String)],
    arrival_seconds: Option<f64>,
    report: &Report,
) -> Vec<String> {
    let (rate, concurrency, api_concurrency, write_units) = match tier {
        "100" => (100.0, 20, 20, 500.0),
        "1000" => (1_000.0, 200, 200, 5_000.0),
        _ => (5_000.0, 1_000, 1_000, 25_000.0),
    };
    let parameter = |name: &str| {
        parameters
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse::<i64>().ok())
    };
    let catch_up_s = parameter("EventsCatchUpMinutes").unwrap_or(60) * 60;
    let verdict = |ok: bool| if ok { "holds" } else { "DOES NOT HOLD" };
    // The queue's own figure when the run was a backlog; the steady load's arrival rate else.
    let arrival = arrival_seconds
        .filter(|&a| a > 0.0)
        .map(|a| report.payments as f64 / a);
    let wanted = arrival.map_or(rate * 0.95, |a| a.min(rate) * 0.95);
    let busiest = |queue: &str| {
        report
            .peak_concurrency
            .iter()
            .filter(|(k, _)| k.contains(queue))
            .map(|(_, v)| *v)
            .max()
            .unwrap_or(0)
    };
    let processors = ["PaymentsQueue", "RefundsQueue", "ProviderEventsQueue"]
        .iter()
        .map(|q| busiest(q))
        .max()
        .unwrap_or(0);
    let api = busiest("api");
    vec![
        format!(
            "  payments processed a second: claimed {rate:.0} (at least {wanted:.0}, 95 % of {}), measured {:.1}: {}",
            if arrival.is_some() { "what arrived" } else { "the tier" },
            report.charged_per_second,
            verdict(report.charged_per_second >= wanted)
        ),
        format!(
            "  provider requests refused: claimed 0, measured {} of {}: {}",
            report.provider_refused,
            report.provider_requests,
            verdict(report.provider_refused == 0)
        ),
        format!(
            "  invocations at once: claimed at most {concurrency} a processor and {api_concurrency} for the API, measured {processors} and {api} ({:?}): {}",
            report.peak_concurrency,
            verdict(processors <= concurrency && api <= api_concurrency)
        ),
        format!(
            "  DynamoDB write units a second: claimed {write_units:.0} (4 to 5 a payment), measured {:.0} (peak {}): {}",
            report.write_units_mean,
            report.write_units_peak,
            verdict(report.write_units_mean <= write_units * 1.05)
        ),
        format!(
            "  the catch-up's lag: claimed within EventsCatchUpMinutes ({catch_up_s} s, its alarm), measured {} s: {}",
            report.catch_up_worst_lag_s,
            verdict(report.catch_up_worst_lag_s <= catch_up_s)
        ),
    ]
}
