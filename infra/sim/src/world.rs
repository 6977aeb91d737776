//! One run: the stack provisioned from `template.yaml` into the models, the payment processor
//! built as its function's environment says, Lambda's event-source mapping feeding it, a
//! producer sending payments (duplicates and bad input among them), the provider settling bank
//! debits days later, DynamoDB's time to live and SQS's retention running, and every invariant
//! checked after every step.
//!
//! Everything runs on one thread, on tokio's paused clock: time moves only when every task
//! waits, so a month passes as fast as the work in it, and the seed fixes every draw.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use aws_lambda_events::event::sqs::{SqsMessage, SqsMessageAttribute};
use payment_core::edges::config::Config;
use payment_core::payments::charge::{PaymentWork, Processor};
use serde_json::json;
use sqs_once::clock::{Clock, TokioClock};
use sqs_once::SqsQueues;

use crate::dynamo::value::Value;
use crate::provider::{methods, Behaviour, Client, Provider};
use crate::sqs::{arn_of, url_of, Message};
use crate::wire::{Faults, Wire};

/// The simulated calendar starts here (2026-01-01T00:00:00Z): no run reads the host's clock.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

/// What one run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// Fixes every draw of the run.
    pub seed: u64,
    /// Payments the producer sends.
    pub payments: usize,
    /// Days the payments arrive over.
    pub arrival_days: f64,
    /// Days the run lasts in all (the provider's late settlements and the records' lifetimes
    /// play out after the last arrival).
    pub days: f64,
    /// Share of payments the producer sends twice (a retrying producer).
    pub duplicate_share: f64,
    /// Share of messages that are not a payment (bad JSON, a payment with a bad field).
    pub bad_input_share: f64,
    /// Share of payments sent again under the same id with another amount (a reused key).
    pub reused_key_share: f64,
    /// Chance that an invocation's process is killed at a random moment of it.
    pub crash_rate: f64,
    /// AWS's faults (both services).
    pub aws: Faults,
    /// The provider's behaviour.
    pub provider: Behaviour,
    /// Chance a standard queue delivers a message twice.
    pub duplicate_delivery_rate: f64,
    /// Template parameters given to the provisioning (`MaxReceiveCount`, ...).
    pub parameters: BTreeMap<String, String>,
    /// Where `template.yaml` is.
    pub template: std::path::PathBuf,
    /// Keep every request in the trace (else only its digest).
    pub keep_trace: bool,
    /// A mutation switched on in the code under test (the simulator's teeth), by name.
    pub mutation: Option<String>,
}

impl Options {
    /// A run of `payments` payments over `days` days with the template's settings and modest
    /// faults everywhere.
    pub fn new(seed: u64, payments: usize, days: f64) -> Self {
        Self {
            seed,
            payments,
            arrival_days: (days / 3.0).min(days),
            days,
            duplicate_share: 0.05,
            bad_input_share: 0.01,
            reused_key_share: 0.005,
            crash_rate: 0.02,
            aws: Faults {
                latency_ms: 8.0,
                error_rate: 0.002,
                throttle_rate: 0.002,
                lost_answer_rate: 0.002,
                outage_until_ms: 0,
            },
            provider: Behaviour {
                error_before_rate: 0.01,
                error_after_rate: 0.01,
                lost_answer_rate: 0.01,
                ..Behaviour::default()
            },
            duplicate_delivery_rate: 0.01,
            parameters: BTreeMap::new(),
            template: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"),
            keep_trace: false,
            mutation: None,
        }
    }
}

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
    /// The last lines of the trace (or all of it with `keep_trace`).
    pub trace: Vec<String>,
}

/// What the producer sent for one payment id.
#[derive(Debug, Clone)]
struct Sent {
    /// The payment method (what the provider will do with it).
    method: &'static str,
}

struct World {
    opts: Options,
    clock: Arc<dyn Clock>,
    wire: Wire,
    provider: Provider,
    config: Config,
    sdk: aws_config::SdkConfig,
    queue: String,
    dlq: String,
    /// Payment ids sent (valid ones), with what was sent.
    sent: Mutex<BTreeMap<String, Sent>>,
    /// Bodies sent that are not valid payments.
    bad: Mutex<usize>,
    violations: Mutex<Vec<Violation>>,
    trace: Mutex<std::collections::VecDeque<String>>,
    stats: Mutex<Report>,
    rng: Mutex<fastrand::Rng>,
}

