//! `make bench`: throughput, latency, calls per payment, CPU and memory per payment, cold start
//! and package size of the processor, measured against the local stack beside the Powertools
//! peer ([`crate::compare`]), printed as a table and written as JSON, Markdown and a PNG (the
//! latency histogram and the comparison's bars) under `bench/results/`.
//!
//! The throughput runs drive the shipped release `bootstrap` as Lambda does: one process per
//! concurrent batch behind a local Runtime API, fed by the local event-source mapping in this
//! process. The OS accounts those processes apart (CPU time from `wait4`, peak RSS from
//! `VmHWM`): the function's own, without the poller, the emulator or the simulator. AWS calls
//! per payment are counted on the wire by an SDK interceptor around the same processor code run in-process
//! (every attempt, retries included); provider calls by the simulator's ledger. The comparison
//! with the peer counts both function processes' calls through a relay
//! ([`crate::wire_count`]), so that a Python process is counted like the `bootstrap`.
//!
//! Why one file of ~1,150 lines: one benchmark run, its measurements and its report, in the
//! order the run makes them; the parts share the run's state and only the run uses them. The
//! peer's environment, the cost model, the comparison's report and the chart are in
//! [`crate::compare`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use serde_json::json;
use sqs_once::record::{ClaimRequest, IdempotencyStore};
use sqs_once::runner::now_ms;

use crate::compare::{self, peer_environment, Contender, PeerOptions};
use crate::demo::{config_for, function_environment};
use crate::load::{payment_body, send_all};
use crate::sim::SimClient;
use crate::wire_count::CountingRelay;
use lambda_local::esm::{self, EsmOptions, Function};
use lambda_local::runtime_api::{lambda_environment, FunctionProcess};
use payctl::template::{
    memory_size_mb, provision, teardown, unique_stack_name, ProvisionOptions, Stack, PROCESSOR,
};

/// Counts AWS requests by operation (`x-amz-target`), as they leave for the wire.
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<Mutex<HashMap<String, u64>>>);

impl CallCounter {
    /// A snapshot of the counts.
    pub fn snapshot(&self) -> HashMap<String, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Calls whose operation starts with `prefix` (`DynamoDB`, `AmazonSQS`) since `before`.
    pub fn since(&self, before: &HashMap<String, u64>, prefix: &str) -> u64 {
        self.snapshot()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
            .sum()
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let op = context
            .request()
            .headers()
            .get("x-amz-target")
            .unwrap_or("unknown")
            .to_owned();
        if let Ok(mut m) = self.0.lock() {
            *m.entry(op).or_default() += 1;
        }
        Ok(())
    }
}

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The SAM template.
    pub template: PathBuf,
    /// Backlog size (payments, duplicates on top).
    pub payments: usize,
    /// Concurrent batches (pollers) of the multi-batch run.
    pub pollers: usize,
    /// Cold-start runs (median reported).
    pub cold_start_runs: usize,
    /// Release bootstraps to measure: (architecture, path).
    pub bootstraps: Vec<(String, PathBuf)>,
    /// The local stack measured against (name and version), for the results' heading.
    pub emulator: String,
    /// Where to write results.
    pub out_dir: PathBuf,
    /// Where the function processes write their logs.
    pub log_dir: PathBuf,
    /// The Powertools peer to compare with, if any.
    pub peer: Option<PeerOptions>,
}

/// This machine's architecture, as Lambda names it: the only bootstrap that runs here.
const HOST_ARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86_64"
} else {
    "arm64"
};

impl BenchOptions {
    /// The bootstrap built for this machine's architecture.
    fn host_bootstrap(&self) -> Result<&Path> {
        self.bootstraps
            .iter()
            .find(|(arch, _)| arch == HOST_ARCH)
            .map(|(_, p)| p.as_path())
            .with_context(|| {
                format!("the benchmark runs the {HOST_ARCH} bootstrap: pass --bootstrap {HOST_ARCH}=PATH")
            })
    }

    /// The program and environment of a contender's function process on `stack`.
    fn function_under_test(
        &self,
        who: Contender,
        stack: &Stack,
    ) -> Result<(PathBuf, BTreeMap<String, String>)> {
        let (_, env) = function_environment(stack, &bench_overrides())?;
        match who {
            Contender::This => Ok((self.host_bootstrap()?.to_path_buf(), env)),
            Contender::Peer => {
                let peer = self
                    .peer
                    .as_ref()
                    .context("no peer to run: pass --peer-bootstrap and --peer-python")?;
                Ok((peer.bootstrap.clone(), peer_environment(peer, &env)?))
            }
        }
    }
}

