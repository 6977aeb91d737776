//! `payctl run`, `relay` and `api serve` stopped and summed up: the first Ctrl-C lets what is
//! in flight finish and counts it, a second stops at once and says what it left; every delivery
//! falls in exactly one bucket of the run's summary; AWS faults are ridden out, not a stop.

use crate::api::{api_process_with, client, free_port, relay_process, rows};
use crate::helpers::*;
use crate::operator::{ctrl_c, payctl_run};
use std::time::Duration;

/// The first Ctrl-C stops receiving and lets the batch in flight finish: every payment the
/// provider charged is acknowledged and counted, no record is left in progress, nothing is left
/// invisible in the queue. (The run used to abandon its pollers: charged, counted 0, the
/// records `IN_PROGRESS` and the messages invisible for the visibility timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_ctrl_c_finishes_the_batch_in_flight_and_counts_it() {
    let t = TestStack::new("op-stop").await;
    let prefix = t.pid("slow");
    // Within the client's timeout (2 s in the fast settings).
    t.fault(&prefix, "latency", None, 1500).await;
    let pids: Vec<String> = (0..5).map(|i| format!("{prefix}-{i}")).collect();
    for pid in &pids {
        t.send(&payment(pid, 100, "pm_card_visa")).await;
    }
    let child = payctl_run(&t, &["--json"]).spawn().unwrap();
    // Claimed: the batch is with the provider, which answers in 1.5 s.
    t.wait_for_claim(&pids[0]).await;
    ctrl_c(&child);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("stopped after its batch")
        .unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stopping: nothing more is received"), "{err}");
    let summary: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the --json summary");
    let mut charged = 0;
    for pid in &pids {
        let n = t.charges(pid).await;
        assert!(n <= 1, "{pid} charged {n} times");
        charged += n;
        if n == 1 {
            let record = t.record(pid).await.expect("a record");
            assert_eq!(
                record.status,
                sqs_once::record::RecordStatus::Completed,
                "{pid}: finished, not left in progress"
            );
        }
    }
    assert!(charged >= 1, "the batch in flight was charged: {err}");
    assert_eq!(summary["charged"], charged as u64, "counted: {summary}");
    assert_eq!(summary["interrupted"], true);
    assert_eq!(summary["left_in_flight"], 0);
    // What was charged was acknowledged; what was never received is still there, visible.
    assert_eq!(t.depth().await as usize, pids.len() - charged, "{err}");
    t.sim.clear_faults_for(&prefix).await.unwrap();
}

/// A second Ctrl-C stops at once and says what it left in flight and when that comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_stops_at_once_and_says_what_it_left() {
    let t = TestStack::new("op-stop2").await;
    let pid = t.pid("slow");
    t.fault(&pid, "latency", None, 10_000).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let child = payctl_run(&t, &["--json"]).spawn().unwrap();
    t.wait_for_claim(&pid).await;
    for _ in 0..2 {
        ctrl_c(&child);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = tokio::time::timeout(Duration::from_secs(5), child.wait_with_output())
        .await
        .expect("stopped at once")
        .unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "stopped at once, 1 left in flight: they come back within the visibility timeout"
        ),
        "{err}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the --json summary");
    assert_eq!(summary["left_in_flight"], 1, "{summary}");
    t.sim.clear_faults_for(&pid).await.unwrap();
}

/// Every delivery of a run falls in exactly one bucket of its summary, the payments that wait
/// for the customer (`requires_action`) or the provider (`processing`) included: the buckets
/// add up to the deliveries received. (The summary had no bucket for those two: 59 of 60
/// deliveries accounted for looked like a lost payment.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_falls_in_exactly_one_bucket_of_the_summary() {
    let t = TestStack::new("op-buckets").await;
    let p = |s: &str| t.pid(s);
    for (id, method) in [
        ("visa", "pm_card_visa"),
        ("visa", "pm_card_visa"),
        ("declined", "pm_card_chargeDeclined"),
        ("auth", "pm_card_authenticationRequired"),
        ("ach", "pm_usBankAccount_success"),
    ] {
        t.send(&payment(&p(id), 100, method)).await;
    }
    t.send("{not json").await;
    let out = payctl_run(&t, &["--until-empty", "--json", "--max-seconds", "60"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the --json summary");
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("no {k} in {s}"));
    let sum_of = |k: &str| -> u64 {
        s[k].as_object()
            .unwrap_or_else(|| panic!("no {k} in {s}"))
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum()
    };
    let buckets = n("charged")
        + n("declined")
        + n("requires_action")
        + n("processing")
        + n("refunded")
        + n("events_applied")
        + n("events_unchanged")
        + sum_of("other_done")
        + n("duplicates")
        + n("retried")
        + sum_of("dead_lettered")
        + n("in_failed_batches");
    assert_eq!(buckets, n("received"), "every delivery in one bucket: {s}");
    assert_eq!(
        (
            n("charged"),
            n("declined"),
            n("requires_action"),
            n("processing")
        ),
        (1, 1, 1, 1),
        "{s}"
    );
    assert_eq!((n("duplicates"), sum_of("dead_lettered")), (1, 1), "{s}");
    assert!(
        err.contains("1 charged, 1 declined, 1 requires_action, 1 processing"),
        "{err}"
    );
}