impl World {
    fn now(&self) -> i64 {
        self.clock.now_ms() - EPOCH_MS
    }

    fn note(&self, line: String) {
        let mut t = self.trace.lock().expect("trace");
        let line = format!("{:>12} {line}", self.now());
        self.wire.aws.lock().expect("aws").fold(line.as_bytes());
        t.push_back(line);
        if !self.opts.keep_trace && t.len() > 40 {
            t.pop_front();
        }
    }

    fn violated(&self, invariant: &'static str, detail: String) {
        self.note(format!("VIOLATION {invariant}: {detail}"));
        self.violations.lock().expect("violations").push(Violation {
            invariant,
            detail,
            at_ms: self.now(),
        });
    }

    fn draw(&self) -> f64 {
        self.rng.lock().expect("rng").f64()
    }

    /// A fresh processor instance (a cold start): the function's init, on the run's clients.
    fn instance(&self) -> Arc<Processor> {
        let pace = payment_core::edges::bootstrap::pace_of(&self.config);
        let client = Client {
            provider: self.provider.clone(),
            pace: pace.clone(),
        };
        let work = PaymentWork::new(Arc::new(client), self.config.provider_key_retention)
            .with_refund_window(self.config.refund_window);
        let store = payment_core::payment_store(
            aws_sdk_dynamodb::Client::new(&self.sdk),
            &self.config.idempotency_table,
        )
        .with_clock(Arc::clone(&self.clock));
        let queues = SqsQueues::new(
            aws_sdk_sqs::Client::new(&self.sdk),
            self.config.dead_letter_queue_url.clone(),
        );
        let mut runner = Processor::new(
            Arc::new(work),
            Arc::new(store),
            Arc::new(queues),
            self.config.settings.clone(),
        )
        .with_clock(Arc::clone(&self.clock));
        if let Some(p) = pace {
            runner = runner.with_pace(p);
        }
        Arc::new(runner)
    }
}