/// The function's settings in every benchmark run: a lease well beyond the provider timeout.
pub(crate) fn bench_overrides() -> BTreeMap<String, String> {
    [
        ("LEASE_SECONDS", "20"),
        ("PAYMENT_API_TIMEOUT_SECONDS", "5"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Instrumented {
    stack: Stack,
    processor: Arc<payment_core::Processor>,
    sqs: aws_sdk_sqs::Client,
    calls: CallCounter,
    sim: SimClient,
}

/// A fresh stack from the template for one measurement (30 s visibility timeout), and its name.
async fn bench_stack(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    prefix: &str,
) -> Result<(String, Stack)> {
    let name = unique_stack_name(prefix);
    let stack = provision(
        sdk,
        &opts.template,
        &ProvisionOptions {
            stack_name: name.clone(),
            visibility_timeout: Some(30),
            ..Default::default()
        },
    )
    .await?;
    Ok((name, stack))
}

async fn instrumented_stack(stack: Stack, sdk: &aws_config::SdkConfig) -> Result<Instrumented> {
    let config = config_for(&stack, &bench_overrides())?;
    let calls = CallCounter::default();
    let ddb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .interceptor(calls.clone())
            .build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(sdk)
            .interceptor(calls.clone())
            .build(),
    );
    let processor =
        payment_core::bootstrap::build_processor_with(&config, sdk, ddb, sqs.clone()).await?;
    Ok(Instrumented {
        stack,
        processor,
        sqs,
        calls,
        sim: SimClient::new(&config.payment_api_url),
    })
}

/// The local event-source mapping of a benchmark run: batches of 10 as soon as they are there.
pub(crate) fn esm_opts(stack: &Stack, pollers: usize) -> EsmOptions {
    EsmOptions {
        queue_url: stack.event_source.queue_url.clone(),
        batch_size: 10,
        batching_window: Duration::ZERO,
        visibility_timeout: None,
        function_timeout: Duration::from_secs(60),
        report_batch_item_failures: true,
        pollers,
        until_empty: true,
        max_duration: Duration::from_secs(600),
    }
}

/// Drains a backlog with `pollers` processes of one contender's function; returns payments
/// per second, latency percentiles (send to acknowledged), the processes' CPU per 1000
/// payments and peak RSS, the billed duration, invocations and log bytes. Both contenders must
/// charge every payment exactly once. With `counted`, the processes reach the endpoint through
/// a [`CountingRelay`] and the result adds their calls on the wire, the mapping's SQS requests
/// and the largest item.
async fn throughput(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
    pollers: usize,
    tag: &str,
    counted: bool,
) -> Result<serde_json::Value> {
    let (name, stack) = bench_stack(sdk, opts, &format!("bench{tag}")).await?;
    let (program, mut env) = opts.function_under_test(who, &stack)?;
    let relay = if counted {
        let upstream = std::env::var("AWS_ENDPOINT_URL")
            .context("counting calls on the wire needs a local AWS_ENDPOINT_URL")?;
        let relay = CountingRelay::start(&upstream).await?;
        env.insert("AWS_ENDPOINT_URL".to_owned(), relay.url().to_owned());
        Some(relay)
    } else {
        None
    };
    let queue_calls = CallCounter::default();
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(sdk)
            .interceptor(queue_calls.clone())
            .build(),
    );
    let (functions, logs) = spawn_functions(opts, &name, who, &program, &env, pollers).await?;
    let n = opts.payments;
    let bodies = backlog(&name, n);
    let sent_at = now_ms();
    send_all(&sqs, &stack.event_source.queue_url, &bodies).await?;
    let drain_started_ms = now_ms();
    let stats = esm::run(
        Function::Processes(functions.iter().map(FunctionProcess::api).collect()),
        sqs.clone(),
        esm_opts(&stack, pollers),
    )
    .await?;
    let (mut cpu_seconds, mut system_seconds, mut peak_rss_kib) = (0.0, 0.0, 0);
    for f in functions {
        let usage = f.stop().await?;
        cpu_seconds += usage.cpu_seconds;
        system_seconds += usage.system_seconds;
        peak_rss_kib = peak_rss_kib.max(usage.peak_rss_kib);
    }
    if stats.timeouts + stats.function_errors > 0 {
        bail!(
            "{}: {} invocations timed out and {} failed: see the logs in {}",
            who.label(),
            stats.timeouts,
            stats.function_errors,
            opts.log_dir.display()
        );
    }
    if stats.deleted() != bodies.len() as u64 {
        bail!(
            "{}: {} of {} messages were acknowledged",
            who.label(),
            stats.deleted(),
            bodies.len()
        );
    }
    let sim = simulator_of(&env)?;
    let ids: Vec<String> = (0..n).map(|i| payment_id(&name, i)).collect();
    compare::charged_once(&sim, &ids, who).await?;
    let mut latencies: Vec<f64> = stats
        .acked_at_ms
        .iter()
        .map(|t| (t - sent_at) as f64)
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    // Drain time: until the last message was acknowledged (not the poller's final empty looks).
    let last = stats
        .acked_at_ms
        .iter()
        .copied()
        .max()
        .unwrap_or(drain_started_ms);
    let elapsed = ((last - drain_started_ms) as f64 / 1000.0).max(1e-3);
    let log_bytes: u64 = logs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let mut result = json!({
        "function": who.label(),
        "pollers": pollers,
        "messages": bodies.len(),
        "payments": n,
        "seconds": elapsed,
        "payments_per_second": n as f64 / elapsed,
        "messages_per_second": bodies.len() as f64 / elapsed,
        "latency_ms": {"p50": percentile(&latencies, 0.5), "p95": percentile(&latencies, 0.95), "p99": percentile(&latencies, 0.99)},
        "latencies_ms": latencies,
        "function_processes": pollers,
        "cpu_ms_per_1000_payments": cpu_seconds * 1000.0 / n as f64 * 1000.0,
        "system_cpu_ms_per_1000_payments": system_seconds * 1000.0 / n as f64 * 1000.0,
        "peak_rss_kib": peak_rss_kib,
        "invocations": stats.invocations,
        "billed_ms": stats.billed_ms,
        "log_bytes": log_bytes,
    });
    if let Some(relay) = relay {
        let wire = compare::wire_per_payment(&relay.counts(), n);
        // What Lambda's poller and the producer send: a receive per invocation (batches of up
        // to 10), the batch sends and the batch deletes.
        let none = HashMap::new();
        let queue = queue_calls.since(&none, "AmazonSQS.SendMessageBatch")
            + queue_calls.since(&none, "AmazonSQS.DeleteMessageBatch")
            + stats.invocations;
        result["sqs_requests_per_payment"] =
            json!(queue as f64 / n as f64 + wire["function_sqs_calls"].as_f64().unwrap_or(0.0));
        result["wire"] = wire;
        result["largest_item_bytes"] = json!(
            compare::largest_item(
                &aws_sdk_dynamodb::Client::new(sdk),
                stack.function_var("IDEMPOTENCY_TABLE")?
            )
            .await?
        );
    }
    teardown(sdk, &stack).await?;
    Ok(result)
}

/// `count` processes of a contender's function, each writing its output to a log file of its
/// own under the log directory; returns them and their log files.
async fn spawn_functions(
    opts: &BenchOptions,
    name: &str,
    who: Contender,
    program: &Path,
    env: &BTreeMap<String, String>,
    count: usize,
) -> Result<(Vec<FunctionProcess>, Vec<PathBuf>)> {
    std::fs::create_dir_all(&opts.log_dir)?;
    let (mut functions, mut logs) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        let path = opts
            .log_dir
            .join(format!("bench-{name}-{}-{i}.log", who.label()));
        let log = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
        functions.push(FunctionProcess::spawn(program, env, log).await?);
        logs.push(path);
    }
    Ok((functions, logs))
}