/// `payctl api serve`'s first Ctrl-C answers the request it is handling (the payment written,
/// its answer on its way) before it exits, then accepts no more. (It used to die with the
/// request: the client saw a broken connection after the write.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_serve_answers_the_request_in_flight_before_it_stops() {
    let t = TestStack::new("op-stop-api").await;
    let port = free_port();
    // The write commits, then the answer waits 2 s (a pause of the task, not of its thread):
    // the Ctrl-C comes in between.
    let child = api_process_with(
        &t,
        port,
        Some("api_after_write=return(2000)"),
        std::process::Stdio::piped(),
    )
    .await;
    let url = format!("http://127.0.0.1:{port}");
    let c = client(&url).await;
    let key = t.pid("p1");
    let body = r#"{"amount":2500,"currency":"usd","customer_id":"cus_stop","payment_method":"pm_card_visa"}"#;
    let request = {
        let key = key.clone();
        tokio::spawn(async move { c.create(&key, body).await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rows(&t).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the API never wrote the payment"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ctrl_c(&child);
    let answer = request.await.unwrap().expect("answered, not cut off");
    assert_eq!(answer.status, 202, "{}", answer.body);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("stopped once the request was answered")
        .unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the requests being answered (1) are finished first"),
        "{err}"
    );
    assert!(err.contains("stopped: every request was answered"), "{err}");
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err(),
        "no longer listening"
    );
}

/// `payctl relay`'s first Ctrl-C finishes the send under way and says how many payments it
/// relayed. (It used to exit 0 at once with nothing said.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_finishes_its_send_and_counts_it_when_stopped() {
    let t = TestStack::new("op-stop-relay").await;
    let port = free_port();
    let _api = api_process_with(&t, port, None, std::process::Stdio::null()).await;
    let c = client(&format!("http://127.0.0.1:{port}")).await;
    let key = t.pid("p1");
    let body = r#"{"amount":2500,"currency":"usd","customer_id":"cus_stop","payment_method":"pm_card_visa"}"#;
    assert_eq!(c.create(&key, body).await.unwrap().status, 202);
    // The message is sent, then the relay waits 2 s before it moves on: the Ctrl-C comes in
    // between.
    let child = relay_process(
        &t,
        "relay_after_send=sleep(2000)",
        std::process::Stdio::piped(),
    )
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while t.depth().await == 0 {
        assert!(std::time::Instant::now() < deadline, "nothing relayed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ctrl_c(&child);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("stopped once the send was finished")
        .unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stopped; payments relayed to the queue: 1"),
        "{err}"
    );
    assert_eq!(t.depth().await, 1, "sent once");
}

/// `payctl run` rides out AWS faults as Lambda's pollers do: with the fault proxy throttling,
/// answering `500`, stalling or losing the answer of 40 % of its AWS calls (10 % each), it backs
/// off, goes on, drains the queue and exits 0; each payment is charged once, and the summary
/// says how many failures it rode out. (It used to exit 1 after the SDK's retries:
/// `receiving messages: ... ThrottlingException`, `deleting processed messages: ...`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payctl_run_rides_out_aws_faults_and_drains() {
    let t = TestStack::new("op-faults").await;
    let proxy = proving::aws_faults::FaultProxy::start(&required_env("AWS_ENDPOINT_URL"), 0.4, 11)
        .await
        .expect("the fault proxy");
    let pids: Vec<String> = (0..20).map(|i| t.pid(&format!("p{i:02}"))).collect();
    for pid in &pids {
        t.send(&payment(pid, 100, "pm_card_visa")).await;
    }
    let out = payctl_run(
        &t,
        &[
            "--until-empty",
            "--json",
            "--pollers",
            "2",
            "--max-seconds",
            "240",
        ],
    )
    .env("AWS_ENDPOINT_URL", &proxy.url)
    // The SDK's own retries off: every fault reaches the poller (and the processor).
    .env("AWS_MAX_ATTEMPTS", "1")
    .output()
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", proxy.counts.summary());
    let summary: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the --json summary");
    for pid in &pids {
        assert_eq!(t.charges(pid).await, 1, "{pid}: {summary}");
    }
    assert!(proxy.counts.total() > 0, "{}", proxy.counts.summary());
    assert!(
        summary["aws_failures"].as_u64().unwrap() > 0,
        "rode some out: {summary}; {}",
        proxy.counts.summary()
    );
    assert!(err.contains("rode out"), "{err}");
    assert_eq!(t.depth().await, 0, "drained");
}
