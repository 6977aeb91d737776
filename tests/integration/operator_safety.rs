//! What an operator must be able to trust of `payctl` when something goes wrong: a payment's
//! key is said before anything is sent, and every failure that may or may not have stored the
//! payment prints the exact command that retries it with the same key.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{bin, root};

/// One request as a stub API saw it.
#[derive(Debug, Clone)]
struct Seen {
    key: Option<String>,
    body: String,
}

/// An API that answers each request with the next of `answers` (status, body), recording what
/// it was sent.
async fn stub_api(answers: Vec<(u16, &'static str)>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for (status, body) in answers {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let mut raw = Vec::new();
            let mut buf = [0u8; 4096];
            let (head_len, length) = loop {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request ended");
                raw.extend_from_slice(&buf[..n]);
                if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse::<usize>().unwrap())
                        .unwrap_or(0);
                    break (end + 4, length);
                }
            };
            while raw.len() < head_len + length {
                let n = conn.read(&mut buf).await.unwrap();
                raw.extend_from_slice(&buf[..n]);
            }
            let head = String::from_utf8_lossy(&raw[..head_len]).into_owned();
            let key = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("idempotency-key")
                    .then(|| v.trim().to_owned())
            });
            let body_in = String::from_utf8_lossy(&raw[head_len..]).into_owned();
            log.lock().unwrap().push(Seen { key, body: body_in });
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(reply.as_bytes()).await.unwrap();
            let _ = conn.shutdown().await;
        }
    });
    (url, seen)
}

fn payctl() -> std::process::Command {
    std::process::Command::new(bin("payctl"))
}

/// The key payctl said it would use, from the first line of its stderr.
fn said_key(stderr: &str) -> String {
    let first = stderr.lines().next().unwrap_or_default();
    first
        .strip_prefix("idempotency key: ")
        .unwrap_or_else(|| panic!("the key comes first: {stderr}"))
        .trim()
        .to_owned()
}

/// The retry command payctl printed, with `payctl` as this build's binary.
fn retry_command(stderr: &str) -> String {
    let at = stderr
        .find("payctl pay ")
        .unwrap_or_else(|| panic!("an exact retry command: {stderr}"));
    let cmd = stderr[at..].lines().next().unwrap().trim().to_owned();
    cmd.replacen("payctl", &format!("'{}'", bin("payctl").display()), 1)
}

