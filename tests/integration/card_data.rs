//! No raw card data at rest or in logs: a payment whose body carries a card number in any
//! field (its description, a metadata key or value, its customer, its payment method, its
//! currency, a field's name) is refused by the API without echoing it, and dead-lettered by
//! the processor with the number masked (first six and last four digits) and flagged, its
//! reason quoting none of it; the number is in no table item, no DLQ body or attribute and no
//! log line of either process.

use std::process::Stdio;

use aws_sdk_sqs::types::MessageSystemAttributeName;

use crate::helpers::*;

const PAN: &str = "4000 0566 5566 5556";
const PAN_DIGITS: &str = "4000056655665556";

fn leaks(text: &str) -> bool {
    text.contains(PAN) || text.contains(PAN_DIGITS) || text.contains("0566 5566")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_number_is_kept_nowhere() {
    let t = TestStack::new("card").await;
    let pid = t.pid("p1");
    let body =
        payment(&pid, 100, PAN).replace(&format!("Order for {pid}"), &format!("card {PAN_DIGITS}"));
    assert!(body.contains(PAN) && body.contains(PAN_DIGITS));
    t.send(&body).await;
    // The number in each other field of a raw message: each refused, none kept.
    let fields = every_field_holding_the_number();
    for (n, (_, value)) in fields.iter().enumerate() {
        let mut message = value.clone();
        message["payment_id"] = t.pid(&format!("f{n}")).into();
        t.send(&message.to_string()).await;
    }

    // The processor as its own process, logging at debug level.
    let payctl = bin("payctl");
    let run = tokio::process::Command::new(&payctl)
        .args([
            "run",
            "--queue-url",
            t.queue_url(),
            "--until-empty",
            "--max-seconds",
            "60",
        ])
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .envs(fast_settings())
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("running payctl run");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        logs.contains("dead-lettered"),
        "the run processed the message: {logs}"
    );
    assert!(!leaks(&logs), "a log line holds the card number");

    // The dead letter: masked, flagged, with the reason.
    let received = t
        .sqs
        .receive_message()
        .queue_url(&t.config.dead_letter_queue_url)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .send()
        .await
        .expect("receiving the dead letter");
    let mut letters = received.messages().to_vec();
    while letters.len() < 1 + fields.len() {
        let more = t
            .sqs
            .receive_message()
            .queue_url(&t.config.dead_letter_queue_url)
            .message_attribute_names("All")
            .max_number_of_messages(10)
            .wait_time_seconds(2)
            .send()
            .await
            .expect("receiving the dead letters");
        if more.messages().is_empty() {
            break;
        }
        letters.extend(more.messages().iter().cloned());
    }
    assert_eq!(letters.len(), 1 + fields.len(), "a dead letter each");
    for l in &letters {
        let text = format!("{:?} {:?}", l.body(), l.message_attributes());
        assert!(!leaks(&text), "a dead letter holds the card number: {text}");
        let code = l
            .message_attributes()
            .and_then(|m| m.get("error_code"))
            .and_then(|v| v.string_value());
        assert_eq!(code, Some("invalid_payment"), "{text}");
    }
    let letter = letters
        .iter()
        .find(|l| l.body().is_some_and(|b| b.contains(&format!("\"{pid}\""))))
        .expect("the first payment's dead letter");
    let dead_body = letter.body().unwrap_or_default();
    assert!(
        !leaks(dead_body),
        "the DLQ body holds the card number: {dead_body}"
    );
    assert!(dead_body.contains("4000 05** **** 5556"), "{dead_body}");
    assert!(dead_body.contains("400005******5556"), "{dead_body}");
    let attr = |k: &str| {
        letter
            .message_attributes()
            .and_then(|m| m.get(k))
            .and_then(|v| v.string_value())
            .map(str::to_owned)
    };
    assert_eq!(attr("card_data_masked").as_deref(), Some("true"));
    assert_eq!(attr("error_code").as_deref(), Some("invalid_payment"));
    assert!(!leaks(&attr("error_message").unwrap_or_default()));

    // The API refuses it without echoing it, stores nothing, and logs nothing of it.
    let config = payment_core::edges::config::ApiConfig::from_lookup(|k| {
        t.stack
            .var_of("PaymentsApiFunction", k)
            .ok()
            .map(str::to_owned)
    })
    .expect("the API's configuration");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut api = tokio::process::Command::new(&payctl)
        .args(["api", "serve", "--address", &format!("127.0.0.1:{port}")])
        .env("PAYMENTS_TABLE", &config.payments_table)
        .env("IDEMPOTENCY_TABLE", &config.idempotency_table)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting payctl api serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the API did not listen"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let client = payctl::client::ApiClient::new(&format!("http://127.0.0.1:{port}"), &sdk).unwrap();
    let api_body = serde_json::json!({
        "amount": 100, "currency": "usd", "customer_id": "cus_card",
        "payment_method": PAN, "description": format!("card {PAN_DIGITS}"),
    })
    .to_string();
    let answer = client.create(&t.pid("api"), &api_body).await.unwrap();
    assert_eq!(answer.status, 400);
    assert!(!leaks(&answer.body), "{}", answer.body);
    for (n, (field, value)) in fields.iter().enumerate() {
        let answer = client
            .create(&t.pid(&format!("api{n}")), &value.to_string())
            .await
            .unwrap();
        assert_eq!(answer.status, 400, "{field}: {}", answer.body);
        assert!(!leaks(&answer.body), "{field}: {}", answer.body);
    }
    // A path holding it is not echoed either.
    let answer = client.get(PAN_DIGITS).await.unwrap();
    assert_eq!(answer.status, 404);
    assert!(!leaks(&answer.body), "{}", answer.body);
    api.start_kill().expect("stopping the API");
    let out = api.wait_with_output().await.expect("the API's output");
    let api_logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!leaks(&api_logs), "an API log line holds the card number");

    // No table item holds it.
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    for table in [&config.payments_table, &config.idempotency_table] {
        let items = ddb
            .scan()
            .table_name(table.as_str())
            .send()
            .await
            .expect("scanning");
        let text = format!("{:?}", items.items());
        assert!(!leaks(&text), "{table} holds the card number");
    }
}

/// A payment body (without its `payment_id`) holding the card number in one field each.
fn every_field_holding_the_number() -> Vec<(&'static str, serde_json::Value)> {
    let base = || {
        serde_json::json!({
            "amount": 100, "currency": "usd", "customer_id": "cus_card",
            "payment_method": "pm_card_visa",
        })
    };
    let with = |field: &'static str, value: serde_json::Value| {
        let mut b = base();
        b[field] = value;
        (field, b)
    };
    vec![
        with("description", format!("my card {PAN} exp 12/30").into()),
        with("metadata", serde_json::json!({ "note": PAN_DIGITS })),
        with("metadata", serde_json::json!({ PAN_DIGITS: "v" })),
        with("metadata", serde_json::json!({ PAN_DIGITS: "" })),
        with("customer_id", PAN_DIGITS.into()),
        with("payment_method", PAN.into()),
        with("currency", PAN_DIGITS.into()),
        with(PAN_DIGITS, 1.into()),
    ]
}
