//! One run: the stack provisioned from `template.yaml` into the models, the payment processor
//! built as its function's environment says, Lambda's event-source mapping feeding it, a
//! producer sending payments (duplicates and bad input among them), the provider settling bank
//! debits days later, DynamoDB's time to live and SQS's retention running, and every invariant
//! checked after every step.
//!
//! Everything runs on one thread, on tokio's paused clock: time moves only when every task
//! waits, so a month passes as fast as the work in it, and the seed fixes every draw.
//!
//! Why ~500 lines: the world's parts (its options, its mutations, the stack it provisions and
//! the tasks it runs) are wired in one place, where a reader sees what a run is made of.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use payment_core::edges::config::Config;
use payment_core::payments::charge::{PaymentWork, Processor};
use sqs_once::clock::{Clock, TokioClock};
use sqs_once::SqsQueues;

use crate::provider::client::Client;
use crate::provider::disputes::DisputePlan;
use crate::provider::Provider;
use crate::wire::Wire;

mod catchup;
mod checks;
mod esm;
mod events;
mod function;
mod gateway;
mod intake;
mod operator;
mod options;
mod refunds;
mod report;
pub mod sweep;

pub use options::Options;
pub use report::{claims, Report, Violation};

/// An outage given as (from day, for hours): its epoch ms.
fn outage_window((from_day, hours): (f64, f64)) -> std::ops::Range<i64> {
    let from = EPOCH_MS + (from_day * 86_400_000.0) as i64;
    from..from + (hours * 3_600_000.0) as i64
}

/// The simulated calendar starts here (2026-01-01T00:00:00Z): no run reads the host's clock.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

