//! `payctl connect` and `payctl preflight` against a stand-in of a deployed stack: a CloudFormation stack on the local
//! endpoint with `template.yaml`'s own parameters (copied from it) and outputs, pointing at a
//! provisioned test stack; its events route is the receiver reading the signing secret from
//! Secrets Manager as the deployed function does, and its inbox drains the events queue. The
//! provider is a simulator of the test's own: webhook endpoints are the whole account's. (The
//! deployed template itself is connected by `make e2e-sam`.)

use std::sync::Arc;
use std::time::Duration;

use payctl::connect::{fingerprint, FINGERPRINT_KEY};
use payctl::template::EVENT_PROCESSOR;
use payment_core::events::catch_up::EVENT_TYPES;
use payment_core::stripe::receiver::EVENTS_PATH;
use serde_json::{json, Value};

use crate::events::events;
use crate::helpers::*;
use crate::own_simulator::{stripe_call, OwnSimulator};

/// The stand-in's template: `template.yaml`'s parameters that payctl reads, one resource, and
/// the outputs given.
fn stand_in(outputs: &[(&str, &str)]) -> String {
    let text = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    let template: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let params: serde_json::Map<String, Value> = payctl::deployed::names::PARAMETERS
        .iter()
        .map(|p| {
            let def = template["Parameters"][*p].clone();
            assert!(!def.is_null(), "template.yaml has no parameter {p}");
            ((*p).to_owned(), serde_json::to_value(def).unwrap())
        })
        .collect();
    let outputs: serde_json::Map<String, Value> = outputs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!({ "Value": v })))
        .collect();
    json!({
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": params,
        "Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": outputs,
    })
    .to_string()
}

async fn secret(sm: &aws_sdk_secretsmanager::Client, name: &str, value: &str) -> String {
    sm.create_secret()
        .name(name)
        .secret_string(value)
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_owned()
}

async fn stored(sm: &aws_sdk_secretsmanager::Client, arn: &str) -> String {
    sm.get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .unwrap()
        .secret_string()
        .unwrap()
        .to_owned()
}

/// A stand-in of a deployed stack with everything `connect` and `preflight` read: a test
/// stack, its inbox, a simulator of its own, the provider key's and the webhook's secrets, the
/// events route served by the receiver as deployed.
pub(crate) struct StandIn {
    pub(crate) ts: TestStack,
    pub(crate) inbox: crate::events::Events,
    pub(crate) sim: OwnSimulator,
    pub(crate) sdk: aws_config::SdkConfig,
    pub(crate) sm: aws_sdk_secretsmanager::Client,
    pub(crate) name: String,
    pub(crate) key_arn: String,
    pub(crate) hook_arn: String,
    pub(crate) url: String,
    pub(crate) table: String,
    pub(crate) queue: String,
    _server: lambda_local::http::LocalHttp,
}

impl StandIn {
    pub(crate) async fn new(tag: &str) -> Self {
        let ts = TestStack::new(tag).await;
        let inbox = events(&ts).await;
        let sim = OwnSimulator::start(tag);
        // The stand-in's route answers on 127.0.0.1: the one departure from Stripe the local
        // runs ask of the simulator (it refuses such a URL as Stripe does otherwise).
        sim_control(&sim, "/_sim/webhook", json!({"allow_private_urls": true})).await;
        let sdk = payment_core::edges::bootstrap::sdk_config().await;
        let sm = aws_sdk_secretsmanager::Client::new(&sdk);
        let name = TestStack::unique_name(tag);
        let key_arn = secret(&sm, &format!("{name}/provider-key"), "sk_test_local").await;
        let hook_arn = secret(
            &sm,
            &format!("{name}/webhook"),
            "placeholder: payctl connect writes it",
        )
        .await;
        let queue = ts.stack.event_sources[EVENT_PROCESSOR].queue_url.clone();
        let config = payment_core::edges::config::ReceiverConfig::from_lookup(|k| match k {
            "WEBHOOK_SECRET_ARN" => Some(hook_arn.clone()),
            "PROVIDER_EVENTS_QUEUE_URL" => Some(queue.clone()),
            _ => None,
        })
        .unwrap();
        let receiver = payment_core::edges::bootstrap::build_receiver(&config, &sdk);
        let server = payctl::api::serve_events(Arc::new(receiver), "127.0.0.1:0")
            .await
            .unwrap();
        let url = format!("{}{EVENTS_PATH}", server.url());
        let table = ts.stack.tables["IdempotencyTable"].clone();
        Self {
            ts,
            inbox,
            sim,
            sdk,
            sm,
            name,
            key_arn,
            hook_arn,
            url,
            table,
            queue,
            _server: server,
        }
    }

