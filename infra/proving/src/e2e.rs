//! The check behind `make e2e-sam`: payments sent to a stack deployed with `sam deploy` onto a
//! local emulator, processed by its own event-source mapping and the real `bootstrap`, verified
//! from the provider's ledger, the table and the DLQ.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;

use crate::api_load::{final_statuses, post_load, wait_settled, ApiRun};
use crate::check::{drain_dlq, scan_records, verify, Sent, Verdict};
use crate::load::{malformed_bodies, payment_body, send_all, Expect, Planned};
use crate::sim::SimClient;
use lambda_local::esm::queue_depth;
use payctl::client::ApiClient;

/// Where the deployed stack is.
#[derive(Debug, Clone)]
pub struct E2eOptions {
    /// The deployed payments queue.
    pub queue_url: String,
    /// The deployed DLQ.
    pub dlq_url: String,
    /// The deployed idempotency table.
    pub table: String,
    /// The provider simulator the function was configured with.
    pub sim_url: String,
    /// Prefix of this run's payment ids.
    pub prefix: String,
    /// Give up after this long.
    pub max_duration: Duration,
    /// The deployed payments API: the load goes through it (and the outbox, the stream and
    /// the relay) instead of straight into the queue.
    pub api_url: Option<String>,
    /// The deployed refunds queue and its dead-letter queue: refunds of what was charged are
    /// sent there and checked too.
    pub refunds: Option<(String, String)>,
    /// The deployed provider-events endpoint: what the provider finishes later is settled
    /// through its events and checked ([`crate::events_check`]).
    pub events: Option<E2eEvents>,
}

/// How the deployed stack takes the provider's events.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// The public route: `ProviderEventsUrl` and its signing secret.
    Webhook {
        /// `ProviderEventsUrl`.
        url: String,
        /// Its signing secret for the simulator to sign with (`None`: registered at the
        /// simulator by `payctl connect`, which issued the secret).
        secret: Option<String>,
    },
    /// Stripe's EventBridge destination: the partner bus (`StripeEventBusName`) on the partner
    /// source, published on by the partner's side ([`crate::partner`]).
    EventBridge {
        /// `StripeEventBusName`.
        bus: String,
        /// The partner event source (`StripeEventSourceName`).
        source: String,
    },
}

/// The deployed stack's provider events.
#[derive(Debug, Clone)]
pub struct E2eEvents {
    /// How they arrive.
    pub delivery: Delivery,
    /// `ProviderEventsDeadLetterQueueUrl`.
    pub dlq_url: String,
}

