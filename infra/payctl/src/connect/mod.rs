//! `payctl connect`: a deployed stack joined to the provider, after its deploy.
//!
//! The webhook's signing secret exists only once the endpoint is registered at Stripe, and the
//! endpoint's URL only once the stack is deployed: the stack is deployed with a placeholder in
//! its `WebhookSecretArn` secret, then this registers the endpoint at the stack's
//! `ProviderEventsUrl` (the inbox's event types, the stack's pinned API version), writes the
//! endpoint's secret into that secret, and sends a signed test event through the deployed route
//! to the inbox. For EventBridge delivery it checks the partner event source, the bus and the
//! rule instead.
//!
//! Safe to run again, and after a crash at any point: the endpoint whose secret the stack holds
//! is known by a fingerprint of that secret in the endpoint's metadata (a truncated SHA-256:
//! nothing a reader could sign with). Any other endpoint of the stack's (at its URL, or marked
//! with its name), or one rendering events in another version, is replaced: a new one is
//! registered and its secret stored beside those held, the others are deleted (with their
//! secrets), and what Stripe may not have delivered to them is queued to the inbox again. Two
//! runs at once are not safe: the last step reads everything again and fails if another run
//! changed it.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use payment_core::events::catch_up::EVENT_TYPES;
use payment_core::stripe::endpoints::{EndpointSpec, WebhookEndpoint};
use payment_core::stripe::StripeClient;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use crate::deployed::Deployed;

mod partner;
mod test_event;
pub use partner::check_partner_bus;
use test_event::{send_test_event, wait_applied};

/// The endpoint's metadata key naming its stack (for a person reading the Dashboard).
pub const STACK_KEY: &str = "stack";
/// The endpoint's metadata key holding its stack's CloudFormation id (account, region, name
/// and creation: a stack of the same name elsewhere on the same Stripe account is another).
pub const STACK_ID_KEY: &str = "stack_id";
/// The endpoint's metadata key holding its secret's fingerprint.
pub const FINGERPRINT_KEY: &str = "signing_secret_sha256";
/// How long Stripe retries a delivery: what a replaced endpoint may not have delivered is at
/// most this old.
pub const STRIPE_RETRIES_S: i64 = 3 * 86_400;

/// What `connect` is given beyond the stack.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The secret holding the key to register the endpoint with (`None`: the stack's own key):
    /// the functions' restricted key then needs no Webhook Endpoints write.
    pub key_secret_arn: Option<String>,
    /// How long to wait for the test event's record in the inbox (zero: not waited for).
    pub wait: Duration,
    /// Register a new endpoint even when the stack's is fine (rotating its signing secret);
    /// the old one is deleted as any replaced one is.
    pub replace: bool,
}

/// A secret's fingerprint: the first 16 hex digits of its SHA-256.
pub fn fingerprint(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))[..16].to_owned()
}

/// Connects `stack` to the provider (see the module's docs).
pub async fn connect(
    sdk: &aws_config::SdkConfig,
    stack: &Deployed,
    opts: &ConnectOptions,
) -> Result<()> {
    let (webhook, eventbridge) = stack.delivery();
    if eventbridge {
        println!("{}", check_partner_bus(sdk, stack).await?);
    }
    if webhook {
        let client = stack.provider(sdk, opts.key_secret_arn.as_deref()).await?;
        let url = stack.output("ProviderEventsUrl")?.to_owned();
        if !url.starts_with("https://") {
            crate::say!("payctl connect: {url} is not HTTPS: Stripe sends live-mode events only to HTTPS URLs");
        }
        let secret = register(sdk, stack, &client, &url, opts.replace).await?;
        let event_id = send_test_event(&url, &secret, client.api_version()).await?;
        if opts.wait.is_zero() {
            println!("test event {event_id}: accepted by {url}");
        } else {
            let table = stack.output("IdempotencyTableName")?;
            wait_applied(sdk, table, &event_id, opts.wait).await?;
            println!(
                "test event {event_id}: accepted by {url} and recorded by the inbox in {table}"
            );
        }
    }
    println!("connected: stack {}", stack.name);
    Ok(())
}

/// The stack's secret: its `whsec_` values.
pub async fn stored_secrets(sm: &aws_sdk_secretsmanager::Client, arn: &str) -> Result<Vec<String>> {
    let got = sm
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(crate::aws::failed)
        .with_context(|| format!("reading the webhook's secret {arn} (the stack's WebhookSecretArn): create it before the deploy, holding a placeholder"))?;
    // Read as the receiver reads it; a placeholder is no secret.
    Ok(
        payment_core::stripe::webhook::SignatureCheck::parse_secrets(
            got.secret_string().unwrap_or_default(),
        )
        .iter()
        .map(|s| s.expose_secret().to_owned())
        .filter(|s| s.starts_with("whsec_"))
        .collect(),
    )
}