/// The provider simulator a function's environment points at.
fn simulator_of(env: &BTreeMap<String, String>) -> Result<SimClient> {
    Ok(SimClient::new(
        env.get("PAYMENT_API_URL")
            .context("the function has no PAYMENT_API_URL")?,
    ))
}

/// Two copies of one payment in two concurrent batches (one function process each), the
/// provider answering in 2 s: how long until both copies are acknowledged, and how many
/// provider calls and charges the payment got.
async fn concurrent_duplicate(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    who: Contender,
) -> Result<serde_json::Value> {
    let (name, stack) = bench_stack(sdk, opts, &format!("benchdup{}", who.label())).await?;
    let (program, env) = opts.function_under_test(who, &stack)?;
    let sim = simulator_of(&env)?;
    let pid = format!("{name}-dup");
    sim.add_faults(json!([{"prefix": pid, "fault": "latency", "latency_ms": 2000}]))
        .await?;
    let (functions, _) = spawn_functions(opts, &name, who, &program, &env, 2).await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let body = payment_body(&pid, 1000, "pm_card_visa");
    let sent_at = now_ms();
    send_all(&sqs, &stack.event_source.queue_url, &[body.clone(), body]).await?;
    let stats = esm::run(
        Function::Processes(functions.iter().map(FunctionProcess::api).collect()),
        sqs,
        EsmOptions {
            batch_size: 1,
            max_duration: Duration::from_secs(180),
            ..esm_opts(&stack, 2)
        },
    )
    .await;
    for f in functions {
        f.stop().await?;
    }
    sim.clear_faults_for(&pid).await?;
    let stats = stats?;
    let ledger = sim.ledger_for(&pid).await?;
    if stats.deleted() != 2 {
        bail!(
            "{}: {} of 2 copies acknowledged",
            who.label(),
            stats.deleted()
        );
    }
    let last = stats.acked_at_ms.iter().copied().max().unwrap_or(sent_at);
    teardown(sdk, &stack).await?;
    Ok(json!({
        "seconds_until_both_acknowledged": (last - sent_at) as f64 / 1000.0,
        "provider_calls": ledger.calls_for(&pid),
        "charges": ledger.charges.get(&pid).map(Vec::len).unwrap_or(0),
        "invocations": stats.invocations,
    }))
}

/// A payment's calls without the processor: the claim, the provider call and the completion
/// through the function's own adapters (the same requests on the wire), or for a duplicate the
/// claim alone, which finds the record done.
struct BareCalls {
    store: sqs_once::DynamoStore,
    provider: payment_core::stripe::StripeClient,
}

