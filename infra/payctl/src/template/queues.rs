//! The template's `AWS::SQS::Queue`s: created, or found and brought to the template's
//! attributes, dead-letter targets first.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_yaml_ng::{Mapping, Value};

use super::resolve::{get, of_type, Resolver};
use super::{local_name, missing, ProvisionOptions, Stack};

/// Creates (or updates) every queue whose references resolve, until all exist.
pub(super) async fn create(
    sqs: &aws_sdk_sqs::Client,
    sdk: &aws_config::SdkConfig,
    opts: &ProvisionOptions,
    r: &mut Resolver<'_>,
    stack: &mut Stack,
    resources: &Mapping,
) -> Result<()> {
    // Queues: create those whose references resolve, until all exist (DLQs come first).
    let mut pending = of_type(resources, "AWS::SQS::Queue");
    while !pending.is_empty() {
        let before = pending.len();
        let mut still = Vec::new();
        for (logical, res) in pending {
            let props = get(res, "Properties").cloned().unwrap_or(Value::Null);
            let mut attributes = HashMap::new();
            let mut ready = true;
            if let Some(rp) = get(&props, "RedrivePolicy") {
                match get(rp, "deadLetterTargetArn")
                    .map(|v| r.resolve(v))
                    .transpose()?
                {
                    Some(Some(arn)) => {
                        let max = match opts.max_receive_count {
                            Some(m) => m as i64,
                            None => r.int(get(rp, "maxReceiveCount"))?.unwrap_or(5),
                        };
                        attributes.insert(
                            QueueAttributeName::RedrivePolicy,
                            serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": max})
                                .to_string(),
                        );
                    }
                    _ => ready = false,
                }
            }
            if !ready {
                still.push((logical, res));
                continue;
            }
            let fifo = opts.fifo || r.string(get(&props, "FifoQueue"))?.as_deref() == Some("true");
            let simple = [
                ("VisibilityTimeout", QueueAttributeName::VisibilityTimeout),
                (
                    "MessageRetentionPeriod",
                    QueueAttributeName::MessageRetentionPeriod,
                ),
                ("DelaySeconds", QueueAttributeName::DelaySeconds),
                ("MaximumMessageSize", QueueAttributeName::MaximumMessageSize),
                (
                    "ReceiveMessageWaitTimeSeconds",
                    QueueAttributeName::ReceiveMessageWaitTimeSeconds,
                ),
                (
                    "ContentBasedDeduplication",
                    QueueAttributeName::ContentBasedDeduplication,
                ),
                ("KmsMasterKeyId", QueueAttributeName::KmsMasterKeyId),
            ];
            for (prop, attr) in simple {
                if let Some(v) = r.string(get(&props, prop))? {
                    attributes.insert(attr, v);
                }
            }
            if fifo {
                attributes.insert(QueueAttributeName::FifoQueue, "true".into());
                if opts.fifo {
                    attributes.insert(QueueAttributeName::ContentBasedDeduplication, "true".into());
                }
            }
            if let (Some(vt), true) = (
                opts.visibility_timeout,
                attributes.contains_key(&QueueAttributeName::RedrivePolicy),
            ) {
                attributes.insert(QueueAttributeName::VisibilityTimeout, vt.to_string());
            }
            let name = local_name(&opts.stack_name, logical, fifo);
            let url = if opts.read_only {
                let url = find_queue(sqs, sdk, &opts.stack_name, &name).await?;
                stack.report.push((format!("queue {name}"), "exists"));
                url
            } else {
                let (url, done) =
                    ensure_queue(sqs, &crate::aws::endpoint(sdk), &name, attributes).await?;
                stack.report.push((format!("queue {name}"), done));
                url
            };
            let arn = sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .with_context(|| format!("reading the ARN of {name}"))?
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
                .ok_or_else(|| anyhow!("no ARN for queue {name}"))?;
            if r.account.is_none() {
                r.account = arn.split(':').nth(4).map(str::to_owned);
            }
            r.refs.insert(logical.to_owned(), url.clone());
            r.attrs.insert(format!("{logical}.Arn"), arn.clone());
            r.attrs.insert(format!("{logical}.QueueUrl"), url.clone());
            r.attrs.insert(format!("{logical}.QueueName"), name.clone());
            stack.queues.insert(logical.to_owned(), url);
            stack.queue_arns.insert(logical.to_owned(), arn);
        }
        if still.len() == before {
            bail!(
                "queues with unresolvable dead-letter targets: {:?}",
                still.iter().map(|s| s.0).collect::<Vec<_>>()
            );
        }
        pending = still;
    }
    Ok(())
}

/// The URL of an existing queue of the stack (read-only: nothing is created or changed).
async fn find_queue(
    sqs: &aws_sdk_sqs::Client,
    sdk: &aws_config::SdkConfig,
    stack_name: &str,
    name: &str,
) -> Result<String> {
    match sqs.get_queue_url().queue_name(name).send().await {
        Ok(o) => o
            .queue_url()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("no URL for queue {name}")),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_queue_does_not_exist()) =>
        {
            bail!(missing(stack_name, &format!("queue {name}")))
        }
        Err(e) => bail!(crate::aws::explain(
            &e,
            &format!("queue {name}"),
            &crate::aws::endpoint(sdk)
        )),
    }
}

