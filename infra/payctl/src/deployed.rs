//! A deployed stack as CloudFormation describes it: its outputs and parameters, read by
//! `payctl connect`, `payctl preflight` and `payctl env` (the operator's shell).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

/// The outputs and parameters of the template that `connect`, `preflight` and `env` read
/// (a unit test holds each to `template.yaml`).
pub mod names {
    /// Outputs.
    pub const OUTPUTS: &[&str] = &[
        "PaymentsApiUrl",
        "PaymentsTableName",
        "IdempotencyTableName",
        "PaymentsQueueUrl",
        "DeadLetterQueueUrl",
        "RefundsQueueUrl",
        "RefundsDeadLetterQueueUrl",
        "ProviderEventsUrl",
        "ProviderEventsQueueUrl",
        "ProviderEventsDeadLetterQueueUrl",
        "StripeEventBusName",
        "PaymentProcessorFunctionName",
        "RefundProcessorFunctionName",
        "EventProcessorFunctionName",
        "AlarmNotificationTopicArn",
    ];
    /// Parameters.
    pub const PARAMETERS: &[&str] = &[
        "PaymentApiUrl",
        "PaymentApiKeySecretArn",
        "StripeApiVersion",
        "ProviderEventsDelivery",
        "WebhookSecretArn",
        "StripeEventSourceName",
        "RefundWindowDays",
        "EventsCatchUpMinutes",
        "HeldRefundHorizonDays",
        "AlarmTopicArn",
        "ReservedConcurrency",
        "ApiReservedConcurrency",
        "ConfigRevision",
    ];
    /// The operator's shell (`payctl env`): variable and output.
    pub const SHELL_OUTPUTS: &[(&str, &str)] = &[
        ("IDEMPOTENCY_TABLE", "IdempotencyTableName"),
        ("PAYMENTS_TABLE", "PaymentsTableName"),
        ("PAYMENTS_QUEUE_URL", "PaymentsQueueUrl"),
        ("DEAD_LETTER_QUEUE_URL", "DeadLetterQueueUrl"),
        ("REFUNDS_QUEUE_URL", "RefundsQueueUrl"),
        ("REFUNDS_DEAD_LETTER_QUEUE_URL", "RefundsDeadLetterQueueUrl"),
        ("PROVIDER_EVENTS_QUEUE_URL", "ProviderEventsQueueUrl"),
        (
            "PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL",
            "ProviderEventsDeadLetterQueueUrl",
        ),
        ("PAYMENTS_API_URL", "PaymentsApiUrl"),
    ];
    /// The operator's shell (`payctl env`): variable and parameter.
    pub const SHELL_PARAMETERS: &[(&str, &str)] = &[
        ("PROVIDER_API_URL", "PaymentApiUrl"),
        ("PAYMENT_API_KEY_SECRET_ARN", "PaymentApiKeySecretArn"),
        ("STRIPE_API_VERSION", "StripeApiVersion"),
        ("REFUND_WINDOW_DAYS", "RefundWindowDays"),
        ("EVENTS_CATCH_UP_MINUTES", "EventsCatchUpMinutes"),
        ("HELD_REFUND_HORIZON_DAYS", "HeldRefundHorizonDays"),
    ];
}

/// A deployed stack's outputs and parameters.
#[derive(Debug, Clone, Default)]
pub struct Deployed {
    /// The stack's name.
    pub name: String,
    /// Its CloudFormation id (`arn:aws:cloudformation:REGION:ACCOUNT:stack/NAME/UUID`).
    pub id: String,
    /// Its status (`CREATE_COMPLETE`, `UPDATE_COMPLETE`, ...).
    pub status: String,
    /// Output name to value.
    pub outputs: BTreeMap<String, String>,
    /// Parameter name to value (as deployed: a template default shows as its value).
    pub parameters: BTreeMap<String, String>,
}

