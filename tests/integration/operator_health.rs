//! `payctl health`: the queues, the dead letters by code, the records, the catch-up and the
//! stack's alarms in one view, with an exit status a script can act on.

use crate::helpers::*;
use crate::operator::payctl_run;

fn health(t: &TestStack, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin("payctl"));
    cmd.arg("health")
        .args(args)
        .env("PAYMENTS_QUEUE_URL", t.queue_url())
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .env_remove("REFUNDS_QUEUE_URL")
        .env_remove("REFUNDS_DEAD_LETTER_QUEUE_URL")
        .env_remove("PROVIDER_EVENTS_QUEUE_URL")
        .env_remove("PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL");
    cmd
}

/// Healthy after a charge (exit 0); after a dead letter it names its code and exits 2; the
/// oldest message's age comes from CloudWatch where the endpoint has it; a firing alarm of the
/// stack is shown and needs attention. (There was no such view: only `dlq list`'s JSON lines.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_shows_queues_dead_letters_records_and_alarms() {
    let t = TestStack::new("op-health").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let out = payctl_run(&t, &["--until-empty"]).output().await.unwrap();
    assert!(out.status.success());

    let out = health(&t, &[]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("healthy: no dead letters"), "{text}");
    assert!(
        text.contains("the OpenRecords index: 0 items"),
        "nothing failing: the index holds nothing, whatever the table holds: {text}"
    );
    // Every record counted, by a scan of the whole table, on request.
    let out = health(&t, &["--scan-records"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("payment")
                && l.split_whitespace().nth(1) == Some("1")),
        "one completed payment record: {text}"
    );
    assert!(text.contains("a scan of the whole table"), "{text}");

    // A payment whose attempt failed with its outcome unknown: in the index until completed.
    let stuck = payment(&t.pid("p2"), 100, "pm_card_visa");
    t.claim_as(&stuck, "w1").await;
    let note = sqs_once::record::FailureNote {
        error: "timed out".into(),
        unknown_outcome: true,
        not_before_ms: None,
    };
    sqs_once::IdempotencyStore::fail(
        &t.store,
        &t.pid("p2"),
        "w1",
        sqs_once::runner::now_ms(),
        &note,
    )
    .await
    .unwrap();
    let out = health(&t, &["--json"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown outcome needs a person"
    );
    let h: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON reading");
    assert_eq!(h["records"]["payment"]["failed"], 1, "{h}");
    assert_eq!(h["records"]["payment"]["unknown"], 1, "{h}");
    assert_eq!(
        h["records"]["payment"]["completed"],
        serde_json::Value::Null,
        "{h}"
    );
    assert_eq!(
        h["records_read"]["items"], 1,
        "only the failed record is read: {h}"
    );
    // Completed, it leaves the index.
    t.claim_as(&stuck, "w2").await;
    sqs_once::IdempotencyStore::complete(
        &t.store,
        &t.pid("p2"),
        "w2",
        &sqs_once::Outcome::new("succeeded"),
        None,
    )
    .await
    .unwrap();
    let out = health(&t, &["--json"]).output().unwrap();
    let h: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON reading");
    assert_eq!(h["records_read"]["items"], 0, "{h}");
    assert_eq!(out.status.code(), Some(0), "{h}");

    t.send("{not json").await;
    let out = payctl_run(&t, &["--until-empty"]).output().await.unwrap();
    assert!(out.status.success());
    // The payments queue's oldest message, as AWS publishes it.
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let cw = aws_sdk_cloudwatch::Client::new(&sdk);
    let queue_name = t.queue_url().rsplit('/').next().unwrap().to_owned();
    cw.put_metric_data()
        .namespace("AWS/SQS")
        .metric_data(
            aws_sdk_cloudwatch::types::MetricDatum::builder()
                .metric_name("ApproximateAgeOfOldestMessage")
                .dimensions(
                    aws_sdk_cloudwatch::types::Dimension::builder()
                        .name("QueueName")
                        .value(&queue_name)
                        .build(),
                )
                .value(42.0)
                .timestamp(std::time::SystemTime::now().into())
                .build(),
        )
        .send()
        .await
        .expect("putting the metric");
    // A firing alarm of the stack, named as CloudFormation names them.
    let alarm = format!("{}-DeadLetterDepthAlarm-ABC123", t.name);
    cw.put_metric_alarm()
        .alarm_name(&alarm)
        .namespace("AWS/SQS")
        .metric_name("ApproximateNumberOfMessagesVisible")
        .statistic(aws_sdk_cloudwatch::types::Statistic::Maximum)
        .period(60)
        .evaluation_periods(1)
        .threshold(0.0)
        .comparison_operator(aws_sdk_cloudwatch::types::ComparisonOperator::GreaterThanThreshold)
        .send()
        .await
        .expect("putting the alarm");
    cw.set_alarm_state()
        .alarm_name(&alarm)
        .state_value(aws_sdk_cloudwatch::types::StateValue::Alarm)
        .state_reason("a dead letter")
        .send()
        .await
        .expect("setting its state");

    let out = health(&t, &["--json", "--stack-name", &t.name])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "needs attention: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let h: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON reading");
    assert_eq!(h["dead_letters"][0]["total"], 1, "{h}");
    assert_eq!(h["dead_letters"][0]["by_code"]["invalid_json"], 1, "{h}");
    assert_eq!(h["queues"][0]["oldest_age_s"], 42.0, "{h}");
    assert_eq!(h["records"]["payment"]["failed"], 0, "{h}");
    assert_eq!(h["alarms"][0]["name"], alarm.as_str(), "{h}");
    assert_eq!(h["alarms"][0]["state"], "ALARM", "{h}");
    let attention = h["attention"].to_string();
    assert!(
        attention.contains("payments: 1 dead letters"),
        "{attention}"
    );
    assert!(
        attention.contains(&format!("the alarm {alarm} is firing")),
        "{attention}"
    );
}

