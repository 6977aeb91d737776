//! The AWS SDK's transport, replaced: the official `aws-sdk-dynamodb` and `aws-sdk-sqs` clients
//! are built on this [`HttpClient`](aws_smithy_runtime_api::client::http::HttpClient), which
//! answers their signed JSON requests from the models in process, on the simulated clock, with
//! no socket. Everything the SDK does around a request (serialising, signing, retrying with
//! backoff, parsing errors into their shapes) runs as in production.
//!
//! Why ~530 lines: the transport, the account it reaches and the faults of the network between
//! them (latency, stalls, lost answers, outages, transaction conflicts) are one request's path.
//!
//! Around each request the transport draws a latency (before the model applies it and after),
//! and its faults: a `500` or a throttle refused before anything is applied, an answer lost
//! after the model applied the request (the caller times out on a write that committed), or a
//! request held in the network for seconds. A request lands on its own task: one sent by an
//! invocation that is killed before it lands is applied all the same, as on the wire.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use serde_json::Value as Json;

use crate::dynamo::Dynamo;
use crate::sqs::Sqs;
use sqs_once::clock::Clock;

/// What the transport does besides carrying requests: latencies and faults, per service.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Median latency of one request, ms (log-normal around it).
    pub latency_ms: f64,
    /// Chance a request is refused with a `500` before it is applied.
    pub error_rate: f64,
    /// Chance a request is throttled (`ThrottlingException`, `RequestThrottled`).
    pub throttle_rate: f64,
    /// Chance the answer to an applied request is lost (the caller sees a timeout).
    pub lost_answer_rate: f64,
    /// Chance a request is held in the network 5 s to [`Faults::stall_max_ms`] before it lands
    /// (a host's pause, a connection's retransmissions): it lands then, whether or not its
    /// sender still waits.
    pub stall_rate: f64,
    /// The longest a stalled request is held, ms (60 s unless a run says otherwise).
    pub stall_max_ms: u64,
    /// Chance a `TransactWriteItems` is cancelled for a conflict with another transaction
    /// on one of its items (`TransactionConflict`: nothing written): requests here apply whole
    /// at one instant, so no two ever overlap by themselves.
    pub conflict_rate: f64,
    /// The service is down from this epoch ms ...
    pub outage_from_ms: i64,
    /// ... until this one (every request fails with a `503`, applying nothing).
    pub outage_until_ms: i64,
}

/// The simulated AWS account: its services' state, shared by every client built on it.
#[derive(Debug)]
pub struct Aws {
    /// DynamoDB's tables.
    pub dynamo: Dynamo,
    /// SQS's queues.
    pub sqs: Sqs,
    /// EventBridge's buses and rules.
    pub eventbridge: crate::eventbridge::EventBridge,
    /// DynamoDB's faults.
    pub dynamo_faults: Faults,
    /// SQS's faults.
    pub sqs_faults: Faults,
    /// Latencies and faults are drawn from it.
    rng: fastrand::Rng,
    /// Requests answered, per service and operation, in order (the trace digest reads it).
    pub log: Vec<String>,
    /// Keep [`Aws::log`] (off for long runs: the digest is then kept as a running hash).
    pub keep_log: bool,
    /// A running hash of every request and answer.
    pub digest: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests refused by an outage (`503`).
    pub outage_refusals: u64,
    /// DynamoDB write units consumed, by simulated second (an item of at most 1 KB a unit,
    /// as every item of this stack is; a transaction's items two each).
    pub write_units: std::collections::BTreeMap<i64, u64>,
}

impl Aws {
    /// An empty account whose randomness comes from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            dynamo: Dynamo::new(),
            sqs: Sqs::new(seed ^ 0x5157),
            eventbridge: Default::default(),
            dynamo_faults: Faults::default(),
            sqs_faults: Faults::default(),
            rng: fastrand::Rng::with_seed(seed),
            log: Vec::new(),
            keep_log: false,
            digest: 0xcbf2_9ce4_8422_2325,
            requests: 0,
            outage_refusals: 0,
            write_units: Default::default(),
        }
    }

    /// SQS is down at `now_ms`: Lambda's own poller (which is not the SDK's client here) can
    /// neither receive nor delete.
    pub fn sqs_down(&self, now_ms: i64) -> bool {
        (self.sqs_faults.outage_from_ms..self.sqs_faults.outage_until_ms).contains(&now_ms)
    }

    /// Folds bytes into the running digest (FNV-1a, 64 bits).
    pub fn fold(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.digest ^= *b as u64;
            self.digest = self.digest.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn latency(&mut self, faults: &Faults) -> Duration {
        if faults.latency_ms <= 0.0 {
            return Duration::ZERO;
        }
        // Log-normal with sigma 0.5 around the median (Box-Muller from two uniform draws).
        let (u1, u2) = (self.rng.f64().max(1e-12), self.rng.f64());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        Duration::from_micros((faults.latency_ms * (0.5 * z).exp() * 1000.0) as u64)
    }
}