/// The Lambda record of a received message, as the event-source mapping builds it.
fn record_of(m: &Message, queue: &str, fifo: bool) -> SqsMessage {
    let mut r = SqsMessage::default();
    r.message_id = Some(m.id.clone());
    r.receipt_handle = m.handle.clone();
    r.body = Some(m.body.clone());
    let attrs = crate::sqs::Sqs::message_json(fifo, m);
    r.attributes = attrs["Attributes"]
        .as_object()
        .map(|a| {
            a.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    r.message_attributes = m
        .attributes
        .iter()
        .map(|(k, v)| {
            let mut a = SqsMessageAttribute::default();
            a.string_value = v["StringValue"].as_str().map(str::to_owned);
            a.data_type = v["DataType"].as_str().map(str::to_owned);
            (k.clone(), a)
        })
        .collect();
    r.event_source_arn = Some(arn_of(queue));
    r.event_source = Some("aws:sqs".into());
    r.aws_region = Some("us-east-1".into());
    r
}

/// Runs one seed to its end and checks it.
pub fn run(opts: Options) -> Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .context("building the simulator's runtime")?;
    // The code under test draws its jitter (fastrand) and tokens on this thread: seeded here.
    fastrand::seed(opts.seed);
    sqs_once::token::seed_this_thread(opts.seed.rotate_left(17));
    rt.block_on(run_on(opts))
}

async fn run_on(opts: Options) -> Result<Report> {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(EPOCH_MS));
    let wire = Wire::new(opts.seed, Arc::clone(&clock));
    {
        let mut aws = wire.aws.lock().expect("aws");
        aws.keep_log = opts.keep_trace;
    }
    let sdk = wire.sdk_config();
    let mut parameters: std::collections::HashMap<String, String> =
        opts.parameters.clone().into_iter().collect();
    parameters
        .entry("ProviderEventsDelivery".into())
        .or_insert_with(|| "webhook".into());
    let stack = payctl::template::provision(
        &sdk,
        &opts.template,
        &payctl::template::ProvisionOptions {
            stack_name: "sim".into(),
            parameters,
            ..Default::default()
        },
    )
    .await
    .context("provisioning template.yaml into the models")?;
    let env = stack
        .function_envs
        .get("PaymentProcessorFunction")
        .context("the template has no PaymentProcessorFunction")?
        .clone();
    let mut env = env;
    for (k, v) in stack
        .deployed_pace
        .get("PaymentProcessorFunction")
        .cloned()
        .unwrap_or_default()
    {
        env.insert(k, v);
    }
    // The provider is reached through its port, not its wire client: no key is ever read.
    if env
        .get("PAYMENT_API_KEY_SECRET_ARN")
        .is_none_or(|v| v.trim().is_empty())
    {
        env.insert("PAYMENT_API_KEY".into(), "sk_test_simulator".into());
    }
    let config =
        Config::from_lookup(|k| env.get(k).cloned()).context("the processor's configuration")?;
    let source = stack.event_sources.get("PaymentProcessorFunction").cloned();
    let queue_url = config
        .source_queue_url
        .clone()
        .context("SOURCE_QUEUE_URL")?;
    let queue = queue_url.rsplit('/').next().unwrap_or_default().to_owned();
    let dlq = config
        .dead_letter_queue_url
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    {
        let mut aws = wire.aws.lock().expect("aws");
        aws.dynamo_faults = opts.aws.clone();
        aws.sqs_faults = opts.aws.clone();
        aws.sqs.duplicate_rate = opts.duplicate_delivery_rate;
    }
    let provider = Provider::new(
        opts.seed ^ 0x9e37,
        Arc::clone(&clock),
        config.provider_timeout,
    );
    *provider.behaviour.lock().expect("behaviour") = opts.provider.clone();
    let world = Arc::new(World {
        opts: opts.clone(),
        clock: Arc::clone(&clock),
        wire: wire.clone(),
        provider,
        config,
        sdk: sdk.clone(),
        queue,
        dlq,
        sent: Mutex::new(BTreeMap::new()),
        bad: Mutex::new(0),
        violations: Mutex::new(Vec::new()),
        trace: Mutex::new(Default::default()),
        stats: Mutex::new(Report::default()),
        rng: Mutex::new(fastrand::Rng::with_seed(opts.seed ^ 0xa5a5)),
    });
    let batch_size = source.as_ref().map_or(10, |s| s.batch_size.max(1) as usize);
    let timeout_s = source
        .as_ref()
        .map_or(60, |s| s.function_timeout_seconds.max(1) as i64);
    let window_s = source
        .as_ref()
        .map_or(0, |s| s.batching_window_seconds.max(0) as u64);
    let concurrency: usize = env
        .get("EVENT_SOURCE_MAX_CONCURRENCY")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    world.note(format!(
        "start: seed {} payments {} days {} batch {batch_size} timeout {timeout_s}s window {window_s}s concurrency {concurrency}",
        opts.seed, opts.payments, opts.days
    ));

    let end_ms = EPOCH_MS + (opts.days * 86_400_000.0) as i64;
    let producer = tokio::spawn(produce(Arc::clone(&world)));
    let housekeeping = tokio::spawn(housekeep(Arc::clone(&world), end_ms));
    let esm = tokio::spawn(event_source(
        Arc::clone(&world),
        batch_size,
        timeout_s,
        concurrency,
        end_ms,
    ));
    producer.await.context("the producer")?;
    esm.await.context("the event source")?;
    housekeeping.await.context("housekeeping")?;
    check_end(&world);

    let mut report = world.stats.lock().expect("stats").clone();
    let aws = wire.aws.lock().expect("aws");
    report.digest = aws.digest;
    report.aws_requests = aws.requests;
    report.violations = world.violations.lock().expect("v").clone();
    report.days = (clock.now_ms() - EPOCH_MS) as f64 / 86_400_000.0;
    report.payments = world.sent.lock().expect("sent").len();
    let books = world.provider.books.lock().expect("books");
    report.provider_requests = books.requests;
    report.provider_refused = books.refused;
    report.charged = books
        .intents
        .values()
        .filter(|i| i.status == "succeeded")
        .map(|i| &i.payment_id)
        .collect::<BTreeSet<_>>()
        .len();
    let mut trace: Vec<String> = world.trace.lock().expect("trace").iter().cloned().collect();
    if opts.keep_trace {
        trace.extend(aws.log.iter().cloned());
    }
    report.trace = trace;
    Ok(report)
}

