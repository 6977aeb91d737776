//! `payctl run` as an operator meets it: a missing resource named with its fix before anything
//! is received, progress while it works, a summary however it stops (Ctrl-C included), `--json`,
//! timestamped log lines, and a non-zero exit when nothing succeeded.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::helpers::*;

pub(crate) fn payctl_run(t: &TestStack, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin("payctl"));
    cmd.args(["run", "--queue-url", t.queue_url()])
        .args(args)
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .envs(fast_settings())
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Sends a child this test spawned SIGINT, as Ctrl-C does.
pub(crate) fn ctrl_c(child: &tokio::process::Child) {
    let pid = child.id().expect("a running child") as i32;
    // SAFETY: kill(2) with a pid this test spawned and SIGINT.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
}

/// A wrong table or queue fails at start, in one line that names it and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_or_queue_is_named_with_its_fix_before_anything_runs() {
    let t = TestStack::new("op-missing").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    for (var, value, named) in [
        (
            "IDEMPOTENCY_TABLE",
            "no-such-table",
            "the idempotency table no-such-table (IDEMPOTENCY_TABLE)",
        ),
        (
            "DEAD_LETTER_QUEUE_URL",
            "http://127.0.0.1:1/000000000000/gone",
            "(DEAD_LETTER_QUEUE_URL)",
        ),
    ] {
        let mut cmd = payctl_run(&t, &["--until-empty"]);
        cmd.env(var, value);
        let out = cmd.output().await.unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].contains(named), "{err}");
        assert!(
            lines[0].contains("payctl provision") || lines[0].contains("does not answer"),
            "says what to do: {err}"
        );
        assert!(
            !err.contains("ServiceError") && !err.contains("backtrace"),
            "{err}"
        );
    }
    assert_eq!(t.depth().await, 1, "nothing was received");
    // The other commands that name a table or a queue say the same.
    let gone = format!(
        "{}/000000000000/gone",
        std::env::var("AWS_ENDPOINT_URL").unwrap()
    );
    for args in [
        vec!["dlq", "list", "--dlq-url", gone.as_str()],
        vec!["send", "--queue-url", gone.as_str(), "--generate", "1"],
        vec![
            "outbox",
            "pending",
            "--table",
            "no-such-table",
            "--records-table",
            "no-such-table",
        ],
        vec!["status", "p", "--table", "no-such-table"],
    ] {
        let out = std::process::Command::new(bin("payctl"))
            .args(&args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("does not exist") && err.contains("payctl provision"),
            "{args:?}: {err}"
        );
    }
}

/// A run in which every delivery failed exits non-zero with its summary (and `--json`);
/// its log lines carry timestamps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_where_nothing_succeeded_exits_non_zero_with_its_summary() {
    let t = TestStack::build("op-failed", fast_settings(), false, 2).await;
    let pid = t.pid("p1");
    t.fault(&pid, "down", None, 0).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let out = payctl_run(&t, &["--until-empty", "--json", "--max-seconds", "60"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("nothing succeeded"), "{err}");
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("--json");
    assert_eq!(summary["charged"], 0);
    assert_eq!(summary["dead_lettered"]["retries_exhausted"], 1);
    assert!(summary["retried"].as_u64().unwrap() >= 1);
    assert!(
        err.contains("0 charged") && err.contains("retries_exhausted 1"),
        "{err}"
    );
    assert!(
        !err.contains("{}") && !err.contains("DeadLettered("),
        "no debug formatting: {err}"
    );
    let logged: serde_json::Value = err
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("a JSON log line");
    assert!(logged["timestamp"].is_string(), "{logged}");
    t.sim.clear_faults_for(&pid).await.unwrap();
}

/// Progress lines while it works; Ctrl-C prints the summary and exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_while_running_and_the_summary_on_ctrl_c() {
    let t = TestStack::new("op-ctrlc").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let child = payctl_run(&t, &["--progress"]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.charges(&pid).await == 0 {
        assert!(Instant::now() < deadline, "never charged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await; // at least one progress line
    ctrl_c(&child);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("stopped on Ctrl-C")
        .unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("| queue:") && err.contains("in flight"),
        "a progress line: {err}"
    );
    assert!(
        err.contains("interrupted: ") && err.contains("1 charged"),
        "{err}"
    );
}

/// `payctl provision` is safe to run again (it reports what exists and updates what differs),
/// prints the local provider rather than the template's default, and refuses a real AWS account
/// unless told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_is_idempotent_and_guards_real_aws() {
    let name = format!("prov-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let provision = |extra: &[&str], local: bool| {
        let mut cmd = std::process::Command::new(bin("payctl"));
        cmd.args(["provision", "--template"])
            .arg(root().join("template.yaml"))
            .args(["--stack-name", &name])
            .args(extra);
        if !local {
            cmd.env_remove("AWS_ENDPOINT_URL");
        }
        let out = cmd.output().expect("running payctl provision");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, first, made) = provision(&[], true);
    assert!(ok, "{made}");
    // Seven queues (payments, refunds, provider events, their dead-letter queues, relay
    // failures), two tables.
    assert_eq!(made.matches("created").count(), 9, "{made}");
    let (ok, second, again) = provision(&[], true);
    assert!(ok, "a second run succeeds: {again}");
    assert_eq!(again.matches("exists").count(), 9, "{again}");
    let urls =
        |out: &str| serde_json::from_str::<serde_json::Value>(out).unwrap()["queues"].clone();
    assert_eq!(urls(&first), urls(&second));
    let env: serde_json::Value = serde_json::from_str(&second).unwrap();
    assert_eq!(
        env["function_env"]["PROVIDER_API_URL"].as_str(),
        std::env::var("PROVIDER_API_URL").ok().as_deref(),
        "the local provider, not the template's api.stripe.com"
    );

    let (ok, _, changed) = provision(&["--visibility-timeout", "17"], true);
    assert!(ok, "{changed}");
    assert!(
        changed.contains(&format!("updated  queue {name}-PaymentsQueue")),
        "{changed}"
    );
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let url = urls(&second)["PaymentsQueue"].as_str().unwrap().to_owned();
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
        .send()
        .await
        .unwrap();
    assert_eq!(
        attrs
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout))
            .map(String::as_str),
        Some("17")
    );

    let (ok, _, refused) = provision(&[], false);
    assert!(!ok, "no endpoint: a real account");
    assert!(refused.contains("--yes-real-aws"), "{refused}");
    let (ok, _, refused) = provision(&["--region", "eu-west-3"], false);
    assert!(!ok);
    assert!(
        refused.contains("AWS (eu-west-3)"),
        "--region is the account's region: {refused}"
    );
}

