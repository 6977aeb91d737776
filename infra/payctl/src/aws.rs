//! Reaching the stack's resources: where the SDK's calls go, what an SDK error means for the
//! resource an operator named (one line with the fix, instead of an SDK error dump), and the
//! start-up checks of the commands that need a table or a queue.

use anyhow::{bail, Context, Result};
use aws_sdk_sqs::types::QueueAttributeName;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

/// The services payctl calls and the SDK's standard variable that sends one elsewhere.
const SERVICE_ENDPOINTS: [(&str, &str); 5] = [
    ("SQS", "AWS_ENDPOINT_URL_SQS"),
    ("DynamoDB", "AWS_ENDPOINT_URL_DYNAMODB"),
    ("DynamoDB Streams", "AWS_ENDPOINT_URL_DYNAMODB_STREAMS"),
    ("CloudWatch", "AWS_ENDPOINT_URL_CLOUDWATCH"),
    ("CloudFormation", "AWS_ENDPOINT_URL_CLOUDFORMATION"),
];

/// Where the SDK sends its calls, for messages: `AWS_ENDPOINT_URL`, or AWS and the region;
/// and each service a per-service variable sends elsewhere (`AWS_ENDPOINT_URL_SQS`, ...), so
/// that a split stack (SQS on LocalStack, DynamoDB on ministack) says which serves which.
pub fn endpoint(sdk: &aws_config::SdkConfig) -> String {
    let base = std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| {
        format!(
            "AWS ({})",
            sdk.region()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "no region set".into())
        )
    });
    let own: Vec<String> = SERVICE_ENDPOINTS
        .iter()
        .filter_map(|(service, var)| {
            std::env::var(var)
                .ok()
                .filter(|u| !u.trim().is_empty())
                .map(|u| format!("{service} at {u}"))
        })
        .collect();
    if own.is_empty() {
        base
    } else {
        format!("{base} ({})", own.join(", "))
    }
}

/// An SDK error as an `anyhow` error with its whole cause chain in one line (what the service
/// answered, or why nothing was answered).
pub fn failed<E: std::error::Error>(e: E) -> anyhow::Error {
    anyhow::anyhow!(
        "{}",
        aws_smithy_types::error::display::DisplayErrorContext(&e)
    )
}

/// One line for an SDK error about `resource`: what is wrong and what to do, never the SDK's
/// debug dump.
pub fn explain<E, R>(e: &SdkError<E, R>, resource: &str, endpoint: &str) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let message = e.message().unwrap_or_default();
    match e.code() {
        Some("ResourceNotFoundException")
        | Some("AWS.SimpleQueueService.NonExistentQueue")
        | Some("QueueDoesNotExist") => format!(
            "{resource} does not exist at {endpoint}: create it (payctl provision locally, sam deploy on AWS) or fix the name"
        ),
        Some(
            code @ ("AccessDeniedException" | "AccessDenied" | "UnrecognizedClientException"
            | "InvalidClientTokenId" | "ExpiredTokenException"),
        ) => format!(
            "{resource}: access refused by {endpoint} ({code}: {message}): check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID) and their IAM policy"
        ),
        Some(code) => format!("{resource}: {code} from {endpoint}: {message}"),
        None => {
            let chain = aws_sdk_sqs::error::DisplayErrorContext(e).to_string();
            let lower = chain.to_lowercase();
            if lower.contains("credential") || lower.contains("imds") {
                format!(
                    "{resource}: no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE; for a local emulator also AWS_ENDPOINT_URL (the local scripts write all of them to .local/env)"
                )
            } else if lower.contains("connection refused")
                || lower.contains("dns error")
                || lower.contains("timed out")
                || lower.contains("timeout")
            {
                format!(
                    "{resource}: {endpoint} does not answer: is the emulator running, and is AWS_ENDPOINT_URL right?"
                )
            } else {
                format!("{resource}: the call to {endpoint} failed: {e}")
            }
        }
    }
}

/// Fails with one line naming the table (as `resource` describes it) and the fix when it
/// cannot be described.
pub async fn check_table(sdk: &aws_config::SdkConfig, table: &str, resource: &str) -> Result<()> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    check(sdk, resource, || {
        ddb.describe_table().table_name(table).send()
    })
    .await
}

/// Fails with one line naming the queue (as `resource` describes it) and the fix when its
/// attributes cannot be read.
pub async fn check_queue(sdk: &aws_config::SdkConfig, url: &str, resource: &str) -> Result<()> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    check(sdk, resource, || {
        sqs.get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
    })
    .await
}