/// Writing to the account folds the text into its digest.
impl std::fmt::Write for Aws {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.fold(s.as_bytes());
        Ok(())
    }
}

/// The transport: clients built with [`Wire::sdk_config`] reach the shared [`Aws`].
#[derive(Debug, Clone)]
pub struct Wire {
    /// The account.
    pub aws: Arc<Mutex<Aws>>,
    /// The simulated clock.
    pub clock: Arc<dyn Clock>,
}

fn respond(status: u16, body: Json, query_error: Option<&str>) -> HttpResponse {
    respond_text(status, body.to_string(), query_error)
}

/// An answer whose body is already written.
fn respond_text(status: u16, body: String, query_error: Option<&str>) -> HttpResponse {
    let mut r = HttpResponse::new(
        status.try_into().expect("a valid status"),
        SdkBody::from(body),
    );
    r.headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    if let Some(q) = query_error {
        r.headers_mut().insert("x-amzn-query-error", q.to_owned());
    }
    r
}

impl Wire {
    /// A transport on a fresh account.
    pub fn new(seed: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            aws: Arc::new(Mutex::new(Aws::new(seed))),
            clock,
        }
    }

    /// The SDK configuration of every client of the run: this transport, fixed credentials and
    /// region, tokio's (paused) sleep, and the simulated clock as the SDK's time source.
    pub fn sdk_config(&self) -> aws_config::SdkConfig {
        let clock = Arc::clone(&self.clock);
        aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(
                    aws_credential_types::Credentials::new(
                        "AKIDSIMULATOR",
                        "simulator",
                        None,
                        None,
                        "simulator",
                    ),
                ),
            )
            .endpoint_url("https://aws.simulator")
            .http_client(SharedHttpClient::new(self.clone()))
            .sleep_impl(aws_smithy_async::rt::sleep::SharedAsyncSleep::new(
                aws_smithy_async::rt::sleep::TokioSleep::new(),
            ))
            .time_source(aws_smithy_async::time::SharedTimeSource::new(SimTime(
                clock,
            )))
            .stalled_stream_protection(
                aws_config::stalled_stream_protection::StalledStreamProtectionConfig::disabled(),
            )
            .build()
    }

    async fn answer(self, target: String, body: Json) -> Result<HttpResponse, ConnectorError> {
        let (service, operation) = target.split_once('.').unwrap_or(("", ""));
        if service == "AWSEvents" {
            // EventBridge's control plane, at provisioning: no latency, no faults.
            let mut aws = self.aws.lock().expect("the account");
            aws.requests += 1;
            let (status, answer) = match aws.eventbridge.handle(operation, &body) {
                Ok(j) => (200, j),
                Err(e) => (400, e.body()),
            };
            let line = format!(
                "{} {target} {body} -> {status} {answer}\n",
                self.clock.now_ms()
            );
            aws.fold(line.as_bytes());
            if aws.keep_log {
                aws.log.push(line);
            }
            let mut r = respond(status, answer, None);
            r.headers_mut()
                .insert("content-type", "application/x-amz-json-1.1");
            return Ok(r);
        }
        let dynamo = service.starts_with("DynamoDB");
        let (before, after, fault) = {
            let mut aws = self.aws.lock().expect("the account");
            let faults = if dynamo {
                aws.dynamo_faults.clone()
            } else {
                aws.sqs_faults.clone()
            };
            let conflict = dynamo
                && operation == "TransactWriteItems"
                && faults.conflict_rate > 0.0
                && aws.rng.f64() < faults.conflict_rate;
            let mut before = aws.latency(&faults);
            if faults.stall_rate > 0.0 && aws.rng.f64() < faults.stall_rate {
                before +=
                    Duration::from_millis(aws.rng.u64(5_000..=faults.stall_max_ms.max(5_000)));
            }
            let after = aws.latency(&faults);
            let now = self.clock.now_ms();
            let roll = aws.rng.f64();
            let fault = if (faults.outage_from_ms..faults.outage_until_ms).contains(&now) {
                Some(503)
            } else if roll < faults.error_rate {
                Some(500)
            } else if roll < faults.error_rate + faults.throttle_rate {
                Some(400)
            } else if roll < faults.error_rate + faults.throttle_rate + faults.lost_answer_rate {
                Some(0)
            } else if conflict {
                Some(409)
            } else {
                None
            };
            (before, after, fault)
        };
        tokio::time::sleep(before).await;
        let now_ms = self.clock.now_ms();
        if fault == Some(409) {
            // One item of the transaction was being written by another: DynamoDB cancels the
            // whole, each item's reason in order ("None" but the one).
            let items = body["TransactItems"].as_array().map_or(1, Vec::len);
            let which = self
                .aws
                .lock()
                .expect("the account")
                .rng
                .usize(0..items.max(1));
            let reasons: Vec<serde_json::Value> = (0..items)
                .map(|n| {
                    if n == which {
                        serde_json::json!({"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"})
                    } else {
                        serde_json::json!({"Code": "None"})
                    }
                })
                .collect();
            let codes: Vec<&str> = reasons
                .iter()
                .map(|r| r["Code"].as_str().unwrap_or("None"))
                .collect();
            let answer = serde_json::json!({
                "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                "message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{}]", codes.join(", ")),
                "CancellationReasons": reasons,
            });
            let line = format!("{now_ms} {target} conflict -> 400 {answer}\n");
            {
                let mut aws = self.aws.lock().expect("the account");
                aws.fold(line.as_bytes());
                if aws.keep_log {
                    aws.log.push(line);
                }
            }
            tokio::time::sleep(after).await;
            return Ok(respond(400, answer, None));
        }
        if let Some(code @ (400 | 500 | 503)) = fault {
            {
                let mut aws = self.aws.lock().expect("the account");
                aws.outage_refusals += u64::from(code == 503);
                let line = format!("{now_ms} {target} fault {code}\n");
                aws.fold(line.as_bytes());
                if aws.keep_log {
                    aws.log.push(line);
                }
            }
            tokio::time::sleep(after).await;
            let (shape, q) = match (dynamo, code) {
                (true, 400) => ("com.amazonaws.dynamodb.v20120810#ThrottlingException", None),
                (true, _) => ("com.amazonaws.dynamodb.v20120810#InternalServerError", None),
                (false, 400) => (
                    "com.amazonaws.sqs#RequestThrottled",
                    Some("RequestThrottled;Sender"),
                ),
                (false, _) => (
                    "com.amazonaws.sqs#InternalError",
                    Some("InternalError;Receiver"),
                ),
            };
            return Ok(respond(
                code,
                serde_json::json!({"__type": shape, "message": "the simulator's fault"}),
                q,
            ));
        }
        let (status, answer, query_error) = {
            let mut aws = self.aws.lock().expect("the account");
            aws.requests += 1;
            let out = if dynamo {
                let units = write_units(operation, &body);
                match aws.dynamo.handle(operation, &body, now_ms.div_euclid(1000)) {
                    Ok(j) => {
                        if units > 0 {
                            *aws.write_units.entry(now_ms.div_euclid(1000)).or_default() += units;
                        }
                        (200, j, None)
                    }
                    Err(e) => {
                        // A refused condition consumes the write's units all the same. A
                        // cancelled transaction is counted as if it had written: DynamoDB's
                        // documents say what a refused single write consumes, not what a
                        // cancelled transaction's prepare does, and this count sizes tables
                        // (an upper bound is the safe side).
                        if units > 0
                            && e.body()["__type"].as_str().is_some_and(|t| {
                                t.ends_with("ConditionalCheckFailedException")
                                    || t.ends_with("TransactionCanceledException")
                            })
                        {
                            *aws.write_units.entry(now_ms.div_euclid(1000)).or_default() += units;
                        }
                        (e.status, e.body(), None)
                    }
                }
            } else {
                match aws.sqs.handle(operation, &body, now_ms) {
                    Ok(j) => (200, j, None),
                    Err(e) => (400, e.body(), Some(format!("{};Sender", e.query_code()))),
                }
            };
            // The answer is written once, for the digest and the wire. The request is folded
            // as parsed (its keys sorted), not as sent: the SDK writes a map's entries in its
            // HashMap's order, which differs from one process to the next.
            let (status, answer, query_error) = out;
            let answer = answer.to_string();
            let request = &body;
            if aws.keep_log {
                let line = format!("{now_ms} {target} {request} -> {status} {answer}\n");
                aws.fold(line.as_bytes());
                aws.log.push(line);
            } else {
                // The same bytes, folded as they are written (no line to keep).
                use std::fmt::Write;
                let _ = writeln!(aws, "{now_ms} {target} {request} -> {status} {answer}");
            }
            (status, answer, query_error)
        };
        tokio::time::sleep(after).await;
        if fault == Some(0) {
            return Err(ConnectorError::timeout(
                "the simulator lost the answer".into(),
            ));
        }
        Ok(respond_text(status, answer, query_error.as_deref()))
    }
}

