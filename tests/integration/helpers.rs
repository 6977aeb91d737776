//! Test harness: every test gets its own queue, DLQ and table, provisioned from `template.yaml`
//! on the local AWS endpoint, and its own payment-id prefix at the provider simulator.
//!
//! The endpoint and the simulator are started by `make test` (`infra/scripts/test.sh`), which
//! exports `AWS_ENDPOINT_URL`, `PROVIDER_API_URL` and `PAYMENT_API_KEY`. Without them the tests
//! fail with a message saying so: a test that cannot run is a failing test.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use aws_sdk_sqs::types::MessageSystemAttributeName;
use lambda_local::esm::{self, EsmOptions};
use payctl::template::{provision, ProvisionOptions, Stack};
use payment_core::edges::config::Config;
use payment_core::Processor;
use proving::check::{drain_dlq, DeadLetterSeen};
use proving::sim::{Ledger, SimClient};
use sqs_once::record::{IdempotencyRecord, IdempotencyStore};
use sqs_once::runner::now_ms;
use sqs_once::DynamoStore;

/// Source queue visibility timeout in tests, seconds: short so redeliveries come quickly.
pub const VISIBILITY: i32 = 4;

pub fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the suite with `make test`, which starts the local AWS endpoint and the provider simulator")
    })
}

/// Workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where cargo builds: CARGO_TARGET_DIR when set (a relative one is the root's), else target/.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if PathBuf::from(&dir).is_absolute() => PathBuf::from(dir),
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// A binary of the workspace's debug build (`payctl`, `proving`).
pub fn bin(name: &str) -> PathBuf {
    target_dir().join("debug").join(name)
}

/// One test's private stack.
pub struct TestStack {
    /// Unique name: prefix of resources and of payment ids.
    pub name: String,
    /// What `template.yaml` created.
    pub stack: Stack,
    /// The processor's configuration (from the template's environment).
    pub config: Config,
    /// The processor under test, with the real adapters.
    pub processor: Arc<Processor>,
    /// SQS client.
    pub sqs: aws_sdk_sqs::Client,
    /// The idempotency table.
    pub store: DynamoStore,
    /// The simulator's control API.
    pub sim: SimClient,
}

