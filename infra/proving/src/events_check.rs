//! What the provider finishes later, settled through its events, in the demo and `make e2e-sam`:
//! a bank debit that succeeds and one that fails after `processing`, a refund that fails after
//! `pending`, and a dispute that opens and is won. The simulator delivers its events, signed, to
//! the provider-events endpoint (with duplicates and out of order), the inbox applies them, and
//! the check reads the records against the provider: every payment settled as the provider
//! holds it, no refund counted that the provider failed, no refunds beyond what disputes leave,
//! nothing in the events' dead-letter queue; then a catch-up over the same window changes
//! nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use payment_core::events::settlement::{DynamoSettlements, Settlements};
use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
use serde_json::json;

use crate::sim::SimClient;

/// The scenario's payments: (suffix, amount, payment method, the status it must settle at).
const PAYMENTS: [(&str, i64, &str, &str); 4] = [
    ("ev-ach-ok", 1500, "pm_usBankAccount_success", "succeeded"),
    (
        "ev-ach-closed",
        1500,
        "pm_usBankAccount_accountClosed",
        "declined",
    ),
    ("ev-refund-fails", 1000, "pm_card_refundFail", "succeeded"),
    ("ev-disputed", 700, "pm_card_createDispute", "succeeded"),
];

/// The payment ids of the scenario under `prefix`.
pub fn payment_ids(prefix: &str) -> Vec<String> {
    PAYMENTS
        .iter()
        .map(|(s, ..)| format!("{prefix}-{s}"))
        .collect()
}

/// The raw payment messages of the scenario.
pub fn payment_bodies(prefix: &str) -> Vec<String> {
    PAYMENTS
        .iter()
        .map(|(s, amount, pm, _)| crate::load::payment_body(&format!("{prefix}-{s}"), *amount, pm))
        .collect()
}

/// The refund of the whole charge of the payment whose refunds fail.
pub fn refund_bodies(prefix: &str) -> Vec<String> {
    vec![payment_core::refunds::work::RefundRequest {
        refund_id: format!("{prefix}-ev-refund-fails-r1"),
        payment_id: format!("{prefix}-ev-refund-fails"),
        amount: None,
        reason: None,
        contract_version: None,
    }
    .to_message_body()]
}

/// Points the simulator's webhook at `url` (signing with `secret`), with duplicates and
/// deliveries overtaking one another.
pub async fn point_webhook(sim: &SimClient, url: &str, secret: &str) -> Result<()> {
    sim.webhook(json!({
        "url": url,
        "secrets": [secret],
        "duplicate_probability": 0.5,
        "max_jitter_ms": 400,
        "retry_base_ms": 300,
        "paused": false,
    }))
    .await
}

/// Serves the provider-events route of `stack` on an ephemeral local port (the same receiver
/// the function runs, queueing to `queue_url`, verifying with `secret`) and points the
/// simulator's webhook at it; the server lives as long as the returned handle.
pub async fn serve_endpoint(
    sdk: &aws_config::SdkConfig,
    stack: &payctl::template::Stack,
    sim: &SimClient,
    queue_url: &str,
    secret: &str,
) -> Result<(lambda_local::http::LocalHttp, String)> {
    use payment_core::events::queue::SqsEventQueue;
    use payment_core::stripe::receiver::{EventReceiver, FixedSecrets, EVENTS_PATH};
    use std::sync::Arc;
    let receiver = EventReceiver::new(
        Arc::new(FixedSecrets(vec![secret.to_owned().into()])),
        Arc::new(SqsEventQueue::new(
            aws_sdk_sqs::Client::new(sdk),
            queue_url.to_owned(),
        )),
        payment_core::stripe::webhook::DEFAULT_TOLERANCE_SECONDS,
    );
    let api_config = payment_core::edges::config::ApiConfig::from_lookup(|k| {
        stack
            .var_of("PaymentsApiFunction", k)
            .ok()
            .map(str::to_owned)
    })?;
    let api =
        payment_core::edges::bootstrap::build_api(&api_config, aws_sdk_dynamodb::Client::new(sdk));
    let server = payctl::api::serve(Arc::new(api), Some(Arc::new(receiver)), "127.0.0.1:0").await?;
    let endpoint = format!("{}{EVENTS_PATH}", server.url());
    point_webhook(sim, &endpoint, secret).await?;
    Ok((server, endpoint))
}