/// The provider's URL under its old name (`PAYMENT_API_URL`, a letter from `PAYMENTS_API_URL`)
/// is still used, and the operator is told to rename it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_url_s_old_name_still_works_and_is_named_for_renaming() {
    let out = tokio::process::Command::new(bin("payctl"))
        .args(["smoke", "--stripe-key-env", "OLD_NAME_TEST_KEY"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .env("PAYMENT_API_URL", "http://127.0.0.1:1")
        .env("OLD_NAME_TEST_KEY", "sk_test_x")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PAYMENT_API_URL is the old name of PROVIDER_API_URL"),
        "{err}"
    );
    assert!(
        err.contains("http://127.0.0.1:1/v1/customers"),
        "the old name's URL is the one used: {err}"
    );
}

/// A shell without credentials or an endpoint gets a hint, not an IMDS error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_without_credentials_is_told_what_to_set() {
    let out = tokio::process::Command::new(bin("payctl"))
        .args([
            "--region",
            "us-east-1",
            "run",
            "--queue-url",
            "https://sqs.us-east-1.amazonaws.com/1/q",
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("IDEMPOTENCY_TABLE", "t")
        .env(
            "DEAD_LETTER_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/1/dlq",
        )
        .env("PROVIDER_API_URL", "http://127.0.0.1:1")
        .env("PAYMENT_API_KEY", "sk_test_x")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no AWS credentials were found") && err.contains("AWS_ENDPOINT_URL"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "{err}"
    );
}

/// `payctl status` reads in UTC, shows only what the record's state means (no lease owner on a
/// completed record), shows the dead letter of a payment that has no record, and `--json` has
/// it all; `payctl history` puts it in time order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_history_read_like_an_operator_needs() {
    let mut env = fast_settings();
    env.insert("IDEMPOTENCY_TTL_SECONDS".into(), "3600".into());
    let t = TestStack::with_env("op-status", env).await;
    let (done, old) = (t.pid("done"), t.pid("old"));
    t.send(&payment(&done, 1999, "pm_card_visa")).await;
    // A message first sent two hours ago: dead-lettered as request_expired, never claimed.
    t.sqs
        .send_message()
        .queue_url(t.queue_url())
        .message_body(payment(&old, 100, "pm_card_visa"))
        .message_attributes(
            "first_sent_at",
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value((sqs_once::runner::now_ms() - 7_200_000).to_string())
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    t.drain(1).await;
    let payctl = |args: &[&str]| {
        let out = std::process::Command::new(bin("payctl"))
            .args(args)
            .args(["--table", &t.config.idempotency_table])
            .output()
            .expect("running payctl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, text, _) = payctl(&["status", &done]);
    assert!(ok, "{text}");
    assert!(
        text.contains("COMPLETED (succeeded 1999 usd, provider pi_"),
        "{text}"
    );
    assert!(
        text.contains("completed        20") && text.contains('Z'),
        "UTC: {text}"
    );
    assert!(
        !text.contains("held by"),
        "no lease on a completed record: {text}"
    );
    let (ok, json, _) = payctl(&["status", &done, "--json"]);
    assert!(ok);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["record"]["status"], "COMPLETED");
    assert!(doc["record"]["completed_at"]["utc"].is_string());
    assert!(doc["record"]["lease_owner"].is_null());
    let (ok, history, _) = payctl(&["history", &done]);
    assert!(ok);
    let lines: Vec<&str> = history.lines().collect();
    assert!(
        lines.first().unwrap().ends_with("first claimed"),
        "{history}"
    );
    assert!(
        lines.last().unwrap().ends_with("completed: succeeded"),
        "{history}"
    );

    let (ok, text, _) = payctl(&["status", &old]);
    assert!(ok, "a dead letter is an answer: {text}");
    assert!(
        text.contains("no record") && text.contains("dead-lettered    request_expired"),
        "{text}"
    );
    let (ok, _, err) = payctl(&["status", &t.pid("never")]);
    assert!(!ok);
    assert!(err.contains("no record and no dead letter"), "{err}");
}