/// Per-test processor tunables, as environment variables of the function.
pub fn fast_settings() -> BTreeMap<String, String> {
    [
        ("LEASE_SECONDS", "5"),
        ("PAYMENT_API_TIMEOUT_SECONDS", "2"),
        // The simulator answers at once: a second covers any call still on its way.
        ("PROVIDER_PROCESSING_ALLOWANCE_SECONDS", "1"),
        // The simulator's search shows a charge as soon as it is made.
        ("PROVIDER_SEARCH_LAG_SECONDS", "1"),
        // Redeliveries follow the short backoff: no spreading over an hour's horizon.
        ("RETRY_HORIZON_SECONDS", "0"),
        ("REDELIVERY_BASE_DELAY_SECONDS", "1"),
        ("REDELIVERY_MAX_DELAY_SECONDS", "2"),
        ("PROVIDER_MAX_ATTEMPTS", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The fast settings with some variables overridden.
pub fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut e = fast_settings();
    for (k, v) in pairs {
        e.insert((*k).to_owned(), (*v).to_owned());
    }
    e
}

impl TestStack {
    /// Provisions a fresh stack with the default fast settings.
    pub async fn new(test: &str) -> Self {
        Self::with_env(test, fast_settings()).await
    }

    /// Provisions a fresh stack; `env` overrides the function's environment.
    pub async fn with_env(test: &str, env: BTreeMap<String, String>) -> Self {
        Self::provisioned(test, env, false).await
    }

    /// Provisions a fresh stack whose queues are FIFO.
    pub async fn fifo(test: &str) -> Self {
        Self::provisioned(test, fast_settings(), true).await
    }

    async fn provisioned(test: &str, env: BTreeMap<String, String>, fifo: bool) -> Self {
        Self::build(test, env, fifo, 20).await
    }

    /// Provisions with FIFO queues or not, and SQS's `maxReceiveCount`.
    pub async fn build(
        test: &str,
        env: BTreeMap<String, String>,
        fifo: bool,
        max_receive_count: i32,
    ) -> Self {
        Self::build_with_visibility(test, env, fifo, max_receive_count, VISIBILITY).await
    }

    /// Provisions with every option, the source queue's visibility timeout (seconds) too.
    pub async fn build_with_visibility(
        test: &str,
        env: BTreeMap<String, String>,
        fifo: bool,
        max_receive_count: i32,
        visibility: i32,
    ) -> Self {
        let name = Self::unique_name(test);
        Self::build_named(
            name,
            env,
            fifo,
            max_receive_count,
            visibility,
            HashMap::new(),
        )
        .await
    }

    /// `test` and eight random hex digits: a stack name no other run uses.
    pub fn unique_name(test: &str) -> String {
        let short = uuid::Uuid::new_v4().simple().to_string();
        format!("{}-{}", test.replace('_', "-"), &short[..8])
    }

    /// A stack whose provider events arrive through Stripe's EventBridge destination
    /// (`ProviderEventsDelivery` `eventbridge`, or `both` with the webhook): the partner event
    /// source is created first, as Stripe creates it, then the stack on it.
    pub async fn through_eventbridge(test: &str, delivery: &str) -> Self {
        let name = Self::unique_name(test);
        let source = proving::partner::local_source(&name);
        let sdk = payment_core::edges::bootstrap::sdk_config().await;
        proving::partner::create_source(&sdk, &source)
            .await
            .expect("creating the partner event source");
        let parameters = HashMap::from([
            ("ProviderEventsDelivery".to_owned(), delivery.to_owned()),
            ("StripeEventSourceName".to_owned(), source),
        ]);
        Self::build_named(name, BTreeMap::new(), false, 5, VISIBILITY, parameters).await
    }

    /// Provisions the stack `name` with every option, the template's parameters too.
    pub async fn build_named(
        name: String,
        env: BTreeMap<String, String>,
        fifo: bool,
        max_receive_count: i32,
        visibility: i32,
        parameters: HashMap<String, String>,
    ) -> Self {
        required_env("AWS_ENDPOINT_URL");
        // A test with a provider of its own (a simulator it started) names it in `env`.
        let sim_url = env
            .get("PROVIDER_API_URL")
            .cloned()
            .unwrap_or_else(|| required_env("PROVIDER_API_URL"));
        let sdk = payment_core::edges::bootstrap::sdk_config().await;
        let stack = provision(
            &sdk,
            &root().join("template.yaml"),
            &ProvisionOptions {
                stack_name: name.clone(),
                visibility_timeout: Some(visibility),
                max_receive_count: Some(max_receive_count),
                fifo,
                parameters,
                ..Default::default()
            },
        )
        .await
        .expect("provisioning from template.yaml");
        let config = proving::demo::config_for(&stack, &env).expect("function configuration");
        assert_eq!(config.payment_api_url, sim_url);
        let processor = payment_core::edges::bootstrap::build_processor(&config, &sdk)
            .await
            .expect("building the processor");
        let store = payment_core::payment_store(
            aws_sdk_dynamodb::Client::new(&sdk),
            &config.idempotency_table,
        );
        Self {
            sqs: aws_sdk_sqs::Client::new(&sdk),
            sim: SimClient::new(&sim_url),
            name,
            stack,
            config,
            processor,
            store,
        }
    }

    /// A payment id unique to this test.
    pub fn pid(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.name)
    }

    /// The source queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.stack.event_source.queue_url
    }

    /// Sends one body; returns its message id.
    pub async fn send(&self, body: &str) -> String {
        self.sqs
            .send_message()
            .queue_url(self.queue_url())
            .message_body(body)
            .send()
            .await
            .expect("send_message")
            .message_id()
            .unwrap_or_default()
            .to_owned()
    }

    /// Sends `n` copies of a body; returns their message ids.
    pub async fn send_copies(&self, body: &str, n: usize) -> Vec<String> {
        let bodies = vec![body.to_owned(); n];
        proving::load::send_all(&self.sqs, self.queue_url(), &bodies)
            .await
            .expect("send copies")
    }

    /// Options of the local event-source mapping for this stack.
    pub fn esm_options(&self, pollers: usize) -> EsmOptions {
        EsmOptions {
            queue_url: self.queue_url().to_owned(),
            batch_size: 10,
            batching_window: Duration::from_millis(100),
            visibility_timeout: None,
            function_timeout: Duration::from_secs(30),
            report_batch_item_failures: true,
            pollers,
            until_empty: true,
            max_duration: Duration::from_secs(120),
        }
    }

    /// Drains the queue with the local event-source mapping.
    pub async fn drain(&self, pollers: usize) -> esm::EsmStats {
        esm::run(
            self.processor.clone(),
            self.sqs.clone(),
            self.esm_options(pollers),
        )
        .await
        .expect("draining the queue")
    }

    /// Sends a body to a FIFO queue in a message group.
    pub async fn send_in_group(&self, body: &str, group: &str) -> String {
        self.sqs
            .send_message()
            .queue_url(self.queue_url())
            .message_body(body)
            .message_group_id(group)
            .send()
            .await
            .expect("send_message")
            .message_id()
            .unwrap_or_default()
            .to_owned()
    }

    /// Receives up to `n` visible messages (several receives) as Lambda records.
    pub async fn receive_records(&self, n: usize) -> Vec<SqsMessage> {
        self.receive_records_from(&self.stack.event_source, n).await
    }

    /// Receives up to `n` messages of an event source's queue as Lambda event records.
    pub async fn receive_records_from(
        &self,
        source: &payctl::template::EventSource,
        n: usize,
    ) -> Vec<SqsMessage> {
        let mut records = Vec::new();
        let mut empty = 0;
        while records.len() < n && empty < 3 {
            let out = self
                .sqs
                .receive_message()
                .queue_url(&source.queue_url)
                .max_number_of_messages(((n - records.len()).min(10)) as i32)
                .wait_time_seconds(1)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .expect("receive_message");
            if out.messages().is_empty() {
                empty += 1;
            }
            for m in out.messages() {
                records.push(esm::to_record(m, &source.queue_arn, "us-east-1"));
            }
        }
        records
    }

    /// Invokes the handler once on these records, as Lambda would, and deletes the messages the
    /// response does not list (what Lambda does with a partial batch response).
    pub async fn invoke(&self, records: Vec<SqsMessage>) -> SqsBatchResponse {
        let handles: Vec<(String, String)> = records
            .iter()
            .map(|r| {
                (
                    r.message_id.clone().unwrap_or_default(),
                    r.receipt_handle.clone().unwrap_or_default(),
                )
            })
            .collect();
        let (response, _) = self
            .processor
            .handle_batch(records, now_ms() + 30_000)
            .await;
        let failed: Vec<&str> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        for (id, rh) in handles {
            if !failed.contains(&id.as_str()) {
                let _ = self
                    .sqs
                    .delete_message()
                    .queue_url(self.queue_url())
                    .receipt_handle(rh)
                    .send()
                    .await;
            }
        }
        response
    }

    /// Makes another worker hold a live lease (a minute) on the payment of this body.
    pub async fn hold_lease_elsewhere(&self, body: &str) {
        self.claim_as(body, "another-worker").await;
    }

    /// Claims the payment of `body` for `owner` with a 60 s lease, as a worker would.
    pub async fn claim_as(&self, body: &str, owner: &str) {
        let req = payment_core::domain::PaymentRequest::parse(body).expect("a valid body");
        let now = now_ms();
        self.store
            .claim(&sqs_once::record::ClaimRequest {
                traceparent: None,
                key: req.payment_id.as_str().to_owned(),
                payload_hash: req.payload_hash(),
                owner: owner.into(),
                now_ms: now,
                lease_expires_at_ms: now + 60_000,
                expires_at_s: now / 1000 + 86_400,
            })
            .await
            .expect("claiming");
    }

    /// The record of a payment.
    pub async fn record(&self, payment_id: &str) -> Option<IdempotencyRecord> {
        self.store
            .get(payment_id)
            .await
            .expect("reading the record")
    }

    /// Waits until a worker running beside the test has claimed the payment, and returns the
    /// record. A read racing the claim may see a half-written item on moto, which applies an
    /// `UpdateItem` one clause at a time (DynamoDB applies it atomically): such a read is retried,
    /// never accepted, until the claim's last clause (`ADD attempts`) shows.
    pub async fn wait_for_claim(&self, payment_id: &str) -> IdempotencyRecord {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            match self.store.get(payment_id).await {
                Ok(Some(record)) if record.attempts > 0 => return record,
                Ok(_) | Err(sqs_once::record::StoreError::Malformed(_)) => {}
                Err(e) => panic!("reading the record: {e}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{payment_id} was not claimed within 15 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Everything in the DLQ (drained).
    pub async fn dead_letters(&self) -> Vec<DeadLetterSeen> {
        let dlq = self.config.dead_letter_queue_url.clone();
        drain_dlq(&self.sqs, &dlq).await.expect("reading the DLQ")
    }

    /// Messages left in the source queue (visible, in flight, delayed).
    pub async fn depth(&self) -> i64 {
        esm::queue_depth(&self.sqs, self.queue_url())
            .await
            .expect("queue depth")
    }

    /// The provider's books for one payment.
    pub async fn ledger(&self, payment_id: &str) -> Ledger {
        self.sim
            .ledger_for(payment_id)
            .await
            .expect("simulator ledger")
    }

    /// Charges the provider booked for a payment.
    pub async fn charges(&self, payment_id: &str) -> usize {
        self.ledger(payment_id)
            .await
            .charges
            .get(payment_id)
            .map(Vec::len)
            .unwrap_or(0)
    }

    /// Provider calls received for a payment.
    pub async fn calls(&self, payment_id: &str) -> u64 {
        self.ledger(payment_id).await.calls_for(payment_id)
    }

    /// Adds a fault rule for payment ids starting with `prefix`.
    pub async fn fault(&self, prefix: &str, fault: &str, times: Option<u32>, latency_ms: u64) {
        let mut rule =
            serde_json::json!({"prefix": prefix, "fault": fault, "latency_ms": latency_ms});
        if let Some(t) = times {
            rule["times"] = t.into();
        }
        self.sim
            .add_faults(serde_json::json!([rule]))
            .await
            .expect("adding a fault");
    }
}

/// A valid payment body.
pub fn payment(payment_id: &str, amount: i64, payment_method: &str) -> String {
    proving::load::payment_body(payment_id, amount, payment_method)
}

/// Asserts the payment ended `COMPLETED` with exactly one charge that the record names.
pub async fn assert_charged_once(t: &TestStack, pid: &str) {
    let ledger = t.ledger(pid).await;
    let charges = ledger.charges.get(pid).cloned().unwrap_or_default();
    assert_eq!(
        charges.len(),
        1,
        "{pid}: provider booked {} charges",
        charges.len()
    );
    let r = t
        .record(pid)
        .await
        .unwrap_or_else(|| panic!("{pid}: no record"));
    assert_eq!(r.status.as_str(), "COMPLETED", "{pid}: {r:?}");
    let o = payment_core::PaymentOutcome::from_outcome(&r.outcome.expect("outcome"));
    assert_eq!(o.status, "succeeded");
    assert_eq!(
        o.provider_payment_id.as_deref(),
        Some(charges[0].id.as_str())
    );
}
