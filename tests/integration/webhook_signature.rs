//! Webhook signatures held to the official `stripe` package: the simulator's signatures must be
//! ones Stripe's verifier accepts, and the provider-events receiver (its verifier, and the
//! route through the local HTTP API) must accept exactly what Stripe's verifier accepts and
//! refuse what it refuses (`infra/contract/check_signatures.py` asks the package).

use std::sync::{Arc, Mutex};

use payment_core::event_receiver::{EventQueue, EventReceiver, FixedSecrets, EVENTS_PATH};
use payment_core::provider_event::ProviderEvent;
use payment_core::stripe_webhook::{sign, SignatureCheck};
use secrecy::SecretString;
use serde_json::{json, Value};
use sqs_once::runner::now_ms;

use crate::helpers::root;

#[derive(Default)]
struct Memory(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl EventQueue for Memory {
    async fn enqueue(&self, _event: &ProviderEvent, body: &str) -> Result<(), String> {
        self.0.lock().unwrap().push(body.to_owned());
        Ok(())
    }
}

/// Asks the official package about each case.
fn stripe_verdicts(cases: &Value) -> Vec<Value> {
    let python = root().join(".venv-stripe/bin/python");
    assert!(
        python.exists(),
        "the official stripe package's virtualenv is missing: make test installs it ({})",
        python.display()
    );
    let mut child = std::process::Command::new(python)
        .arg(root().join("infra/contract/check_signatures.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running check_signatures.py");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cases.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "check_signatures.py failed");
    serde_json::from_slice(&out.stdout).expect("the package's verdicts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_accepts_exactly_what_stripe_s_verifier_accepts() {
    let now = now_ms() / 1000;
    let body = r#"{"id":"evt_sig_1","object":"event","type":"payment_intent.succeeded","created":1,"data":{"object":{"id":"pi_1","object":"payment_intent","status":"succeeded","description":"caf\u00e9 \u2615"}}}"#;
    let unicode = r#"{"id":"evt_sig_2","object":"event","type":"refund.failed","created":1,"data":{"object":{"id":"re_1","object":"refund","status":"failed","metadata":{"note":"café ☕"}}}}"#;
    let ours = |secrets: &[&str], t: i64, b: &str| sign(secrets, t, b.as_bytes());
    let valid = ours(&["whsec_new"], now, body);
    // (name, body, header or signed by the simulator, held secrets, what Stripe must say)
    let cases = json!([
        {"name": "simulator-signed", "body": body, "sign": {"secrets": ["whsec_new"], "t": now}, "held": ["whsec_new"], "tolerance": 300, "want": true},
        {"name": "simulator-signed-unicode", "body": unicode, "sign": {"secrets": ["whsec_new"], "t": now}, "held": ["whsec_new"], "tolerance": 300, "want": true},
        {"name": "ours-signed", "body": body, "header": valid, "held": ["whsec_new"], "tolerance": 300, "want": true},
        {"name": "tampered-body", "body": body.replace("succeeded", "canceled"), "header": valid, "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "wrong-secret", "body": body, "header": valid, "held": ["whsec_other"], "tolerance": 300, "want": false},
        {"name": "stale", "body": body, "sign": {"secrets": ["whsec_new"], "t": now - 310}, "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "recent", "body": body, "sign": {"secrets": ["whsec_new"], "t": now - 290}, "held": ["whsec_new"], "tolerance": 300, "want": true},
        {"name": "future", "body": body, "sign": {"secrets": ["whsec_new"], "t": now + 600}, "held": ["whsec_new"], "tolerance": 300, "want": true},
        {"name": "rolled-both-held-old", "body": body, "sign": {"secrets": ["whsec_old", "whsec_new"], "t": now}, "held": ["whsec_old"], "tolerance": 300, "want": true},
        {"name": "rolled-both-held-new", "body": body, "sign": {"secrets": ["whsec_old", "whsec_new"], "t": now}, "held": ["whsec_new"], "tolerance": 300, "want": true},
        {"name": "new-only-held-both", "body": body, "sign": {"secrets": ["whsec_new"], "t": now}, "held": ["whsec_old", "whsec_new"], "tolerance": 300, "want": true},
        {"name": "new-only-held-old", "body": body, "sign": {"secrets": ["whsec_new"], "t": now}, "held": ["whsec_old"], "tolerance": 300, "want": false},
        {"name": "no-header", "body": body, "header": null, "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "v0-only", "body": body, "header": valid.replace("v1=", "v0="), "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "uppercase-hex", "body": body, "header": format!("t={now},v1={}", valid.split("v1=").nth(1).unwrap().to_uppercase()), "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "spaced-items", "body": body, "header": valid.replace(",v1=", ", v1="), "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "no-timestamp", "body": body, "header": format!("v1={}", valid.split("v1=").nth(1).unwrap()), "held": ["whsec_new"], "tolerance": 300, "want": false},
        {"name": "stale-without-age-check", "body": body, "sign": {"secrets": ["whsec_new"], "t": now - 86_400}, "held": ["whsec_new"], "tolerance": 0, "want": true},
    ]);
    let verdicts = stripe_verdicts(&cases);
    assert_eq!(verdicts.len(), cases.as_array().unwrap().len());
    let api_config = payment_core::config::ApiConfig::from_lookup(|k| match k {
        "PAYMENTS_TABLE" | "IDEMPOTENCY_TABLE" => Some("not-used-by-the-events-route".into()),
        _ => None,
    })
    .unwrap();
    let sdk = payment_core::bootstrap::sdk_config().await;
    let http = reqwest::Client::new();
    for (case, v) in cases.as_array().unwrap().iter().zip(&verdicts) {
        let name = case["name"].as_str().unwrap();
        let stripe_accepts = v["stripe_accepts"].as_bool().unwrap();
        assert_eq!(
            stripe_accepts,
            case["want"].as_bool().unwrap(),
            "{name}: the stripe package says {v}"
        );
        let body = case["body"].as_str().unwrap();
        let header = v["header"].as_str();
        let held: Vec<SecretString> = case["held"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| SecretString::from(s.as_str().unwrap().to_owned()))
            .collect();
        let tolerance = case["tolerance"].as_i64().unwrap();
        let ours = SignatureCheck::new(held.clone(), tolerance).verify(
            header,
            body.as_bytes(),
            now_ms() / 1000,
        );
        assert_eq!(
            ours.is_ok(),
            stripe_accepts,
            "{name}: ours says {ours:?}, stripe {v}"
        );

        // The route, as the provider reaches it: no IAM signature, the raw bytes.
        let queue = Arc::new(Memory::default());
        let receiver = EventReceiver::new(Arc::new(FixedSecrets(held)), queue.clone(), tolerance);
        let api =
            payment_core::bootstrap::build_api(&api_config, aws_sdk_dynamodb::Client::new(&sdk));
        let server = payctl::api::serve(Arc::new(api), Some(Arc::new(receiver)), "127.0.0.1:0")
            .await
            .unwrap();
        let mut req = http
            .post(format!("{}{EVENTS_PATH}", server.url()))
            .header("content-type", "application/json; charset=utf-8")
            .body(body.to_owned());
        if let Some(h) = header {
            req = req.header("Stripe-Signature", h);
        }
        let status = req.send().await.unwrap().status().as_u16();
        assert_eq!(
            status,
            if stripe_accepts { 200 } else { 400 },
            "{name}: the route answered {status}"
        );
        let queued = queue.0.lock().unwrap().clone();
        assert_eq!(
            queued,
            if stripe_accepts {
                vec![body.to_owned()]
            } else {
                vec![]
            },
            "{name}: queued as it came, or nothing"
        );
    }
}