async fn put_secrets(
    sm: &aws_sdk_secretsmanager::Client,
    arn: &str,
    secrets: &[String],
) -> Result<()> {
    sm.put_secret_value()
        .secret_id(arn)
        .secret_string(secrets.join(","))
        .send()
        .await
        .map_err(crate::aws::failed)
        .with_context(|| {
            format!("writing the signing secret into {arn} (the stack's WebhookSecretArn)")
        })?;
    Ok(())
}

fn key(stack: &Deployed, what: &str) -> String {
    format!("connect:{}:{what}", stack.name)
}

/// The stored secret the endpoint's fingerprint names.
fn held_secret(e: &WebhookEndpoint, stored: &[String]) -> Option<String> {
    let f = e.metadata.get(FINGERPRINT_KEY)?;
    stored.iter().find(|s| &fingerprint(s) == f).cloned()
}

/// The endpoint at `url` whose secret the stack holds, registered or brought up to date; every
/// other endpoint of the stack's deleted. Returns the secret.
async fn register(
    sdk: &aws_config::SdkConfig,
    stack: &Deployed,
    client: &StripeClient,
    url: &str,
    replace: bool,
) -> Result<String> {
    let arn = stack
        .param("WebhookSecretArn")
        .with_context(|| format!("stack {} has no WebhookSecretArn parameter", stack.name))?;
    let sm = aws_sdk_secretsmanager::Client::new(sdk);
    let stored = stored_secrets(&sm, arn).await?;
    let version = client.api_version().to_owned();
    let listed = client
        .webhook_endpoints()
        .await
        .context("listing the account's webhook endpoints")?;
    // The stack's: at its URL, or registered for it before (at a URL it had then).
    let ours: Vec<&WebhookEndpoint> = listed
        .iter()
        .filter(|e| e.is_at(url) || e.metadata.get(STACK_ID_KEY) == Some(&stack.id))
        .collect();
    let held = ours
        .iter()
        .filter(|e| !replace && e.is_at(url) && e.api_version.as_deref() == Some(version.as_str()))
        .find_map(|e| Some((e, held_secret(e, &stored)?)));
    let needed: Vec<String> = EVENT_TYPES.iter().map(|t| (*t).to_owned()).collect();
    let (kept, secret) = match held {
        Some((e, secret)) => {
            let missing = e.missing_types();
            let sent_all = missing.is_empty();
            if !sent_all || e.status != "enabled" {
                let mut events: Vec<String> = e.enabled_events.clone();
                events.extend(missing.iter().map(|t| (*t).to_owned()));
                let update_key = key(
                    stack,
                    &format!("update:{}:{}", e.id, uuid::Uuid::new_v4().simple()),
                );
                client
                    .update_webhook_endpoint(
                        &update_key,
                        &e.id,
                        (!sent_all).then_some(&events[..]),
                        &[],
                    )
                    .await
                    .with_context(|| format!("updating webhook endpoint {}", e.id))?;
                println!(
                    "webhook endpoint {} at {url}: enabled, sent the inbox's {} event types",
                    e.id,
                    needed.len()
                );
            } else {
                println!("webhook endpoint {} at {url}: registered already, sent the inbox's event types, version {version}", e.id);
            }
            (e.id.clone(), secret)
        }
        None => {
            let spec = EndpointSpec {
                url: url.to_owned(),
                events: needed.clone(),
                api_version: version.clone(),
                description: format!("payments stack {} (payctl connect)", stack.name),
                metadata: vec![
                    (STACK_KEY.to_owned(), stack.name.clone()),
                    (STACK_ID_KEY.to_owned(), stack.id.clone()),
                ],
            };
            // One key per request and state of the account (a run that stopped after Stripe
            // registered the endpoint finds it listed next time, so its key differs).
            let mut replaced: Vec<&str> = ours.iter().map(|e| e.id.as_str()).collect();
            replaced.sort_unstable();
            let seed = format!(
                "{url}|{version}|{}|{}",
                needed.join(","),
                replaced.join(",")
            );
            let mut create_key = key(stack, &format!("create:{}", fingerprint(&seed)));
            let (mut made, mut secret) = client
                .create_webhook_endpoint(&create_key, &spec)
                .await
                .context("registering the webhook endpoint")?;
            if !client
                .webhook_endpoints()
                .await?
                .iter()
                .any(|e| e.id == made.id)
            {
                // A replay of an endpoint deleted since: register another.
                create_key = format!("{create_key}:{}", uuid::Uuid::new_v4().simple());
                (made, secret) = client
                    .create_webhook_endpoint(&create_key, &spec)
                    .await
                    .context("registering the webhook endpoint")?;
            }
            let secret = secret.expose_secret().to_owned();
            // Marked before it is stored: a run stopped in between leaves an endpoint whose
            // secret is not held (replaced next time), never a held secret no endpoint names.
            let mark = vec![(FINGERPRINT_KEY.to_owned(), fingerprint(&secret))];
            client
                .update_webhook_endpoint(
                    &key(stack, &format!("mark:{}", made.id)),
                    &made.id,
                    None,
                    &mark,
                )
                .await
                .with_context(|| {
                    format!(
                        "marking webhook endpoint {} with its secret's fingerprint",
                        made.id
                    )
                })?;
            // The new secret first, the ones held after it: deliveries of the endpoints being
            // replaced still verify until they are deleted.
            let mut both = vec![secret.clone()];
            both.extend(stored.iter().filter(|s| **s != secret).cloned());
            put_secrets(&sm, arn, &both).await?;
            println!(
                "webhook endpoint {} at {url}: registered, sent the inbox's {} event types in version {version}; its signing secret is in {arn}",
                made.id,
                needed.len()
            );
            (made.id, secret)
        }
    };
    let replaced: Vec<&&WebhookEndpoint> = ours.iter().filter(|e| e.id != kept).collect();
    if !replaced.is_empty() {
        // Stripe stops retrying a deleted endpoint's deliveries: what it may not have
        // delivered (at most its three days of retries old) is queued to the inbox first,
        // which applies each event once; the kept endpoint is sent everything made since it
        // was registered or enabled. A run stopped after this queues it again.
        let now = sqs_once::runner::now_ms() / 1000;
        let oldest = replaced.iter().map(|e| e.created).min().unwrap_or(now);
        let since = oldest.max(now - STRIPE_RETRIES_S);
        requeue(sdk, stack, client, since, now).await?;
    }
    for e in &replaced {
        client
            .delete_webhook_endpoint(&e.id)
            .await
            .with_context(|| format!("deleting webhook endpoint {} (replaced by {kept})", e.id))?;
        let why = if replace {
            "payctl connect --replace".to_owned()
        } else if !e.is_at(url) {
            format!("it is at {}, not the stack's URL", e.url)
        } else if e.api_version.as_deref() != Some(version.as_str()) {
            format!(
                "its version {} is not the stack's {version}",
                e.api_version
                    .as_deref()
                    .unwrap_or("(the account's default)")
            )
        } else {
            "the stack does not hold its secret".to_owned()
        };
        println!(
            "webhook endpoint {} at {}: deleted, replaced by {kept} ({why})",
            e.id, e.url
        );
    }
    // The secrets of what was deleted go; the kept endpoint's, and any other held (one added
    // by hand: a secret rolled in Stripe's Dashboard), stay.
    let gone: Vec<&String> = replaced
        .iter()
        .filter_map(|e| e.metadata.get(FINGERPRINT_KEY))
        .collect();
    let now_stored = stored_secrets(&sm, arn).await?;
    let keep: Vec<String> = now_stored
        .iter()
        .filter(|s| **s == secret || !gone.contains(&&fingerprint(s)))
        .cloned()
        .collect();
    if keep != now_stored {
        put_secrets(&sm, arn, &keep).await?;
    }
    // Another run at the same time could have deleted the kept endpoint or written its own
    // secret last: read both back.
    let after = client.webhook_endpoints().await?;
    let kept_now = after.iter().find(|e| e.id == kept);
    let stored_now = stored_secrets(&sm, arn).await?;
    let fit = kept_now.is_some_and(|e| {
        e.status == "enabled"
            && e.is_at(url)
            && e.api_version.as_deref() == Some(version.as_str())
            && e.missing_types().is_empty()
            && held_secret(e, &stored_now).as_deref() == Some(secret.as_str())
    });
    if !fit {
        bail!("webhook endpoint {kept} or the stack's secret changed while this ran (another payctl connect at the same time?): run payctl connect again, alone");
    }
    Ok(secret)
}

/// Queues the provider's events made in `[since, until]` (Unix seconds) to the stack's inbox.
async fn requeue(
    sdk: &aws_config::SdkConfig,
    stack: &Deployed,
    client: &StripeClient,
    since: i64,
    until: i64,
) -> Result<()> {
    let queue_url = stack.output("ProviderEventsQueueUrl")?;
    let mut queue = payment_core::events::queue::SqsEventQueue::new(
        aws_sdk_sqs::Client::new(sdk),
        queue_url.to_owned(),
    );
    if let Ok(dlq) = stack.output("ProviderEventsDeadLetterQueueUrl") {
        queue = queue.with_dead_letters(dlq.to_owned());
    }
    let report = payment_core::events::catch_up::catch_up(client, &queue, since, until)
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("queueing the events since {} that the replaced endpoints may not have delivered: run payctl events catch-up --since {since}", crate::time::utc(since * 1000)))?;
    println!(
        "queued {} events made since {} to the inbox: those the replaced endpoints may not have delivered (each is applied once)",
        report.queued,
        crate::time::utc(report.since_s * 1000)
    );
    Ok(())
}