/// The mutations a run can put back, each a version of the system that was (or would be)
/// wrong, for the simulator to show that it finds them. Those of the protocol
/// (`sqs_once::mutation::ALL`) are put back in `sqs-once` itself and need a build with its
/// `sim-mutations` feature (the simulator's tests; `make sim MUTATION=...`).
pub const MUTATIONS: &[(&str, &str)] = &[
    (
        "query_reads_the_table",
        "a DynamoDB query in the model reads every item of its table, not its partition: the run's cost grows with its square (crate::cost::MUTATIONS, the scaling test's teeth)",
    ),
    (
        "provider_walks_keys",
        "the provider model walks every idempotency key of the last 24 hours on each charge (crate::cost::MUTATIONS)",
    ),
    (
        "charged_records_21_days",
        "a charged payment's record kept the record retention (21 days), not the refund window: main before the lifetimes work",
    ),
    (
        "unknown_mark_not_sticky",
        "an attempt starts with a clear unknown-outcome mark instead of the one it inherits (sqs_once::mutation)",
    ),
    (
        "completion_unfenced",
        "a completion is written whoever holds the lease (sqs_once::mutation; the model's FENCED=0)",
    ),
    (
        "early_refund_not_held",
        "a refund of a settling payment is handed back until its retry horizon, then dead-lettered: main before held refunds (payment_core::refunds::MUTATIONS)",
    ),
    (
        "inherited_unknown_skips_refund_lookup",
        "a refund sent again after its record expired is called blind by an attempt that inherits an unknown outcome: made twice, or its amount given back (payment_core::refunds::MUTATIONS; issue 65, found by SWEEP=true seed 3)",
    ),
    (
        "a_read_before_a_refused_write_spends_the_attempt",
        "a refund's read that precedes its write makes waiting for the pace an attempt: resumed and retried refunds dead-lettered retries_exhausted at a low pace (sqs_once::mutation; issue 65)",
    ),
    (
        "expired_payment_record_waited_for",
        "a refund of a payment whose record expired waits for it until its retries are spent: dead-lettered retries_exhausted after each redrive (payment_core::refunds::MUTATIONS; issue 65)",
    ),
    (
        "held_refunds_never_resumed",
        "a held refund is never resumed when its payment settles: the check that held is an end only while the payment settles (payment_core::refunds::MUTATIONS; issue 65)",
    ),
    (
        "a_done_copy_waits_for_the_pace",
        "a copy of a message already completed waits for the pace before its claim finds it done: duplicates cycle through a burst (sqs_once::mutation; issue 65)",
    ),
    (
        "requeued_only_on_the_last_receive",
        "a message never attempted is copied afresh only on its last receive: a duplicate delivered later, or a crash there, finds it with no receive left and SQS moves it without a reason (sqs_once::mutation; issue 65)",
    ),
    (
        "an_attempt_books_only_its_first_slot",
        "a refund's write books its slot after every first slot the batch's other messages booked: at a low rate past its lease, every attempt reads and never writes, and its copies multiply (sqs_once::mutation; issue 65)",
    ),
    (
        "unknown_refund_of_a_gone_payment_waits",
        "an unknown refund of a payment with no record waits for a lookup that can never be made, although no attempt of its record can have reserved: dead-lettered retries_exhausted after each redrive (payment_core::refunds::MUTATIONS; issue 65)",
    ),
    (
        "held_refund_canceled_on_decline",
        "a decline counts as settled for the refunds a payment holds: they are canceled, and never made when its customer pays the same PaymentIntent days later (payment_core::refunds::MUTATIONS; issue 65, bug 3)",
    ),
    (
        "refund_with_no_payment_record_not_searched",
        "a refund whose payment has no record is refused payment_unknown without asking the provider: a resend of a refund made before the records expired is dead-lettered for a person to refund by hand again (payment_core::refunds::MUTATIONS; issue 65)",
    ),
    (
        "endpoint_registered_since_fit",
        "the catch-up takes an endpoint registered after the list was last checked through for fit: the events made while it was away are never applied (payment_core::events::catch_up::MUTATIONS; issue 65, bug 4)",
    ),
    (
        "catch_up_without_overlap",
        "the catch-up starts from its last event, not the overlap before it: an event the list showed late, its delivery failed, is never applied (payment_core::events::catch_up::MUTATIONS; issue 65)",
    ),
    (
        "catch_up_off",
        "no scheduled catch-up: what the webhook never delivered is never applied (main before the catch-up)",
    ),
    (
        "catch_up_every_event_at_instance_share",
        "the scheduled catch-up lists every event, not only the undelivered, at one instance's share of the function's rate: main before the events-at-pace work",
    ),
    (
        "intake_takes_any_text",
        "the doors check text for its length only: a payment holding U+FFFF is answered 202 and its row reaches the relay (payment_core::domain::text::MUTATIONS)",
    ),
    (
        "inbox_applies_payload",
        "the inbox takes an event's payload for the provider's copy of its object: an insider's forged event settles payments, refunds and disputes (payment_core::events::inbox::MUTATIONS)",
    ),
    (
        "inbox_reads_not_booked",
        "the inbox as before its events were paced: a dispute's event claimed before its first read has a slot, and a read the pace refused an attempt (payment_core::events::inbox::MUTATIONS)",
    ),
];

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
    /// Payments whose shoppers' text no door may take, and those the API accepted all the same.
    refused: Mutex<intake::shopper::Refused>,
    violations: Mutex<Vec<Violation>>,
    trace: Mutex<std::collections::VecDeque<String>>,
    stats: Mutex<Report>,
    rng: Mutex<fastrand::Rng>,
    /// The dead letters the operator has read.
    seen: Mutex<Option<operator::Seen>>,
    /// The refund processor.
    refunds: function::Function,
    /// The events inbox.
    events: function::Function,
    /// Refunds the merchant sent, by refund id.
    refunds_sent: Mutex<BTreeMap<String, refunds::RefundSent>>,
    /// The refunds' dead letters already judged, by message id.
    refund_letters: Mutex<std::collections::BTreeSet<String>>,
    /// The messages a killed invocation held (by id): a receive of theirs spent by a crash.
    crashed_on: Mutex<std::collections::BTreeSet<String>>,
    /// Refunds whose record expired completed (an end, though the record is gone).
    refunds_ended: Mutex<std::collections::BTreeSet<String>>,
    /// Refunds the merchant sends once more when their record expires: body by refund id.
    refunds_late: Mutex<BTreeMap<String, String>>,
    /// The scheduled catch-up's runs.
    catch_up: catchup::Shared,
    /// How the provider's events arrive: through the webhook route ...
    webhook: bool,
    /// ... and through EventBridge, published by this partner event source.
    bridge: Option<String>,
    /// The payments API, when payments go through it.
    api: Option<intake::api::ApiFunction>,
    /// The outbox relay and its stream mapping, when payments go through the API.
    relay: Option<Arc<intake::relay::Mapping>>,
    /// When the first payment arrived (epoch ms).
    first_arrival_ms: Mutex<Option<i64>>,
    /// API invocations under way.
    api_in_flight: std::sync::atomic::AtomicUsize,
    /// The API function's reserved concurrency (`ApiReservedConcurrency`).
    api_reserved: usize,
    /// The events route's throttle.
    route: Mutex<gateway::Bucket>,
    /// The payments API's routes' throttle (the stage's default route settings), if any.
    api_gate: Mutex<Option<gateway::Bucket>>,
    /// Set when a check found the work growing without bound: every loop of the world stops
    /// at once, and the end's checks are not made (the run's finding is that violation).
    halted: std::sync::atomic::AtomicBool,
}

