//! Provisioning a local endpoint from `template.yaml` itself, so local and deployed never drift.
//!
//! Reads the SAM template, keeps the resources of the shape its parameters choose (their
//! `Condition`s evaluated), creates every `AWS::SQS::Queue` (dead-letter targets first), every
//! `AWS::DynamoDB::Table` and the EventBridge partner bus with its rule (when the shape has
//! one) through the official SDK clients, and resolves the function's
//! environment and its SQS event source (batch size, batching window, timeout) with the
//! intrinsic functions the template uses (`Ref`, `Fn::GetAtt`, `Fn::Sub`, short and long form).
//!
//! The template's intrinsic functions are resolved in `resolve`; each resource type is
//! provisioned in its own module (`queues`, `tables`), and the functions' environments and
//! event sources are read in `functions`, all against one `Resolver` that learns
//! each resource's name and ARN as it is created.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_yaml_ng::Value;

mod conditions;
mod events;
mod functions;
mod queues;
mod resolve;
mod tables;

use resolve::{get, Resolver};

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
    /// Only read the stack (`payctl env`): find every resource, change none, and take the
    /// settings an earlier provision was given from the tags it left on the queues. A missing
    /// resource is an error that names `payctl provision`.
    pub read_only: bool,
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
    if let Some(route) = &stack.event_bridge {
        events::teardown(&aws_sdk_eventbridge::Client::new(sdk), route).await?;
    }
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

/// A function's DynamoDB stream event source (the outbox relay's), as the template declares it.
#[derive(Debug, Clone)]
pub struct StreamSource {
    /// The table whose stream it reads.
    pub table: String,
    /// `BatchSize` (default 100).
    pub batch_size: i32,
    /// `MaximumBatchingWindowInSeconds` (default 0).
    pub batching_window_seconds: i32,
    /// Function `Timeout` (default 3).
    pub function_timeout_seconds: i32,
    /// `MaximumRetryAttempts` (-1, the default, retries until the record expires).
    pub maximum_retry_attempts: i32,
    /// `MaximumRecordAgeInSeconds` (-1, the default: the stream's 24 hours).
    pub maximum_record_age_seconds: i32,
    /// `BisectBatchOnFunctionError`.
    pub bisect_on_error: bool,
    /// `FunctionResponseTypes` includes `ReportBatchItemFailures`.
    pub report_batch_item_failures: bool,
    /// `FilterCriteria`'s patterns, as JSON text (a record passes if one matches).
    pub filters: Vec<String>,
    /// The on-failure destination's queue URL, if it is a queue of the template.
    pub on_failure_queue_url: Option<String>,
}