/// Tries of a start-up check after a passing failure (a few seconds in all): the endpoint
/// that does not answer at all is reported after them.
const CHECK_TRIES: u32 = 4;

/// A start-up check: `call` tried again after a passing failure (throttled, `5xx`, a
/// timeout), up to [`CHECK_TRIES`] times; any other failure, or the last, explained in one line.
async fn check<T, E, Fut>(
    sdk: &aws_config::SdkConfig,
    resource: &str,
    call: impl Fn() -> Fut,
) -> Result<()>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    Fut: std::future::Future<
        Output = Result<T, SdkError<E, aws_sdk_sqs::config::http::HttpResponse>>,
    >,
{
    let mut backoff = lambda_local::faults::Backoff::default();
    loop {
        match call().await {
            Ok(_) => return Ok(()),
            Err(e) if lambda_local::faults::passing(&e) && backoff.failures() < CHECK_TRIES => {
                tokio::time::sleep(backoff.wait()).await
            }
            Err(e) => bail!(explain(&e, resource, &endpoint(sdk))),
        }
    }
}

/// Fails fast, naming the variable and the fix, when the processor's table or queues cannot be
/// reached: `DescribeTable` and `GetQueueAttributes` before the first message is received.
pub async fn check_processor_resources(
    sdk: &aws_config::SdkConfig,
    table: &str,
    queue_url: &str,
    dlq_url: &str,
) -> Result<()> {
    check_table(
        sdk,
        table,
        &format!("the idempotency table {table} (IDEMPOTENCY_TABLE)"),
    )
    .await?;
    check_queue(
        sdk,
        queue_url,
        &format!("the payments queue {queue_url} (PAYMENTS_QUEUE_URL)"),
    )
    .await?;
    check_queue(
        sdk,
        dlq_url,
        &format!("the dead-letter queue {dlq_url} (DEAD_LETTER_QUEUE_URL)"),
    )
    .await?;
    Ok(())
}

/// The SDK configuration of a command: the default chain (environment, `AWS_ENDPOINT_URL`,
/// profile files), with `--region` and `--profile` when given.
pub async fn sdk_config(region: Option<String>, profile: Option<String>) -> aws_config::SdkConfig {
    // Every attempt ends: a connection that goes silent (a laptop asleep, an emulator wedged)
    // is a timeout to ride out or report, never a command that hangs. The longest call payctl
    // makes, a receive, waits 1 s for messages.
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .operation_attempt_timeout(std::time::Duration::from_secs(30))
        .build();
    let mut loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).timeout_config(timeouts);
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    if let Some(profile) = profile {
        loader = loader.profile_name(profile);
    }
    loader.load().await
}

/// Refuses `--profile` while `AWS_ENDPOINT_URL` is set: the variable wins over every profile's
/// endpoint, so the command would reach the variable's endpoint, not the profile's account.
/// A `--region` there is kept, with a note that it applies to that endpoint.
pub fn check_explicit(profile: Option<&str>, region: Option<&str>) -> Result<()> {
    let Ok(url) = std::env::var("AWS_ENDPOINT_URL") else {
        return Ok(());
    };
    if let Some(p) = profile {
        bail!("--profile {p} is given, but AWS_ENDPOINT_URL={url} is set and wins over any profile: unset AWS_ENDPOINT_URL (use a shell that did not source .local/env) to reach the profile's account, or drop --profile for the local endpoint");
    }
    if let Some(r) = region {
        crate::say!("payctl: --region {r} applies to AWS_ENDPOINT_URL={url}");
    }
    Ok(())
}

/// Says on stderr where a command that writes is about to write: `what`, the endpoint, and the
/// account of the credentials (STS `GetCallerIdentity`; "unknown" when it does not answer).
pub async fn announce(sdk: &aws_config::SdkConfig, what: &str) {
    let account = account(sdk)
        .await
        .unwrap_or_else(|_| "unknown (GetCallerIdentity did not answer)".to_owned());
    crate::say!("payctl: {what} on {}, account {account}", endpoint(sdk));
}

/// The account of the credentials (STS `GetCallerIdentity`, waiting at most 5 s).
pub async fn account(sdk: &aws_config::SdkConfig) -> Result<String> {
    let sts = aws_sdk_sts::Client::new(sdk);
    let id = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        sts.get_caller_identity().send(),
    )
    .await
    .context("GetCallerIdentity did not answer in 5 s")?
    .map_err(|e| {
        anyhow::anyhow!(
            "GetCallerIdentity: {}",
            aws_sdk_sts::error::DisplayErrorContext(&e)
        )
    })?;
    Ok(id.account().unwrap_or("unknown").to_owned())
}
