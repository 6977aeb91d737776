//! Provisioning a local endpoint from `template.yaml` itself, so local and deployed never drift.
//!
//! Reads the SAM template, creates every `AWS::SQS::Queue` (dead-letter targets first) and
//! every `AWS::DynamoDB::Table` through the official SDK clients, and resolves the function's
//! environment and its SQS event source (batch size, batching window, timeout) with the
//! intrinsic functions the template uses (`Ref`, `Fn::GetAtt`, `Fn::Sub`, short and long form).
//!
//! Why one file of ~790 lines: the template's resolver (`!Ref`, `!GetAtt`, `!Sub`, `!If`, ...)
//! and the provisioning of each resource type share one resolved state; they change together
//! when the template gains a resource type.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_yaml_ng::Value;

/// What to create, and how to bend it for a local run.
#[derive(Debug, Clone, Default)]
pub struct ProvisionOptions {
    /// Prefix of every resource name (unique per test or demo run).
    pub stack_name: String,
    /// Template parameter values (override the defaults).
    pub parameters: HashMap<String, String>,
    /// Local override of the source queues' visibility timeout, so tests do not wait minutes.
    pub visibility_timeout: Option<i32>,
    /// Local override of `maxReceiveCount` in redrive policies.
    pub max_receive_count: Option<i32>,
    /// Make every queue FIFO (with content-based deduplication), to test FIFO ordering with
    /// the same template.
    pub fifo: bool,
}

impl Stack {
    /// A variable of the function's resolved environment (`IDEMPOTENCY_TABLE`, ...).
    pub fn function_var(&self, name: &str) -> Result<&str> {
        self.function_env
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("the template gives the function no {name}"))
    }
}

/// `prefix` followed by six random hex digits: a stack name no earlier run used.
pub fn unique_stack_name(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    )
}

/// Deletes what [`provision`] created (its queues and tables), so that a long local run does
/// not leave the emulator holding every earlier run's data.
pub async fn teardown(sdk: &aws_config::SdkConfig, stack: &Stack) -> Result<()> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    for url in stack.queues.values() {
        sqs.delete_queue()
            .queue_url(url)
            .send()
            .await
            .with_context(|| format!("deleting the queue {url}"))?;
    }
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    for table in stack.tables.values() {
        ddb.delete_table()
            .table_name(table)
            .send()
            .await
            .with_context(|| format!("deleting the table {table}"))?;
    }
    Ok(())
}

/// The local event-source mapping's settings, from the function's SQS event.
#[derive(Debug, Clone)]
pub struct EventSource {
    /// The source queue's URL.
    pub queue_url: String,
    /// The source queue's ARN (the records' `eventSourceARN`).
    pub queue_arn: String,
    /// `BatchSize` (default 10).
    pub batch_size: i32,
    /// `MaximumBatchingWindowInSeconds` (default 0).
    pub batching_window_seconds: i32,
    /// Function `Timeout` (default 3, as Lambda's).
    pub function_timeout_seconds: i32,
    /// `FunctionResponseTypes` includes `ReportBatchItemFailures`.
    pub report_batch_item_failures: bool,
}

/// What was created.
#[derive(Debug, Clone)]
pub struct Stack {
    /// Queue URLs by logical id.
    pub queues: BTreeMap<String, String>,
    /// Queue ARNs by logical id.
    pub queue_arns: BTreeMap<String, String>,
    /// Table names by logical id.
    pub tables: BTreeMap<String, String>,
    /// The processor function's environment, resolved (variables that reference a parameter
    /// without a value are left out).
    pub function_env: BTreeMap<String, String>,
    /// The function's SQS event source.
    pub event_source: EventSource,
    /// Every SQS-triggered function's event source by logical id (the processor's is also
    /// [`Stack::event_source`]).
    pub event_sources: BTreeMap<String, EventSource>,
    /// Every function's environment by logical id (the API's and the relay's too), resolved.
    pub function_envs: BTreeMap<String, BTreeMap<String, String>>,
    /// What provisioning did to each resource: `created`, `exists` or `updated`, by name.
    pub report: Vec<(String, &'static str)>,
}

impl Stack {
    /// A variable of another function's environment (`PaymentsApiFunction`, ...).
    pub fn var_of(&self, function: &str, name: &str) -> Result<&str> {
        self.function_envs
            .get(function)
            .with_context(|| format!("the template has no function {function}"))?
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("the template gives {function} no {name}"))
    }