/// The settings a provision was given beyond the template's defaults, kept as tags on each of
/// the stack's queues (`payctl:param:NAME`, `payctl:visibility-timeout`,
/// `payctl:max-receive-count`), so that a read of the stack (`payctl env`) resolves the same
/// function settings without being told them again. Tags of an earlier provision that this one
/// does not repeat are removed.
pub(super) async fn remember_settings(
    sqs: &aws_sdk_sqs::Client,
    opts: &ProvisionOptions,
    stack: &Stack,
) -> Result<()> {
    let mut wanted: HashMap<String, String> = opts
        .parameters
        .iter()
        .map(|(k, v)| (format!("{PARAM_TAG}{k}"), v.clone()))
        .collect();
    if let Some(vt) = opts.visibility_timeout {
        wanted.insert(VISIBILITY_TAG.into(), vt.to_string());
    }
    if let Some(m) = opts.max_receive_count {
        wanted.insert(MAX_RECEIVE_TAG.into(), m.to_string());
    }
    for url in stack.queues.values() {
        let current = sqs
            .list_queue_tags()
            .queue_url(url)
            .send()
            .await
            .with_context(|| format!("reading the tags of {url}"))?;
        let stale: Vec<String> = current
            .tags()
            .map(|t| {
                t.keys()
                    .filter(|k| k.starts_with("payctl:") && !wanted.contains_key(*k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if !stale.is_empty() {
            sqs.untag_queue()
                .queue_url(url)
                .set_tag_keys(Some(stale))
                .send()
                .await
                .with_context(|| format!("untagging {url}"))?;
        }
        if !wanted.is_empty() {
            sqs.tag_queue()
                .queue_url(url)
                .set_tags(Some(wanted.clone()))
                .send()
                .await
                .with_context(|| format!("tagging {url} with its provisioned settings"))?;
        }
    }
    Ok(())
}

/// The settings [`remember_settings`] kept on the stack's queue `url`, into `opts` (what `opts`
/// already says wins).
pub(super) async fn recall_settings(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    opts: &mut ProvisionOptions,
) -> Result<()> {
    let tags = sqs
        .list_queue_tags()
        .queue_url(url)
        .send()
        .await
        .with_context(|| format!("reading the tags of {url}"))?;
    for (k, v) in tags.tags().into_iter().flatten() {
        if let Some(param) = k.strip_prefix(PARAM_TAG) {
            opts.parameters
                .entry(param.to_owned())
                .or_insert_with(|| v.clone());
        } else if k == VISIBILITY_TAG && opts.visibility_timeout.is_none() {
            opts.visibility_timeout = v.parse().ok();
        } else if k == MAX_RECEIVE_TAG && opts.max_receive_count.is_none() {
            opts.max_receive_count = v.parse().ok();
        }
    }
    Ok(())
}

const PARAM_TAG: &str = "payctl:param:";
const VISIBILITY_TAG: &str = "payctl:visibility-timeout";
const MAX_RECEIVE_TAG: &str = "payctl:max-receive-count";

/// Creates a queue, or finds it and brings its attributes to what the template says: `created`,
/// `exists` (nothing differs) or `updated`.
async fn ensure_queue(
    sqs: &aws_sdk_sqs::Client,
    endpoint: &str,
    name: &str,
    attributes: HashMap<QueueAttributeName, String>,
) -> Result<(String, &'static str)> {
    let existing = match sqs.get_queue_url().queue_name(name).send().await {
        Ok(o) => o.queue_url().map(str::to_owned),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_queue_does_not_exist()) =>
        {
            None
        }
        Err(e) => {
            return Err(anyhow!(crate::aws::explain(
                &e,
                &format!("queue {name}"),
                endpoint
            )))
        }
    };
    let Some(url) = existing else {
        let url = sqs
            .create_queue()
            .queue_name(name)
            .set_attributes(Some(attributes))
            .send()
            .await
            .with_context(|| format!("creating queue {name}"))?
            .queue_url()
            .ok_or_else(|| anyhow!("no URL for queue {name}"))?
            .to_owned();
        return Ok((url, "created"));
    };
    let current = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .with_context(|| format!("reading the attributes of queue {name}"))?;
    let now = current.attributes().cloned().unwrap_or_default();
    // FifoQueue cannot change; the rest can be set in place.
    let differing: HashMap<QueueAttributeName, String> = attributes
        .into_iter()
        .filter(|(k, _)| *k != QueueAttributeName::FifoQueue)
        .filter(|(k, v)| !same_attribute(k, now.get(k), v))
        .collect();
    if differing.is_empty() {
        return Ok((url, "exists"));
    }
    sqs.set_queue_attributes()
        .queue_url(&url)
        .set_attributes(Some(differing))
        .send()
        .await
        .with_context(|| format!("updating the attributes of queue {name}"))?;
    Ok((url, "updated"))
}

/// Whether a queue attribute already has the wanted value (a redrive policy compared as JSON).
fn same_attribute(k: &QueueAttributeName, current: Option<&String>, wanted: &str) -> bool {
    match (k, current) {
        (QueueAttributeName::RedrivePolicy, Some(c)) => {
            serde_json::from_str::<serde_json::Value>(c).ok()
                == serde_json::from_str::<serde_json::Value>(wanted).ok()
        }
        (_, Some(c)) => c == wanted,
        (_, None) => false,
    }
}