/// The producer: payments arriving at random over the arrival days, some twice, some bad.
async fn produce(w: Arc<World>) {
    let sqs = aws_sdk_sqs::Client::new(&w.sdk);
    let url = url_of(&w.queue);
    let span_ms = (w.opts.arrival_days * 86_400_000.0) as i64;
    let mut times: Vec<i64> = (0..w.opts.payments)
        .map(|_| (w.draw() * span_ms as f64) as i64)
        .collect();
    times.sort();
    let mut later: Vec<(i64, String)> = Vec::new();
    for (n, at) in times.into_iter().enumerate() {
        let wait = (EPOCH_MS + at - w.clock.now_ms()).max(0);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        let roll = w.draw();
        let body = if roll < w.opts.bad_input_share {
            *w.bad.lock().expect("bad") += 1;
            if w.draw() < 0.5 {
                "{\"payment_id\": \"broken".to_owned()
            } else {
                json!({"payment_id": format!("p-{n:07}"), "amount": -5, "currency": "usd", "customer_id": "cus_sim", "payment_method": methods::CARD}).to_string()
            }
        } else {
            let m = w.draw();
            let method = if m < 0.85 {
                methods::CARD
            } else if m < 0.90 {
                methods::DECLINED
            } else if m < 0.93 {
                methods::NEEDS_CUSTOMER
            } else if m < 0.98 {
                methods::BANK_DEBIT
            } else {
                methods::BANK_DEBIT_FAILS
            };
            let id = format!("p-{n:07}");
            let amount = 100 + (w.draw() * 100_000.0) as i64;
            let body = json!({"payment_id": id, "amount": amount, "currency": "usd", "customer_id": format!("cus_{}", n % 997), "payment_method": method}).to_string();
            if w.draw() < w.opts.reused_key_share {
                let other = json!({"payment_id": id, "amount": amount + 1, "currency": "usd", "customer_id": format!("cus_{}", n % 997), "payment_method": method}).to_string();
                later.push((w.clock.now_ms() + (w.draw() * 3_600_000.0) as i64, other));
            }
            if w.draw() < w.opts.duplicate_share {
                later.push((
                    w.clock.now_ms() + (w.draw() * 7_200_000.0) as i64,
                    body.clone(),
                ));
            }
            w.sent.lock().expect("sent").insert(id, Sent { method });
            body
        };
        send(&w, &sqs, &url, &body).await;
        later.retain(|(at, b)| {
            if *at <= w.clock.now_ms() {
                let (w2, sqs2, url2, b2) = (Arc::clone(&w), sqs.clone(), url.clone(), b.clone());
                tokio::spawn(async move { send(&w2, &sqs2, &url2, &b2).await });
                false
            } else {
                true
            }
        });
    }
    later.sort();
    for (at, body) in later {
        let wait = (at - w.clock.now_ms()).max(0);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        send(&w, &sqs, &url, &body).await;
    }
}