    /// The payments table (the API's rows and outbox), by its logical id.
    pub fn payments_table(&self) -> Result<&str> {
        self.tables
            .get("PaymentsTable")
            .map(String::as_str)
            .context("the template has no PaymentsTable")
    }
}

fn tag_name(tag: &serde_yaml_ng::value::Tag) -> String {
    tag.to_string().trim_start_matches('!').to_owned()
}

/// Splits an intrinsic function (short tag or long `Fn::X` / `Ref` map) into name and argument.
fn intrinsic(v: &Value) -> Option<(String, &Value)> {
    match v {
        Value::Tagged(t) => {
            let name = tag_name(&t.tag);
            let name = if name == "Ref" {
                name
            } else {
                format!("Fn::{name}")
            };
            Some((name, &t.value))
        }
        Value::Mapping(m) if m.len() == 1 => {
            let (k, arg) = m.iter().next()?;
            let k = k.as_str()?;
            (k == "Ref" || k.starts_with("Fn::")).then(|| (k.to_owned(), arg))
        }
        _ => None,
    }
}

/// Resolves template values against what exists so far.
struct Resolver<'a> {
    stack_name: &'a str,
    region: String,
    /// The caller's account, read from the first queue's ARN (the endpoint's own).
    account: Option<String>,
    parameters: HashMap<String, String>,
    refs: HashMap<String, String>,
    attrs: HashMap<String, String>,
}

impl Resolver<'_> {
    fn resolve(&self, v: &Value) -> Result<Option<String>> {
        if let Some((f, arg)) = intrinsic(v) {
            return match f.as_str() {
                "Ref" => {
                    let name = arg.as_str().ok_or_else(|| anyhow!("Ref needs a name"))?;
                    Ok(self.lookup(name))
                }
                "Fn::GetAtt" => {
                    let path = match arg {
                        Value::String(s) => s.clone(),
                        Value::Sequence(parts) => parts
                            .iter()
                            .filter_map(|p| p.as_str())
                            .collect::<Vec<_>>()
                            .join("."),
                        _ => bail!("Fn::GetAtt needs Resource.Attribute"),
                    };
                    Ok(self.attrs.get(&path).cloned())
                }
                "Fn::Sub" => {
                    let template = match arg {
                        Value::String(s) => s.clone(),
                        Value::Sequence(p) => p
                            .first()
                            .and_then(|s| s.as_str())
                            .map(str::to_owned)
                            .ok_or_else(|| anyhow!("Fn::Sub needs a string"))?,
                        _ => bail!("Fn::Sub needs a string"),
                    };
                    self.substitute(&template)
                }
                other => bail!("intrinsic function {other} is not supported locally"),
            };
        }
        Ok(match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        })
    }

    fn lookup(&self, name: &str) -> Option<String> {
        match name {
            "AWS::StackName" => Some(self.stack_name.to_owned()),
            "AWS::Region" => Some(self.region.clone()),
            "AWS::AccountId" => self.account.clone(),
            "AWS::Partition" => Some("aws".to_owned()),
            "AWS::URLSuffix" => Some("amazonaws.com".to_owned()),
            _ => self
                .parameters
                .get(name)
                .or_else(|| self.refs.get(name))
                .cloned(),
        }
    }

    fn substitute(&self, template: &str) -> Result<Option<String>> {
        let mut out = String::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .ok_or_else(|| anyhow!("unclosed ${{ in Fn::Sub"))?;
            let name = &rest[start + 2..start + end];
            let value = if name.contains('.') && !name.starts_with("AWS::") {
                self.attrs.get(name).cloned()
            } else {
                self.lookup(name)
            };
            match value {
                Some(v) => out.push_str(&v),
                None => return Ok(None),
            }
            rest = &rest[start + end + 1..];
        }
        out.push_str(rest);
        Ok(Some(out))
    }

    fn int(&self, v: Option<&Value>) -> Result<Option<i64>> {
        match v {
            None => Ok(None),
            Some(v) => match self.resolve(v)? {
                Some(s) => Ok(Some(
                    s.parse()
                        .with_context(|| format!("expected a number, got {s}"))?,
                )),
                None => Ok(None),
            },
        }
    }
}

fn get<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.as_mapping().and_then(|m| m.get(key))
}

