//! `payctl connect`: a deployed stack joined to the provider, after its deploy.
//!
//! The webhook's signing secret exists only once the endpoint is registered at Stripe, and the
//! endpoint's URL only once the stack is deployed: the stack is deployed with a placeholder in
//! its `WebhookSecretArn` secret, then this registers the endpoint (the inbox's event types,
//! the stack's pinned API version), writes the endpoint's secret into that secret, and sends a
//! signed test event through the deployed route to the inbox. For EventBridge delivery it checks
//! the partner event source, the bus and the rule instead.
//!
//! Safe to run again, and after a crash at any point: the endpoint whose secret the stack holds
//! is known by a fingerprint of that secret in the endpoint's metadata (a truncated SHA-256:
//! nothing a reader could sign with). An endpoint at the stack's URL without it, or rendering
//! events in another version, is replaced: a new one is registered, the secret holds both
//! secrets while the old one is deleted, then the new one alone.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use payment_core::events::catch_up::EVENT_TYPES;
use payment_core::stripe::endpoints::{EndpointSpec, WebhookEndpoint};
use payment_core::stripe::StripeClient;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use crate::deployed::Deployed;

/// The endpoint's metadata key naming its stack.
pub const STACK_KEY: &str = "stack";
/// The endpoint's metadata key holding its secret's fingerprint.
pub const FINGERPRINT_KEY: &str = "signing_secret_sha256";

/// What `connect` is given beyond the stack.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The URL Stripe is to call, when it is not the stack's `ProviderEventsUrl` (a custom
    /// domain in front of the API).
    pub url: Option<String>,
    /// How long to wait for the test event's record in the inbox (zero: not waited for).
    pub wait: Duration,
}

/// A secret's fingerprint: the first 16 hex digits of its SHA-256.
pub fn fingerprint(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))[..16].to_owned()
}