/// What the events settled.
#[derive(Debug, Default)]
pub struct EventsVerdict {
    /// The final status of each payment, by id.
    pub statuses: BTreeMap<String, String>,
    /// Every violation.
    pub violations: Vec<String>,
}

/// Where the scenario stands: `Ok(None)` once settled, else what it still waits for.
pub async fn settled(
    sdk: &aws_config::SdkConfig,
    table: &str,
    sim: &SimClient,
    prefix: &str,
) -> Result<(Option<String>, EventsVerdict)> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let records = DynamoSettlements::new(ddb.clone(), table);
    let ledger = DynamoRefundLedger::new(ddb, table);
    let books = sim.ledger().await?;
    let mut v = EventsVerdict::default();
    let mut waiting = None;
    for (suffix, amount, _, want) in PAYMENTS {
        let pid = format!("{prefix}-{suffix}");
        let status = records
            .payment(&pid)
            .await?
            .and_then(|p| p.status)
            .unwrap_or_else(|| "no record".into());
        v.statuses.insert(pid.clone(), status.clone());
        if status != want {
            waiting.get_or_insert(format!("{pid} is {status}, not {want} yet"));
        }
        let charges = books.charges.get(&pid).map(Vec::len).unwrap_or(0);
        if charges != usize::from(want == "succeeded") {
            v.violations
                .push(format!("{pid}: the provider booked {charges} charges"));
        }
        // No refund counted that the provider failed; refunds and disputes within the charge.
        if let Some(p) = ledger.payment(&pid).await? {
            for (rid, held) in &p.refunds {
                let moved = books.refunded(rid);
                if moved != *held {
                    waiting.get_or_insert(format!(
                        "{pid} holds {held} for refund {rid}, which moved {moved}"
                    ));
                }
            }
            if p.refunded + p.disputed > amount {
                v.violations.push(format!(
                    "{pid}: {} refunded and {} disputed, more than its charge of {amount}",
                    p.refunded, p.disputed
                ));
            }
        }
    }
    let disputed = format!("{prefix}-ev-disputed");
    let dispute = records
        .payment(&disputed)
        .await?
        .map(|p| (p.disputed, p.disputes));
    match dispute {
        Some((0, d)) if d.values().any(|(s, _)| s == "won") => {}
        other => {
            waiting.get_or_insert(format!("{disputed}'s dispute is {other:?}, not won yet"));
        }
    }
    Ok((waiting, v))
}