fn local_name(stack: &str, logical: &str, fifo: bool) -> String {
    let mut name: String = format!("{stack}-{logical}")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(if fifo { 75 } else { 80 })
        .collect();
    if fifo {
        name.push_str(".fifo");
    }
    name
}

/// The payment processor's logical id in the template.
pub const PROCESSOR: &str = "PaymentProcessorFunction";

/// The refund processor's logical id in the template.
pub const REFUND_PROCESSOR: &str = "RefundProcessorFunction";

/// A function's memory size in MB as the template gives it (its own `MemorySize`, else the
/// `Globals`', else Lambda's default of 128).
pub fn memory_size_mb(template_path: &Path, function: &str) -> Result<u64> {
    let text = std::fs::read_to_string(template_path)
        .with_context(|| format!("reading {}", template_path.display()))?;
    let doc: Value = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("parsing {}", template_path.display()))?;
    let own = get(&doc, "Resources")
        .and_then(|r| get(r, function))
        .with_context(|| format!("the template has no {function}"))
        .map(|f| get(f, "Properties").and_then(|p| get(p, "MemorySize")))?;
    let global = get(&doc, "Globals")
        .and_then(|g| get(g, "Function"))
        .and_then(|f| get(f, "MemorySize"));
    match own.or(global) {
        None => Ok(128),
        Some(v) => v
            .as_u64()
            .with_context(|| format!("{function}'s MemorySize is not a number of MB")),
    }
}

