//! What every measurement of the benchmark stands on: its options, the function settings it
//! runs with, the instrumented stack (AWS calls counted by an SDK interceptor), and the
//! backlog.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};

use crate::compare::{peer_environment, Contender, PeerOptions};
use crate::demo::{config_for, function_environment};
use crate::load::payment_body;
use crate::sim::SimClient;
use lambda_local::esm::EsmOptions;
use payctl::template::{provision, unique_stack_name, ProvisionOptions, Stack};

/// Counts AWS requests by operation (`x-amz-target`), as they leave for the wire, and the
/// DynamoDB write requests they carry (an item of a transaction counts twice, as DynamoDB
/// bills it; items of a batch once each).
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<Mutex<HashMap<String, u64>>>, Arc<Mutex<u64>>);

/// DynamoDB write requests in one request's body, transactional items twice: what it is
/// billed in write units when every item is at most 1 KB.
pub fn write_requests(op: &str, body: Option<&[u8]>) -> u64 {
    let json = || -> serde_json::Value {
        body.and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default()
    };
    match op.rsplit('.').next() {
        Some("PutItem" | "UpdateItem" | "DeleteItem") => 1,
        Some("TransactWriteItems") => {
            2 * json()["TransactItems"]
                .as_array()
                .map(|a| {
                    // A ConditionCheck writes nothing but is billed as a write too.
                    a.len() as u64
                })
                .unwrap_or(0)
        }
        Some("BatchWriteItem") => json()["RequestItems"]
            .as_object()
            .map(|t| {
                t.values()
                    .map(|r| r.as_array().map(Vec::len).unwrap_or(0) as u64)
                    .sum()
            })
            .unwrap_or(0),
        _ => 0,
    }
}

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

    /// DynamoDB write requests so far, transactional items twice ([`write_requests`]).
    pub fn write_requests(&self) -> u64 {
        self.1.lock().map(|n| *n).unwrap_or(0)
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
        let writes = write_requests(&op, context.request().body().bytes());
        if let Ok(mut n) = self.1.lock() {
            *n += writes;
        }
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
    /// The provider's answer time in the realistic runs: (p50, p99) ms of a log-normal.
    pub latency: (f64, f64),
    /// Backlog drained by one process at that latency (payments, duplicates on top).
    pub latency_payments: usize,
    /// Payments of the open-loop load at that latency.
    pub open_loop_payments: usize,
    /// Its arrival rate, payments per second (below both contenders' capacity).
    pub open_loop_rate: f64,
    /// The payments queue's visibility timeout in the retry rows (`None`: the template's).
    pub retry_visibility_timeout: Option<i32>,
    /// Backlog of the provider-rate rows (no duplicates).
    pub rate_payments: usize,
    /// Measure only the provider-rate rows.
    pub only_rate: bool,
    /// The provider-rate rows' accounts by name (empty: all).
    pub rate_accounts: Vec<String>,
    /// Where this contender's function exports its traces (`None`: traces off, as the
    /// template's default).
    pub traces_endpoint: Option<String>,
}

/// This machine's architecture, as Lambda names it: the only bootstrap that runs here.
pub(super) const HOST_ARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86_64"
} else {
    "arm64"
};

impl BenchOptions {
    /// The bootstrap built for this machine's architecture.
    pub(super) fn host_bootstrap(&self) -> Result<&Path> {
        self.bootstraps
            .iter()
            .find(|(arch, _)| arch == HOST_ARCH)
            .map(|(_, p)| p.as_path())
            .with_context(|| {
                format!("the benchmark runs the {HOST_ARCH} bootstrap: pass --bootstrap {HOST_ARCH}=PATH")
            })
    }

    /// The program and environment of a contender's function process on `stack`.
    pub(super) fn function_under_test(
        &self,
        who: Contender,
        stack: &Stack,
    ) -> Result<(PathBuf, BTreeMap<String, String>)> {
        let (_, mut env) = function_environment(stack, &bench_overrides())?;
        if let Some(endpoint) = &self.traces_endpoint {
            env.insert("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint.clone());
        }
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
pub fn bench_overrides() -> BTreeMap<String, String> {
    [
        ("LEASE_SECONDS", "20"),
        ("PAYMENT_API_TIMEOUT_SECONDS", "5"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(super) struct Instrumented {
    pub(super) stack: Stack,
    pub(super) processor: Arc<payment_core::Processor>,
    pub(super) sqs: aws_sdk_sqs::Client,
    pub(super) calls: CallCounter,
    pub(super) sim: SimClient,
}

/// A fresh stack from the template for one measurement (30 s visibility timeout), and its name.
pub(super) async fn bench_stack(
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

pub(super) async fn instrumented_stack(
    stack: Stack,
    sdk: &aws_config::SdkConfig,
) -> Result<Instrumented> {
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
        payment_core::edges::bootstrap::build_processor_with(&config, sdk, ddb, sqs.clone())
            .await?;
    Ok(Instrumented {
        stack,
        processor,
        sqs,
        calls,
        sim: SimClient::new(&config.payment_api_url),
    })
}

/// The local event-source mapping of a benchmark run: batches of 10 as soon as they are there.
pub fn esm_opts(stack: &Stack, pollers: usize) -> EsmOptions {
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

/// The provider simulator a function's environment points at.
pub(super) fn simulator_of(env: &BTreeMap<String, String>) -> Result<SimClient> {
    Ok(SimClient::new(
        env.get("PROVIDER_API_URL")
            .context("the function has no PROVIDER_API_URL")?,
    ))
}

/// The id of a run's `i`th payment.
pub(super) fn payment_id(name: &str, i: usize) -> String {
    format!("{name}-{i:05}")
}

/// The backlog of a run: `n` payments, then a copy of every tenth (10 % duplicates).
pub(super) fn backlog(name: &str, n: usize) -> Vec<String> {
    let mut bodies: Vec<String> = (0..n)
        .map(|i| payment_body(&payment_id(name, i), 1000 + i as i64, "pm_card_visa"))
        .collect();
    let dups: Vec<String> = bodies.iter().step_by(10).cloned().collect();
    bodies.extend(dups);
    bodies
}
