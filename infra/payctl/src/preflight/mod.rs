//! `payctl preflight`: what a live account needs before traffic, read without changing
//! anything: the region of what the stack reads, the Lambda concurrency quota, the provider key's
//! mode and each permission the code uses, the account's API version beside the pinned one, the
//! alarm topic and who it reaches, and the webhook endpoint (or the partner bus). Each finding
//! names its fix.

use anyhow::{Context, Result};
use payment_core::stripe::permissions::probes;
use secrecy::ExposeSecret;
use serde_json::Value;

use crate::connect::{fingerprint, FINGERPRINT_KEY};
use crate::deployed::Deployed;

mod findings;
pub use findings::*;
use findings::{bad, ok};

/// Runs every check of `stack`; `live`: the key's mode wanted.
pub async fn run(
    sdk: &aws_config::SdkConfig,
    stack: &Deployed,
    live: Option<bool>,
) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    let region_name = sdk.region().map(|r| r.to_string()).unwrap_or_default();
    let arns: Vec<(&str, &str)> = [
        (
            "PaymentApiKeySecretArn",
            stack.param("PaymentApiKeySecretArn"),
        ),
        ("WebhookSecretArn", stack.param("WebhookSecretArn")),
        ("AlarmTopicArn", stack.param("AlarmTopicArn")),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    out.push(region(&region_name, &arns));

    let settings = aws_sdk_lambda::Client::new(sdk)
        .get_account_settings()
        .send()
        .await
        .map_err(crate::aws::failed)
        .context("reading the account's Lambda settings")?;
    let limit = settings
        .account_limit()
        .map(|l| i64::from(l.concurrent_executions()))
        .unwrap_or_default();
    out.push(quota(limit, reserved_by(stack)));

    let key = stack.provider_key(sdk, None).await?;
    out.push(key_mode(key.expose_secret(), live));
    let client = stack.client(key)?;
    let (webhook, eventbridge) = stack.delivery();
    // What the functions' key must do (payctl connect may register the endpoint with another:
    // --key-secret-arn).
    let mut newest_version = None;
    for p in probes(&["processors"]) {
        let key = format!("preflight:{}", uuid::Uuid::new_v4().simple());
        out.push(match client.probe(&p, &key).await {
            Ok((status, body)) => {
                if p.resource == "events" && status == 200 {
                    newest_version = serde_json::from_str::<Value>(&body)
                        .ok()
                        .and_then(|v| v["data"][0]["api_version"].as_str().map(str::to_owned));
                }
                permission(p.resource, p.access, status, &body)
            }
            Err(e) => bad(
                "permission",
                format!("{} {}: no answer ({e})", p.method, p.path),
                "check PaymentApiUrl and the network, then run preflight again",
            ),
        });
    }
    out.push(version(client.api_version(), newest_version.as_deref()));

    // A check that cannot read what it needs is a finding too: the others still print.
    let unread = |check: &'static str, e: anyhow::Error| {
        bad(check, format!("could not read it: {e:#}"), "give this shell's credentials the read (or fix what the error names) and run preflight again")
    };
    out.push(
        live_versions(sdk, stack)
            .await
            .unwrap_or_else(|e| unread("versions", e)),
    );
    out.push(
        alarm_topic(sdk, stack)
            .await
            .unwrap_or_else(|e| unread("alarms", e)),
    );
    if webhook {
        out.push(
            endpoint(sdk, stack, &client)
                .await
                .unwrap_or_else(|e| unread("events", e)),
        );
    }
    if eventbridge {
        out.push(match crate::connect::check_partner_bus(sdk, stack).await {
            Ok(said) => ok("events", said),
            Err(e) => bad("events", format!("{e:#}"), "create the EventBridge destination in Stripe for this account and region, then deploy the stack with its StripeEventSourceName"),
        });
    }
    Ok(out)
}