/// On a terminal `payctl run`'s log is short text lines, not JSON objects burying the progress
/// and the summary (a pseudo-terminal from util-linux's `script`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_the_run_logs_text_not_json() {
    let t = TestStack::new("op-tty").await;
    t.send(&payment(&t.pid("p1"), 100, "pm_card_visa")).await;
    t.send("{not json").await;
    let command = format!(
        "{} run --until-empty --queue-url {}",
        bin("payctl").display(),
        t.queue_url()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
        .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
        .envs(fast_settings())
        .output()
        .expect("util-linux script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 charged"), "the summary: {text}");
    assert!(
        text.contains("message dead-lettered"),
        "the log line: {text}"
    );
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with('{')),
        "no JSON line on a terminal: {text}"
    );
}

/// A catch-up whose runs stopped checking the provider's list (failing, or behind a backlog)
/// needs a person once it is behind by more than a run's interval: `payctl health` says how far
/// and exits 2. (The last event queued said nothing: listing only undelivered events it may be
/// weeks old while the runs keep up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_behind_the_list_by_more_than_its_interval_needs_attention() {
    use payment_core::events::catch_up::{Checkpoint, Position};
    let t = TestStack::new("op-health-lag").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    let now = sqs_once::runner::now_ms() / 1000;
    let recent = Position {
        caught_up: true,
        version: 1,
        checked_through_s: Some(now - 1_800),
        ..Position::default()
    };
    assert!(checkpoint
        .advance(&Position::default(), &recent)
        .await
        .unwrap());
    let out = health(&t, &[]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "half an hour behind an hourly run: {text}"
    );
    assert!(
        text.contains("30 min") || text.contains("checked through"),
        "{text}"
    );
    let behind = Position {
        version: 2,
        checked_through_s: Some(now - 3 * 3_600),
        ..recent.clone()
    };
    assert!(checkpoint.advance(&recent, &behind).await.unwrap());
    let out = health(&t, &["--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let h: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON reading");
    assert!(
        h["attention"].to_string().contains("events catch-up"),
        "{h}"
    );
    // Every quarter of an hour, with the stack's interval given.
    let out = health(&t, &["--catch-up-minutes", "240"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}
