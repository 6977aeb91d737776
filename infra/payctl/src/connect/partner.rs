//! EventBridge delivery's side of `connect` (and `preflight`): the partner event source, the
//! stack's bus on it, and the rule to the provider-events queue.

use anyhow::{bail, Context, Result};

use crate::deployed::Deployed;

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
    let mut routed = false;
    let mut next: Option<String> = None;
    loop {
        let rules = eb
            .list_rules()
            .event_bus_name(bus)
            .set_next_token(next.clone())
            .send()
            .await
            .map_err(crate::aws::failed)?;
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
        next = rules.next_token().map(str::to_owned);
        if next.is_none() {
            break;
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