/// Closes the scenario's dispute as won once the simulator opened it.
pub async fn win_dispute(sim: &SimClient, prefix: &str, within: Duration) -> Result<()> {
    let pid = format!("{prefix}-ev-disputed");
    let deadline = Instant::now() + within;
    loop {
        let books = sim.ledger().await?;
        let intent = books
            .charges
            .get(&pid)
            .and_then(|c| c.first())
            .map(|c| c.id.clone());
        if let Some(d) = intent.and_then(|i| books.disputes.get(&i).cloned()) {
            let id = d["id"].as_str().context("a dispute without an id")?;
            if d["status"] == "needs_response" {
                return sim.close_dispute(id, true).await;
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the simulator opened no dispute for {pid} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (running `drain` between looks) until the scenario is settled, for at most `within`.
pub async fn settle<F, Fut>(
    sdk: &aws_config::SdkConfig,
    table: &str,
    sim: &SimClient,
    prefix: &str,
    within: Duration,
    mut drain: F,
) -> Result<EventsVerdict>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let deadline = Instant::now() + within;
    loop {
        drain().await?;
        let (waiting, mut v) = settled(sdk, table, sim, prefix).await?;
        match waiting {
            None => return Ok(v),
            Some(why) if Instant::now() > deadline => {
                v.violations.push(format!(
                    "not settled through events within {within:?}: {why}"
                ));
                return Ok(v);
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// What the demo's events phase did.
#[derive(Debug, Default)]
pub struct EventsRun {
    /// The verdict.
    pub verdict: EventsVerdict,
    /// What the inbox made of the deliveries: by label, duplicates, dead letters.
    pub inbox: sqs_once::BatchSummary,
    /// Webhook deliveries the simulator made, of how many events, and how many the route
    /// accepted (answered 2xx: each is one message for the inbox).
    pub deliveries: (u32, usize, u32),
    /// Events the catch-up queued again, and how many of them it applied (must be 0).
    pub catch_up: (usize, u32),
}

impl EventsRun {
    /// Each accepted delivery's one outcome at the inbox, by name; they add up to the accepted
    /// deliveries when nothing was lost.
    pub fn outcomes(&self) -> Vec<(String, u32)> {
        use payment_core::events::inbox::labels;
        let mut out: Vec<(String, u32)> = [
            labels::APPLIED,
            labels::UNCHANGED,
            labels::FOREIGN,
            labels::UNHANDLED,
        ]
        .iter()
        .map(|l| (l.to_string(), self.inbox.done(l)))
        .collect();
        for (label, n) in &self.inbox.done {
            if !out.iter().any(|(l, _)| l == label) {
                out.push((label.clone(), *n));
            }
        }
        out.push(("duplicates".into(), self.inbox.duplicates));
        out.push(("dead-lettered".into(), self.inbox.dead_lettered_total()));
        out
    }
}

/// The demo's events phase on a provisioned `stack`: the scenario's payments through
/// `payments`, its refund through `refunds`, the events delivered by the simulator to the
/// provider-events route served here, applied by the inbox; then a catch-up of the same window.
pub async fn demo_phase(
    sdk: &aws_config::SdkConfig,
    stack: &payctl::template::Stack,
    overrides: &BTreeMap<String, String>,
    payments: std::sync::Arc<payment_core::Processor>,
    refunds: std::sync::Arc<payment_core::refunds::work::RefundProcessor>,
    prefix: &str,
) -> Result<EventsRun> {
    use payctl::template::{EVENT_PROCESSOR, REFUND_PROCESSOR};
    use payment_core::events::queue::SqsEventQueue;
    let since = sqs_once::runner::now_ms() / 1000 - 1;
    let config = crate::functions::event_config_for(stack, overrides)?;
    let sim = SimClient::new(&config.payment_api_url);
    // The simulator keeps every delivery it made: this phase's are those after these.
    let before = sim.deliveries().await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let inbox = payment_core::edges::bootstrap::build_event_processor(&config, sdk).await?;
    let queue_url = config
        .provider_events_queue_url
        .clone()
        .context("the template gives the event function no PROVIDER_EVENTS_QUEUE_URL")?;
    let secret = format!("whsec_demo_{}", uuid::Uuid::new_v4().simple());
    let (_server, endpoint) = serve_endpoint(sdk, stack, &sim, &queue_url, &secret).await?;
    println!("provider events: the simulator delivers signed events to {endpoint} (half of them twice, out of order)");

    crate::load::send_all(&sqs, &stack.event_source.queue_url, &payment_bodies(prefix)).await?;
    crate::functions::drain_source(payments, &sqs, &stack.event_source, 1).await?;
    let refund_source = &stack.event_sources[REFUND_PROCESSOR];
    crate::load::send_all(&sqs, &refund_source.queue_url, &refund_bodies(prefix)).await?;
    crate::functions::drain_source(refunds, &sqs, refund_source, 1).await?;
    win_dispute(&sim, prefix, Duration::from_secs(60)).await?;

    let source = &stack.event_sources[EVENT_PROCESSOR];
    let mut run = EventsRun::default();
    let summary = std::sync::Mutex::new(sqs_once::BatchSummary::default());
    run.verdict = settle(
        sdk,
        &config.idempotency_table,
        &sim,
        prefix,
        Duration::from_secs(90),
        || async {
            let stats = crate::functions::drain_source(inbox.clone(), &sqs, source, 2).await?;
            summary
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .merge(&stats.summary);
            Ok(())
        },
    )
    .await?;
    // No more deliveries, then what the last ones queued: every accepted delivery is counted.
    sim.webhook(json!({"url": null})).await?;
    let last = crate::functions::drain_source(inbox.clone(), &sqs, source, 2).await?;
    let mut s = summary
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    s.merge(&last.summary);
    run.inbox = s;
    let statuses: Vec<Vec<u16>> = sim
        .deliveries()
        .await?
        .into_iter()
        .map(|(id, d)| {
            let earlier = before.get(&id).map_or(0, |b| b.statuses.len());
            d.statuses[earlier.min(d.statuses.len())..].to_vec()
        })
        .filter(|s| !s.is_empty())
        .collect();
    run.deliveries = (
        statuses.iter().map(|s| s.len() as u32).sum(),
        statuses.len(),
        statuses
            .iter()
            .flatten()
            .filter(|s| (200..300).contains(*s))
            .count() as u32,
    );
    let outcomes: u32 = run.outcomes().iter().map(|(_, n)| n).sum();
    if outcomes != run.deliveries.2 {
        run.verdict.violations.push(format!(
            "the route accepted {} deliveries, the inbox accounted for {outcomes}",
            run.deliveries.2
        ));
    }

    // The same window listed again, as the scheduled catch-up would after an outage.
    let provider = payment_core::edges::bootstrap::provider_from(&config, sdk).await?;
    let queue = SqsEventQueue::new(sqs.clone(), queue_url);
    let until = sqs_once::runner::now_ms() / 1000 + 1;
    let report = payment_core::events::catch_up::catch_up(&provider, &queue, since, until)
        .await
        .map_err(anyhow::Error::msg)?;
    let again = crate::functions::drain_source(inbox, &sqs, source, 2).await?;
    run.catch_up = (
        report.queued,
        again
            .summary
            .done(payment_core::events::inbox::labels::APPLIED),
    );
    if run.catch_up.1 != 0 {
        run.verdict.violations.push(format!(
            "the catch-up of a window already applied changed {} things",
            run.catch_up.1
        ));
    }
    let dead = crate::check::drain_dlq(&sqs, &config.dead_letter_queue_url).await?;
    if !dead.is_empty() {
        run.verdict.violations.push(format!(
            "{} provider events dead-lettered: {:?}",
            dead.len(),
            dead.iter().map(|d| &d.error_code).collect::<Vec<_>>()
        ));
    }
    Ok(run)
}

impl EventsRun {
    /// The summary lines.
    pub fn print(&self) {
        let (made, events, accepted) = self.deliveries;
        let outcomes = self.outcomes();
        println!(
            "provider events:          {made} deliveries of {events} events by the simulator: {accepted} accepted by the route, {} refused (sent again)",
            made - accepted
        );
        println!(
            "  at the inbox:           {} = {}",
            outcomes
                .iter()
                .map(|(l, n)| format!("{n} {l}"))
                .collect::<Vec<_>>()
                .join(" + "),
            outcomes.iter().map(|(_, n)| n).sum::<u32>()
        );
        println!(
            "settled through events:   {}",
            self.verdict
                .statuses
                .iter()
                .map(|(k, v)| format!("{} {v}", k.rsplit("-ev-").next().unwrap_or(k)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "catch-up of the window:   {} events queued again, {} applied (each applies once)",
            self.catch_up.0, self.catch_up.1
        );
    }
}
