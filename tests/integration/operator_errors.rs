//! Errors an operator meets, each in one line with its cause and its fix: no region, a busy
//! address, a redrive where the endpoint cannot list a DLQ's sources.

use crate::helpers::*;
use crate::operator::payctl_run;

fn lines(text: &str) -> usize {
    text.lines().filter(|l| !l.trim().is_empty()).count()
}

/// No region anywhere: one line naming AWS_REGION, not the SDK's two warnings about the
/// instance metadata service it tried instead.
#[test]
fn no_region_is_one_line_naming_aws_region() {
    let out = std::process::Command::new(root().join("target/debug/payctl"))
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
    let out = std::process::Command::new(root().join("target/debug/payctl"))
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
    let out = tokio::process::Command::new(root().join("target/debug/payctl"))
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
    let out = tokio::process::Command::new(root().join("target/debug/payctl"))
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
