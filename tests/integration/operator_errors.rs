//! Errors an operator meets, each in one line with its cause and its fix: no region, a busy
//! address, a redrive where the endpoint cannot list a DLQ's sources; input checked where it
//! is typed (bodies the processor would dead-letter, amounts not in minor units); an
//! interrupted send that says what went.

use crate::helpers::*;
use crate::operator::payctl_run;

fn lines(text: &str) -> usize {
    text.lines().filter(|l| !l.trim().is_empty()).count()
}

/// No region anywhere: one line naming AWS_REGION, not the SDK's two warnings about the
/// instance metadata service it tried instead.
#[test]
fn no_region_is_one_line_naming_aws_region() {
    let out = std::process::Command::new(bin("payctl"))
        .args([
            "run",
            "--queue-url",
            "https://sqs.us-east-1.amazonaws.com/1/q",
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "y")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no AWS region is set: export AWS_REGION"),
        "{err}"
    );
    assert!(!err.contains("IMDS"), "{err}");
    assert_eq!(lines(&err), 1, "{err}");
}

/// An address already taken is named, in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_address_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = std::process::Command::new(bin("payctl"))
        .args(["api", "serve", "--address", &address])
        .env("PAYMENTS_TABLE", "t")
        .env("IDEMPOTENCY_TABLE", "i")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("listening on {address}")) && last.contains("in use"),
        "{err}"
    );
}

/// `payctl dlq redrive` with no --queue-url on an endpoint without ListDeadLetterSourceQueues
/// (ministack) finds the DLQ's home among the stack's queues in the environment, by their
/// redrive policies, and moves the letter back; nothing is dumped. (It printed ~2 KB of the
/// SDK's debug output before "pass --queue-url".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_redrive_finds_the_home_queue_from_the_environment() {
    let t = TestStack::new("op-redrive").await;
    let pid = t.pid("bad");
    t.send(&payment(&pid, -5, "pm_card_visa")).await;
    let out = payctl_run(&t, &["--until-empty"]).output().await.unwrap();
    assert!(out.status.success());
    assert_eq!(t.depth().await, 0);
    let out = tokio::process::Command::new(bin("payctl"))
        .args(["dlq", "redrive", "--force"])
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .env("PAYMENTS_QUEUE_URL", t.queue_url())
        .env_remove("REFUNDS_QUEUE_URL")
        .env_remove("PROVIDER_EVENTS_QUEUE_URL")
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "redriving {} to {}",
            t.config.dead_letter_queue_url,
            t.queue_url()
        )),
        "{said}"
    );
    assert!(said.contains("moved 1 messages back"), "{said}");
    assert!(
        !said.contains("Error {") && !said.contains("raw: Response"),
        "{said}"
    );
    assert_eq!(t.depth().await, 1, "back in the payments queue");
    // Without the environment's queues it says what to pass, in one line.
    let out = tokio::process::Command::new(bin("payctl"))
        .args(["dlq", "redrive"])
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .env_remove("PAYMENTS_QUEUE_URL")
        .env_remove("REFUNDS_QUEUE_URL")
        .env_remove("PROVIDER_EVENTS_QUEUE_URL")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("pass --queue-url"), "{err}");
    assert!(!err.contains("Error {"), "{err}");
}

fn payctl(t: &TestStack, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin("payctl"))
        .args(args)
        .env("PAYMENTS_QUEUE_URL", t.queue_url())
        .output()
        .unwrap()
}

/// `payctl send` checks each body with the processor's own validation and sends nothing when
/// one would be dead-lettered, naming it and why; `--no-validate` sends it as it is. (Bad
/// JSON, a negative amount, currency `xyz` and 70 KB of metadata were sent with exit 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_refuses_what_the_processor_would_dead_letter() {
    let t = TestStack::new("op-send-check").await;
    let big = format!(
        r#"{{"payment_id":"p4","amount":100,"currency":"usd","customer_id":"c","payment_method":"pm_card_visa","metadata":{{"note":"{}"}}}}"#,
        "x".repeat(70_000)
    );
    for (body, says) in [
        ("{not json".to_owned(), "invalid_json"),
        (
            r#"{"payment_id":"p2","amount":-5,"currency":"usd","customer_id":"c","payment_method":"pm_card_visa"}"#.to_owned(),
            "invalid_payment",
        ),
        (
            r#"{"payment_id":"p3","amount":100,"currency":"xyz","customer_id":"c","payment_method":"pm_card_visa"}"#.to_owned(),
            "currency",
        ),
        (big, "bytes"),
    ] {
        let out = payctl(&t, &["send", "--body", &body]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("would be dead-lettered by the processor, so nothing was sent"), "{err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(err.contains("--no-validate"), "{err}");
    }
    assert_eq!(t.depth().await, 0, "nothing sent");
    let out = payctl(&t, &["send", "--no-validate", "--body", "{not json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(t.depth().await, 1, "sent as it is");
}

/// Amounts are minor units: a decimal is answered with what was meant, a negative number with
/// what amounts are (not `invalid digit found in string` or a clap error about a flag).
#[test]
fn amounts_explain_minor_units() {
    let run = |amount: &str| {
        let out = std::process::Command::new(bin("payctl"))
            .args(["pay", "--api-url", "http://127.0.0.1:1", "--amount", amount])
            .args(["--currency", "usd", "--customer", "cus_1"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("19.99");
    assert!(
        err.contains("amounts are whole minor units") && err.contains("did you mean 1999?"),
        "{err}"
    );
    let err = run("-100");
    assert!(
        err.contains("-100 is negative: amounts are whole minor units"),
        "{err}"
    );
}

/// An interrupted `send --generate` says how many went and how to go on without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_generate_says_how_many_went_and_how_to_go_on() {
    let t = TestStack::new("op-send-int").await;
    let child = tokio::process::Command::new(bin("payctl"))
        .args(["send", "--generate", "20000", "--prefix", &t.name])
        .env("PAYMENTS_QUEUE_URL", t.queue_url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // A wait for the first messages, not a speed check: the whole suite shares the emulator.
    // (It failed when payctl refused its own generated bodies: a description quoting an id
    // whose digits, joined by a dash, passed the card check.)
    let mut child = child;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while t.depth().await < 50 {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was sent in two minutes; payctl {:?}",
            child.try_wait()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    crate::operator::ctrl_c(&child);
    let out = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let sent: i64 = err
        .split("interrupted: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {err}"));
    assert!((50..20000).contains(&sent), "{err}");
    let from: usize = err
        .split("--first ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no --first: {err}"));
    assert!(
        err.contains(&format!(
            "go on with --generate {} --first {from}",
            20000 - from
        )),
        "{err}"
    );
    // Every payment before it is in the queue (the send stopped; what it counted went).
    let depth = t.depth().await;
    assert!(
        depth as usize >= from && depth >= sent,
        "{depth} in the queue, {sent} counted, from {from}: {err}"
    );
}
