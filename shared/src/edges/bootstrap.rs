//! Wiring: builds the [`Processor`] with its real adapters from a [`Config`] and the SDK
//! configuration (whose endpoint comes from the standard `AWS_ENDPOINT_URL`).

use std::sync::Arc;

use secrecy::SecretString;

use crate::api::PaymentsApi;
use crate::edges::config::{
    ApiConfig, ApiKeySource, Config, ReceiverConfig, RelayConfig, SigningSecretSource,
};
use sqs_once::SqsQueues;

use crate::api::table::DynamoPayments;
use crate::payments::charge::{PaymentWork, Processor};
use crate::payments::outbox::Relay;
use crate::stripe::StripeClient;

/// Why the processor could not be built (fails the init).
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A configuration variable is missing or invalid.
    #[error(transparent)]
    Config(#[from] crate::edges::config::ConfigError),
    /// The API key could not be read from Secrets Manager.
    #[error("reading the API key from PAYMENT_API_KEY_SECRET_ARN failed: {0}")]
    Secret(String),
    /// The HTTP client could not be built.
    #[error("building the provider client failed: {0}")]
    Http(String),
    /// `SOURCE_QUEUE_URL` could not be read, or its limits do not fit the settings.
    #[error("SOURCE_QUEUE_URL: {0}")]
    SourceQueue(String),
}

/// Reads the source queue's limits (when `SOURCE_QUEUE_URL` is set) and refuses settings
/// whose retry horizon would outlive the queue's retention; the limits stay cached for the
/// queue's messages.
async fn check_source_queue(config: &Config, queues: &SqsQueues) -> Result<(), InitError> {
    let Some(url) = &config.source_queue_url else {
        return Ok(());
    };
    let (_, limits) = queues
        .limits_of_url(url)
        .await
        .map_err(|e| InitError::SourceQueue(e.to_string()))?;
    config
        .settings
        .check_queue(&limits)
        .map_err(|e| InitError::SourceQueue(e.to_string()))
}

/// Loads the SDK configuration from the standard chain (region, credentials, endpoint).
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}

/// Reads the API key once. A secret string that is a JSON object is read as `{"api_key": ..}`.
pub async fn resolve_api_key(
    source: &ApiKeySource,
    sdk: &aws_config::SdkConfig,
) -> Result<SecretString, InitError> {
    match source {
        ApiKeySource::Plain(k) => Ok(k.clone()),
        ApiKeySource::SecretArn(arn) => {
            let client = aws_sdk_secretsmanager::Client::new(sdk);
            let out = client
                .get_secret_value()
                .secret_id(arn)
                .send()
                .await
                .map_err(|e| {
                    InitError::Secret(
                        aws_sdk_secretsmanager::error::DisplayErrorContext(&e).to_string(),
                    )
                })?;
            let raw = out
                .secret_string()
                .ok_or_else(|| InitError::Secret("the secret has no string value".into()))?;
            let key = match serde_json::from_str::<serde_json::Value>(raw) {
                Ok(serde_json::Value::Object(m)) => m
                    .get("api_key")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        InitError::Secret("the JSON secret has no \"api_key\" string".into())
                    })?,
                _ => raw.trim().to_owned(),
            };
            Ok(SecretString::from(key))
        }
    }
}