fn same_url(a: &str, b: &str) -> bool {
    let bare = |u: &str| u.trim().trim_end_matches('/').to_ascii_lowercase();
    bare(a) == bare(b)
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
        let client = stack.provider(sdk).await?;
        let url = match &opts.url {
            Some(u) => u.clone(),
            None => stack.output("ProviderEventsUrl")?.to_owned(),
        };
        if !url.starts_with("https://") {
            crate::say!("payctl connect: {url} is not HTTPS: Stripe sends live-mode events only to HTTPS URLs");
        }
        let secret = register(sdk, stack, &client, &url).await?;
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
    Ok(got
        .secret_string()
        .unwrap_or_default()
        .split([',', '\n'])
        .map(str::trim)
        .filter(|s| s.starts_with("whsec_"))
        .map(str::to_owned)
        .collect())
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

/// The endpoint at `url` whose secret the stack holds, registered or brought up to date;
/// every other endpoint at `url` deleted. Returns the secret.
async fn register(
    sdk: &aws_config::SdkConfig,
    stack: &Deployed,
    client: &StripeClient,
    url: &str,
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
    let ours: Vec<&WebhookEndpoint> = listed.iter().filter(|e| same_url(&e.url, url)).collect();
    let held_secret = |e: &WebhookEndpoint| {
        let f = e.metadata.get(FINGERPRINT_KEY)?;
        stored.iter().find(|s| &fingerprint(s) == f).cloned()
    };
    let held = ours
        .iter()
        .find(|e| e.api_version.as_deref() == Some(version.as_str()) && held_secret(e).is_some());
    let needed: Vec<String> = EVENT_TYPES.iter().map(|t| (*t).to_owned()).collect();
    let (kept, secret) = match held {
        Some(e) => {
            let secret = held_secret(e).expect("found above");
            let sent_all = e.enabled_events.iter().any(|t| t == "*")
                || needed.iter().all(|t| e.enabled_events.contains(t));
            if !sent_all || e.status != "enabled" {
                let mut events: Vec<String> = e.enabled_events.clone();
                events.extend(
                    needed
                        .iter()
                        .filter(|t| !e.enabled_events.contains(t))
                        .cloned(),
                );
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
                metadata: vec![(STACK_KEY.to_owned(), stack.name.clone())],
            };
            // One key per state of the account: a crash after Stripe registered the endpoint
            // and before its secret was stored is answered again, secret and all, by the next run
            // (within Stripe's 24 h).
            let mut replaced: Vec<&str> = ours.iter().map(|e| e.id.as_str()).collect();
            replaced.sort_unstable();
            let seed = format!("{url}|{version}|{}", replaced.join(","));
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
            // The new secret first, the ones held after it: deliveries of the endpoints being
            // replaced still verify until they are deleted.
            let mut both = vec![secret.clone()];
            both.extend(stored.iter().filter(|s| **s != secret).cloned());
            put_secrets(&sm, arn, &both).await?;
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
            println!(
                "webhook endpoint {} at {url}: registered, sent the inbox's {} event types in version {version}; its signing secret is in {arn}",
                made.id,
                needed.len()
            );
            (made.id, secret)
        }
    };
    for e in ours.iter().filter(|e| e.id != kept) {
        client
            .delete_webhook_endpoint(&e.id)
            .await
            .with_context(|| format!("deleting webhook endpoint {} (replaced by {kept})", e.id))?;
        let why = if e.api_version.as_deref() != Some(version.as_str()) {
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
            "webhook endpoint {} at {url}: deleted, replaced by {kept} ({why})",
            e.id
        );
    }
    if stored != [secret.clone()] {
        put_secrets(&sm, arn, std::slice::from_ref(&secret)).await?;
    }
    Ok(secret)
}

/// Posts a signed test event (a `payment_intent.canceled` of no payment of this system's: the
/// inbox records it `foreign` and changes nothing) to `url` until it is accepted: the receiver
/// reads a changed secret again at most every 30 s after a mismatch. Returns its id.
async fn send_test_event(url: &str, secret: &str, version: &str) -> Result<String> {
    let id = format!("evt_connect_{}", uuid::Uuid::new_v4().simple());
    let now = sqs_once::runner::now_ms() / 1000;
    let body = serde_json::json!({
        "id": id, "object": "event", "api_version": version, "created": now, "livemode": false,
        "pending_webhooks": 1, "request": {"id": null, "idempotency_key": null},
        "type": "payment_intent.canceled",
        "data": {"object": {"id": format!("pi_connect_{}", uuid::Uuid::new_v4().simple()),
                            "object": "payment_intent", "status": "canceled", "metadata": {}}},
    })
    .to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(75);
    loop {
        let t = sqs_once::runner::now_ms() / 1000;
        let header = payment_core::stripe::webhook::sign(&[secret], t, body.as_bytes());
        let answer = http
            .post(url)
            .header("Content-Type", "application/json; charset=utf-8")
            .header("Stripe-Signature", header)
            .body(body.clone())
            .send()
            .await;
        let why = match answer {
            Ok(r) if r.status().is_success() => return Ok(id),
            Ok(r) => format!(
                "HTTP {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => e.without_url().to_string(),
        };
        if Instant::now() >= deadline {
            bail!("the stack's events route {url} refused a test event signed with the stored secret ({why}): is the stack deployed and its ProviderEventsFunction healthy? (its logs say why)");
        }
        crate::say!("payctl connect: test event not accepted yet ({why}); the route reads a new secret within 30 s, trying again");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Waits until the inbox has completed event `id`'s record.
async fn wait_applied(
    sdk: &aws_config::SdkConfig,
    table: &str,
    id: &str,
    wait: Duration,
) -> Result<()> {
    use sqs_once::record::{IdempotencyStore, RecordStatus};
    let store = payment_core::events::event_store(aws_sdk_dynamodb::Client::new(sdk), table);
    let deadline = Instant::now() + wait;
    loop {
        let record = store
            .get(id)
            .await
            .map_err(|e| anyhow::anyhow!("reading {id} from {table}: {e}"))?;
        if record
            .as_ref()
            .is_some_and(|r| r.status == RecordStatus::Completed)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the test event {id} was accepted but the inbox has not recorded it in {table} within {} s: look at the provider-events queue and the event processor's logs",
                wait.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// EventBridge delivery: the partner event source is active, the stack's bus is on it, and a
/// rule sends to the provider-events queue. Says so in a line.
pub async fn check_partner_bus(sdk: &aws_config::SdkConfig, stack: &Deployed) -> Result<String> {
    let source = stack.param("StripeEventSourceName").with_context(|| {
        format!(
            "stack {} receives events through EventBridge but has no StripeEventSourceName",
            stack.name
        )
    })?;
    let eb = aws_sdk_eventbridge::Client::new(sdk);
    let described = eb
        .describe_event_source()
        .name(source)
        .send()
        .await
        .map_err(crate::aws::failed)
        .with_context(|| format!("reading the partner event source {source}: create the EventBridge event destination in Stripe's Dashboard for this account and region first"))?;
    let state = described
        .state()
        .map(|s| s.as_str().to_owned())
        .unwrap_or_default();
    if !state.is_empty() && state != "ACTIVE" {
        bail!("the partner event source {source} is {state}: associate it with an event bus (the stack's StripeEventBus does, once deployed) and make sure Stripe's event destination is enabled");
    }
    let bus = stack.output("StripeEventBusName")?;
    eb.describe_event_bus()
        .name(bus)
        .send()
        .await
        .map_err(crate::aws::failed)
        .with_context(|| format!("reading the stack's partner bus {bus}"))?;
    let queue_url = stack.output("ProviderEventsQueueUrl")?;
    let queue_arn = aws_sdk_sqs::Client::new(sdk)
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(crate::aws::failed)?
        .attributes()
        .and_then(|a| {
            a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn)
                .cloned()
        })
        .unwrap_or_default();
    let rules = eb
        .list_rules()
        .event_bus_name(bus)
        .send()
        .await
        .map_err(crate::aws::failed)?;
    let mut routed = false;
    for rule in rules.rules() {
        let enabled = rule.state().is_some_and(|s| s.as_str() == "ENABLED");
        let Some(name) = rule.name() else { continue };
        let targets = eb
            .list_targets_by_rule()
            .rule(name)
            .event_bus_name(bus)
            .send()
            .await
            .map_err(crate::aws::failed)?;
        if enabled && targets.targets().iter().any(|t| t.arn() == queue_arn) {
            routed = true;
        }
    }
    if !routed {
        bail!("no enabled rule on {bus} sends to the provider-events queue {queue_arn}: deploy the stack again (its StripeEventsRule does)");
    }
    Ok(format!(
        "partner event source {source}: {}, on bus {bus}, routed to the provider-events queue",
        if state.is_empty() { "found" } else { "ACTIVE" }
    ))
}