/// Each function's `live` alias against what the stack deployed: the version CloudFormation
/// published and the configuration the function holds ($LATEST, which the last deploy wrote).
async fn live_versions(sdk: &aws_config::SdkConfig, stack: &Deployed) -> Result<Finding> {
    use aws_sdk_lambda::operation::get_function_configuration::GetFunctionConfigurationOutput as Config;
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let settings = |c: &Config| {
        let mut out: Vec<(String, String)> = c
            .environment()
            .and_then(|e| e.variables())
            .map(|v| v.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        for (k, v) in [
            ("CodeSha256", format!("{:?}", c.code_sha256())),
            ("Runtime", format!("{:?}", c.runtime())),
            ("Handler", format!("{:?}", c.handler())),
            ("Timeout", format!("{:?}", c.timeout())),
            ("MemorySize", format!("{:?}", c.memory_size())),
            ("Architectures", format!("{:?}", c.architectures())),
            ("KMSKeyArn", format!("{:?}", c.kms_key_arn())),
            (
                "TracingConfig",
                format!("{:?}", c.tracing_config().map(|t| t.mode())),
            ),
            (
                "Layers",
                format!(
                    "{:?}",
                    c.layers().iter().map(|l| l.arn()).collect::<Vec<_>>()
                ),
            ),
        ] {
            out.push((k.to_owned(), v));
        }
        out.sort();
        out
    };
    let mut resources = stack.all_resources(sdk).await?;
    // The stack's versions are qualified ARNs: ...:function:<name>:<version>.
    let deployed: std::collections::HashMap<String, String> = resources
        .remove("AWS::Lambda::Version")
        .unwrap_or_default()
        .iter()
        .filter_map(|arn| {
            let (function, version) = arn.rsplit_once(':')?;
            Some((function.rsplit(':').next()?.to_owned(), version.to_owned()))
        })
        .collect();
    let config = |name: &str, qualifier: Option<String>| {
        let read = lambda
            .get_function_configuration()
            .function_name(name)
            .set_qualifier(qualifier.clone())
            .send();
        let what = format!(
            "reading {name}'s configuration ({})",
            qualifier.as_deref().unwrap_or("$LATEST")
        );
        async move { read.await.map_err(crate::aws::failed).context(what) }
    };
    let mut functions = Vec::new();
    for name in resources
        .remove("AWS::Lambda::Function")
        .unwrap_or_default()
    {
        let latest = config(&name, None).await?;
        let alias = match lambda
            .get_alias()
            .function_name(&name)
            .name(LIVE_ALIAS)
            .send()
            .await
        {
            Ok(a) => a,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                functions.push(LiveVersion {
                    name,
                    ..Default::default()
                });
                continue;
            }
            Err(e) => {
                return Err(crate::aws::failed(e))
                    .with_context(|| format!("reading {name}'s {LIVE_ALIAS} alias"))
            }
        };
        let version = alias.function_version().map(str::to_owned);
        let live = config(&name, version.clone()).await?;
        // Without kms:Decrypt on the functions' key Lambda returns the environment's error
        // in place of its variables; both sides would then read as empty and equal.
        let unreadable = [&latest, &live].iter().find_map(|c| {
            let e = c.environment()?.error()?;
            Some(format!(
                "its environment could not be read ({}: {})",
                e.error_code().unwrap_or("error"),
                e.message().unwrap_or_default()
            ))
        });
        functions.push(LiveVersion {
            unreadable,
            shifting: alias
                .routing_config()
                .and_then(|r| r.additional_version_weights())
                .and_then(|w| w.iter().next())
                .map(|(v, share)| (v.clone(), *share)),
            deployed: deployed.get(&name).cloned(),
            differs: differences(&settings(&latest), &settings(&live)),
            version,
            name,
        });
    }
    let revision = stack.param("ConfigRevision").and_then(|r| r.parse().ok());
    Ok(live_versions_finding(&functions, revision))
}