impl Deployed {
    /// Reads stack `name` (`DescribeStacks`); `Ok(None)` when no such stack exists.
    pub async fn find(sdk: &aws_config::SdkConfig, name: &str) -> Result<Option<Self>> {
        let cfn = aws_sdk_cloudformation::Client::new(sdk);
        let described = match cfn.describe_stacks().stack_name(name).send().await {
            Ok(d) => d,
            Err(e) => {
                let text = aws_sdk_cloudformation::error::DisplayErrorContext(&e).to_string();
                if text.contains("does not exist") {
                    return Ok(None);
                }
                return Err(anyhow::anyhow!(
                    "reading stack {name} from CloudFormation ({}): {}",
                    crate::aws::endpoint(sdk),
                    text
                ));
            }
        };
        let Some(stack) = described.stacks().first() else {
            return Ok(None);
        };
        let outputs = stack
            .outputs()
            .iter()
            .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
            .collect();
        let parameters = stack
            .parameters()
            .iter()
            .filter_map(|p| {
                Some((
                    p.parameter_key()?.to_owned(),
                    p.resolved_value()
                        .or(p.parameter_value())
                        .unwrap_or_default()
                        .to_owned(),
                ))
            })
            .collect();
        Ok(Some(Self {
            name: name.to_owned(),
            id: stack.stack_id().unwrap_or(name).to_owned(),
            status: stack
                .stack_status()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
            outputs,
            parameters,
        }))
    }

    /// Reads stack `name`, which must exist and be deployed.
    pub async fn read(sdk: &aws_config::SdkConfig, name: &str) -> Result<Self> {
        let Some(stack) = Self::find(sdk, name).await? else {
            bail!(
                "no stack {name} in CloudFormation ({}, region {}): deploy it first (sam deploy --stack-name {name}), or check --region",
                crate::aws::endpoint(sdk),
                sdk.region().map(|r| r.to_string()).unwrap_or_default()
            );
        };
        // A stack rolled back after an update is the previous deploy, whole; one rolled back
        // from its creation has nothing.
        let usable = stack.status.ends_with("_COMPLETE")
            && (!stack.status.contains("ROLLBACK") || stack.status == "UPDATE_ROLLBACK_COMPLETE");
        if !usable {
            bail!(
                "stack {name} is {}: wait for its deploy to finish (or fix what failed and deploy again)",
                stack.status
            );
        }
        Ok(stack)
    }

    /// Output `key`; an error naming it when the stack has none.
    pub fn output(&self, key: &str) -> Result<&str> {
        debug_assert!(
            names::OUTPUTS.contains(&key),
            "{key} is not in names::OUTPUTS"
        );
        self.outputs
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .with_context(|| format!("stack {} has no output {key}: is it deployed from this project's template.yaml?", self.name))
    }