    /// Creates the CloudFormation stand-in `name` with these parameters and outputs beside the
    /// usual ones.
    pub(crate) async fn deploy(
        &self,
        name: &str,
        params: &[(&str, &str)],
        outputs: &[(&str, &str)],
    ) {
        let cfn = aws_sdk_cloudformation::Client::new(&self.sdk);
        let mut all_outputs = vec![
            ("ProviderEventsUrl", self.url.as_str()),
            ("IdempotencyTableName", self.table.as_str()),
            ("ProviderEventsQueueUrl", self.queue.as_str()),
        ];
        all_outputs.extend_from_slice(outputs);
        let mut create = cfn
            .create_stack()
            .stack_name(name)
            .template_body(stand_in(&all_outputs));
        let base = [
            ("PaymentApiUrl", self.sim.url.as_str()),
            ("PaymentApiKeySecretArn", self.key_arn.as_str()),
            ("WebhookSecretArn", self.hook_arn.as_str()),
        ];
        for (k, v) in base.iter().chain(params) {
            create = create.parameters(
                aws_sdk_cloudformation::types::Parameter::builder()
                    .parameter_key(*k)
                    .parameter_value(*v)
                    .build(),
            );
        }
        create.send().await.unwrap();
        for _ in 0..100 {
            let s = cfn.describe_stacks().stack_name(name).send().await.unwrap();
            if s.stacks()[0].stack_status().unwrap().as_str() == "CREATE_COMPLETE" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the stand-in {name} was not created");
    }

    /// `payctl ARGS` while the inbox drains its queue: (exit code, stdout).
    pub(crate) async fn payctl(&self, args: &[&str]) -> (i32, String) {
        let mut child = tokio::process::Command::new(bin("payctl"))
            .args(args)
            .env_remove("PROVIDER_API_URL")
            .env_remove("PAYMENT_API_KEY")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            self.inbox.drain(&self.ts).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let out = child.wait_with_output().await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        (status.code().unwrap_or(-1), stdout)
    }

    pub(crate) async fn connect(&self) -> (i32, String) {
        self.payctl(&["connect", "--stack-name", &self.name, "--wait", "60"])
            .await
    }
}

pub(crate) async fn sim_control(sim: &OwnSimulator, path: &str, body: Value) {
    reqwest::Client::new()
        .post(format!("{}{path}", sim.url))
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

/// A `/v1` request to the test's own simulator, as the project's client sends it.
pub(crate) async fn stripe(
    sim: &OwnSimulator,
    method: reqwest::Method,
    path: &str,
    form: &[(&str, &str)],
    key: &str,
) -> Value {
    stripe_call(&sim.url, "sk_test_local", method, path, &[], form, key).await
}

/// The simulator's endpoints at `url`.
pub(crate) async fn endpoints_at(sim: &OwnSimulator, url: &str) -> Vec<Value> {
    let listed = stripe_call(
        &sim.url,
        "sk_test_local",
        reqwest::Method::GET,
        "/v1/webhook_endpoints",
        &[("limit", "100")],
        &[],
        "",
    )
    .await;
    listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["url"] == url)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_registers_the_endpoint_stores_its_secret_and_reaches_the_inbox_and_mends_a_crashed_run(
) {
    let s = StandIn::new("connect").await;
    s.deploy(&s.name, &[], &[]).await;
    let (sim, sm, url, name, hook_arn) = (&s.sim, &s.sm, &s.url, &s.name, &s.hook_arn);
    let (table, queue, key_arn) = (&s.table, &s.queue, &s.key_arn);

    // The first run: registered with the inbox's types and the pinned version, its secret
    // stored in place of the placeholder, the test event recorded by the inbox.
    let (code, out) = s.connect().await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("registered, sent the inbox's"), "{out}");
    assert!(out.contains("recorded by the inbox"), "{out}");
    let at = endpoints_at(sim, url).await;
    assert_eq!(at.len(), 1, "{at:?}");
    let first = at[0]["id"].as_str().unwrap().to_owned();
    let kinds: Vec<&str> = at[0]["enabled_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(kinds, EVENT_TYPES);
    assert_eq!(
        at[0]["api_version"],
        payment_core::stripe::DEFAULT_API_VERSION
    );
    let secret_now = stored(sm, hook_arn).await;
    assert!(secret_now.starts_with("whsec_"), "{secret_now}");
    assert_eq!(at[0]["metadata"][FINGERPRINT_KEY], fingerprint(&secret_now));

    // Again: nothing to change.
    let (code, out) = s.connect().await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("registered already"), "{out}");
    assert_eq!(stored(sm, hook_arn).await, secret_now);
    assert_eq!(endpoints_at(sim, url).await.len(), 1);

    // A run that crashed after Stripe registered its endpoint and before the secret was stored
    // (the placeholder is back; a stray endpoint sends here too): replaced, the strays deleted.
    sm.put_secret_value()
        .secret_id(hook_arn)
        .secret_string("placeholder")
        .send()
        .await
        .unwrap();
    let stray = stripe(
        sim,
        reqwest::Method::POST,
        "/v1/webhook_endpoints",
        &[("url", url.as_str()), ("enabled_events[0]", "*")],
        &format!("stray-{name}"),
    )
    .await;
    let (code, out) = s.connect().await;
    assert_eq!(code, 0, "{out}");
    let at = endpoints_at(sim, url).await;
    assert_eq!(at.len(), 1, "{at:?}");
    let kept = at[0]["id"].as_str().unwrap();
    assert!(kept != first && kept != stray["id"], "{out}");
    assert!(out.contains(&format!("{first} at {url}: deleted")), "{out}");
    let secret_after = stored(sm, hook_arn).await;
    assert!(
        secret_after.starts_with("whsec_") && !secret_after.contains(','),
        "{secret_after}"
    );
    assert_eq!(
        at[0]["metadata"][FINGERPRINT_KEY],
        fingerprint(&secret_after)
    );
    assert!(out.contains("recorded by the inbox"), "{out}");
    // What the deleted endpoints may not have delivered went to the inbox again.
    assert!(
        out.contains("queued ") && out.contains("replaced endpoints may not have delivered"),
        "{out}"
    );

    // A secret being rolled in Stripe's Dashboard (the new one held beside the old): kept.
    let rolled = format!("whsec_rolled_in_the_dashboard,{secret_after}");
    sm.put_secret_value()
        .secret_id(hook_arn)
        .secret_string(&rolled)
        .send()
        .await
        .unwrap();
    let (code, out) = s.connect().await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("registered already"), "{out}");
    assert_eq!(stored(sm, hook_arn).await, rolled);

