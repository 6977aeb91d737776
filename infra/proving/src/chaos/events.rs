//! The chaos run's events phase: what the provider finishes later, under the same crashes.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use super::fleet::Fleet;
use super::ChaosOptions;
use crate::check::drain_dlq;
use crate::load::send_all;
use crate::sim::SimClient;

/// The events phase of the chaos run: the scenarios' payments and refunds through crashing
/// processes, then crashing event processes until every scenario is settled as the provider
/// holds it (no refund counted that the provider failed, refunds and disputes within the
/// charge, every bank debit settled), with nothing in the events' dead-letter queue.
#[allow(clippy::too_many_arguments)]
pub(super) async fn events_phase(
    sdk: &aws_config::SdkConfig,
    stack: &payctl::template::Stack,
    sim: &SimClient,
    fleet: &mut Fleet,
    arm: &mut impl FnMut() -> String,
    scenarios: &[String],
    opts: &ChaosOptions,
    deadline: (Instant, Duration, u64),
) -> Result<Vec<String>> {
    use crate::events_check as ev;
    use payctl::template::{EVENT_PROCESSOR, REFUND_PROCESSOR};
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let events_source = &stack.event_sources[EVENT_PROCESSOR];
    let events_dlq = stack
        .var_of(EVENT_PROCESSOR, "DEAD_LETTER_QUEUE_URL")?
        .to_owned();
    let secret = format!("whsec_chaos_{}", opts.seed);
    let (_server, _) =
        ev::serve_endpoint(sdk, stack, sim, &events_source.queue_url, &secret).await?;
    println!("events: {} scenarios (bank debits, a refund that fails, a dispute) settled through the provider's events", scenarios.len());
    let payments: Vec<String> = scenarios
        .iter()
        .flat_map(|p| ev::payment_bodies(p))
        .collect();
    let refunds: Vec<String> = scenarios
        .iter()
        .flat_map(|p| ev::refund_bodies(p))
        .collect();
    let refunds_source = &stack.event_sources[REFUND_PROCESSOR];
    for (queue, dlq, work, bodies) in [
        (
            &stack.event_source.queue_url,
            stack.function_var("DEAD_LETTER_QUEUE_URL")?,
            "payments",
            &payments,
        ),
        (
            &refunds_source.queue_url,
            stack.var_of(REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")?,
            "refunds",
            &refunds,
        ),
    ] {
        fleet.args = [
            "--work",
            work,
            "--queue-url",
            queue,
            "--dead-letter-queue-url",
            dlq,
        ]
        .map(str::to_owned)
        .to_vec();
        fleet.start(opts.instances, arm)?;
        send_all(&sqs, queue, bodies).await?;
        fleet.drain(&sqs, queue, arm, deadline).await?;
        fleet.stop().await;
    }
    for p in scenarios {
        ev::win_dispute(sim, p, Duration::from_secs(60)).await?;
    }
    fleet.args = [
        "--work",
        "events",
        "--queue-url",
        &events_source.queue_url,
        "--dead-letter-queue-url",
        &events_dlq,
    ]
    .map(str::to_owned)
    .to_vec();
    fleet.start(opts.instances, arm)?;
    let table = stack.function_var("IDEMPOTENCY_TABLE")?.to_owned();
    let mut violations = Vec::new();
    loop {
        fleet.supervise(arm)?;
        let mut waiting = None;
        let mut found = Vec::new();
        for p in scenarios {
            let (w, v) = ev::settled(sdk, &table, sim, p).await?;
            waiting = waiting.or(w);
            found.extend(v.violations);
        }
        match waiting {
            None => {
                violations.extend(found);
                break;
            }
            Some(why) if deadline.0.elapsed() > deadline.1 => {
                violations.extend(found);
                violations.push(format!(
                    "not settled through events in time (seed {}): {why}",
                    deadline.2
                ));
                break;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    fleet
        .drain(&sqs, &events_source.queue_url, arm, deadline)
        .await?;
    fleet.stop().await;
    sim.webhook(json!({"url": null})).await?;
    let dead = drain_dlq(&sqs, &events_dlq).await?;
    if !dead.is_empty() {
        violations.push(format!(
            "{} provider events dead-lettered: {:?}",
            dead.len(),
            dead.iter().map(|d| &d.error_code).collect::<Vec<_>>()
        ));
    }
    println!(
        "events: every scenario settled through events under crashes: {}",
        if violations.is_empty() { "yes" } else { "NO" }
    );
    Ok(violations)
}