impl World {
    fn now(&self) -> i64 {
        self.clock.now_ms() - EPOCH_MS
    }

    /// Whether the world still runs: before `end_ms`, and not halted.
    fn running(&self, end_ms: i64) -> bool {
        self.clock.now_ms() < end_ms && !self.halted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops the world: a check found what would only grow from here.
    fn halt(&self) {
        self.halted.store(true, std::sync::atomic::Ordering::SeqCst);
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

    /// A standard normal draw (Box-Muller).
    fn normal(&self) -> f64 {
        let (u1, u2) = (self.draw().max(1e-12), self.draw());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Whether the events route admits a request now (its `ProviderEventsRateLimit` and
    /// `ProviderEventsBurstLimit`).
    fn route_admits(&self) -> bool {
        let now = self.clock.now_ms();
        self.route.lock().expect("route").admits(now)
    }

    /// A fresh processor instance (a cold start): the function's init, on the run's clients.
    fn instance(&self) -> Arc<Processor> {
        let pace = payment_core::edges::bootstrap::pace_of(&self.config);
        let client = Client {
            provider: self.provider.clone(),
            pace: pace.clone(),
        };
        let refund_window = match self.opts.mutation.as_deref() {
            Some("charged_records_21_days") => self.config.settings.record_ttl,
            _ => self.config.refund_window,
        };
        let work = PaymentWork::new(Arc::new(client), self.config.provider_key_retention)
            .with_refund_window(refund_window);
        let store = payment_core::payment_store(
            crate::wire::dynamodb_client(&self.sdk),
            &self.config.idempotency_table,
        )
        .with_clock(Arc::clone(&self.clock));
        let queues = SqsQueues::new(
            crate::wire::sqs_client(&self.sdk),
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
    sqs_once::mutation::clear();
    crate::cost::put_back(opts.mutation.as_deref());
    crate::cost::take();
    if let Some(m) = opts.mutation.as_deref() {
        anyhow::ensure!(MUTATIONS.iter().any(|(n, _)| *n == m), "no mutation {m}");
        for list in [
            sqs_once::mutation::ALL,
            payment_core::refunds::MUTATIONS,
            payment_core::events::inbox::MUTATIONS,
            payment_core::events::catch_up::MUTATIONS,
            payment_core::domain::text::MUTATIONS,
        ] {
            if list.iter().any(|(n, _)| *n == m) {
                sqs_once::mutation::put_back_from(list, m).map_err(anyhow::Error::msg)?;
            }
        }
    }
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
    let delivery = parameters
        .entry("ProviderEventsDelivery".into())
        .or_insert_with(|| "webhook".into())
        .clone();
    let webhook = matches!(delivery.as_str(), "webhook" | "both");
    let bridge = matches!(delivery.as_str(), "eventbridge" | "both").then(|| {
        parameters
            .entry("StripeEventSourceName".into())
            .or_insert_with(|| "aws.partner/stripe.com/ed_simulator".into())
            .clone()
    });
    let shape = payctl::template::shape_of(&opts.template, &parameters)?;
    let number = |name: &str| -> Result<f64> {
        shape
            .parameters
            .get(name)
            .and_then(|m| m.parse().ok())
            .with_context(|| format!("the template's {name}"))
    };
    let minutes = number("EventsCatchUpMinutes")? as u64;
    let api_reserved = number("ApiReservedConcurrency")? as usize;
    let route_limits = (
        number("ProviderEventsRateLimit")?,
        number("ProviderEventsBurstLimit")?,
    );
    let catch_up_every = std::time::Duration::from_secs(minutes * 60);
    let stack = payctl::template::provision(
        &sdk,
        &opts.template,
        &payctl::template::ProvisionOptions {
            stack_name: "sim".into(),
            parameters,
            visibility_timeout: opts.visibility_timeout,
            max_receive_count: opts.max_receive_count,
            fifo: opts.fifo,
            read_only: false,
        },
    )
    .await
    .context("provisioning template.yaml into the models")?;
    let payments = function::Function::of(&stack, "PaymentProcessorFunction")?;
    let refunds = function::Function::of(&stack, "RefundProcessorFunction")?;
    let events = function::Function::of(&stack, "EventProcessorFunction")?;
    let (api, relay) = if opts.api_share > 0.0 {
        (
            Some(intake::api::build(
                &stack,
                &shape,
                &sdk,
                Arc::clone(&clock),
            )?),
            Some(Arc::new(intake::relay::build(&stack, &sdk, &clock)?)),
        )
    } else {
        (None, None)
    };
    let config = payments.config.clone();
    let queue = payments.queue.clone();
    let dlq = payments.dlq.clone();
    {
        let mut aws = wire.aws.lock().expect("aws");
        aws.dynamo_faults = opts.aws.clone();
        aws.sqs_faults = opts.aws.clone();
        let window = |o| {
            let w = outage_window(o);
            (w.start, w.end)
        };
        if let Some(o) = opts.dynamo_outage {
            (
                aws.dynamo_faults.outage_from_ms,
                aws.dynamo_faults.outage_until_ms,
            ) = window(o);
        }
        if let Some(o) = opts.sqs_outage {
            (
                aws.sqs_faults.outage_from_ms,
                aws.sqs_faults.outage_until_ms,
            ) = window(o);
        }
        aws.sqs.duplicate_rate = opts.duplicate_delivery_rate;
        if let Some(t) = aws.dynamo.tables.get_mut(&config.idempotency_table) {
            t.watch = Some(checks::completed_again);
        }
    }
    let provider = Provider::new(
        opts.seed ^ 0x9e37,
        Arc::clone(&clock),
        config.provider_timeout,
    );
    let mut behaviour = opts.provider.clone();
    if let Some((from_day, hours)) = opts.provider_outage {
        let w = outage_window((from_day, hours));
        (behaviour.outage_from_ms, behaviour.outage_until_ms) = (w.start, w.end);
    }
    *provider.behaviour.lock().expect("behaviour") = behaviour;
    provider.books.lock().expect("books").endpoint = crate::provider::listing::Endpoint {
        registered_ms: EPOCH_MS - 30 * 86_400_000,
        gaps: opts.endpoint_gaps.clone(),
        disabled: opts.endpoint_disabled.clone(),
    };
    provider.books.lock().expect("books").dispute_plan = Some(DisputePlan {
        seed: opts.seed,
        share: opts.disputes.0,
        open_days: opts.disputes.1,
    });
    provider.books.lock().expect("books").repay_plan = Some(crate::provider::settle::RepayPlan {
        seed: opts.seed,
        share: opts.repay_share,
        days: (opts.provider.timeline, 8.0 * opts.provider.timeline),
        settle_days: opts.provider.settle_days,
    });
    let world = Arc::new(World {
        opts: opts.clone(),
        clock: Arc::clone(&clock),
        wire: wire.clone(),
        provider,
        config,
        sdk: sdk.clone(),
        queue,
        dlq,
        refunds: refunds.clone(),
        events: events.clone(),
        refunds_sent: Mutex::new(BTreeMap::new()),
        refund_letters: Mutex::new(std::collections::BTreeSet::new()),
        crashed_on: Mutex::new(std::collections::BTreeSet::new()),
        refunds_ended: Mutex::new(std::collections::BTreeSet::new()),
        refunds_late: Mutex::new(BTreeMap::new()),
        sent: Mutex::new(BTreeMap::new()),
        bad: Mutex::new(0),
        refused: Mutex::default(),
        violations: Mutex::new(Vec::new()),
        trace: Mutex::new(Default::default()),
        stats: Mutex::new(Report::default()),
        rng: Mutex::new(fastrand::Rng::with_seed(opts.seed ^ 0xa5a5)),
        seen: Mutex::new(None),
        catch_up: Default::default(),
        webhook,
        bridge,
        api,
        relay,
        api_in_flight: Default::default(),
        api_reserved,
        first_arrival_ms: Mutex::new(None),
        route: Mutex::new(gateway::Bucket::new(route_limits)),
        api_gate: Mutex::new(shape.api_throttle.map(gateway::Bucket::new)),
        halted: Default::default(),
    });
    world.note(format!(
        "start: seed {} payments {} days {}; payments: batch {} timeout {}s concurrency {}; refunds: batch {} timeout {}s concurrency {}",
        opts.seed, opts.payments, opts.days, payments.batch, payments.timeout_s, payments.concurrency,
        refunds.batch, refunds.timeout_s, refunds.concurrency
    ));

    let end_ms = EPOCH_MS + (opts.days * 86_400_000.0) as i64;
    let producer = tokio::spawn(intake::producer::produce(Arc::clone(&world)));
    let housekeeping = tokio::spawn(checks::housekeep(Arc::clone(&world), end_ms));
    let seen: operator::Seen = Default::default();
    let operator = tokio::spawn(operator::answer_alarms(
        Arc::clone(&world),
        Arc::clone(&seen),
        end_ms,
    ));
    *world.seen.lock().expect("seen") = Some(seen);
    let w = Arc::clone(&world);
    let payments_source = payments.source(Arc::new(move || w.instance()));
    let esm = tokio::spawn(esm::event_source(
        Arc::clone(&world),
        payments_source,
        end_ms,
    ));
    let w = Arc::clone(&world);
    let refunds_source = refunds.source(Arc::new(move || refunds::instance(&w)));
    let refund_esm = tokio::spawn(esm::event_source(
        Arc::clone(&world),
        refunds_source,
        end_ms,
    ));
    let w = Arc::clone(&world);
    let events_source = events.source(Arc::new(move || events::instance(&w)));
    let events_esm = tokio::spawn(esm::event_source(Arc::clone(&world), events_source, end_ms));
    let delivery = tokio::spawn(events::deliver(Arc::clone(&world), end_ms));
    let relaying = world.relay.clone().map(|m| {
        (
            tokio::spawn(intake::relay::stream_source(
                Arc::clone(&world),
                Arc::clone(&m),
                end_ms,
            )),
            tokio::spawn(operator::answer_relay_alarms(Arc::clone(&world), m, end_ms)),
        )
    });
    let catch_up = tokio::spawn(catchup::schedule(
        Arc::clone(&world),
        catch_up_every,
        end_ms,
    ));
    producer.await.context("the producer")?;
    events_esm.await.context("the inbox's event source")?;
    delivery.await.context("the webhook")?;
    catch_up.await.context("the catch-up's schedule")?;
    esm.await.context("the event source")?;
    refund_esm.await.context("the refunds' event source")?;
    housekeeping.await.context("housekeeping")?;
    operator.await.context("the operator")?;
    if let Some((mapping, alarms)) = relaying {
        mapping.await.context("the relay's stream mapping")?;
        alarms.await.context("the operator of the relay's alarms")?;
    }
    if !world.halted.load(std::sync::atomic::Ordering::SeqCst) {
        checks::check_end(&world);
        refunds::check_end(&world);
    }

    let mut report = world.stats.lock().expect("stats").clone();
    let aws = wire.aws.lock().expect("aws");
    report.digest = aws.digest;
    report.model_visits = crate::cost::take();
    report.aws_requests = aws.requests;
    report.aws_outage_refusals = aws.outage_refusals;
    report.violations = world.violations.lock().expect("v").clone();
    report.days = (clock.now_ms() - EPOCH_MS) as f64 / 86_400_000.0;
    report.payments = world.sent.lock().expect("sent").len();
    let books = world.provider.books.lock().expect("books");
    report.provider_requests = books.requests;
    report.provider_refused = books.refused;
    report.refunds_made = books.refunds.len();
    report.refunds_failed = books
        .refunds
        .values()
        .filter(|r| r.status == "failed")
        .count();
    report.refunds_sent = world.refunds_sent.lock().expect("refunds").len();
    report.disputes = books.disputes.values().filter(|d| d.opened()).count();
    report.disputes_appealed = books.disputes.values().filter(|d| d.appealed).count();
    {
        let c = world.catch_up.lock().expect("catch-up");
        report.catch_up_runs = c.runs;
        report.catch_up_worst_lag_s = c.worst_lag_s;
    }
    report::capacity(
        &mut report,
        &books,
        &aws.write_units,
        *world.first_arrival_ms.lock().expect("first"),
    );
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
