//! The template's functions: each one's environment, and its SQS event source (a SAM `Events`
//! entry of type SQS, or a declared `AWS::Lambda::EventSourceMapping`).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use serde_yaml_ng::{Mapping, Value};

use super::resolve::{get, referenced_function, Resolver};
use super::{EventSource, ProvisionOptions, Stack, PROCESSOR};

/// Reads every function's environment and event source into the stack.
pub(super) fn resolve(
    doc: &Value,
    opts: &ProvisionOptions,
    r: &mut Resolver<'_>,
    mut stack: Stack,
    resources: &Mapping,
) -> Result<Stack> {
    // Every function's environment; the processor's SQS event source: a SAM `Events` entry of
    // type SQS, or an `AWS::Lambda::EventSourceMapping` whose source is a queue of the template.
    let globals = get(doc, "Globals").and_then(|g| get(g, "Function"));
    let mut mappings: BTreeMap<String, Value> = BTreeMap::new();
    // Mappings whose source is a table's stream, by function: (the table's name, properties).
    let mut stream_mappings: BTreeMap<String, (String, Value)> = BTreeMap::new();
    for (_, res) in resources {
        if get(res, "Type").and_then(|t| t.as_str()) != Some("AWS::Lambda::EventSourceMapping") {
            continue;
        }
        let props = get(res, "Properties").cloned().unwrap_or(Value::Null);
        let function = referenced_function(get(&props, "FunctionName"));
        let source = r.string(get(&props, "EventSourceArn"))?;
        if let (Some(function), Some(source)) = (function, source) {
            if stack.queue_arns.values().any(|a| *a == source) {
                mappings.insert(function, props);
            } else if let Some((table, _)) = source
                .split_once(":table/")
                .and_then(|(_, rest)| rest.split_once("/stream/"))
            {
                stream_mappings.insert(function, (table.to_owned(), props));
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
        // SAM's merge: the Globals' variables, then the function's own over them.
        fn variables(of: Option<&Value>) -> Option<&Mapping> {
            of.and_then(|p| get(p, "Environment"))
                .and_then(|e| get(e, "Variables"))
                .and_then(|v| v.as_mapping())
        }
        let vars = variables(globals)
            .into_iter()
            .flatten()
            .chain(variables(Some(&props)).into_iter().flatten());
        for (k, v) in vars {
            if let (Some(k), Some(v)) = (k.as_str(), r.resolve(v)?) {
                env.insert(k.to_owned(), v);
            }
        }
        // The provider's pace is the deployment's: a local process stands for every instance
        // of its function at once, and the simulator limits nothing unless told. Local runs are
        // paced only when PROVIDER_REQUESTS_PER_SECOND is set in their own environment.
        let pace: BTreeMap<String, String> = payment_core::edges::config::PACE_VARS
            .iter()
            .filter_map(|k| env.remove(*k).map(|v| (k.to_string(), v)))
            .collect();
        if let Some(logical) = logical.as_str() {
            stack.function_envs.insert(logical.to_owned(), env.clone());
            stack
                .function_timeouts
                .insert(logical.to_owned(), timeout_of(r, &props, globals)?);
            if !pace.is_empty() {
                stack.deployed_pace.insert(logical.to_owned(), pace);
            }
        }
        if let Some((table, ep)) = logical.as_str().and_then(|l| stream_mappings.get(l)) {
            let source = stream_source(r, table, ep, &props, globals, &stack)?;
            stack
                .stream_sources
                .insert(logical.as_str().unwrap_or_default().to_owned(), source);
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
        let queue_arn = r
            .string(get(&ep, "Queue").or_else(|| get(&ep, "EventSourceArn")))?
            .ok_or_else(|| anyhow!("SQS event without a resolvable Queue"))?;
        let queue_url = stack
            .queue_arns
            .iter()
            .find(|(_, a)| **a == queue_arn)
            .and_then(|(l, _)| stack.queues.get(l))
            .cloned()
            .ok_or_else(|| anyhow!("the SQS event's queue is not in the template"))?;
        let timeout = timeout_of(r, &props, globals)?;
        let source = EventSource {
            queue_url,
            queue_arn,
            batch_size: r.int(get(&ep, "BatchSize"))?.unwrap_or(10) as i32,
            batching_window_seconds: r
                .int(get(&ep, "MaximumBatchingWindowInSeconds"))?
                .unwrap_or(0) as i32,
            function_timeout_seconds: timeout as i32,
            report_batch_item_failures: reports_item_failures(&ep),
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

/// A stream mapping's settings, with Lambda's defaults where the template says nothing.
fn stream_source(
    r: &mut Resolver<'_>,
    table: &str,
    ep: &Value,
    function: &Value,
    globals: Option<&Value>,
    stack: &Stack,
) -> Result<super::StreamSource> {
    let timeout = timeout_of(r, function, globals)?;
    let flag = |k: &str| get(ep, k).and_then(Value::as_bool).unwrap_or(false);
    let mut filters = Vec::new();
    for f in get(ep, "FilterCriteria")
        .and_then(|c| get(c, "Filters"))
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        if let Some(p) = r.string(get(f, "Pattern"))? {
            filters.push(p);
        }
    }
    let destination = r.string(
        get(ep, "DestinationConfig")
            .and_then(|d| get(d, "OnFailure"))
            .and_then(|o| get(o, "Destination")),
    )?;
    let on_failure_queue_url = destination.and_then(|arn| {
        stack
            .queue_arns
            .iter()
            .find(|(_, a)| **a == arn)
            .and_then(|(l, _)| stack.queues.get(l))
            .cloned()
    });
    Ok(super::StreamSource {
        table: table.to_owned(),
        batch_size: r.int(get(ep, "BatchSize"))?.unwrap_or(100) as i32,
        batching_window_seconds: r
            .int(get(ep, "MaximumBatchingWindowInSeconds"))?
            .unwrap_or(0) as i32,
        function_timeout_seconds: timeout as i32,
        maximum_retry_attempts: r.int(get(ep, "MaximumRetryAttempts"))?.unwrap_or(-1) as i32,
        maximum_record_age_seconds: r.int(get(ep, "MaximumRecordAgeInSeconds"))?.unwrap_or(-1)
            as i32,
        bisect_on_error: flag("BisectBatchOnFunctionError"),
        report_batch_item_failures: reports_item_failures(ep),
        filters,
        on_failure_queue_url,
    })
}

/// A function's `Timeout` (its own, else the Globals', else Lambda's 3 s).
fn timeout_of(r: &Resolver<'_>, function: &Value, globals: Option<&Value>) -> Result<i64> {
    Ok(
        r.int(get(function, "Timeout").or_else(|| globals.and_then(|g| get(g, "Timeout"))))?
            .unwrap_or(3),
    )
}

/// A mapping's `FunctionResponseTypes` includes `ReportBatchItemFailures`.
fn reports_item_failures(mapping: &Value) -> bool {
    get(mapping, "FunctionResponseTypes")
        .and_then(|v| v.as_sequence())
        .is_some_and(|s| {
            s.iter()
                .any(|t| t.as_str() == Some("ReportBatchItemFailures"))
        })
}
