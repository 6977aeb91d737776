//! EventBridge, as far as the stack uses it: a partner event bus on Stripe's event source, one
//! rule on it with its pattern, and the rule's target (an SQS queue, with its retry policy and
//! dead-letter queue), as payctl's provisioning creates them from `template.yaml`
//! (`CreateEventBus`, `PutRule`, `PutTargets`); and the matching of an event against the
//! rules (what Stripe's events destination publishes on the bus). Delivering to a target is
//! the world's (`world::events`): it needs the clock and SQS.
//!
//! `PutTargets` refuses a FIFO target without `SqsParameters.MessageGroupId`, and a FIFO
//! dead-letter queue, as EventBridge does.
//!
//! Patterns: the subset EventBridge documents as exact matching (a field's value one of a list
//! of strings, nested objects field by field); anything else in a pattern is refused at
//! `PutRule`, so that a template using more than this model matches fails loudly here rather
//! than matching differently.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

/// A refusal, as EventBridge's JSON protocol answers it.
#[derive(Debug, Clone)]
pub struct BridgeError {
    /// The error's shape (`__type`).
    pub code: &'static str,
    /// Its message.
    pub message: String,
}

impl BridgeError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The answer's body.
    pub fn body(&self) -> Json {
        json!({"__type": self.code, "message": self.message})
    }
}

/// A rule's target.
#[derive(Debug, Clone)]
pub struct Target {
    /// The target's id.
    pub id: String,
    /// The queue's ARN.
    pub arn: String,
    /// `DeadLetterConfig.Arn`.
    pub dead_letter: Option<String>,
    /// `RetryPolicy.MaximumEventAgeInSeconds` (EventBridge's default: 24 hours).
    pub max_age_s: i64,
    /// `RetryPolicy.MaximumRetryAttempts` (default 185).
    pub max_attempts: i64,
    /// `SqsParameters.MessageGroupId`, for a FIFO queue.
    pub group: Option<String>,
}

#[derive(Debug, Clone)]
struct Rule {
    bus: String,
    pattern: Json,
    targets: Vec<Target>,
}

/// The account's buses and rules.
#[derive(Debug, Default, Clone)]
pub struct EventBridge {
    /// Bus name → the partner event source it is on.
    buses: BTreeMap<String, String>,
    rules: BTreeMap<String, Rule>,
}

fn text<'a>(body: &'a Json, key: &str) -> Result<&'a str, BridgeError> {
    body.get(key).and_then(Json::as_str).ok_or_else(|| {
        BridgeError::new(
            "ValidationException",
            format!("1 validation error detected: {key} must not be null"),
        )
    })
}

/// Checks that `pattern` uses only exact matching: every leaf a non-empty list of strings.
pub fn supported(pattern: &Json) -> Result<(), String> {
    let Some(fields) = pattern.as_object().filter(|m| !m.is_empty()) else {
        return Err("a pattern is a non-empty object".into());
    };
    for (k, v) in fields {
        match v {
            Json::Object(_) => supported(v)?,
            Json::Array(a) if !a.is_empty() && a.iter().all(Json::is_string) => {}
            _ => return Err(format!("{k}: only lists of strings are modelled")),
        }
    }
    Ok(())
}

/// Whether `event` matches `pattern` (exact matching: each field of the pattern present in the
/// event, its value one of the pattern's).
pub fn matches(pattern: &Json, event: &Json) -> bool {
    pattern
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, p)| match (p, event.get(k)) {
            (Json::Object(_), Some(e)) => matches(p, e),
            (Json::Array(allowed), Some(Json::String(v))) => {
                allowed.iter().any(|a| a.as_str() == Some(v))
            }
            _ => false,
        })
}