impl HttpConnector for Wire {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request
            .headers()
            .get("x-amz-target")
            .unwrap_or_default()
            .to_owned();
        let body: Json = request
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Json::Null);
        // A request sent lands whether or not its sender still waits for the answer: one whose
        // invocation is killed while it is in flight is still applied (its own task).
        let landing = tokio::spawn(self.clone().answer(target, body));
        HttpConnectorFuture::new(async move {
            landing
                .await
                .map_err(|e| ConnectorError::other(Box::new(e), None))?
        })
    }
}

impl HttpClient for Wire {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

/// The SDK's work a simulated request does not need, left out of every client of the run: the
/// SigV4 signature (the models do not check one; the SDK's `noAuth` scheme is preferred) and the
/// user-agent header (its interceptor, disabled for each operation by this one). What the
/// project's code meets is unchanged: the same serializers, deserializers, retries and errors.
#[derive(Debug)]
struct Unsigned;

impl aws_smithy_runtime_api::client::interceptors::Intercept for Unsigned {
    fn name(&self) -> &'static str {
        "simulator: unsigned, no user agent"
    }

    fn read_before_execution(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        cfg.interceptor_state().store_put(
            aws_smithy_runtime_api::client::interceptors::disable_interceptor::<
                aws_runtime::user_agent::UserAgentInterceptor,
            >("the simulator reads no user agent"),
        );
        Ok(())
    }
}

