//! Webhook signatures held to the official `stripe` package: the simulator's signatures must be
//! ones Stripe's verifier accepts, and the provider-events receiver (its verifier, and the
//! route through the local HTTP API) must accept exactly what Stripe's verifier accepts and
//! refuse what it refuses (`infra/contract/check_signatures.py` asks the package).

use std::sync::{Arc, Mutex};

use payment_core::events::queue::EventQueue;
use payment_core::provider::event::ProviderEvent;
use payment_core::stripe::receiver::{EventReceiver, FixedSecrets, EVENTS_PATH};
use payment_core::stripe::webhook::{sign, SignatureCheck, SignatureError};
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
    // Headers written by hand ("{SIG}" is the v1 of the body under whsec_new at the timestamp
    // `t`, as Python's int() reads it), each decided by the package: bare items, duplicate
    // timestamps, signs, underscores and spaces in `t`, timestamps beyond 64 bits, case, extra
    // `=`, the caps.
    let digits = now.to_string();
    let underscored = format!("{}_{}_{}", &digits[..1], &digits[1..4], &digits[4..]);
    let huge = format!("1{}", "0".repeat(30));
    let huge_past = format!("-{huge}");
    let arabic: String = digits
        .chars()
        .map(|c| char::from_u32(0x660 + c.to_digit(10).unwrap()).unwrap())
        .collect();
    let many_items = format!("t={now},v1={{SIG}}{}", ",v0=00".repeat(70));
    let long_item = format!("t={now},v1={{SIG}},x={}", "a".repeat(9000));
    let hand = |name: &str, header: &str, t: &str, tolerance: i64, want: bool| {
        json!({"name": name, "body": body, "header": header, "sig": {"secret": "whsec_new", "t": t},
               "held": ["whsec_new"], "tolerance": tolerance, "want": want})
    };
    let n = digits.as_str();
    let mut written = vec![
        hand("bare-v1-after", "t={T},v1={SIG},v1", n, 300, false),
        hand("bare-t-after", "t={T},v1={SIG},t", n, 300, false),
        hand("bare-t-before", "t,t={T},v1={SIG}", n, 300, false),
        hand("bare-other-item", "t={T},v1={SIG},v0", n, 300, true),
        hand("empty-items", "t={T},,v1={SIG},", n, 300, true),
        hand("second-t-ignored", "t={T},v1={SIG},t=bogus", n, 300, true),
        hand("first-t-bogus", "t=bogus,t={T},v1={SIG}", n, 300, false),
        hand(
            "first-t-other-time",
            &format!("t={},t={{T}},v1={{SIG}}", now - 5),
            n,
            300,
            false,
        ),
        hand(
            "underscored-t",
            &format!("t={underscored},v1={{SIG}}"),
            &underscored,
            300,
            true,
        ),
        hand(
            "double-underscore-t",
            &format!("t={},v1={{SIG}}", underscored.replacen('_', "__", 1)),
            n,
            300,
            false,
        ),
        hand("trailing-underscore-t", "t={T}_,v1={SIG}", n, 300, false),
        hand("plus-t", "t=+{T},v1={SIG}", n, 300, true),
        hand("leading-zeros-t", "t=000{T},v1={SIG}", n, 300, true),
        hand("spaced-t", "t= {T}\t,v1={SIG}", n, 300, true),
        hand("sign-then-space-t", "t=+ {T},v1={SIG}", n, 300, false),
        hand("minus-zero-t", "t=-0,v1={SIG}", "0", 0, true),
        hand(
            "huge-future-t",
            &format!("t={huge},v1={{SIG}}"),
            &huge,
            300,
            true,
        ),
        hand(
            "huge-past-t",
            &format!("t={huge_past},v1={{SIG}}"),
            &huge_past,
            300,
            false,
        ),
        hand(
            "huge-past-t-without-age-check",
            &format!("t={huge_past},v1={{SIG}}"),
            &huge_past,
            0,
            true,
        ),
        hand(
            "t-over-python-digits",
            &format!("t=1{},v1={{SIG}}", "0".repeat(4300)),
            n,
            0,
            false,
        ),
        hand("uppercase-scheme", "t={T},V1={SIG}", n, 300, false),
        hand("uppercase-t", "T={T},v1={SIG}", n, 300, false),
        hand("spaced-key", "t={T}, v1={SIG}", n, 300, false),
        hand("extra-equals-in-v1", "t={T},v1={SIG}=x", n, 300, true),
        hand("extra-equals-in-t", "t={T}=x,v1={SIG}", n, 300, true),
        hand(
            "empty-v1s-then-valid",
            &format!("t={now}{},v1={{SIG}}", ",v1=".repeat(30)),
            n,
            300,
            true,
        ),
        hand(
            "non-ascii-v1-before-valid",
            "t={T},v1=caf\u{e9},v1={SIG}",
            n,
            300,
            false,
        ),
        // Where ours and the package differ, on purpose (the README says why): a header over
        // the caps, or with a character outside ASCII, is refused before anything is hashed.
        hand("over-the-item-cap", &many_items, n, 300, true),
        hand("over-the-byte-cap", &long_item, n, 300, true),
        hand(
            "non-ascii-in-an-ignored-item",
            "t={T},v1={SIG},x=caf\u{e9}",
            n,
            300,
            true,
        ),
        hand(
            "non-ascii-digits-in-t",
            &format!("t={arabic},v1={{SIG}}"),
            n,
            300,
            true,
        ),
    ];
    // A body that is not UTF-8 (the package decodes it before signing).
    let raw: &[u8] = b"{\"id\":\"evt_\xff\"}";
    written.push(json!({"name": "body-not-utf8", "body_hex": raw.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "header": "t={T},v1={SIG}", "sig": {"secret": "whsec_new", "t": n}, "held": ["whsec_new"], "tolerance": 300, "want": false}));
    // A blank secret held matches nothing (the package refuses it).
    written.push(
        json!({"name": "blank-secret-held", "body": body, "header": "t={T},v1={SIG}",
        "sig": {"secret": " ", "t": n}, "held": [" "], "tolerance": 300, "want": false}),
    );
    for case in &mut written {
        let header = case["header"].as_str().unwrap().replace("{T}", n);
        case["header"] = json!(header);
    }
    let cases = json!(cases
        .as_array()
        .unwrap()
        .iter()
        .cloned()
        .chain(written)
        .collect::<Vec<_>>());
    // The cases where ours refuses what the package accepts, and why (the README's list).
    let differs = |name: &str| match name {
        "over-the-item-cap" | "over-the-byte-cap" => Some(SignatureError::Oversized),
        "non-ascii-in-an-ignored-item" | "non-ascii-digits-in-t" => Some(SignatureError::NotAscii),
        _ => None,
    };
    let verdicts = stripe_verdicts(&cases);
    assert_eq!(verdicts.len(), cases.as_array().unwrap().len());
    let api_config = payment_core::edges::config::ApiConfig::from_lookup(|k| match k {
        "PAYMENTS_TABLE" | "IDEMPOTENCY_TABLE" => Some("not-used-by-the-events-route".into()),
        _ => None,
    })
    .unwrap();
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let http = reqwest::Client::new();
    for (case, v) in cases.as_array().unwrap().iter().zip(&verdicts) {
        let name = case["name"].as_str().unwrap();
        let stripe_accepts = v["stripe_accepts"].as_bool().unwrap();
        assert_eq!(
            stripe_accepts,
            case["want"].as_bool().unwrap(),
            "{name}: the stripe package says {v}"
        );
        let body: Vec<u8> = match case["body_hex"].as_str() {
            Some(hex) => (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect(),
            None => case["body"].as_str().unwrap().as_bytes().to_vec(),
        };
        let header = v["header"].as_str();
        let held: Vec<SecretString> = case["held"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| SecretString::from(s.as_str().unwrap().to_owned()))
            .collect();
        let tolerance = case["tolerance"].as_u64().unwrap();
        let ours = SignatureCheck::new(held.clone(), tolerance).verify(header, &body, now_ms());
        let route_accepts = match differs(name) {
            Some(why) => {
                assert!(stripe_accepts, "{name}: the package now refuses it: {v}");
                assert_eq!(ours, Err(why), "{name}: ours refuses it before any MAC");
                false
            }
            None => {
                assert_eq!(
                    ours.is_ok(),
                    stripe_accepts,
                    "{name}: ours says {ours:?}, stripe {v}"
                );
                stripe_accepts
            }
        };

        // The route, as the provider reaches it: no IAM signature, the raw bytes.
        let queue = Arc::new(Memory::default());
        let receiver = EventReceiver::new(Arc::new(FixedSecrets(held)), queue.clone(), tolerance);
        let api = payment_core::edges::bootstrap::build_api(
            &api_config,
            aws_sdk_dynamodb::Client::new(&sdk),
        );
        let server = payctl::api::serve(Arc::new(api), Some(Arc::new(receiver)), "127.0.0.1:0")
            .await
            .unwrap();
        let mut req = http
            .post(format!("{}{EVENTS_PATH}", server.url()))
            .header("content-type", "application/json; charset=utf-8")
            .body(body.clone());
        if let Some(h) = header {
            // As bytes: a header outside ASCII is sent as its UTF-8.
            req = req.header(
                "Stripe-Signature",
                reqwest::header::HeaderValue::from_bytes(h.as_bytes()).unwrap(),
            );
        }
        let status = req.send().await.unwrap().status().as_u16();
        assert_eq!(
            status,
            if route_accepts { 200 } else { 400 },
            "{name}: the route answered {status}"
        );
        let queued = queue.0.lock().unwrap().clone();
        let expected = if route_accepts {
            vec![String::from_utf8(body).unwrap()]
        } else {
            vec![]
        };
        assert_eq!(queued, expected, "{name}: queued as it came, or nothing");
    }
}

/// What a forged request can make the route do: with two secrets held, the worst header within
/// the caps costs two MACs, the shapes past the caps none; a body declared over the limit is
/// answered 413 without being read; the function refuses the largest event Lambda accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_request_costs_the_route_at_most_one_mac_per_secret() {
    let costs = proving::webhook::costs(3).await.unwrap();
    let macs: Vec<(String, f64)> = costs["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["case"].as_str().unwrap().to_owned(),
                c["macs_per_request"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        macs,
        [
            ("genuine delivery".to_owned(), 2.0),
            ("forged: full header within the caps".to_owned(), 2.0),
            ("forged: 2,000 hex v1".to_owned(), 0.0),
            ("forged: 2,000 empty v1".to_owned(), 0.0),
        ]
    );
    assert!(
        costs["declared_oversized_ms"].as_f64().unwrap() < 1000.0,
        "{costs}"
    );
    assert_eq!(costs["function"].as_array().unwrap().len(), 3);
}