impl BareCalls {
    async fn new(
        sdk: &aws_config::SdkConfig,
        config: &payment_core::config::Config,
    ) -> Result<Self> {
        Ok(Self {
            store: payment_core::payment_store(
                aws_sdk_dynamodb::Client::new(sdk),
                &config.idempotency_table,
            ),
            provider: payment_core::bootstrap::provider_from(config, sdk).await?,
        })
    }

    async fn pay(&self, body: &str) -> Result<()> {
        use payment_core::provider::PaymentProvider;
        use sqs_once::record::ClaimResult;
        let req = payment_core::domain::PaymentRequest::parse(body)?;
        let now = now_ms();
        let claim = self
            .store
            .claim(&ClaimRequest {
                key: req.payment_id.as_str().to_owned(),
                payload_hash: req.payload_hash(),
                owner: "bare".into(),
                now_ms: now,
                lease_expires_at_ms: now + 20_000,
                expires_at_s: now / 1000 + 3600,
            })
            .await?;
        if let ClaimResult::Conflict(_) = claim {
            return Ok(());
        }
        let response = self.provider.create_payment(&req).await?;
        let (outcome, dead_letter) = payment_core::charge::outcome_of(&req, &response);
        if let Some((code, why)) = dead_letter {
            bail!("{}: {code}: {why}", req.payment_id.as_str());
        }
        // The same write as the processor's: a charge's record kept for the refund window.
        let outcome = outcome.to_outcome();
        let keep = (outcome.status == "succeeded")
            .then(|| now / 1000 + payment_core::charge::DEFAULT_REFUND_WINDOW.as_secs() as i64);
        self.store
            .complete(req.payment_id.as_str(), "bare", &outcome, keep)
            .await?;
        Ok(())
    }
}

/// The id of a run's `i`th payment.
fn payment_id(name: &str, i: usize) -> String {
    format!("{name}-{i:05}")
}

/// The backlog of a run: `n` payments, then a copy of every tenth (10 % duplicates).
fn backlog(name: &str, n: usize) -> Vec<String> {
    let mut bodies: Vec<String> = (0..n)
        .map(|i| payment_body(&payment_id(name, i), 1000 + i as i64, "pm_card_visa"))
        .collect();
    let dups: Vec<String> = bodies.iter().step_by(10).cloned().collect();
    bodies.extend(dups);
    bodies
}