/// Stripe's events through EventBridge in a local stack: the bus and rule created, by name.
#[derive(Debug, Clone)]
pub struct EventBridgeRoute {
    /// The partner event bus (named for its source).
    pub bus: String,
    /// The rule on it.
    pub rule: String,
    /// The partner event source the bus is on.
    pub source: String,
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
    /// Every stream-triggered function's event source by logical id.
    pub stream_sources: BTreeMap<String, StreamSource>,
    /// Every function's environment by logical id (the API's and the relay's too), resolved.
    pub function_envs: BTreeMap<String, BTreeMap<String, String>>,
    /// Every function's `Timeout` in seconds (its own, else the Globals', else Lambda's 3), by
    /// logical id.
    pub function_timeouts: BTreeMap<String, i64>,
    /// What each function paces its provider calls to when deployed, by logical id: the
    /// template's `payment_core::edges::config::PACE_VARS`, resolved. They are left out of
    /// [`Stack::function_envs`] (a local process stands for every instance at once); the
    /// benchmark runs the deployed pace with one process per instance.
    pub deployed_pace: BTreeMap<String, BTreeMap<String, String>>,
    /// What provisioning did to each resource: `created`, `exists` or `updated`, by name.
    pub report: Vec<(String, &'static str)>,
    /// The partner event bus and its rule, when the shape takes Stripe's events through
    /// EventBridge (`ProviderEventsDelivery` `eventbridge` or `both`).
    pub event_bridge: Option<EventBridgeRoute>,
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

    /// The payments table (the API's rows, each its own outbox entry), by its logical id.
    pub fn payments_table(&self) -> Result<&str> {
        self.tables
            .get("PaymentsTable")
            .map(String::as_str)
            .context("the template has no PaymentsTable")
    }
}

/// The error of a read of a stack that lacks `resource`.
pub(super) fn missing(stack_name: &str, resource: &str) -> String {
    format!("the stack {stack_name} has no {resource}: create it with payctl provision --stack-name {stack_name} (reading a stack never creates anything)")
}

pub(super) fn local_name(stack: &str, logical: &str, fifo: bool) -> String {
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

/// The event processor's logical id in the template.
pub const EVENT_PROCESSOR: &str = "EventProcessorFunction";

/// The template at `path`, parsed (its tags kept).
fn read_template(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A function's memory size in MB as the template gives it (its own `MemorySize`, else the
/// `Globals`', else Lambda's default of 128).
pub fn memory_size_mb(template_path: &Path, function: &str) -> Result<u64> {
    let doc = read_template(template_path)?;
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

/// The template's parameters: each one's default, then the `given` values, which must be
/// parameters of the template and among their `AllowedValues`.
fn parameters_of(doc: &Value, given: &HashMap<String, String>) -> Result<HashMap<String, String>> {
    let mut parameters = HashMap::new();
    if let Some(ps) = get(doc, "Parameters").and_then(|p| p.as_mapping()) {
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
    for (name, value) in given {
        let declared = get(doc, "Parameters")
            .and_then(|p| get(p, name))
            .with_context(|| format!("the template has no parameter {name}"))?;
        if let Some(allowed) = get(declared, "AllowedValues").and_then(|a| a.as_sequence()) {
            let allowed: Vec<String> = allowed.iter().filter_map(text_of).collect();
            if !allowed.contains(value) {
                bail!(
                    "{name}={value} is not one of the template's {}",
                    allowed.join(", ")
                );
            }
        }
    }
    parameters.extend(given.clone());
    Ok(parameters)
}

/// What CloudFormation would make of the template for its parameters' defaults and `given`:
/// how many resources of each type, the parameters' values, and the custom metrics (not in an
/// `AWS/` namespace) its alarms and dashboards read, as (namespace, metric name).
#[derive(Debug, Clone)]
pub struct Shape {
    pub counts: BTreeMap<String, usize>,
    pub parameters: HashMap<String, String>,
    pub custom_metrics: std::collections::BTreeSet<(String, String)>,
    /// An HTTP API stage's default route throttle (requests a second, burst), where the
    /// template gives one as numbers or parameters.
    pub api_throttle: Option<(f64, f64)>,
    /// Each HTTP API Lambda integration's `TimeoutInMillis` (API Gateway's 30,000 where it
    /// gives none), by the logical id of the function it invokes (`!Ref F` or `!Ref F.Alias`).
    pub integration_timeouts_ms: BTreeMap<String, i64>,
}

/// The [`Shape`] of the template at `template_path`.
pub fn shape_of(template_path: &Path, given: &HashMap<String, String>) -> Result<Shape> {
    let doc = read_template(template_path)?;
    let all = get(&doc, "Resources")
        .and_then(|r| r.as_mapping())
        .ok_or_else(|| anyhow!("template has no Resources"))?;
    let parameters = parameters_of(&doc, given)?;
    let resources = conditions::Conditions::new(&doc, &parameters).resources(all)?;
    let mut counts = BTreeMap::new();
    let mut custom_metrics = std::collections::BTreeSet::new();
    let mut api_throttle = None;
    let mut integration_timeouts_ms = BTreeMap::new();
    for res in resources.values() {
        let kind = get(res, "Type").and_then(Value::as_str).unwrap_or_default();
        *counts.entry(kind.to_owned()).or_default() += 1;
        let props = get(res, "Properties");
        if kind == "AWS::ApiGatewayV2::Stage" {
            let route = props.and_then(|p| get(p, "DefaultRouteSettings"));
            let rate = number_in(route, "ThrottlingRateLimit", &parameters)?;
            let burst = number_in(route, "ThrottlingBurstLimit", &parameters)?;
            if let (Some(rate), Some(burst)) = (rate, burst) {
                api_throttle = Some((rate, burst));
            }
        }
        if kind == "AWS::ApiGatewayV2::Integration" {
            let uri = props.and_then(|p| get(p, "IntegrationUri"));
            if let Some(function) = resolve::referenced_function(uri) {
                let ms = number_in(props, "TimeoutInMillis", &parameters)?.unwrap_or(30_000.0);
                integration_timeouts_ms.insert(function, ms as i64);
            }
        }
        let text = |k: &str| props.and_then(|p| get(p, k)).and_then(Value::as_str);
        if let (true, Some(ns), Some(name)) = (
            kind == "AWS::CloudWatch::Alarm",
            text("Namespace"),
            text("MetricName"),
        ) {
            if !ns.starts_with("AWS/") {
                custom_metrics.insert((ns.to_owned(), name.to_owned()));
            }
        }
        // A dashboard's metric rows: ["Namespace", "MetricName", dimensions...].
        let body = props.and_then(|p| get(p, "DashboardBody"));
        let body = body
            .and_then(|b| b.as_str().map(str::to_owned))
            .or_else(|| {
                body.and_then(resolve::intrinsic).and_then(|(_, arg)| {
                    arg.as_str()
                        .or_else(|| {
                            arg.as_sequence()
                                .and_then(|s| s.first())
                                .and_then(Value::as_str)
                        })
                        .map(str::to_owned)
                })
            });
        for row in body.iter().flat_map(|b| b.split('[').skip(1)) {
            let mut fields = row.split(',').map(str::trim);
            let unquote = |f: Option<&str>| {
                f.and_then(|f| f.strip_prefix('"'))
                    .and_then(|f| f.strip_suffix('"'))
                    .map(str::to_owned)
            };
            if let (Some(ns), Some(name)) = (unquote(fields.next()), unquote(fields.next())) {
                if !ns.starts_with("AWS/") && ns.chars().all(|c| c.is_ascii_alphanumeric()) {
                    custom_metrics.insert((ns, name));
                }
            }
        }
    }
    Ok(Shape {
        counts,
        parameters,
        custom_metrics,
        api_throttle,
        integration_timeouts_ms,
    })
}

/// `key` of `map` as a number: a literal, or a `Ref` to a parameter (its value, given or the
/// default); `None` where the key is absent, an error where it is neither (CloudFormation would
/// refuse the template, and a silent `None` would model no limit at all).
fn number_in(
    map: Option<&Value>,
    key: &str,
    parameters: &HashMap<String, String>,
) -> Result<Option<f64>> {
    let Some(v) = map.and_then(|m| get(m, key)) else {
        return Ok(None);
    };
    v.as_f64()
        .or_else(|| {
            resolve::intrinsic(v)
                .filter(|(f, _)| f == "Ref")
                .and_then(|(_, name)| name.as_str().and_then(|n| parameters.get(n)))
                .and_then(|p| p.parse().ok())
        })
        .map(Some)
        .with_context(|| format!("{key} is neither a number nor a parameter with a numeric value"))
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Creates the template's queues and tables on the endpoint of `sdk` and resolves every
/// function's environment and every SQS event source (the payment processor's first).
pub async fn provision(
    sdk: &aws_config::SdkConfig,
    template_path: &Path,
    opts: &ProvisionOptions,
) -> Result<Stack> {
    let doc = read_template(template_path)?;
    let all_resources = get(&doc, "Resources")
        .and_then(|r| r.as_mapping())
        .ok_or_else(|| anyhow!("template has no Resources"))?;

    let parameters = parameters_of(&doc, &opts.parameters)?;
    let mut conditions = conditions::Conditions::new(&doc, &parameters);
    let shape = conditions.resources(all_resources)?;
    let resources = &shape;
    let truths = conditions.all()?;
    let mut r = Resolver {
        conditions: truths,
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
        function_timeouts: BTreeMap::new(),
        deployed_pace: BTreeMap::new(),
        event_sources: BTreeMap::new(),
        stream_sources: BTreeMap::new(),
        report: Vec::new(),
        event_bridge: None,
        event_source: EventSource {
            queue_url: String::new(),
            queue_arn: String::new(),
            batch_size: 10,
            batching_window_seconds: 0,
            function_timeout_seconds: 3,
            report_batch_item_failures: false,
        },
    };

    queues::create(&sqs, sdk, opts, &mut r, &mut stack, resources).await?;
    let mut opts = opts.clone();
    if opts.read_only {
        if let Some(url) = stack.queues.values().next() {
            queues::recall_settings(&sqs, url, &mut opts).await?;
            for (k, v) in &opts.parameters {
                r.parameters.insert(k.clone(), v.clone());
            }
        }
    } else {
        queues::remember_settings(&sqs, &opts, &stack).await?;
    }
    tables::create(&ddb, sdk, &opts, &mut r, &mut stack, resources).await?;
    let eventbridge = aws_sdk_eventbridge::Client::new(sdk);
    events::create(&eventbridge, opts.read_only, &mut r, &mut stack, resources).await?;
    functions::resolve(&doc, &opts, &mut r, stack, resources)
}

#[cfg(test)]
mod tests;