/// Builds the processor with the DynamoDB, SQS and Stripe adapters.
pub async fn build_processor(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<Processor>, InitError> {
    build_processor_with(
        config,
        sdk,
        aws_sdk_dynamodb::Client::new(sdk),
        aws_sdk_sqs::Client::new(sdk),
    )
    .await
}

/// Builds the processor around given SDK clients (instrumented ones, in the benchmark).
pub async fn build_processor_with(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
) -> Result<Arc<Processor>, InitError> {
    let pace = pace_of(config);
    let provider = paced_provider(config, sdk, &pace).await?;
    let work = PaymentWork::new(Arc::new(provider), config.provider_key_retention)
        .with_refund_window(config.refund_window);
    let store = crate::payments::payment_store(dynamodb, &config.idempotency_table);
    let queues = SqsQueues::new(sqs, config.dead_letter_queue_url.clone());
    check_source_queue(config, &queues).await?;
    Ok(Arc::new(paced_runner(
        Processor::new(
            Arc::new(work),
            Arc::new(store),
            Arc::new(queues),
            config.settings.clone(),
        )
        .with_metrics(with_stack(crate::payments::charge::metric_names())),
        pace,
    )))
}

/// Builds the refund processor with the DynamoDB, SQS and Stripe adapters: the same
/// configuration as the payment processor's (its `DEAD_LETTER_QUEUE_URL` is the refunds' DLQ).
pub async fn build_refund_processor(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<crate::refunds::work::RefundProcessor>, InitError> {
    build_refund_processor_on(config, sdk, sqs_once::clock::system()).await
}

/// [`build_refund_processor`] on another clock (a compressed calendar moves it months ahead).
pub async fn build_refund_processor_on(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    clock: Arc<dyn sqs_once::clock::Clock>,
) -> Result<Arc<crate::refunds::work::RefundProcessor>, InitError> {
    config.check_read_and_write_fit_a_lease()?;
    let pace = pace_of(config);
    let provider = paced_provider(config, sdk, &pace).await?;
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    let ledger = crate::refunds::ledger::DynamoRefundLedger::new(
        dynamodb.clone(),
        &config.idempotency_table,
    )
    .with_payments_table(config.payments_table.clone());
    let work = crate::refunds::work::RefundWork::new(
        Arc::new(provider),
        Arc::new(ledger),
        config.provider_key_retention,
    )
    .with_refund_window(config.refund_window)
    .with_payment_record_ttl(config.settings.record_ttl)
    .with_clock(Arc::clone(&clock));
    let store = crate::refunds::refund_store(dynamodb, &config.idempotency_table)
        .with_clock(Arc::clone(&clock));
    let queues = SqsQueues::new(
        aws_sdk_sqs::Client::new(sdk),
        config.dead_letter_queue_url.clone(),
    );
    check_source_queue(config, &queues).await?;
    Ok(Arc::new(paced_runner(
        crate::refunds::work::RefundProcessor::new(
            Arc::new(work),
            Arc::new(store),
            Arc::new(queues),
            config.settings.clone(),
        )
        .with_clock(clock)
        .with_metrics(with_stack(crate::refunds::work::metric_names())),
        pace,
    )))
}

/// Reads the environment and builds the refund processor: the refund function's whole init.
pub async fn refund_processor_from_env(
) -> Result<Arc<crate::refunds::work::RefundProcessor>, InitError> {
    let config = Config::from_env()?;
    let sdk = sdk_config().await;
    build_refund_processor(&config, &sdk).await
}

/// The provider client of a configuration, its API key read once.
pub async fn provider_from(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<StripeClient, InitError> {
    let key = resolve_api_key(&config.api_key, sdk).await?;
    StripeClient::new(
        &config.payment_api_url,
        key,
        &config.stripe_api_version,
        config.provider_timeout,
    )
    .map_err(|e| InitError::Http(e.to_string()))
}

/// The process's request pace of a configuration (`PROVIDER_REQUESTS_PER_SECOND`), shared by
/// its runner and its provider client; `None` unpaced.
pub fn pace_of(config: &Config) -> Option<Arc<sqs_once::pace::Pace>> {
    config
        .provider_pace
        .map(|rate| Arc::new(sqs_once::pace::Pace::new(rate)))
}

/// The provider client of a configuration, paced with `pace` when given.
async fn paced_provider(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    pace: &Option<Arc<sqs_once::pace::Pace>>,
) -> Result<StripeClient, InitError> {
    let client = provider_from(config, sdk).await?;
    Ok(match pace {
        Some(p) => client.with_pace(Arc::clone(p)),
        None => client,
    })
}

/// A runner paced with `pace` when given.
fn paced_runner<W: sqs_once::Work>(
    runner: sqs_once::BatchRunner<W>,
    pace: Option<Arc<sqs_once::pace::Pace>>,
) -> sqs_once::BatchRunner<W> {
    match pace {
        Some(p) => runner.with_pace(p),
        None => runner,
    }
}

/// Reads the environment and builds the processor: the function's whole init.
pub async fn processor_from_env() -> Result<Arc<Processor>, InitError> {
    let config = Config::from_env()?;
    let sdk = sdk_config().await;
    build_processor(&config, &sdk).await
}

/// Builds the payments API from the environment (`PAYMENTS_TABLE`, `IDEMPOTENCY_TABLE`,
/// `IDEMPOTENCY_TTL_*`): the payments-api function's whole init.
pub async fn api_from_env() -> Result<Arc<PaymentsApi>, InitError> {
    let config = ApiConfig::from_lookup(|k| std::env::var(k).ok())?;
    let sdk = sdk_config().await;
    Ok(Arc::new(build_api(
        &config,
        aws_sdk_dynamodb::Client::new(&sdk),
    )))
}

/// The payments API over the DynamoDB tables of a configuration.
pub fn build_api(config: &ApiConfig, dynamodb: aws_sdk_dynamodb::Client) -> PaymentsApi {
    build_api_on(config, dynamodb, sqs_once::clock::system())
}

/// [`build_api`] on another clock (the whole-system simulator's).
pub fn build_api_on(
    config: &ApiConfig,
    dynamodb: aws_sdk_dynamodb::Client,
    clock: Arc<dyn sqs_once::clock::Clock>,
) -> PaymentsApi {
    let store = DynamoPayments::new(
        dynamodb,
        config.payments_table.clone(),
        config.idempotency_table.clone(),
    );
    PaymentsApi::new(Arc::new(store), clock, config.retention).with_contract(config.contract)
}

/// Builds the outbox relay from the environment (`PAYMENTS_TABLE`, `PAYMENTS_QUEUE_URL`,
/// `FIFO_GROUP_BY`): the outbox-relay function's whole init.
pub async fn relay_from_env() -> Result<Arc<Relay>, InitError> {
    let config = RelayConfig::from_lookup(|k| std::env::var(k).ok())?;
    let sdk = sdk_config().await;
    Ok(Arc::new(build_relay(&config, &sdk)))
}

/// The outbox relay of a configuration.
pub fn build_relay(config: &RelayConfig, sdk: &aws_config::SdkConfig) -> Relay {
    let relay = Relay::new(
        aws_sdk_sqs::Client::new(sdk),
        config.queue_url.clone(),
        config.group_by,
    );
    match &config.idempotency_table {
        Some(table) => relay.with_marks(
            Arc::new(crate::payments::payment_store(
                aws_sdk_dynamodb::Client::new(sdk),
                table,
            )),
            sqs_once::clock::system(),
        ),
        None => relay,
    }
}

/// Builds the events inbox with the DynamoDB, SQS and Stripe adapters: the processor's
/// configuration (its `DEAD_LETTER_QUEUE_URL` is the events' DLQ).
pub async fn build_event_processor(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<crate::events::inbox::EventProcessor>, InitError> {
    build_event_processor_on(config, sdk, sqs_once::clock::system()).await
}

/// [`build_event_processor`] on another clock (a compressed calendar moves it months ahead).
pub async fn build_event_processor_on(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    clock: Arc<dyn sqs_once::clock::Clock>,
) -> Result<Arc<crate::events::inbox::EventProcessor>, InitError> {
    let pace = pace_of(config);
    let provider = paced_provider(config, sdk, &pace).await?;
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    let settlements = crate::events::settlement::DynamoSettlements::new(
        dynamodb.clone(),
        &config.idempotency_table,
    );
    let mut work = crate::events::inbox::EventWork::new(
        Arc::new(settlements),
        Arc::new(provider),
        config.refund_window,
    )
    .with_clock(Arc::clone(&clock));
    if let Some(held) = held_refunds(config, sdk, Arc::clone(&clock)) {
        work = work.with_held_refunds(held);
    }
    let store = crate::events::event_store(dynamodb, &config.idempotency_table);
    let queues = SqsQueues::new(
        aws_sdk_sqs::Client::new(sdk),
        config.dead_letter_queue_url.clone(),
    );
    check_source_queue(config, &queues).await?;
    Ok(Arc::new(paced_runner(
        crate::events::inbox::EventProcessor::new(
            Arc::new(work),
            Arc::new(store),
            Arc::new(queues),
            config.settings.clone(),
        )
        .with_clock(clock)
        .with_metrics(with_stack(crate::events::inbox::metric_names())),
        pace,
    )))
}

/// The refunds payments hold until they settle, resumed into `REFUNDS_QUEUE_URL` (`None`
/// without it).
fn held_refunds(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    clock: Arc<dyn sqs_once::clock::Clock>,
) -> Option<Arc<crate::refunds::held::HeldRefunds>> {
    let url = config.refunds_queue_url.as_ref()?;
    let queue = crate::refunds::queue::SqsRefundQueue::new(aws_sdk_sqs::Client::new(sdk), url);
    Some(Arc::new(
        crate::refunds::held::HeldRefunds::new(
            aws_sdk_dynamodb::Client::new(sdk),
            &config.idempotency_table,
            Arc::new(queue),
            config.refund_window,
        )
        .with_clock(clock),
    ))
}

/// The scheduled catch-up of a configuration (`None` without `PROVIDER_EVENTS_QUEUE_URL`).
pub async fn build_catch_up(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<Option<crate::events::catch_up::ScheduledCatchUp>, InitError> {
    let Some(url) = &config.provider_events_queue_url else {
        return Ok(None);
    };
    // Its own pace at the function's share: a run is one invocation at a time, a catch-up run
    // and a batch never share an instance (Lambda runs one invocation at a time), and its
    // pages come one after another (docs/events.md, "The catch-up's capacity").
    let pace = config
        .catch_up_pace
        .map(|rate| Arc::new(sqs_once::pace::Pace::new(rate)));
    let client = paced_provider(config, sdk, &pace).await?;
    Ok(Some(crate::events::catch_up::ScheduledCatchUp {
        lister: Arc::new(crate::stripe::objects::EventListing::new(
            client,
            config.provider_events_url.clone(),
        )),
        lists: config.catch_up_lists,
        queue: Arc::new(
            crate::events::queue::SqsEventQueue::new(aws_sdk_sqs::Client::new(sdk), url.clone())
                .with_dead_letters(config.dead_letter_queue_url.clone()),
        ),
        checkpoint: crate::events::catch_up::Checkpoint::new(
            aws_sdk_dynamodb::Client::new(sdk),
            &config.idempotency_table,
        ),
        held: held_refunds(config, sdk, sqs_once::clock::system())
            .map(|h| (h, config.held_refund_horizon)),
        clock: sqs_once::clock::system(),
    }))
}

/// The event function's parts: the inbox and, with `PROVIDER_EVENTS_QUEUE_URL`, its
/// scheduled catch-up.
pub type EventFunction = (
    Arc<crate::events::inbox::EventProcessor>,
    Option<crate::events::catch_up::ScheduledCatchUp>,
);

/// Reads the environment and builds the events inbox and its scheduled catch-up: the event
/// function's whole init.
pub async fn event_processor_from_env() -> Result<EventFunction, InitError> {
    let config = Config::from_env()?;
    let sdk = sdk_config().await;
    Ok((
        build_event_processor(&config, &sdk).await?,
        build_catch_up(&config, &sdk).await?,
    ))
}

/// The provider-events receiver of a configuration.
pub fn build_receiver(
    config: &ReceiverConfig,
    sdk: &aws_config::SdkConfig,
) -> crate::stripe::receiver::EventReceiver {
    use crate::events::queue::SqsEventQueue;
    use crate::stripe::receiver::{FixedSecrets, SecretsManagerSecrets};
    let secrets: Arc<dyn crate::stripe::receiver::SigningSecrets> = match &config.secret {
        SigningSecretSource::SecretArn(arn) => Arc::new(SecretsManagerSecrets::new(
            aws_sdk_secretsmanager::Client::new(sdk),
            arn.clone(),
        )),
        SigningSecretSource::Plain(text) => Arc::new(FixedSecrets(
            crate::stripe::webhook::SignatureCheck::parse_secrets(text),
        )),
    };
    crate::stripe::receiver::EventReceiver::new(
        secrets,
        Arc::new(SqsEventQueue::new(
            aws_sdk_sqs::Client::new(sdk),
            config.queue_url.clone(),
        )),
        config.tolerance_s,
    )
}

/// Reads the environment (`PROVIDER_EVENTS_QUEUE_URL`, `WEBHOOK_SECRET_ARN`,
/// `WEBHOOK_TOLERANCE_SECONDS`) and builds the receiver: the provider-events function's init.
pub async fn receiver_from_env() -> Result<Arc<crate::stripe::receiver::EventReceiver>, InitError> {
    let config = ReceiverConfig::from_lookup(|k| std::env::var(k).ok())?;
    let sdk = sdk_config().await;
    Ok(Arc::new(build_receiver(&config, &sdk)))
}

/// A work's metric names with this process's own dimensions ahead of `Service` (the stack's
/// name, from `STACK_NAME`: [`crate::telemetry::dimensions`]).
fn with_stack(names: sqs_once::metrics::MetricNames) -> sqs_once::metrics::MetricNames {
    sqs_once::metrics::MetricNames {
        dimensions: crate::telemetry::dimensions().to_vec(),
        ..names
    }
}