    /// Parameter `key` (`None` when unset or empty).
    pub fn param(&self, key: &str) -> Option<&str> {
        debug_assert!(
            names::PARAMETERS.contains(&key),
            "{key} is not in names::PARAMETERS"
        );
        self.parameters
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// How the stack receives the provider's events: (webhook, EventBridge).
    pub fn delivery(&self) -> (bool, bool) {
        match self.param("ProviderEventsDelivery").unwrap_or("webhook") {
            "eventbridge" => (false, true),
            "both" => (true, true),
            _ => (true, false),
        }
    }

    /// The provider key the stack's functions use (from its secret, or from `key_arn` when
    /// given).
    pub async fn provider_key(
        &self,
        sdk: &aws_config::SdkConfig,
        key_arn: Option<&str>,
    ) -> Result<secrecy::SecretString> {
        let arn = match key_arn {
            Some(a) => a,
            None => self.param("PaymentApiKeySecretArn").with_context(|| {
                format!(
                    "stack {} has no PaymentApiKeySecretArn parameter",
                    self.name
                )
            })?,
        };
        let source = payment_core::edges::config::ApiKeySource::SecretArn(arn.to_owned());
        payment_core::edges::bootstrap::resolve_api_key(&source, sdk)
            .await
            .with_context(|| {
                format!(
                    "reading the provider's key from {arn} (the stack's PaymentApiKeySecretArn)"
                )
            })
    }

    /// The provider client of the stack's functions (their URL and pinned version) with `key`.
    pub fn client(&self, key: secrecy::SecretString) -> Result<payment_core::stripe::StripeClient> {
        let url = self
            .param("PaymentApiUrl")
            .unwrap_or("https://api.stripe.com");
        let version = self
            .param("StripeApiVersion")
            .unwrap_or(payment_core::stripe::DEFAULT_API_VERSION);
        Ok(payment_core::stripe::StripeClient::new(
            url,
            key,
            version,
            std::time::Duration::from_secs(20),
        )?)
    }

    /// The provider client the stack's functions use, with their key or `key_arn`'s.
    pub async fn provider(
        &self,
        sdk: &aws_config::SdkConfig,
        key_arn: Option<&str>,
    ) -> Result<payment_core::stripe::StripeClient> {
        self.client(self.provider_key(sdk, key_arn).await?)
    }

    /// The physical ids of the stack's resources of `kind` (`AWS::CloudWatch::Alarm`: the
    /// alarms' names), from CloudFormation.
    pub async fn resources(&self, sdk: &aws_config::SdkConfig, kind: &str) -> Result<Vec<String>> {
        Ok(self
            .all_resources(sdk)
            .await?
            .remove(kind)
            .unwrap_or_default())
    }

    /// The physical ids of all the stack's resources by type, from one listing.
    pub async fn all_resources(
        &self,
        sdk: &aws_config::SdkConfig,
    ) -> Result<std::collections::HashMap<String, Vec<String>>> {
        let cfn = aws_sdk_cloudformation::Client::new(sdk);
        let mut out: std::collections::HashMap<String, Vec<String>> = Default::default();
        let mut next: Option<String> = None;
        loop {
            let page = cfn
                .list_stack_resources()
                .stack_name(&self.name)
                .set_next_token(next.clone())
                .send()
                .await
                .map_err(crate::aws::failed)
                .with_context(|| format!("listing the resources of stack {}", self.name))?;
            for r in page.stack_resource_summaries() {
                if let (Some(kind), Some(id)) = (r.resource_type(), r.physical_resource_id()) {
                    out.entry(kind.to_owned()).or_default().push(id.to_owned());
                }
            }
            next = page.next_token().map(str::to_owned);
            if next.is_none() {
                return Ok(out);
            }
        }
    }

    /// `export` lines for the operator's shell against this stack: what `health`,
    /// `reconcile`, `dlq`, `outbox` and `events catch-up` read.
    pub fn shell(&self, region: Option<&str>) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        if let Some(r) = region {
            vars.push(("AWS_REGION".to_owned(), r.to_owned()));
        }
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
            vars.push(("AWS_ENDPOINT_URL".to_owned(), endpoint));
        }
        vars.push(("STACK_NAME".to_owned(), self.name.clone()));
        for &(var, key) in names::SHELL_OUTPUTS {
            if let Some(v) = self.outputs.get(key).filter(|v| !v.is_empty()) {
                vars.push((var.to_owned(), v.clone()));
            }
        }
        for &(var, key) in names::SHELL_PARAMETERS {
            if let Some(v) = self.param(key) {
                vars.push((var.to_owned(), v.to_owned()));
            }
        }
        vars
    }
}

#[cfg(test)]
mod tests {
    use super::names::*;

    #[test]
    fn the_outputs_and_parameters_read_are_the_template_s() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
        let template: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let outputs = OUTPUTS.iter().chain(SHELL_OUTPUTS.iter().map(|(_, o)| o));
        for o in outputs {
            assert!(
                !template["Outputs"][*o].is_null(),
                "template.yaml has no output {o}"
            );
        }
        let parameters = PARAMETERS
            .iter()
            .chain(SHELL_PARAMETERS.iter().map(|(_, p)| p));
        for p in parameters {
            assert!(
                !template["Parameters"][*p].is_null(),
                "template.yaml has no parameter {p}"
            );
        }
    }
}