/// Creates the template's queues and tables on the endpoint of `sdk` and resolves every
/// function's environment and every SQS event source (the payment processor's first).
pub async fn provision(
    sdk: &aws_config::SdkConfig,
    template_path: &Path,
    opts: &ProvisionOptions,
) -> Result<Stack> {
    let text = std::fs::read_to_string(template_path)
        .with_context(|| format!("reading {}", template_path.display()))?;
    let doc: Value = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("parsing {}", template_path.display()))?;
    let resources = get(&doc, "Resources")
        .and_then(|r| r.as_mapping())
        .ok_or_else(|| anyhow!("template has no Resources"))?;

    let mut parameters = HashMap::new();
    if let Some(ps) = get(&doc, "Parameters").and_then(|p| p.as_mapping()) {
        for (k, v) in ps {
            if let (Some(k), Some(d)) = (k.as_str(), get(v, "Default")) {
                let d = match d {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => continue,
                };
                parameters.insert(k.to_owned(), d);
            }
        }
    }
    parameters.extend(opts.parameters.clone());
    let mut r = Resolver {
        stack_name: &opts.stack_name,
        region: sdk
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "us-east-1".into()),
        parameters,
        account: None,
        refs: HashMap::new(),
        attrs: HashMap::new(),
    };

    let sqs = aws_sdk_sqs::Client::new(sdk);
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let mut stack = Stack {
        queues: BTreeMap::new(),
        queue_arns: BTreeMap::new(),
        tables: BTreeMap::new(),
        function_env: BTreeMap::new(),
        function_envs: BTreeMap::new(),
        event_sources: BTreeMap::new(),
        report: Vec::new(),
        event_source: EventSource {
            queue_url: String::new(),
            queue_arn: String::new(),
            batch_size: 10,
            batching_window_seconds: 0,
            function_timeout_seconds: 3,
            report_batch_item_failures: false,
        },
    };

    // Queues: create those whose references resolve, until all exist (DLQs come first).
    let mut pending: Vec<(&str, &Value)> = resources
        .iter()
        .filter(|(_, v)| get(v, "Type").and_then(|t| t.as_str()) == Some("AWS::SQS::Queue"))
        .filter_map(|(k, v)| Some((k.as_str()?, v)))
        .collect();
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
            let fifo = opts.fifo
                || get(&props, "FifoQueue")
                    .map(|v| r.resolve(v))
                    .transpose()?
                    .flatten()
                    .as_deref()
                    == Some("true");
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
                if let Some(v) = get(&props, prop)
                    .map(|v| r.resolve(v))
                    .transpose()?
                    .flatten()
                {
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
            let (url, done) =
                ensure_queue(&sqs, &crate::operate::endpoint(sdk), &name, attributes).await?;
            stack.report.push((format!("queue {name}"), done));
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

    for (logical, res) in resources {
        let (Some(logical), Some("AWS::DynamoDB::Table")) =
            (logical.as_str(), get(res, "Type").and_then(|t| t.as_str()))
        else {
            continue;
        };
        let props = get(res, "Properties").cloned().unwrap_or(Value::Null);
        let name = local_name(&opts.stack_name, logical, false);
        let stream_view = get(&props, "StreamSpecification")
            .and_then(|v| get(v, "StreamViewType"))
            .and_then(|v| v.as_str());
        let existing = match ddb.describe_table().table_name(&name).send().await {
            Ok(d) => d.table().cloned(),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                None
            }
            Err(e) => {
                return Err(anyhow!(crate::operate::explain(
                    &e,
                    &format!("table {name}"),
                    &crate::operate::endpoint(sdk)
                )))
            }
        };
        let mut req = ddb
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest);
        for ad in get(&props, "AttributeDefinitions")
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
        {
            let n = get(ad, "AttributeName")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            let t = get(ad, "AttributeType")
                .and_then(|v| v.as_str())
                .unwrap_or("S");
            req = req.attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(n)
                    .attribute_type(ScalarAttributeType::from(t))
                    .build()?,
            );
        }
        for ks in get(&props, "KeySchema")
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
        {
            let n = get(ks, "AttributeName")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            let t = get(ks, "KeyType")
                .and_then(|v| v.as_str())
                .unwrap_or("HASH");
            req = req.key_schema(
                KeySchemaElement::builder()
                    .attribute_name(n)
                    .key_type(KeyType::from(t))
                    .build()?,
            );
        }
        if let Some(view) = stream_view {
            req = req.stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::from(view))
                    .build()?,
            );
        }
        let table = match existing {
            Some(t) => {
                // An existing table: its stream is switched on if the template wants one.
                let has_stream = t.stream_specification().is_some_and(|s| s.stream_enabled());
                match (stream_view, has_stream) {
                    (Some(view), false) => {
                        let updated = ddb
                            .update_table()
                            .table_name(&name)
                            .stream_specification(
                                StreamSpecification::builder()
                                    .stream_enabled(true)
                                    .stream_view_type(StreamViewType::from(view))
                                    .build()?,
                            )
                            .send()
                            .await
                            .with_context(|| format!("enabling the stream of table {name}"))?;
                        stack.report.push((format!("table {name}"), "updated"));
                        updated.table_description().cloned().unwrap_or(t)
                    }
                    _ => {
                        stack.report.push((format!("table {name}"), "exists"));
                        t
                    }
                }
            }
            None => {
                let created = req
                    .send()
                    .await
                    .with_context(|| format!("creating table {name}"))?;
                stack.report.push((format!("table {name}"), "created"));
                created
                    .table_description()
                    .cloned()
                    .ok_or_else(|| anyhow!("no description of the new table {name}"))?
            }
        };
        if let Some(arn) = table.latest_stream_arn() {
            r.attrs
                .insert(format!("{logical}.StreamArn"), arn.to_owned());
        }
        let table_arn = table.table_arn().map(str::to_owned);
        let ttl_on = ddb
            .describe_time_to_live()
            .table_name(&name)
            .send()
            .await
            .ok()
            .and_then(|d| {
                d.time_to_live_description()
                    .and_then(|t| t.time_to_live_status().cloned())
            })
            .is_some_and(|s| s.as_str() == "ENABLED" || s.as_str() == "ENABLING");
        if let (Some(ttl), false) = (get(&props, "TimeToLiveSpecification"), ttl_on) {
            let attr = get(ttl, "AttributeName")
                .and_then(|v| v.as_str())
                .unwrap_or("expires_at");
            ddb.update_time_to_live()
                .table_name(&name)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name(attr)
                        .enabled(true)
                        .build()?,
                )
                .send()
                .await
                .with_context(|| format!("enabling TTL on {name}"))?;
        }
        r.refs.insert(logical.to_owned(), name.clone());
        r.attrs.insert(
            format!("{logical}.Arn"),
            table_arn.unwrap_or_else(|| {
                format!(
                    "arn:aws:dynamodb:{}:{}:table/{name}",
                    r.region,
                    r.account.clone().unwrap_or_default()
                )
            }),
        );
        stack.tables.insert(logical.to_owned(), name);
    }

    // Every function's environment; the processor's SQS event source: a SAM `Events` entry of
    // type SQS, or an `AWS::Lambda::EventSourceMapping` whose source is a queue of the template.
    let globals = get(&doc, "Globals").and_then(|g| get(g, "Function"));
    let mut mappings: BTreeMap<String, Value> = BTreeMap::new();
    for (_, res) in resources {
        if get(res, "Type").and_then(|t| t.as_str()) != Some("AWS::Lambda::EventSourceMapping") {
            continue;
        }
        let props = get(res, "Properties").cloned().unwrap_or(Value::Null);
        let function = get(&props, "FunctionName")
            .and_then(intrinsic)
            .filter(|(f, _)| f == "Ref")
            .and_then(|(_, arg)| arg.as_str().map(str::to_owned));
        let source = get(&props, "EventSourceArn")
            .map(|v| r.resolve(v))
            .transpose()?
            .flatten();
        if let (Some(function), Some(source)) = (function, source) {
            if stack.queue_arns.values().any(|a| *a == source) {
                mappings.insert(function, props);
            }
        }
    }
    let mut processor_found = false;
    for (logical, res) in resources {
        if get(res, "Type").and_then(|t| t.as_str()) != Some("AWS::Serverless::Function") {
            continue;
        }
        let props = get(res, "Properties").cloned().unwrap_or(Value::Null);
        let mut env = BTreeMap::new();
        let vars = get(&props, "Environment")
            .and_then(|e| get(e, "Variables"))
            .and_then(|v| v.as_mapping());
        for (k, v) in vars.into_iter().flatten() {
            if let (Some(k), Some(v)) = (k.as_str(), r.resolve(v)?) {
                env.insert(k.to_owned(), v);
            }
        }
        if let Some(logical) = logical.as_str() {
            stack.function_envs.insert(logical.to_owned(), env.clone());
        }
        let sam_event = get(&props, "Events")
            .and_then(|e| e.as_mapping())
            .and_then(|m| {
                m.values()
                    .find(|e| get(e, "Type").and_then(|t| t.as_str()) == Some("SQS"))
            })
            .map(|event| get(event, "Properties").cloned().unwrap_or(Value::Null));
        let Some(ep) =
            sam_event.or_else(|| logical.as_str().and_then(|l| mappings.get(l)).cloned())
        else {
            continue;
        };
        let queue_arn = get(&ep, "Queue")
            .or_else(|| get(&ep, "EventSourceArn"))
            .map(|v| r.resolve(v))
            .transpose()?
            .flatten()
            .ok_or_else(|| anyhow!("SQS event without a resolvable Queue"))?;
        let queue_url = stack
            .queue_arns
            .iter()
            .find(|(_, a)| **a == queue_arn)
            .and_then(|(l, _)| stack.queues.get(l))
            .cloned()
            .ok_or_else(|| anyhow!("the SQS event's queue is not in the template"))?;
        let timeout = r
            .int(get(&props, "Timeout").or_else(|| globals.and_then(|g| get(g, "Timeout"))))?
            .unwrap_or(3);
        let source = EventSource {
            queue_url,
            queue_arn,
            batch_size: r.int(get(&ep, "BatchSize"))?.unwrap_or(10) as i32,
            batching_window_seconds: r
                .int(get(&ep, "MaximumBatchingWindowInSeconds"))?
                .unwrap_or(0) as i32,
            function_timeout_seconds: timeout as i32,
            report_batch_item_failures: get(&ep, "FunctionResponseTypes")
                .and_then(|v| v.as_sequence())
                .is_some_and(|s| {
                    s.iter()
                        .any(|t| t.as_str() == Some("ReportBatchItemFailures"))
                }),
        };
        // The function must know the visibility it heartbeats with: follow a local override.
        if let (Some(vt), Some(logical)) = (opts.visibility_timeout, logical.as_str()) {
            if let Some(v) = stack
                .function_envs
                .get_mut(logical)
                .and_then(|e| e.get_mut("QUEUE_VISIBILITY_TIMEOUT_SECONDS"))
            {
                *v = vt.to_string();
            }
        }
        let logical = logical.as_str().unwrap_or_default().to_owned();
        // The payment processor's is the stack's main one; else the first.
        if !processor_found || logical == PROCESSOR {
            stack.event_source = source.clone();
            stack.function_env = stack
                .function_envs
                .get(&logical)
                .cloned()
                .unwrap_or_default();
            processor_found = true;
        }
        stack.event_sources.insert(logical, source);
    }
    if processor_found {
        return Ok(stack);
    }
    bail!("the template has no AWS::Serverless::Function with an SQS event or event source mapping")
}

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
            return Err(anyhow!(crate::operate::explain(
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