/// The local stack's own capacity for the processor's call mix, and the CPU those calls cost
/// alone. The same backlog and concurrency with no processor: each poller a thread with a
/// runtime of its own (as each function process has) that receives a batch, makes each
/// message's bare calls ([`BareCalls`]) for the 10 messages at once as the processor does, and
/// deletes the batch. Returns messages per second (the ceiling the processor's throughput is
/// compared with) and milliseconds of CPU per payment spent in the bare calls (the floor under
/// the function's CPU: what the SDK, the HTTP client and the kernel cost for these requests),
/// from `getrusage(RUSAGE_THREAD)` around each batch's calls.
async fn emulator_capacity(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
    pollers: usize,
) -> Result<(f64, f64)> {
    let (name, stack) = bench_stack(sdk, opts, "benchcap").await?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let config = config_for(&stack, &bench_overrides())?;
    let bodies = backlog(&name, opts.payments);
    send_all(&sqs, &stack.event_source.queue_url, &bodies).await?;
    let started = Instant::now();
    let threads: Vec<_> = (0..pollers)
        .map(|_| {
            let (sdk, config, url) = (
                sdk.clone(),
                config.clone(),
                stack.event_source.queue_url.clone(),
            );
            std::thread::spawn(move || -> Result<f64> {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(bare_poller(sdk, config, url))
            })
        })
        .collect();
    let mut cpu_seconds = 0.0;
    for t in threads {
        cpu_seconds += t
            .join()
            .map_err(|_| anyhow::anyhow!("a capacity poller panicked"))??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    teardown(sdk, &stack).await?;
    Ok((
        bodies.len() as f64 / elapsed,
        cpu_seconds * 1000.0 / opts.payments as f64,
    ))
}

/// One capacity poller: drains the queue with bare calls; returns the CPU seconds they took.
async fn bare_poller(
    sdk: aws_config::SdkConfig,
    config: payment_core::config::Config,
    url: String,
) -> Result<f64> {
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let calls = BareCalls::new(&sdk, &config).await?;
    let (mut cpu_seconds, mut empty) = (0.0, 0);
    while empty < 2 {
        let out = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(0)
            .send()
            .await?;
        if out.messages().is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        let before = thread_cpu_seconds();
        futures::future::try_join_all(
            out.messages()
                .iter()
                .map(|m| calls.pay(m.body().unwrap_or_default())),
        )
        .await?;
        cpu_seconds += thread_cpu_seconds() - before;
        let entries = out
            .messages()
            .iter()
            .enumerate()
            .map(|(i, m)| {
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        sqs.delete_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await?;
    }
    Ok(cpu_seconds)
}

/// User plus system CPU seconds of the calling thread.
fn thread_cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_THREAD is valid on Linux.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr());
        u.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Calls per payment for the three cases that decide cost.
async fn calls_per_payment(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
) -> Result<serde_json::Value> {
    let (name, stack) = bench_stack(sdk, opts, "benchcalls").await?;
    let s = instrumented_stack(stack, sdk).await?;
    let url = s.stack.event_source.queue_url.clone();
    let once = |pid: String| {
        let (s_sqs, url) = (s.sqs.clone(), url.clone());
        async move {
            s_sqs
                .send_message()
                .queue_url(&url)
                .message_body(payment_body(&pid, 100, "pm_card_visa"))
                .send()
                .await?;
            let msgs = loop {
                let out = s_sqs
                    .receive_message()
                    .queue_url(&url)
                    .wait_time_seconds(1)
                    .message_system_attribute_names(
                        aws_sdk_sqs::types::MessageSystemAttributeName::All,
                    )
                    .send()
                    .await?;
                if !out.messages().is_empty() {
                    break out.messages().to_vec();
                }
            };
            Ok::<_, anyhow::Error>(msgs)
        }
    };
    let arn = esm::queue_arn(&s.sqs, &url).await?;
    let to_records =
        |msgs: Vec<aws_sdk_sqs::types::Message>| -> Vec<aws_lambda_events::event::sqs::SqsMessage> {
            msgs.iter()
                .map(|m| esm::to_record(m, &arn, "us-east-1"))
                .collect()
        };
    // One invocation with the records of `pid`: the AWS calls it made and its provider calls.
    let measured = |case: &'static str, pid: String, records| {
        let s = &s;
        async move {
            let before = s.calls.snapshot();
            let provider_before = s.sim.ledger_for(&pid).await?.calls_for(&pid);
            s.processor.handle_batch(records, now_ms() + 60_000).await;
            let provider = s.sim.ledger_for(&pid).await?.calls_for(&pid) - provider_before;
            Ok::<_, anyhow::Error>(
                json!({"case": case, "dynamodb": s.calls.since(&before, "DynamoDB"), "sqs": s.calls.since(&before, "AmazonSQS"), "provider": provider}),
            )
        }
    };
    let mut measure = Vec::new();
    // New payment, then a duplicate of it.
    let pid = format!("{name}-new");
    for case in ["new_payment", "duplicate_of_completed"] {
        let records = to_records(once(pid.clone()).await?);
        measure.push(measured(case, pid.clone(), records).await?);
    }
    // In progress elsewhere: another worker holds a live lease.
    let busy = format!("{name}-busy");
    let req =
        payment_core::domain::PaymentRequest::parse(&payment_body(&busy, 100, "pm_card_visa"))?;
    let store = payment_core::payment_store(
        aws_sdk_dynamodb::Client::new(sdk),
        s.stack.function_var("IDEMPOTENCY_TABLE")?,
    );
    store
        .claim(&ClaimRequest {
            key: req.payment_id.as_str().to_owned(),
            payload_hash: req.payload_hash(),
            owner: "elsewhere".into(),
            now_ms: now_ms(),
            lease_expires_at_ms: now_ms() + 60_000,
            expires_at_s: now_ms() / 1000 + 3600,
        })
        .await?;
    let records = to_records(once(busy.clone()).await?);
    measure.push(measured("in_progress_elsewhere", busy, records).await?);
    teardown(sdk, &s.stack).await?;
    Ok(json!(measure))
}

/// Median time from process start to the first Runtime API request of a function's program
/// (a release `bootstrap`, or the peer's), started with `env` and Lambda's variables.
async fn cold_start(program: &Path, env: &BTreeMap<String, String>, runs: usize) -> Result<f64> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let started = Instant::now();
        let mut child = tokio::process::Command::new(program)
            .env_clear()
            .envs(lambda_environment(&addr.to_string()))
            .envs(env)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        child.kill().await.ok();
        match accepted {
            Ok(Ok(_)) => samples.push(elapsed),
            _ => bail!("{} never called the Runtime API", program.display()),
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok(percentile(&samples, 0.5))
}

/// The better of two runs of one contender, measure by measure: the faster drain (with its
/// latencies), the lower CPU and the lower peak RSS.
fn best_of(a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::MAX);
    let mut best = if f(&a, "payments_per_second") >= f(&b, "payments_per_second") {
        a.clone()
    } else {
        b.clone()
    };
    for k in [
        "cpu_ms_per_1000_payments",
        "system_cpu_ms_per_1000_payments",
        "peak_rss_kib",
        "billed_ms",
    ] {
        best[k] = if f(&a, k) <= f(&b, k) {
            a[k].clone()
        } else {
            b[k].clone()
        };
    }
    best["runs"] = json!([
        {"payments_per_second": a["payments_per_second"], "cpu_ms_per_1000_payments": a["cpu_ms_per_1000_payments"]},
        {"payments_per_second": b["payments_per_second"], "cpu_ms_per_1000_payments": b["cpu_ms_per_1000_payments"]},
    ]);
    best
}