async fn wait_drained(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    started: Instant,
    max: Duration,
) -> Result<()> {
    let mut empty = 0;
    while empty < 3 {
        if started.elapsed() > max {
            bail!("the deployed stack did not drain its queue within {max:?}");
        }
        empty = if queue_depth(sqs, queue_url).await? == 0 {
            empty + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Sends the e2e load and verifies it. Returns the verdict (violations make the caller fail).
pub async fn run(sdk: &aws_config::SdkConfig, opts: &E2eOptions) -> Result<Verdict> {
    let started = Instant::now();
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let sim = SimClient::new(&opts.sim_url);
    let p = &opts.prefix;
    // One payment whose first delivery fails every provider call: a batch item failure, then
    // a redelivery that charges it.
    let flaky = format!("{p}-flaky");
    sim.add_faults(json!([{"prefix": flaky, "fault": "down", "times": 3}]))
        .await?;

    let mut first: Vec<Planned> = Vec::new();
    for i in 0..20 {
        let id = format!("{p}-{i:03}");
        let (pm, expect) = if i % 5 == 4 {
            ("pm_card_chargeDeclined", Expect::Declined)
        } else {
            ("pm_card_visa", Expect::Charged("succeeded"))
        };
        first.push(Planned {
            body: payment_body(&id, 1000 + i, pm),
            payment_id: Some(id),
            expect,
            kind: "unique",
        });
    }
    first.push(Planned {
        body: payment_body(&flaky, 777, "pm_card_visa"),
        payment_id: Some(flaky.clone()),
        expect: Expect::Charged("succeeded"),
        kind: "unique",
    });
    for (body, code) in malformed_bodies(&format!("{p}-bad")).into_iter().take(4) {
        first.push(Planned {
            body,
            payment_id: None,
            expect: Expect::Invalid(code),
            kind: "malformed",
        });
    }
    // Duplicates of completed payments, sent after the first wave drained.
    let second: Vec<Planned> = first
        .iter()
        .filter(|x| x.kind == "unique")
        .take(8)
        .map(|x| Planned {
            kind: "duplicate",
            ..x.clone()
        })
        .collect();

    if let Some(api_url) = &opts.api_url {
        return through_api(sdk, opts, api_url, &first, &second, &flaky, started).await;
    }
    let mut sent = Vec::new();
    for (wave, load) in [(1, &first), (2, &second)] {
        let bodies: Vec<String> = load.iter().map(|x| x.body.clone()).collect();
        let ids = send_all(&sqs, &opts.queue_url, &bodies).await?;
        println!(
            "wave {wave}: sent {} messages to the deployed queue",
            ids.len()
        );
        sent.extend(
            load.iter()
                .cloned()
                .zip(ids)
                .map(|(planned, message_id)| Sent {
                    planned,
                    message_id,
                }),
        );
        wait_drained(&sqs, &opts.queue_url, started, opts.max_duration).await?;
    }

    let depth = queue_depth(&sqs, &opts.queue_url).await?;
    let dlq = drain_dlq(&sqs, &opts.dlq_url).await?;
    let records = scan_records(&aws_sdk_dynamodb::Client::new(sdk), &opts.table).await?;
    let ledger = sim.ledger().await?;
    let mut verdict = verify(&sent, &ledger, &records, &dlq, depth);
    refunds_phase(sdk, opts, &records, &mut verdict, started).await?;
    events_phase(sdk, opts, &mut verdict, started).await?;
    let flaky_calls = ledger.calls_for(&flaky);
    let flaky_attempts = records.get(&flaky).map(|r| r.attempts).unwrap_or(0);
    if flaky_attempts < 2 || flaky_calls < 4 {
        verdict.violations.push(format!(
            "{flaky} should have failed its first delivery and been charged on a redelivery: {flaky_attempts} attempts, {flaky_calls} provider calls"
        ));
    }
    let provider_calls = ledger.calls_under(p);
    println!();
    println!("== e2e on the deployed stack (ledger, table, DLQ) ==");
    verdict.print_counts(sent.len());
    println!("redelivered after a batch item failure: {flaky} ({flaky_attempts} attempts, {flaky_calls} provider calls)");
    println!("provider calls:         {provider_calls}");
    conclude(verdict, started)
}

/// The e2e load through the deployed API: three concurrent POSTs per payment in the first wave,
/// retries of eight of them in the second; checked from the API's answers, its `GET` statuses,
/// the provider's ledger, the table and the DLQ.
async fn through_api(
    sdk: &aws_config::SdkConfig,
    opts: &E2eOptions,
    api_url: &str,
    first: &[Planned],
    second: &[Planned],
    flaky: &str,
    started: Instant,
) -> Result<Verdict> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let sim = SimClient::new(&opts.sim_url);
    let client = ApiClient::new(api_url, sdk)?;
    // What the run relies on from the emulator's HTTP API, first: AWS_IAM refuses an unsigned
    // request, and the Lambda proxy integration carries a signed request (path parameter
    // included) to the function and its answer back.
    let unsigned = reqwest::Client::new()
        .get(format!("{api_url}/v1/payments/{}-probe", opts.prefix))
        .send()
        .await?;
    if unsigned.status().as_u16() != 403 {
        bail!(
            "the deployed API answered an unsigned request with {}: its AWS_IAM authorization is not enforced",
            unsigned.status()
        );
    }
    let probe = client.get(&format!("{}-probe", opts.prefix)).await?;
    if probe.status != 404 || probe.json()?["error"]["code"] != "resource_missing" {
        bail!(
            "a signed GET of an unknown payment did not reach the function through the proxy integration: {} {}",
            probe.status,
            probe.body
        );
    }
    println!("deployed API: unsigned requests refused (403); signed requests reach the function (404 resource_missing for an unknown payment)");
    let mut answers = std::collections::HashMap::new();
    let mut run = ApiRun::default();
    for (wave, load, copies) in [(1, first, 3), (2, second, 1)] {
        let r = post_load(&client, load, copies, &mut answers).await?;
        println!(
            "wave {wave}: {} requests to the deployed API ({} replays, {} refused)",
            r.requests, r.replays, r.refused
        );
        run.merge(r);
        wait_settled(&client, &run.sent, started, opts.max_duration).await?;
    }
    wait_drained(&sqs, &opts.queue_url, started, opts.max_duration).await?;
    let depth = queue_depth(&sqs, &opts.queue_url).await?;
    let dlq = drain_dlq(&sqs, &opts.dlq_url).await?;
    let records = scan_records(&aws_sdk_dynamodb::Client::new(sdk), &opts.table).await?;
    let ledger = sim.ledger().await?;
    let mut verdict = verify(&run.sent, &ledger, &records, &dlq, depth);
    verdict.violations.extend(run.violations.clone());
    refunds_phase(sdk, opts, &records, &mut verdict, started).await?;
    let (statuses, wrong) = final_statuses(&client, &run.sent).await?;
    verdict.violations.extend(wrong);
    let flaky_attempts = records.get(flaky).map(|r| r.attempts).unwrap_or(0);
    if flaky_attempts < 2 {
        verdict.violations.push(format!(
            "{flaky} should have failed its first delivery and been charged on a redelivery: {flaky_attempts} attempts"
        ));
    }
    println!();
    println!("== e2e through the deployed API (answers, GET, ledger, table, DLQ) ==");
    println!(
        "API requests:           {} ({} replays, {} refused as planned)",
        run.requests, run.replays, run.refused
    );
    println!("payments accepted:      {}", run.sent.len());
    println!("GET statuses:           {statuses:?}");
    verdict.print_counts(run.sent.len());
    println!(
        "provider calls:         {}",
        ledger.calls_under(&opts.prefix)
    );
    conclude(verdict, started)
}

/// Prints how long the run took and its result line.
/// Refunds of the run's payments through the deployed refund processor: sent twice each,
/// waited for, and checked ([`crate::refund_check`]).
async fn refunds_phase(
    sdk: &aws_config::SdkConfig,
    opts: &E2eOptions,
    records: &std::collections::HashMap<String, sqs_once::record::IdempotencyRecord>,
    verdict: &mut Verdict,
    started: Instant,
) -> Result<()> {
    let Some((queue_url, dlq_url)) = &opts.refunds else {
        return Ok(());
    };
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let plans = crate::refund_check::plan(&opts.prefix, records, 9);
    let bodies = crate::refund_check::bodies(&plans);
    send_all(&sqs, queue_url, &bodies).await?;
    println!(
        "refunds: sent {} messages ({} refunds, each twice) to the deployed refunds queue",
        bodies.len(),
        plans.len()
    );
    wait_drained(&sqs, queue_url, started, opts.max_duration).await?;
    let ledger = SimClient::new(&opts.sim_url).ledger().await?;
    let r = crate::refund_check::observe(sdk, &opts.table, dlq_url, &ledger, &plans).await?;
    r.print(bodies.len());
    if r.refunded == 0 {
        verdict
            .violations
            .push("the deployed refund processor refunded nothing".into());
    }
    verdict.violations.extend(r.violations);
    Ok(())
}

/// What the provider finishes later, through the deployed stack: the simulator delivers its
/// events to the deployed endpoint; the deployed inbox applies them.
async fn events_phase(
    sdk: &aws_config::SdkConfig,
    opts: &E2eOptions,
    verdict: &mut Verdict,
    started: Instant,
) -> Result<()> {
    let (Some(events), Some((refunds_queue, _))) = (&opts.events, &opts.refunds) else {
        return Ok(());
    };
    use crate::events_check as ev;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let sim = SimClient::new(&opts.sim_url);
    // The partner's side of EventBridge lives as long as the phase.
    let mut _partner = None;
    match &events.delivery {
        Delivery::Webhook { url, secret } => {
            // A forged delivery is refused before anything is queued.
            let forged = reqwest::Client::new()
                .post(url)
                .header("Stripe-Signature", format!("t={},v1={}", sqs_once::runner::now_ms() / 1000, "0".repeat(64)))
                .body(r#"{"id":"evt_forged","object":"event","type":"payment_intent.succeeded","created":1,"data":{"object":{}}}"#)
                .send()
                .await?;
            if forged.status().as_u16() != 400 {
                verdict.violations.push(format!(
                    "the deployed endpoint answered a forged delivery with {}",
                    forged.status()
                ));
            }
            match secret {
                Some(secret) => {
                    ev::point_webhook(&sim, url, secret).await?;
                    println!("provider events: the simulator delivers to the deployed {url} (a forged delivery was refused)");
                }
                None => {
                    let listed = sim.registered_endpoint().await?;
                    if listed.as_deref() != Some(url.as_str()) {
                        anyhow::bail!("the simulator sends to {listed:?}, not to the deployed {url}: run payctl connect first");
                    }
                    println!("provider events: the simulator delivers to the deployed {url}, registered by payctl connect (a forged delivery was refused)");
                }
            }
        }
        Delivery::EventBridge { bus, source } => {
            let secret = format!("whsec_partner_{}", uuid::Uuid::new_v4().simple());
            let (server, endpoint) = crate::partner::serve(sdk, &sim, bus, source, &secret).await?;
            _partner = Some(server);
            println!("provider events: the simulator's deliveries reach {endpoint}, which publishes each on the deployed partner bus {bus} as {source} (half of them twice, out of order); the stack's rule takes them to its queue");
        }
    }
    let p = format!("{}-events", opts.prefix);
    send_all(&sqs, &opts.queue_url, &ev::payment_bodies(&p)).await?;
    wait_drained(&sqs, &opts.queue_url, started, opts.max_duration).await?;
    send_all(&sqs, refunds_queue, &ev::refund_bodies(&p)).await?;
    wait_drained(&sqs, refunds_queue, started, opts.max_duration).await?;
    ev::win_dispute(&sim, &p, Duration::from_secs(60)).await?;
    let left = opts.max_duration.saturating_sub(started.elapsed());
    let v = ev::settle(sdk, &opts.table, &sim, &p, left, || async { Ok(()) }).await?;
    sim.webhook(json!({"url": null})).await?;
    let dead = drain_dlq(&sqs, &events.dlq_url).await?;
    if !dead.is_empty() {
        verdict.violations.push(format!(
            "{} provider events dead-lettered: {:?}",
            dead.len(),
            dead.iter().map(|d| &d.error_code).collect::<Vec<_>>()
        ));
    }
    println!(
        "settled through events: {}",
        v.statuses
            .iter()
            .map(|(k, s)| format!("{} {s}", k.rsplit("-ev-").next().unwrap_or(k)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    verdict.violations.extend(v.violations);
    Ok(())
}

fn conclude(verdict: Verdict, started: Instant) -> Result<Verdict> {
    println!(
        "took:                   {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if verdict.violations.is_empty() {
        println!("E2E OK");
    } else {
        println!("E2E FAILED: {} violations", verdict.violations.len());
        verdict.print_violations(30);
    }
    Ok(verdict)
}
