//! Stripe's events through EventBridge, provisioned as the template says when its shape has
//! them (`ProviderEventsDelivery` `eventbridge` or `both`): the partner event bus on
//! `StripeEventSourceName`, the rule with its pattern, and its target (the provider-events
//! queue, with EventBridge's DLQ and retry policy). The partner event source itself is
//! Stripe's to create; on a local endpoint the tests create it as Stripe would.

use anyhow::{anyhow, Context, Result};
use aws_sdk_eventbridge::types::{DeadLetterConfig, RetryPolicy, RuleState, SqsParameters, Target};
use serde_yaml_ng::{Mapping, Value};

use super::resolve::{get, intrinsic, of_type, Resolver};
use super::{EventBridgeRoute, Stack};

/// A template value as JSON, its intrinsic functions resolved.
fn to_json(r: &Resolver<'_>, v: &Value) -> Result<serde_json::Value> {
    if intrinsic(v).is_some() {
        let s = r
            .resolve(v)?
            .ok_or_else(|| anyhow!("cannot resolve {v:?} locally"))?;
        return Ok(serde_json::Value::String(s));
    }
    Ok(match v {
        Value::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let k = k
                    .as_str()
                    .ok_or_else(|| anyhow!("a key that is not a string"))?;
                out.insert(k.to_owned(), to_json(r, v)?);
            }
            serde_json::Value::Object(out)
        }
        Value::Sequence(s) => {
            serde_json::Value::Array(s.iter().map(|v| to_json(r, v)).collect::<Result<_>>()?)
        }
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Number(n) => serde_json::to_value(n)?,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        _ => serde_json::Value::Null,
    })
}

