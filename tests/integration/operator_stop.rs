//! `payctl run` stopped and summed up: the first Ctrl-C lets the batch in flight finish and
//! counts it, a second stops at once and says what it left; every delivery falls in exactly one
//! bucket of the summary.

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
