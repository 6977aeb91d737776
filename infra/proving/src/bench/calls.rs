//! AWS calls, CPU and memory per payment, the emulator's own capacity (a bare poller), and
//! the cold start.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use sqs_once::record::{ClaimRequest, IdempotencyStore};
use sqs_once::runner::now_ms;

use super::setup::*;
use crate::demo::config_for;
use crate::load::{payment_body, send_all};
use lambda_local::esm;
use lambda_local::runtime_api::lambda_environment;
use payctl::template::teardown;

/// A payment's calls without the processor: the claim, the provider call and the completion
/// through the function's own adapters (the same requests on the wire), or for a duplicate the
/// claim alone, which finds the record done.
pub(super) struct BareCalls {
    pub(super) store: sqs_once::DynamoStore,
    pub(super) provider: payment_core::stripe::StripeClient,
}

impl BareCalls {
    async fn new(
        sdk: &aws_config::SdkConfig,
        config: &payment_core::edges::config::Config,
    ) -> Result<Self> {
        Ok(Self {
            store: payment_core::payment_store(
                aws_sdk_dynamodb::Client::new(sdk),
                &config.idempotency_table,
            ),
            provider: payment_core::edges::bootstrap::provider_from(config, sdk).await?,
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
                traceparent: None,
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
        let (outcome, dead_letter) = payment_core::payments::charge::outcome_of(&req, &response);
        if let Some((code, why)) = dead_letter {
            bail!("{}: {code}: {why}", req.payment_id.as_str());
        }
        // The same write as the processor's: a charge's record kept for the refund window.
        let outcome = outcome.to_outcome();
        let keep = (outcome.status == "succeeded").then(|| {
            now / 1000 + payment_core::payments::charge::DEFAULT_REFUND_WINDOW.as_secs() as i64
        });
        self.store
            .complete(req.payment_id.as_str(), "bare", &outcome, keep)
            .await?;
        Ok(())
    }
}

/// The local stack's own capacity for the processor's call mix, and the CPU those calls cost
/// alone. The same backlog and concurrency with no processor: each poller a thread with a
/// runtime of its own (as each function process has) that receives a batch, makes each
/// message's bare calls ([`BareCalls`]) for the 10 messages at once as the processor does, and
/// deletes the batch. Returns messages per second (the ceiling the processor's throughput is
/// compared with) and milliseconds of CPU per payment spent in the bare calls (the floor under
/// the function's CPU: what the SDK, the HTTP client and the kernel cost for these requests),
/// from `getrusage(RUSAGE_THREAD)` around each batch's calls.
pub(super) async fn emulator_capacity(
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
pub(super) async fn bare_poller(
    sdk: aws_config::SdkConfig,
    config: payment_core::edges::config::Config,
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
pub(super) fn thread_cpu_seconds() -> f64 {
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
pub(super) async fn calls_per_payment(
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
            traceparent: None,
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
pub(super) async fn cold_start(
    program: &Path,
    env: &BTreeMap<String, String>,
    runs: usize,
) -> Result<f64> {
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