async fn alarm_topic(sdk: &aws_config::SdkConfig, stack: &Deployed) -> Result<Finding> {
    let topic = stack.output("AlarmNotificationTopicArn")?.to_owned();
    let sns = aws_sdk_sns::Client::new(sdk);
    let (mut confirmed, mut pending) = (0, 0);
    let mut next: Option<String> = None;
    loop {
        let page = sns
            .list_subscriptions_by_topic()
            .topic_arn(&topic)
            .set_next_token(next.clone())
            .send()
            .await
            .map_err(crate::aws::failed)
            .with_context(|| format!("reading the subscriptions of {topic}"))?;
        for s in page.subscriptions() {
            match s.subscription_arn().unwrap_or_default() {
                "PendingConfirmation" => pending += 1,
                "Deleted" | "" => {}
                _ => confirmed += 1,
            }
        }
        next = page.next_token().map(str::to_owned);
        if next.is_none() {
            break;
        }
    }
    // The stack's own alarms, by name from CloudFormation (a name prefix would take in a
    // stack whose name starts with this one's).
    let names = stack.resources(sdk, "AWS::CloudWatch::Alarm").await?;
    let cloudwatch = aws_sdk_cloudwatch::Client::new(sdk);
    let (all, mut notifying) = (names.len(), 0);
    for chunk in names.chunks(100) {
        let page = cloudwatch
            .describe_alarms()
            .set_alarm_names(Some(chunk.to_vec()))
            .max_records(100)
            .send()
            .await
            .map_err(crate::aws::failed)
            .context("reading the stack's alarms")?;
        notifying += page
            .metric_alarms()
            .iter()
            .filter(|a| a.alarm_actions().contains(&topic))
            .count();
    }
    Ok(alarms(&topic, confirmed, pending, notifying, all))
}

/// The stack's webhook endpoint: registered at its URL, enabled, sent every type the inbox
/// applies, and holding the secret the stack has. The version it renders events in is said,
/// never a fault: the inbox reads each object it applies at the pinned version.
async fn endpoint(
    sdk: &aws_config::SdkConfig,
    stack: &Deployed,
    client: &payment_core::stripe::StripeClient,
) -> Result<Finding> {
    let url = stack.output("ProviderEventsUrl")?;
    let listed = client
        .webhook_endpoints()
        .await
        .map_err(|e| anyhow::anyhow!("listing the webhook endpoints: {e}"))?;
    let stored = match stack.param("WebhookSecretArn") {
        Some(arn) => {
            crate::connect::stored_secrets(&aws_sdk_secretsmanager::Client::new(sdk), arn).await?
        }
        None => Vec::new(),
    };
    let fix = format!("payctl connect --stack-name {}", stack.name);
    let ours: Vec<_> = listed
        .iter()
        .filter(|e| {
            e.metadata
                .get(FINGERPRINT_KEY)
                .is_some_and(|f| stored.iter().any(|s| &fingerprint(s) == f))
        })
        .collect();
    let Some(e) = ours.first() else {
        let at_url = listed.iter().filter(|e| e.is_at(url)).count();
        return Ok(bad("events", format!("no webhook endpoint holds the stack's signing secret ({at_url} registered at {url})"), fix));
    };
    let missing = e.missing_types();
    let rendered = e
        .api_version
        .as_deref()
        .unwrap_or("the account's default version");
    let mut wrong = Vec::new();
    if !e.is_at(url) {
        wrong.push(format!(
            "it is at {}, not the stack's ProviderEventsUrl {url}, which the catch-up checks",
            e.url
        ));
    }
    if e.status != "enabled" {
        wrong.push(format!("it is {}", e.status));
    }
    if !missing.is_empty() {
        wrong.push(format!("it is not sent {}", missing.join(", ")));
    }
    Ok(if wrong.is_empty() {
        ok(
            "events",
            format!(
                "webhook endpoint {} at {}: enabled, every type (rendered in {rendered}), the stack's secret",
                e.id, e.url
            ),
        )
    } else {
        bad(
            "events",
            format!(
                "webhook endpoint {} at {}: {}",
                e.id,
                e.url,
                wrong.join("; ")
            ),
            fix,
        )
    })
}