/// The SDK's `noAuth` scheme, preferred over SigV4.
fn no_auth() -> aws_smithy_runtime_api::client::auth::AuthSchemeId {
    aws_smithy_runtime_api::client::auth::AuthSchemeId::new("noAuth")
}

/// A DynamoDB client with a retry quota of its own, as each Lambda process has. The SDK keeps a
/// partition's default retry token bucket in a process-wide map: built with `Client::new`, every
/// simulated instance, and every run in the same process (the tests run several at once), would
/// share one bucket, and an outage's retries in one run would refuse another's (a seed that
/// did not replay was how this showed).
pub fn dynamodb_client(sdk: &aws_config::SdkConfig) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::retry::{RetryPartition, TokenBucket};
    let config = aws_sdk_dynamodb::config::Builder::from(sdk)
        .allow_no_auth()
        .auth_scheme_preference([no_auth()])
        .interceptor(Unsigned)
        .retry_partition(
            RetryPartition::custom("simulated-process")
                .token_bucket(TokenBucket::default())
                .build(),
        )
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// An SQS client with a retry quota of its own (as [`dynamodb_client`]).
pub fn sqs_client(sdk: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::retry::{RetryPartition, TokenBucket};
    let config = aws_sdk_sqs::config::Builder::from(sdk)
        .allow_no_auth()
        .auth_scheme_preference([no_auth()])
        .interceptor(Unsigned)
        .retry_partition(
            RetryPartition::custom("simulated-process")
                .token_bucket(TokenBucket::default())
                .build(),
        )
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// The SDK's time source (request signing, retry timing) read from the simulated clock.
#[derive(Debug)]
struct SimTime(Arc<dyn Clock>);

impl aws_smithy_async::time::TimeSource for SimTime {
    fn now(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(self.0.now_ms().max(0) as u64)
    }
}

/// The write units a DynamoDB request consumes (items of at most 1 KB).
fn write_units(operation: &str, body: &Json) -> u64 {
    match operation {
        "PutItem" | "UpdateItem" | "DeleteItem" => 1,
        "TransactWriteItems" => {
            2 * body["TransactItems"]
                .as_array()
                .map_or(0, |a| a.len() as u64)
        }
        "BatchWriteItem" => body["RequestItems"].as_object().map_or(0, |t| {
            t.values()
                .filter_map(|r| r.as_array())
                .map(|r| r.len() as u64)
                .sum()
        }),
        _ => 0,
    }
}