    // Rotating with --replace: a new endpoint and secret; the old one deleted after what it
    // may not have delivered is queued, and its secret dropped; the one added by hand stays.
    let before = endpoints_at(sim, url).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (code, out) = s
        .payctl(&["connect", "--stack-name", name, "--replace", "--wait", "60"])
        .await;
    assert_eq!(code, 0, "{out}");
    let at = endpoints_at(sim, url).await;
    assert_eq!(at.len(), 1, "{at:?}");
    assert_ne!(at[0]["id"], before.as_str());
    assert!(
        out.contains(&format!("{before} at {url}: deleted")),
        "{out}"
    );
    let rotated = stored(sm, hook_arn).await;
    let values: Vec<&str> = rotated.split(',').collect();
    assert_eq!(values.len(), 2, "{rotated}");
    assert_eq!(at[0]["metadata"][FINGERPRINT_KEY], fingerprint(values[0]));
    assert_eq!(values[1], "whsec_rolled_in_the_dashboard");

    // An endpoint registered for this stack at another URL (the URL it had before a custom
    // domain, say) is the stack's too: deleted, its secret dropped.
    let stack_id = aws_sdk_cloudformation::Client::new(&s.sdk)
        .describe_stacks()
        .stack_name(name)
        .send()
        .await
        .unwrap()
        .stacks()[0]
        .stack_id()
        .unwrap()
        .to_owned();
    let elsewhere = stripe(
        sim,
        reqwest::Method::POST,
        "/v1/webhook_endpoints",
        &[
            ("url", "https://old.example/v1/provider-events"),
            ("enabled_events[0]", "*"),
            ("metadata[stack_id]", stack_id.as_str()),
        ],
        &format!("elsewhere-{name}"),
    )
    .await;
    let (code, out) = s.connect().await;
    assert_eq!(code, 0, "{out}");
    let gone = elsewhere["id"].as_str().unwrap();
    assert!(
        out.contains(&format!(
            "{gone} at https://old.example/v1/provider-events: deleted"
        )),
        "{out}"
    );
    assert!(endpoints_at(sim, "https://old.example/v1/provider-events")
        .await
        .is_empty());

    // The operator's shell against the deployed stack: from its outputs and parameters.
    let out = std::process::Command::new(bin("payctl"))
        .args(["env", "--stack-name", name])
        .env_remove("PROVIDER_API_URL")
        .output()
        .unwrap();
    let shell = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shell}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        format!("export IDEMPOTENCY_TABLE='{table}'"),
        format!("export PROVIDER_EVENTS_QUEUE_URL='{queue}'"),
        format!("export PROVIDER_API_URL='{}'", sim.url),
        format!("export PAYMENT_API_KEY_SECRET_ARN='{key_arn}'"),
        format!("export STACK_NAME='{name}'"),
        format!(
            "export STRIPE_API_VERSION='{}'",
            payment_core::stripe::DEFAULT_API_VERSION
        ),
    ] {
        assert!(shell.lines().any(|l| l == line), "{line} not in:\n{shell}");
    }
}