/// A `503` (or anything else that may have stored the payment) ends with the command that
/// retries it; run as printed, that command sends the same key and the same body, and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_says_its_key_before_sending_and_prints_the_exact_retry() {
    let (url, seen) = stub_api(vec![
        (503, r#"{"message":"Service Unavailable"}"#),
        (201, r#"{"id":"x","status":"pending"}"#),
    ])
    .await;
    let out = payctl()
        .args([
            "pay",
            "--api-url",
            &url,
            "--amount",
            "1999",
            "--currency",
            "usd",
        ])
        .args([
            "--customer",
            "cus_o'brien",
            "--description",
            "two words & more",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let key = said_key(&err);
    assert!(
        err.contains("503") && err.contains("retry with the same key"),
        "{err}"
    );
    let retry = retry_command(&err);
    assert!(
        retry.contains(&format!("--idempotency-key {key}")),
        "{retry}"
    );
    let again = std::process::Command::new("bash")
        .args(["-c", &retry])
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "the printed retry works: {}",
        String::from_utf8_lossy(&again.stderr)
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].key.as_deref(), Some(key.as_str()));
    assert_eq!(seen[1].key, seen[0].key, "the same key");
    assert_eq!(
        seen[1].body, seen[0].body,
        "the same payment, byte for byte"
    );
    assert!(seen[0].body.contains("two words & more") && seen[0].body.contains("cus_o'brien"));
}

/// An API that does not answer at all: the key was said first, and the error says the payment
/// may or may not exist and how to retry it safely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_against_an_api_that_does_not_answer_still_hands_over_its_key() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = payctl()
        .args([
            "pay",
            "--api-url",
            &url,
            "--amount",
            "500",
            "--currency",
            "eur",
        ])
        .args(["--customer", "cus_1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let key = said_key(&err);
    assert!(err.contains("may or may not have been stored"), "{err}");
    assert!(
        retry_command(&err).contains(&format!("--idempotency-key {key}")),
        "{err}"
    );
    // A refusal that stored nothing (400) names no retry: the request itself must change.
    let (url, _) = stub_api(vec![(400, r#"{"error":{"code":"invalid_payment"}}"#)]).await;
    let out = payctl()
        .args([
            "pay",
            "--api-url",
            &url,
            "--amount",
            "0",
            "--currency",
            "usd",
        ])
        .args(["--customer", "cus_1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("400"), "{err}");
    assert!(!err.contains("retry with the same key"), "{err}");
}

/// A stop from a service manager (SIGTERM) ends `payctl run` with its summary, as Ctrl-C does,
/// and the shell's status for that signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_its_summary_when_stopped_with_sigterm() {
    use crate::helpers::{payment, TestStack};
    use std::time::{Duration, Instant};
    let t = TestStack::new("op-sigterm").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let child = crate::operator::payctl_run(&t, &[]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Charged, and its batch answered (the message deleted): the run has counted it.
    while t.charges(&pid).await == 0 || t.depth().await > 0 {
        assert!(Instant::now() < deadline, "never charged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid_of = child.id().expect("a running child") as i32;
    // SAFETY: kill(2) with a pid this test spawned and SIGTERM.
    assert_eq!(unsafe { libc::kill(pid_of, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("stopped on SIGTERM")
        .unwrap();
    assert_eq!(out.status.code(), Some(143));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("interrupted: ") && err.contains("1 charged"),
        "{err}"
    );
}

/// `payctl env` reads a stack and changes nothing: after a provision with non-default settings,
/// the queues keep them, the exports carry them (the function settings as provisioned, both
/// works' queues, the API's URL), it finds the template from a folder below the repository's
/// root, a stack that does not exist is an error naming `provision`, and a second shell with
/// only those exports charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payctl_env_reads_the_stack_as_provisioned_and_changes_nothing() {
    use aws_sdk_sqs::types::QueueAttributeName;
    let name = format!("env-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let bin = bin("payctl");
    let missing = payctl()
        .args(["env", "--stack-name", &name])
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success(), "a missing stack is an error");
    assert!(
        err.contains(&format!("payctl provision --stack-name {name}")),
        "{err}"
    );
    let provisioned = payctl()
        .args([
            "provision",
            "--stack-name",
            &name,
            "--visibility-timeout",
            "5",
        ])
        .args([
            "--param",
            "MaxReceiveCount=3",
            "--param",
            "RetryHorizonSeconds=120",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        provisioned.status.success(),
        "{}",
        String::from_utf8_lossy(&provisioned.stderr)
    );
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs
        .get_queue_url()
        .queue_name(format!("{name}-PaymentsQueue"))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_owned();
    let attributes = || async {
        let a = sqs
            .get_queue_attributes()
            .queue_url(&queue)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .unwrap();
        let a = a.attributes().unwrap();
        (
            a[&QueueAttributeName::VisibilityTimeout].clone(),
            a[&QueueAttributeName::RedrivePolicy].clone(),
        )
    };
    let before = attributes().await;
    assert_eq!(before.0, "5");
    assert!(before.1.contains("\"maxReceiveCount\":3"), "{}", before.1);
    let out = payctl()
        .args(["env", "--stack-name", &name])
        .current_dir(root().join("infra/payctl/src"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(attributes().await, before, "env changed nothing");
    let exports = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in [
        format!("export IDEMPOTENCY_TABLE='{name}-IdempotencyTable'"),
        "export QUEUE_VISIBILITY_TIMEOUT_SECONDS='5'".to_owned(),
        "export QUEUE_MAX_RECEIVE_COUNT='3'".to_owned(),
        "export RETRY_HORIZON_SECONDS='120'".to_owned(),
        format!("export PAYMENTS_QUEUE_URL='{queue}'"),
        "export PAYMENTS_API_URL=".to_owned(),
        "export REFUNDS_QUEUE_URL=".to_owned(),
        "export REFUNDS_DEAD_LETTER_QUEUE_URL=".to_owned(),
    ] {
        assert!(exports.contains(&line), "{line} in:\n{exports}");
    }
    let script = format!(
        "set -e\n{exports}\n'{p}' send --generate 2 --prefix {name}\n'{p}' run --until-empty --max-seconds 60 \
         --function-timeout 20 --json",
        p = bin.display()
    );
    let second = std::process::Command::new("bash")
        .args(["-c", &script])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_default())
        .output()
        .expect("running the second shell");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{said}");
    let summary: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&second.stdout)
            .lines()
            .last()
            .unwrap_or_default(),
    )
    .expect("the run's JSON summary");
    assert_eq!(summary["charged"], 2, "{said}");
    assert_eq!(attributes().await, before, "the run changed nothing either");
}

/// An explicit `--profile` never silently loses to `AWS_ENDPOINT_URL`, and a command that writes
/// says where: the endpoint and the account of its credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_endpoints_win_visibly_and_writers_say_where_they_write() {
    use crate::helpers::TestStack;
    let t = TestStack::new("op-where").await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("the local endpoint");
    let out = payctl()
        .args(["--profile", "prod", "status", "p", "--table", "t"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {err}");
    assert!(
        err.contains("--profile prod") && err.contains(&format!("AWS_ENDPOINT_URL={endpoint}")),
        "{err}"
    );
    let out = payctl()
        .args(["send", "--queue-url", t.queue_url(), "--generate", "1"])
        .args(["--prefix", &t.pid("w")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let said = err
        .lines()
        .find(|l| l.starts_with("payctl: sending payments to "))
        .unwrap_or_else(|| panic!("where it writes: {err}"));
    assert!(said.contains(&format!("on {endpoint}, account ")), "{said}");
    let account = said.rsplit("account ").next().unwrap();
    assert!(
        account.len() == 12 && account.chars().all(|c| c.is_ascii_digit()),
        "the credentials' account: {said}"
    );
}

/// `payctl reconcile` exits 0 only when every payment it looked at is settled: a payment with
/// no record, or one that must be looked at again, is exit status 2, so that a script never
/// reads "nothing found" as "done".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_exits_zero_only_when_everything_is_settled() {
    use crate::helpers::{payment, TestStack};
    let t = TestStack::new("op-reconcile").await;
    let charged = t.pid("done");
    t.send(&payment(&charged, 100, "pm_card_visa")).await;
    t.drain(1).await;
    let reconcile = |id: &str| {
        payctl()
            .args(["reconcile", id, "--table", &t.config.idempotency_table])
            .output()
            .unwrap()
    };
    let done = reconcile(&charged);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let unknown = reconcile(&t.pid("never-sent"));
    let said = String::from_utf8_lossy(&unknown.stdout);
    assert_eq!(unknown.status.code(), Some(2), "{said}");
    assert!(said.contains("no record"), "{said}");
}

/// A second `payctl send --generate` can send new payments (`--first`), and each run says which
/// ids it sent and where the next new ones start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_payments_say_their_ids_and_continue_with_first() {
    use crate::helpers::TestStack;
    let t = TestStack::new("op-generate").await;
    let prefix = t.pid("g");
    let send = |extra: &[&str]| {
        let out = payctl()
            .args(["send", "--queue-url", t.queue_url(), "--generate", "2"])
            .args(["--prefix", &prefix])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = send(&[]);
    assert!(
        first.contains(&format!("{prefix}-000000 to {prefix}-000001"))
            && first.contains("--first 2"),
        "{first}"
    );
    let second = send(&["--first", "2"]);
    assert!(
        second.contains(&format!("{prefix}-000002 to {prefix}-000003")),
        "{second}"
    );
    let stats = t.drain(1).await;
    assert_eq!(
        stats.summary.done("charged"),
        4,
        "four payments, none a copy"
    );
}

/// `payctl run --until-empty` says what it waits for: while the only message is hidden until its
/// redelivery, the progress line names when it comes back, and a run that ends before then says
/// so instead of just "did not drain".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_empty_says_when_the_next_message_comes_back() {
    use crate::helpers::{payment, TestStack};
    use std::time::Duration;
    let t = TestStack::new("op-waits").await;
    let pid = t.pid("p1");
    t.fault(&pid, "down", None, 0).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let mut cmd =
        crate::operator::payctl_run(&t, &["--until-empty", "--max-seconds", "8", "--progress"]);
    cmd.env("REDELIVERY_BASE_DELAY_SECONDS", "60")
        .env("REDELIVERY_MAX_DELAY_SECONDS", "120");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the run ends at --max-seconds")
        .unwrap();
    t.sim.clear_faults_for(&pid).await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let progress = err
        .lines()
        .find(|l| l.contains("| queue: 0 waiting, 1 in flight"))
        .unwrap_or_else(|| panic!("a progress line while it waits: {err}"));
    assert!(
        progress.contains("the next handed-back message comes back at "),
        "{progress}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("did not drain")
            && last.contains("comes back at")
            && last.contains("--max-seconds"),
        "{last}"
    );
}