/// Runs every measurement, prints the table, writes the results.
pub async fn run(sdk: &aws_config::SdkConfig, opts: &BenchOptions) -> Result<serde_json::Value> {
    std::fs::create_dir_all(&opts.out_dir)?;
    println!(
        "benchmark: {} payments (+10% duplicates), 1 and {} concurrent batches",
        opts.payments, opts.pollers
    );
    let contenders: &[Contender] = if opts.peer.is_some() {
        &[Contender::This, Contender::Peer]
    } else {
        &[Contender::This]
    };
    // At each concurrency: the stack alone, then this, the peer, this, the peer, then the
    // stack alone again. The ceiling is the better of the two stack-alone runs, so that neither
    // noise nor the emulator's drift lowers it; each contender keeps the better of its two.
    let mut best = BTreeMap::new();
    let mut capacity = BTreeMap::new();
    for (pollers, tag) in [(1, "a"), (opts.pollers, "b")] {
        let before = emulator_capacity(sdk, opts, pollers).await?;
        let mut first = Vec::new();
        for round in 0..2 {
            for &who in contenders {
                let tag = format!("{tag}{}", who.label());
                let run = throughput(sdk, opts, who, pollers, &tag, false).await?;
                if round == 0 {
                    first.push(run);
                } else {
                    let a = first.remove(0);
                    best.insert((who.label(), pollers), best_of(a, run));
                }
            }
        }
        let after = emulator_capacity(sdk, opts, pollers).await?;
        capacity.insert(pollers, if before.0 >= after.0 { before } else { after });
    }
    let (one, many) = (
        best[&("this", 1)].clone(),
        best[&("this", opts.pollers)].clone(),
    );
    let (cap_one, floor_one) = capacity[&1];
    let (cap_many, floor_many) = capacity[&opts.pollers];
    let calls = calls_per_payment(sdk, opts).await?;
    let api = api_measurement(sdk, opts).await?;
    let mut sizes = BTreeMap::new();
    for (arch, path) in &opts.bootstraps {
        sizes.insert(
            arch.clone(),
            std::fs::metadata(path)
                .with_context(|| format!("{}", path.display()))?
                .len(),
        );
    }
    let cold_env = BTreeMap::from(
        [
            ("IDEMPOTENCY_TABLE", "bench"),
            (
                "DEAD_LETTER_QUEUE_URL",
                "http://127.0.0.1:9/000000000000/dlq",
            ),
            ("PAYMENT_API_URL", "http://127.0.0.1:9"),
            ("PAYMENT_API_KEY", "sk_test_bench"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let this_cold = cold_start(opts.host_bootstrap()?, &cold_env, opts.cold_start_runs).await?;
    let cold = BTreeMap::from([(HOST_ARCH, this_cold)]);
    let rss = [&one, &many]
        .iter()
        .filter_map(|t| t["peak_rss_kib"].as_i64())
        .max()
        .unwrap_or(0);
    let retries =
        crate::retries::measure(sdk, &opts.template, opts.host_bootstrap()?, &opts.log_dir).await?;
    let mut result = json!({
        "run": run_facts(opts),
        "retries": retries,
        "payments": opts.payments,
        "throughput": [one, many],
        "stack_capacity_per_second": {"1": cap_one, opts.pollers.to_string(): cap_many},
        "bare_calls_cpu_ms_per_payment": {"1": floor_one, opts.pollers.to_string(): floor_many},
        "calls_per_payment": calls,
        "cold_start_ms_median": cold,
        "bootstrap_bytes": sizes,
        "peak_rss_kib": rss,
        "api": api,
    });
    let mut ratios = Vec::new();
    if let Some(peer) = &opts.peer {
        let mut peer_env = cold_env.clone();
        peer_env.insert("PEER_PYTHON".to_owned(), peer.python.display().to_string());
        let peer_cold = cold_start(&peer.bootstrap, &peer_env, opts.cold_start_runs).await?;
        let mut counted = BTreeMap::new();
        let mut duplicate = BTreeMap::new();
        for &who in contenders {
            counted.insert(
                who.label(),
                throughput(
                    sdk,
                    opts,
                    who,
                    opts.pollers,
                    &format!("calls{}", who.label()),
                    true,
                )
                .await?,
            );
            duplicate.insert(who.label(), concurrent_duplicate(sdk, opts, who).await?);
        }
        let memory_mb = memory_size_mb(&opts.template, PROCESSOR)?;
        let comparison = compare::comparison(&compare::Measured {
            peer: peer.description.clone(),
            pollers: opts.pollers,
            best: &best,
            counted: &counted,
            duplicate: &duplicate,
            cold_ms: (this_cold, peer_cold),
            floor_ms: (floor_one, floor_many),
            memory_mb,
        });
        ratios = compare::ratios(&comparison);
        result["comparison"] = comparison;
        result["peer_throughput"] = json!([
            best[&("peer", 1)].clone(),
            best[&("peer", opts.pollers)].clone()
        ]);
    }
    let lat: Vec<f64> = one["latencies_ms"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
        .unwrap_or_default();
    compare::chart(&lat, &ratios, &opts.out_dir.join("bench.png"))?;
    let mut slim = result.clone();
    for key in ["throughput", "peer_throughput"] {
        for t in slim[key].as_array_mut().into_iter().flatten() {
            t.as_object_mut().map(|o| o.remove("latencies_ms"));
        }
    }
    std::fs::write(
        opts.out_dir.join("results.json"),
        serde_json::to_string_pretty(&slim)?,
    )?;
    let md = markdown(&slim, opts);
    std::fs::write(opts.out_dir.join("results.md"), &md)?;
    println!("{md}");
    Ok(slim)
}

/// The payments API on the local stack: requests per second and latency of `POST` (a backlog
/// of fresh keys, eight clients at once), and the end-to-end latency from `POST` to a `GET`
/// that says `succeeded` (the API, the outbox stream, the relay, the queue, the processor and
/// the provider; five payments at a time). The API, relay and processor run in this process;
/// their AWS calls go to the emulator.
async fn api_measurement(
    sdk: &aws_config::SdkConfig,
    opts: &BenchOptions,
) -> Result<serde_json::Value> {
    use futures::stream::{self, StreamExt};
    use payment_core::config::{ApiConfig, RelayConfig};
    let (name, stack) = bench_stack(sdk, opts, "bench-api").await?;
    let env_of = |function: &'static str| {
        let stack = &stack;
        move |k: &str| stack.var_of(function, k).ok().map(str::to_owned)
    };
    let api = payment_core::bootstrap::build_api(
        &ApiConfig::from_lookup(env_of("PaymentsApiFunction"))?,
        aws_sdk_dynamodb::Client::new(sdk),
    );
    let server = payctl::api::serve(Arc::new(api), "127.0.0.1:0").await?;
    let relay = payment_core::bootstrap::build_relay(
        &RelayConfig::from_lookup(env_of("OutboxRelayFunction"))?,
        sdk,
    );
    let _mapping = payctl::relay::start(sdk, stack.payments_table()?, Arc::new(relay)).await?;
    let config = config_for(&stack, &bench_overrides())?;
    let processor = payment_core::bootstrap::build_processor(&config, sdk).await?;
    let mut esm_options = esm_opts(&stack, opts.pollers);
    esm_options.until_empty = false;
    let consumer = tokio::spawn(esm::run(
        processor,
        aws_sdk_sqs::Client::new(sdk),
        esm_options,
    ));
    let client = payctl::client::ApiClient::new(server.url(), sdk)?;
    let body = |i: usize| {
        let b: serde_json::Value =
            serde_json::from_str(&payment_body("x", 1000 + i as i64, "pm_card_visa"))
                .unwrap_or_default();
        let mut b = b.as_object().cloned().unwrap_or_default();
        b.remove("payment_id");
        serde_json::Value::Object(b).to_string()
    };

    // End to end first, on an idle stack.
    let samples = (opts.payments / 10).clamp(10, 100);
    let client_ref = &client;
    let end_to_end: Vec<Result<f64>> = stream::iter(0..samples)
        .map(|i| {
            let key = format!("{name}-e2e-{i:04}");
            let b = body(i);
            async move {
                let t = Instant::now();
                let created = client_ref.create(&key, &b).await?;
                if created.status != 202 {
                    bail!("POST {key}: {} {}", created.status, created.body);
                }
                loop {
                    let got = client_ref.get(&key).await?.json()?;
                    match got["status"].as_str() {
                        Some("succeeded") => return Ok(t.elapsed().as_secs_f64() * 1e3),
                        Some("pending" | "processing") if t.elapsed() < Duration::from_secs(60) => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        other => bail!("{key} ended {other:?}: {got}"),
                    }
                }
            }
        })
        .buffer_unordered(5)
        .collect()
        .await;
    let mut e2e: Vec<f64> = end_to_end.into_iter().collect::<Result<_>>()?;
    e2e.sort_by(f64::total_cmp);

    // Then POST throughput with fresh keys.
    let requests = opts.payments.max(20);
    let started = Instant::now();
    let posted: Vec<Result<f64>> = stream::iter(0..requests)
        .map(|i| {
            let key = format!("{name}-rps-{i:05}");
            let b = body(i);
            async move {
                let t = Instant::now();
                let a = client_ref.create(&key, &b).await?;
                if a.status != 202 {
                    bail!("POST {key}: {} {}", a.status, a.body);
                }
                Ok(t.elapsed().as_secs_f64() * 1e3)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut lat: Vec<f64> = posted.into_iter().collect::<Result<_>>()?;
    lat.sort_by(f64::total_cmp);
    consumer.abort();
    teardown(sdk, &stack).await.ok();
    Ok(json!({
        "requests": requests,
        "clients": 8,
        "requests_per_second": requests as f64 / elapsed,
        "latency_ms": {"p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99)},
        "post_to_succeeded_ms": {
            "samples": e2e.len(),
            "p50": percentile(&e2e, 0.5), "p95": percentile(&e2e, 0.95), "p99": percentile(&e2e, 0.99)
        },
    }))
}

/// When, what and where: the date, the commit, the machine, the emulator and the sizes, so
/// that a result can be compared with another only when these match.
fn run_facts(opts: &BenchOptions) -> serde_json::Value {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    json!({
        "date": payctl::time::utc(now_ms()),
        "commit": commit,
        "machine": format!("{HOST_ARCH}, {cores} cores, {cpu}"),
        "emulator": opts.emulator,
        "payments": opts.payments,
        "duplicates": opts.payments / 10,
        "pollers": opts.pollers,
        "cold_start_runs": opts.cold_start_runs,
    })
}

fn markdown(r: &serde_json::Value, opts: &BenchOptions) -> String {
    let mut s = String::new();
    let run = &r["run"];
    s.push_str(&format!(
        "Run {} at commit {} on {}, against {}: {} payments + {} duplicates, 1 and {} concurrent batches.\n\n",
        run["date"].as_str().unwrap_or("?"),
        run["commit"].as_str().unwrap_or("?"),
        run["machine"].as_str().unwrap_or("?"),
        run["emulator"].as_str().unwrap_or("?"),
        run["payments"],
        run["duplicates"],
        run["pollers"]
    ));
    s.push_str("| measure | value |\n|---|---|\n");
    for t in r["throughput"].as_array().into_iter().flatten() {
        let p = t["pollers"].as_u64().unwrap_or(0);
        let cap = r["stack_capacity_per_second"][p.to_string()]
            .as_f64()
            .unwrap_or(0.0);
        s.push_str(&format!(
            "| throughput, {p} concurrent batch(es) | {:.0} payments/s ({:.0} messages/s); the local stack alone, same calls and concurrency: {:.0} messages/s; {:.0} % of it |\n",
            t["payments_per_second"].as_f64().unwrap_or(0.0),
            t["messages_per_second"].as_f64().unwrap_or(0.0),
            cap,
            100.0 * t["messages_per_second"].as_f64().unwrap_or(0.0) / cap.max(1e-9)
        ));
        s.push_str(&format!(
            "| latency send → acknowledged, {p} batch(es) (p50 / p95 / p99) | {:.0} / {:.0} / {:.0} ms |\n",
            t["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            t["latency_ms"]["p95"].as_f64().unwrap_or(0.0),
            t["latency_ms"]["p99"].as_f64().unwrap_or(0.0)
        ));
        s.push_str(&format!(
            "| function CPU per payment, {p} batch(es) (all {p} `bootstrap` processes, user + system) | {:.3} ms, of which system {:.3} ms; the same calls alone, from the benchmark's build: {:.3} ms |\n",
            t["cpu_ms_per_1000_payments"].as_f64().unwrap_or(0.0) / 1000.0,
            t["system_cpu_ms_per_1000_payments"].as_f64().unwrap_or(0.0) / 1000.0,
            r["bare_calls_cpu_ms_per_payment"][p.to_string()]
                .as_f64()
                .unwrap_or(0.0)
        ));
    }
    let api = &r["api"];
    s.push_str(&format!(
        "| payments API, POST /v1/payments ({} requests, {} clients; API served in-process, DynamoDB on the emulator) | {:.0} requests/s, p50 {:.1} ms, p99 {:.1} ms |\n",
        api["requests"], api["clients"],
        api["requests_per_second"].as_f64().unwrap_or(0.0),
        api["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
        api["latency_ms"]["p99"].as_f64().unwrap_or(0.0)
    ));
    s.push_str(&format!(
        "| POST → GET says succeeded (API, outbox stream, relay, queue, processor, provider; {} payments, 5 at a time) (p50 / p95 / p99) | {:.0} / {:.0} / {:.0} ms |\n",
        api["post_to_succeeded_ms"]["samples"],
        api["post_to_succeeded_ms"]["p50"].as_f64().unwrap_or(0.0),
        api["post_to_succeeded_ms"]["p95"].as_f64().unwrap_or(0.0),
        api["post_to_succeeded_ms"]["p99"].as_f64().unwrap_or(0.0)
    ));
    for c in r["calls_per_payment"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| calls: {} | {} DynamoDB, {} SQS, {} provider |\n",
            c["case"].as_str().unwrap_or(""),
            c["dynamodb"],
            c["sqs"],
            c["provider"]
        ));
    }
    s.push_str(&format!(
        "| function peak RSS (the largest `bootstrap` process) | {:.1} MiB |\n",
        r["peak_rss_kib"].as_f64().unwrap_or(0.0) / 1024.0
    ));
    for (arch, ms) in r["cold_start_ms_median"].as_object().into_iter().flatten() {
        s.push_str(&format!(
            "| cold start to first Runtime API request ({arch}, median of {}) | {:.1} ms |\n",
            opts.cold_start_runs,
            ms.as_f64().unwrap_or(0.0)
        ));
    }
    for (arch, b) in r["bootstrap_bytes"].as_object().into_iter().flatten() {
        s.push_str(&format!(
            "| `bootstrap` size ({arch}, stripped) | {:.1} MiB |\n",
            b.as_f64().unwrap_or(0.0) / 1048576.0
        ));
    }
    s.push_str(&crate::retries::markdown(&r["retries"]));
    if r.get("comparison").is_some() {
        s.push_str(&compare::markdown(r));
    }
    s
}