/// Sends one message as a producer does: retried until SQS takes it.
async fn send(w: &World, sqs: &aws_sdk_sqs::Client, url: &str, body: &str) {
    loop {
        match sqs
            .send_message()
            .queue_url(url)
            .message_body(body)
            .send()
            .await
        {
            Ok(_) => return,
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
        w.note("producer: send retried".into());
    }
}

/// Lambda's event-source mapping for the processor: polls, batches, invokes up to its maximum
/// concurrency, deletes what the response does not report as failed.
async fn event_source(
    w: Arc<World>,
    batch: usize,
    timeout_s: i64,
    concurrency: usize,
    end_ms: i64,
) {
    let idle: Arc<Mutex<Vec<Arc<Processor>>>> = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let fifo = w.queue.ends_with(".fifo");
    loop {
        if w.clock.now_ms() >= end_ms {
            break;
        }
        let permit = Arc::clone(&running).acquire_owned().await.expect("open");
        let msgs = {
            let mut aws = w.wire.aws.lock().expect("aws");
            let now = w.clock.now_ms();
            aws.sqs
                .receive(&url_of(&w.queue), batch, None, now)
                .unwrap_or_default()
        };
        if msgs.is_empty() {
            drop(permit);
            // Long polling: the mapping asks again as soon as a message arrives or one in
            // flight becomes visible again (and at least every 20 s, as a long poll ends).
            let (arrivals, next) = {
                let aws = w.wire.aws.lock().expect("aws");
                (
                    std::sync::Arc::clone(&aws.sqs.arrivals),
                    aws.sqs.next_visible(&url_of(&w.queue)),
                )
            };
            let now = w.clock.now_ms();
            let wait = next.map_or(20_000, |n| (n - now).clamp(1, 20_000));
            let _ =
                tokio::time::timeout(Duration::from_millis(wait as u64), arrivals.notified()).await;
            continue;
        }
        let records: Vec<SqsMessage> = msgs.iter().map(|m| record_of(m, &w.queue, fifo)).collect();
        let instance = idle.lock().expect("idle").pop();
        let (w2, idle2) = (Arc::clone(&w), Arc::clone(&idle));
        tokio::spawn(async move {
            let _permit = permit;
            let (instance, cold) = match instance {
                Some(i) => (i, false),
                None => {
                    // A cold start: the init runs before the batch (~150 ms on arm64).
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    (w2.instance(), true)
                }
            };
            invoke(&w2, instance, records, timeout_s, cold, &idle2).await;
        });
    }
}

/// One invocation: the runner's `handle_batch` until it answers, the deadline kills it, or a
/// crash does; then the mapping deletes what succeeded.
async fn invoke(
    w: &Arc<World>,
    instance: Arc<Processor>,
    records: Vec<SqsMessage>,
    timeout_s: i64,
    cold: bool,
    idle: &Arc<Mutex<Vec<Arc<Processor>>>>,
) {
    {
        let mut s = w.stats.lock().expect("stats");
        s.invocations += 1;
        s.cold_starts += cold as u64;
    }
    let deadline_ms = w.clock.now_ms() + timeout_s * 1000;
    // A crash lands at a moment of the invocation's work: exponential with a mean of one
    // second (a batch's typical length), so that most land while it works, some late.
    let crash_at = (w.draw() < w.opts.crash_rate)
        .then(|| Duration::from_secs_f64((-(1.0 - w.draw()).ln()).min(timeout_s as f64)));
    let ids: Vec<(String, String)> = records
        .iter()
        .map(|r| {
            (
                r.message_id.clone().unwrap_or_default(),
                r.receipt_handle.clone().unwrap_or_default(),
            )
        })
        .collect();
    let run = {
        let instance = Arc::clone(&instance);
        tokio::spawn(async move { instance.handle_batch(records, deadline_ms).await })
    };
    let limit = crash_at.unwrap_or(Duration::from_secs(timeout_s as u64));
    let abort = run.abort_handle();
    let answered = tokio::time::timeout(limit, run).await;
    let response = match answered {
        Ok(Ok((response, _summary))) => response,
        _ => {
            // Killed (a crash, or the deadline): the process and everything it was doing are
            // gone; its messages come back when their visibility ends.
            abort.abort();
            w.stats.lock().expect("stats").killed += 1;
            w.note(format!(
                "invocation of {} killed after {limit:?}",
                ids.len()
            ));
            check_now(w);
            return;
        }
    };
    let failed: BTreeSet<String> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    {
        let mut aws = w.wire.aws.lock().expect("aws");
        for (id, handle) in &ids {
            if !failed.contains(id) {
                let _ = aws.sqs.delete(&url_of(&w.queue), handle);
            }
        }
    }
    w.note(format!(
        "invocation of {}: {} handed back",
        ids.len(),
        failed.len()
    ));
    idle.lock().expect("idle").push(instance);
    check_now(w);
}

/// The provider's and AWS's own time, every ten minutes: debits settle, retention drops,
/// and (hourly, as lazily as DynamoDB's own sweep) time to live deletes.
async fn housekeep(w: Arc<World>, end_ms: i64) {
    let seed = w.opts.seed;
    let mut tick: u64 = 0;
    while w.clock.now_ms() < end_ms {
        tokio::time::sleep(Duration::from_secs(600)).await;
        tick += 1;
        let now = w.clock.now_ms();
        w.provider
            .books
            .lock()
            .expect("books")
            .settle(now, |i| is_failing(&w, &i.payment_id));
        let (expired, dropped) = {
            let mut aws = w.wire.aws.lock().expect("aws");
            let expired = if tick.is_multiple_of(6) {
                aws.dynamo.expire(now.div_euclid(1000), &|table, key, at| {
                    // Up to 48 hours after `expires_at`, drawn per item from the seed.
                    (fnv(format!("{seed}/{table}/{key}/{at}").as_bytes()) % (48 * 3600)) as i64
                })
            } else {
                Vec::new()
            };
            (expired, aws.sqs.expire(now))
        };
        w.stats.lock().expect("stats").expired_records += expired.len();
        for (_, item) in expired {
            check_expiry(&w, &item);
        }
        for (queue, m) in dropped {
            w.violated(
                "no message lost at a queue's retention",
                format!(
                    "{} dropped from {queue} after {} receives: {}",
                    m.id, m.receives, m.body
                ),
            );
        }
        check_now(&w);
    }
}

fn is_failing(w: &World, payment_id: &str) -> bool {
    w.sent
        .lock()
        .expect("sent")
        .get(payment_id)
        .is_some_and(|s| s.method == methods::BANK_DEBIT_FAILS)
}

/// FNV-1a, 64 bits.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A record deleted by time to live while the provider may still change its payment is lost
/// history: a late settlement, refund or dispute would find nothing.
fn check_expiry(w: &World, item: &crate::dynamo::value::Item) {
    let Some(Value::S(pk)) = item.get("pk") else {
        return;
    };
    let Some(pid) = pk.strip_prefix("payment#") else {
        return;
    };
    let books = w.provider.books.lock().expect("books");
    for i in books.intents_of(pid) {
        if i.status == "processing" {
            w.violated(
                "no record deleted while the provider can still change it",
                format!("{pk} expired while {} is processing", i.id),
            );
        }
    }
}

/// The invariants that hold at every step: what the provider's books found as it happened.
fn check_now(w: &World) {
    let found: Vec<String> =
        std::mem::take(&mut w.provider.books.lock().expect("books").double_charges);
    for detail in found {
        w.violated("no payment charged twice", detail);
    }
}

/// The invariants of a quiet system, at the end.
fn check_end(w: &World) {
    let aws = w.wire.aws.lock().expect("aws");
    let table = &w.config.idempotency_table;
    let Some(t) = aws.dynamo.tables.get(table) else {
        drop(aws);
        w.violated("the stack exists", format!("no table {table}"));
        return;
    };
    let mut dead: BTreeMap<String, usize> = BTreeMap::new();
    let mut dead_ids: BTreeSet<String> = BTreeSet::new();
    if let Some(q) = aws.sqs.queues.get(&w.dlq) {
        for m in &q.messages {
            let code = m
                .attributes
                .get("error_code")
                .and_then(|v| v["StringValue"].as_str())
                .unwrap_or("max_receives")
                .to_owned();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&m.body) {
                if let Some(id) = v["payment_id"].as_str() {
                    dead_ids.insert(id.to_owned());
                }
            }
            *dead.entry(code).or_default() += 1;
        }
    }
    let in_queue = aws.sqs.queues.get(&w.queue).map_or(0, |q| q.messages.len());
    let records: BTreeMap<String, crate::dynamo::value::Item> = t
        .items
        .values()
        .filter_map(|i| match i.get("pk") {
            Some(Value::S(pk)) => pk
                .strip_prefix("payment#")
                .map(|p| (p.to_owned(), i.clone())),
            _ => None,
        })
        .collect();
    drop(aws);
    for code in dead.keys() {
        if !payctl::dead_letter_codes::KNOWN_CODES.contains(&code.as_str()) {
            w.violated(
                "every dead letter has a code the runbook explains",
                format!("code {code}"),
            );
        }
    }
    if in_queue > 0 {
        w.violated(
            "every accepted payment ends",
            format!("{in_queue} messages still in the source queue at the end"),
        );
    }
    let sent = w.sent.lock().expect("sent").clone();
    let books = w.provider.books.lock().expect("books");
    for (pid, s) in &sent {
        let intents = books.intents_of(pid);
        let charged = intents
            .iter()
            .any(|i| matches!(i.status.as_str(), "succeeded" | "processing"));
        let record = records.get(pid);
        let status = record.and_then(|r| match r.get("status") {
            Some(Value::S(s)) => Some(s.as_str()),
            _ => None,
        });
        let ended = status == Some("COMPLETED")
            || dead_ids.contains(pid)
            || (record.is_none() && !intents.is_empty());
        if !ended {
            w.violated(
                "every accepted payment ends",
                format!(
                    "{pid} ({}) has record {status:?}, {} intents, no dead letter",
                    s.method,
                    intents.len()
                ),
            );
        }
        if status == Some("COMPLETED") {
            let outcome = record.and_then(|r| match r.get("outcome") {
                Some(Value::M(m)) => m.get("provider_payment_id").cloned(),
                _ => None,
            });
            if let Some(Value::S(pi)) = outcome {
                if !intents.iter().any(|i| i.id == pi) {
                    w.violated(
                        "every ledger equals the provider's books",
                        format!("{pid}'s record names {pi}, which the provider does not hold"),
                    );
                }
            } else if charged {
                w.violated(
                    "every ledger equals the provider's books",
                    format!("{pid} is charged at the provider and its record names no intent"),
                );
            }
        }
    }
    drop(books);
    w.stats.lock().expect("stats").dead_letters = dead;
}