/// Creates the shape's partner bus, its rule and the rule's target (nothing when the shape has
/// no bus). In `read_only` mode only names them.
pub(super) async fn create(
    client: &aws_sdk_eventbridge::Client,
    read_only: bool,
    r: &mut Resolver<'_>,
    stack: &mut Stack,
    resources: &Mapping,
) -> Result<()> {
    let buses = of_type(resources, "AWS::Events::EventBus");
    let Some((bus_logical, bus)) = buses.first() else {
        return Ok(());
    };
    let props = get(bus, "Properties").cloned().unwrap_or(Value::Null);
    let resolved = |key: &str| -> Result<String> {
        r.string(get(&props, key))?
            .filter(|s| !s.is_empty())
            .with_context(|| {
                format!("{bus_logical} has no {key}: give the stack StripeEventSourceName")
            })
    };
    let (name, source) = (resolved("Name")?, resolved("EventSourceName")?);
    if !read_only {
        match client
            .create_event_bus()
            .name(&name)
            .event_source_name(&source)
            .send()
            .await
        {
            Ok(_) => stack.report.push((name.clone(), "created")),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_already_exists_exception()) =>
            {
                stack.report.push((name.clone(), "exists"))
            }
            Err(e) => {
                return Err(anyhow!(
                    "creating the event bus {name} on the partner event source {source}: {}",
                    aws_sdk_eventbridge::error::DisplayErrorContext(&e)
                ))
            }
        }
    }
    r.refs.insert((*bus_logical).to_owned(), name.clone());
    let on_bus: Vec<_> = of_type(resources, "AWS::Events::Rule")
        .into_iter()
        .filter(|(_, rule)| {
            get(rule, "Properties")
                .and_then(|p| get(p, "EventBusName"))
                .and_then(intrinsic)
                .and_then(|(_, a)| a.as_str())
                == Some(bus_logical)
        })
        .collect();
    let [(rule_logical, rule)] = on_bus.as_slice() else {
        return Err(anyhow!(
            "{bus_logical} needs one rule on it, not {}",
            on_bus.len()
        ));
    };
    let props = get(rule, "Properties").cloned().unwrap_or(Value::Null);
    let rule_name = r
        .string(get(&props, "Name"))?
        .unwrap_or_else(|| super::local_name(r.stack_name, rule_logical, false));
    let pattern = to_json(
        r,
        get(&props, "EventPattern").ok_or_else(|| anyhow!("{rule_logical} has no EventPattern"))?,
    )?;
    if !read_only {
        client
            .put_rule()
            .name(&rule_name)
            .event_bus_name(&name)
            .event_pattern(pattern.to_string())
            .state(RuleState::Enabled)
            .send()
            .await
            .map_err(|e| {
                anyhow!(
                    "creating the rule {rule_name} on {name}: {}",
                    aws_sdk_eventbridge::error::DisplayErrorContext(&e)
                )
            })?;
        let mut targets = Vec::new();
        for t in get(&props, "Targets")
            .and_then(|t| t.as_sequence())
            .into_iter()
            .flatten()
        {
            let field = |key: &str| r.string(get(t, key));
            let arn = field("Arn")?.ok_or_else(|| anyhow!("{rule_logical}'s target has no Arn"))?;
            let mut target = Target::builder()
                .id(field("Id")?.unwrap_or_else(|| "target".to_owned()))
                .arn(arn);
            if let Some(dlq) = get(t, "DeadLetterConfig").and_then(|d| get(d, "Arn")) {
                let dlq = r
                    .resolve(dlq)?
                    .ok_or_else(|| anyhow!("{rule_logical}'s dead-letter queue does not exist"))?;
                target = target.dead_letter_config(DeadLetterConfig::builder().arn(dlq).build());
            }
            if let Some(group) =
                r.string(get(t, "SqsParameters").and_then(|p| get(p, "MessageGroupId")))?
            {
                target =
                    target.sqs_parameters(SqsParameters::builder().message_group_id(group).build());
            }
            if let Some(p) = get(t, "RetryPolicy") {
                target = target.retry_policy(
                    RetryPolicy::builder()
                        .set_maximum_retry_attempts(
                            r.int(get(p, "MaximumRetryAttempts"))?.map(|v| v as i32),
                        )
                        .set_maximum_event_age_in_seconds(
                            r.int(get(p, "MaximumEventAgeInSeconds"))?.map(|v| v as i32),
                        )
                        .build(),
                );
            }
            targets.push(target.build()?);
        }
        client
            .put_targets()
            .rule(&rule_name)
            .event_bus_name(&name)
            .set_targets(Some(targets))
            .send()
            .await
            .map_err(|e| {
                anyhow!(
                    "pointing the rule {rule_name} at its target: {}",
                    aws_sdk_eventbridge::error::DisplayErrorContext(&e)
                )
            })?;
        stack.report.push((rule_name.clone(), "created"));
    }
    stack.event_bridge = Some(EventBridgeRoute {
        bus: name,
        rule: rule_name,
        source,
    });
    Ok(())
}

/// Deletes what [`create`] made: the rule's targets, the rule, the bus.
pub(super) async fn teardown(
    client: &aws_sdk_eventbridge::Client,
    route: &EventBridgeRoute,
) -> Result<()> {
    let targets = client
        .list_targets_by_rule()
        .rule(&route.rule)
        .event_bus_name(&route.bus)
        .send()
        .await
        .with_context(|| format!("listing the targets of {}", route.rule))?;
    let ids: Vec<String> = targets
        .targets()
        .iter()
        .map(|t| t.id().to_owned())
        .collect();
    if !ids.is_empty() {
        client
            .remove_targets()
            .rule(&route.rule)
            .event_bus_name(&route.bus)
            .set_ids(Some(ids))
            .send()
            .await
            .with_context(|| format!("removing the targets of {}", route.rule))?;
    }
    client
        .delete_rule()
        .name(&route.rule)
        .event_bus_name(&route.bus)
        .send()
        .await
        .with_context(|| format!("deleting the rule {}", route.rule))?;
    client
        .delete_event_bus()
        .name(&route.bus)
        .send()
        .await
        .with_context(|| format!("deleting the event bus {}", route.bus))?;
    Ok(())
}