impl EventBridge {
    /// Answers one control-plane request.
    pub fn handle(&mut self, operation: &str, body: &Json) -> Result<Json, BridgeError> {
        match operation {
            "CreateEventBus" => {
                let name = text(body, "Name")?;
                let source = text(body, "EventSourceName")?;
                if self.buses.contains_key(name) {
                    return Err(BridgeError::new(
                        "ResourceAlreadyExistsException",
                        format!("Event bus {name} already exists."),
                    ));
                }
                self.buses.insert(name.to_owned(), source.to_owned());
                Ok(
                    json!({"EventBusArn": format!("arn:aws:events:us-east-1:000000000000:event-bus/{name}")}),
                )
            }
            "PutRule" => {
                let name = text(body, "Name")?;
                let bus = text(body, "EventBusName")?;
                if !self.buses.contains_key(bus) {
                    return Err(BridgeError::new(
                        "ResourceNotFoundException",
                        format!("Event bus {bus} does not exist."),
                    ));
                }
                let pattern: Json = serde_json::from_str(text(body, "EventPattern")?)
                    .map_err(|e| BridgeError::new("InvalidEventPatternException", e.to_string()))?;
                supported(&pattern).map_err(|e| {
                    BridgeError::new(
                        "InvalidEventPatternException",
                        format!("not modelled by the simulator: {e}"),
                    )
                })?;
                self.rules.insert(
                    name.to_owned(),
                    Rule {
                        bus: bus.to_owned(),
                        pattern,
                        targets: Vec::new(),
                    },
                );
                Ok(
                    json!({"RuleArn": format!("arn:aws:events:us-east-1:000000000000:rule/{bus}/{name}")}),
                )
            }
            "PutTargets" => {
                let name = text(body, "Rule")?;
                let rule = self.rules.get_mut(name).ok_or_else(|| {
                    BridgeError::new(
                        "ResourceNotFoundException",
                        format!("Rule {name} does not exist."),
                    )
                })?;
                for t in body
                    .get("Targets")
                    .and_then(Json::as_array)
                    .into_iter()
                    .flatten()
                {
                    let policy = t.get("RetryPolicy");
                    let number = |key: &str, default: i64| {
                        policy
                            .and_then(|p| p.get(key))
                            .and_then(Json::as_i64)
                            .unwrap_or(default)
                    };
                    let target = Target {
                        id: text(t, "Id")?.to_owned(),
                        arn: text(t, "Arn")?.to_owned(),
                        dead_letter: t
                            .pointer("/DeadLetterConfig/Arn")
                            .and_then(Json::as_str)
                            .map(str::to_owned),
                        max_age_s: number("MaximumEventAgeInSeconds", 86_400),
                        max_attempts: number("MaximumRetryAttempts", 185),
                        group: t
                            .pointer("/SqsParameters/MessageGroupId")
                            .and_then(Json::as_str)
                            .map(str::to_owned),
                    };
                    // What EventBridge refuses at `PutTargets`: a FIFO queue without the group
                    // its messages go in, and a FIFO dead-letter queue (it takes standard ones).
                    if target.arn.ends_with(".fifo") && target.group.is_none() {
                        return Err(BridgeError::new(
                            "ValidationException",
                            format!(
                                "Parameter(s) SqsParameters must be specified for target: {}.",
                                target.id
                            ),
                        ));
                    }
                    if target
                        .dead_letter
                        .as_deref()
                        .is_some_and(|d| d.ends_with(".fifo"))
                    {
                        return Err(BridgeError::new(
                            "ValidationException",
                            format!(
                                "The dead-letter queue of target {} must be a standard queue.",
                                target.id
                            ),
                        ));
                    }
                    rule.targets.retain(|old| old.id != target.id);
                    rule.targets.push(target);
                }
                Ok(json!({"FailedEntryCount": 0, "FailedEntries": []}))
            }
            other => Err(BridgeError::new(
                "UnknownOperationException",
                format!("{other} is not modelled by the simulator"),
            )),
        }
    }

    /// The targets an event published by the partner source `source` reaches: every rule's on
    /// the buses on that source whose pattern the event's envelope matches.
    pub fn targets(&self, source: &str, envelope: &Json) -> Vec<Target> {
        self.rules
            .values()
            .filter(|r| self.buses.get(&r.bus).map(String::as_str) == Some(source))
            .filter(|r| matches(&r.pattern, envelope))
            .flat_map(|r| r.targets.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_matches_exactly_and_refuses_what_it_does_not_model() {
        let mut eb = EventBridge::default();
        eb.handle(
            "CreateEventBus",
            &json!({"Name": "b", "EventSourceName": "aws.partner/stripe.com/ed_1"}),
        )
        .unwrap();
        let pattern =
            json!({"source": ["aws.partner/stripe.com/ed_1"], "detail-type": ["refund.failed"]});
        eb.handle(
            "PutRule",
            &json!({"Name": "r", "EventBusName": "b", "EventPattern": pattern.to_string()}),
        )
        .unwrap();
        eb.handle(
            "PutTargets",
            &json!({"Rule": "r", "EventBusName": "b", "Targets": [{"Id": "q", "Arn": "arn:aws:sqs:us-east-1:000000000000:q"}]}),
        )
        .unwrap();
        let event = |kind: &str| json!({"source": "aws.partner/stripe.com/ed_1", "detail-type": kind, "detail": {}});
        assert_eq!(
            eb.targets("aws.partner/stripe.com/ed_1", &event("refund.failed"))
                .len(),
            1
        );
        assert!(eb
            .targets("aws.partner/stripe.com/ed_1", &event("refund.created"))
            .is_empty());
        assert!(eb
            .targets("aws.partner/stripe.com/ed_2", &event("refund.failed"))
            .is_empty());
        let prefix = json!({"source": [{"prefix": "aws.partner/"}]});
        let refused = eb
            .handle(
                "PutRule",
                &json!({"Name": "p", "EventBusName": "b", "EventPattern": prefix.to_string()}),
            )
            .unwrap_err();
        assert_eq!(refused.code, "InvalidEventPatternException");
        let fifo = |target: Json| {
            eb.clone()
                .handle(
                    "PutTargets",
                    &json!({"Rule": "r", "EventBusName": "b", "Targets": [target]}),
                )
                .map(|_| ())
                .map_err(|e| e.code)
        };
        let q = "arn:aws:sqs:us-east-1:000000000000:q.fifo";
        assert_eq!(
            fifo(json!({"Id": "q", "Arn": q})),
            Err("ValidationException")
        );
        assert_eq!(
            fifo(json!({"Id": "q", "Arn": q, "SqsParameters": {"MessageGroupId": "events"}})),
            Ok(())
        );
        assert_eq!(
            fifo(
                json!({"Id": "q", "Arn": q, "SqsParameters": {"MessageGroupId": "events"},
                "DeadLetterConfig": {"Arn": "arn:aws:sqs:us-east-1:000000000000:dlq.fifo"}})
            ),
            Err("ValidationException")
        );
    }
}
