//! Long work, deadlines, lost leases, FIFO order and the provider's finite memory, against the
//! emulator and the simulator.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sqs_once::runner::now_ms;

use crate::helpers::*;

/// A provider slower than three visibility timeouts: the heartbeat keeps the message hidden
/// and the lease alive; one delivery, one call, one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_provider_beyond_three_visibility_timeouts_charges_once_without_redelivery() {
    let t = TestStack::with_env(
        "slow",
        env(&[
            ("LEASE_SECONDS", "30"),
            ("PAYMENT_API_TIMEOUT_SECONDS", "20"),
        ]),
    )
    .await;
    let pid = t.pid("p1");
    let latency = (3 * VISIBILITY as u64 + 1) * 1000;
    t.fault(&pid, "latency", Some(1), latency).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let stats = t.drain(2).await;
    assert_charged_once(&t, &pid).await;
    assert_eq!(stats.received, 1, "no redelivery while the heartbeat ran");
    assert_eq!(t.calls(&pid).await, 1);
    assert_eq!(t.record(&pid).await.unwrap().attempts, 1);
}

/// An invocation killed at its timeout (the event-source mapping drops it, as Lambda kills
/// the process) leaves its record in progress; the next delivery takes it over once the lease
/// ends and completes it with the provider's one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_invocation_completes_on_the_next_delivery() {
    let t = TestStack::with_env(
        "timeout",
        env(&[
            ("LEASE_SECONDS", "13"),
            ("PAYMENT_API_TIMEOUT_SECONDS", "11"),
        ]),
    )
    .await;
    let pid = t.pid("p1");
    t.fault(&pid, "latency", Some(1), 8_000).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let records = t.receive_records(1).await;
    let killed = tokio::time::timeout(
        Duration::from_secs(3),
        t.processor.handle_batch(records, now_ms() + 30_000),
    )
    .await;
    assert!(
        killed.is_err(),
        "the invocation was still running at its timeout"
    );
    let r = t.record(&pid).await.unwrap();
    assert_eq!(
        r.status.as_str(),
        "IN_PROGRESS",
        "left in progress by the killed invocation"
    );

    let stats = t.drain(1).await;
    assert_eq!(stats.timeouts, 0);
    assert_charged_once(&t, &pid).await;
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.attempts, 2, "taken over once the lease ended");
    assert!(t.dead_letters().await.is_empty());
}

/// A worker whose lease renewal is refused stops its work and completes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_stops_the_work() {
    let t = TestStack::with_env(
        "lostlease",
        env(&[
            ("LEASE_SECONDS", "30"),
            ("PAYMENT_API_TIMEOUT_SECONDS", "20"),
        ]),
    )
    .await;
    let pid = t.pid("p1");
    t.fault(&pid, "latency", Some(1), 10_000).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let records = t.receive_records(1).await;
    let started = std::time::Instant::now();
    let worker = {
        let processor = t.processor.clone();
        tokio::spawn(async move { processor.handle_batch(records, now_ms() + 30_000).await })
    };
    // Once the worker holds the record, another owner takes it.
    let claimed = t.wait_for_claim(&pid).await;
    assert_eq!(claimed.status.as_str(), "IN_PROGRESS");
    aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await)
        .update_item()
        .table_name(&t.config.idempotency_table)
        .key("pk", AttributeValue::S(format!("payment#{pid}")))
        .update_expression("SET lease_owner = :o")
        .expression_attribute_values(":o", AttributeValue::S("another-worker".into()))
        .send()
        .await
        .unwrap();
    let (response, _) = worker.await.unwrap();
    assert_eq!(response.batch_item_failures.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "stopped at the next beat, not after the 10 s call"
    );
    let r = t.record(&pid).await.unwrap();
    assert_eq!(
        (r.status.as_str(), r.lease_owner.as_deref()),
        ("IN_PROGRESS", Some("another-worker"))
    );
}

/// FIFO: a failure blocks the rest of its group in the batch; other groups go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_group_is_blocked_after_a_failure() {
    let t = TestStack::fifo("fifo").await;
    let (a1, a2, a3, b1, b2) = (
        t.pid("a1"),
        t.pid("a2"),
        t.pid("a3"),
        t.pid("b1"),
        t.pid("b2"),
    );
    t.fault(&a1, "down", None, 0).await;
    let mut ids = Vec::new();
    for (pid, g) in [(&a1, "A"), (&b1, "B"), (&a2, "A"), (&a3, "A"), (&b2, "B")] {
        ids.push(t.send_in_group(&payment(pid, 100, "pm_card_visa"), g).await);
    }
    let records = t.receive_records(5).await;
    assert_eq!(records.len(), 5);
    let response = t.invoke(records).await;
    let mut failed: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    failed.sort();
    let mut want = vec![ids[0].clone(), ids[2].clone(), ids[3].clone()];
    want.sort();
    assert_eq!(failed, want);
    assert_eq!(
        t.calls(&a2).await + t.calls(&a3).await,
        0,
        "not processed after the failure"
    );
    assert_charged_once(&t, &b1).await;
    assert_charged_once(&t, &b2).await;
    t.sim.clear_faults_for(&a1).await.unwrap();
}

/// FIFO: a producer's bad payments of one customer (one group) are all dead-lettered, and every
/// letter shows to `payctl dlq list`, with the group it had kept for a redrive. In the dead-letter
/// queue each letter is a group of its own: a FIFO receive returns nothing more of a group while
/// some of it is in flight, so twelve letters of one group showed ten, and the rest reached the
/// queue's retention unread (the simulator's sweep, FIFO drawn: seed 1, 2026-12-07).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_dead_letter_queue_shows_every_letter_of_one_group() {
    let t = TestStack::fifo("fifo-dlq").await;
    for n in 0..12 {
        t.send_in_group(
            &payment(&t.pid(&format!("bad{n}")), -5, "pm_card_visa"),
            "A",
        )
        .await;
    }
    let mut dead = 0;
    for _ in 0..6 {
        let records = t.receive_records(10).await;
        if records.is_empty() {
            break;
        }
        let response = t.invoke(records.clone()).await;
        dead += records.len() - response.batch_item_failures.len();
    }
    assert_eq!(dead, 12, "every bad payment dead-lettered");
    let letters = payctl::dlq::list(&t.sqs, &t.config.dead_letter_queue_url, 100)
        .await
        .unwrap();
    assert_eq!(letters.len(), 12, "{letters:?}");
    assert!(letters
        .iter()
        .all(|l| l.error_code.as_deref() == Some("invalid_payment")));
    let m = t
        .sqs
        .receive_message()
        .queue_url(&t.config.dead_letter_queue_url)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let group = m.messages()[0]
        .message_attributes()
        .and_then(|a| a.get(sqs_once::queue::attrs::SOURCE_GROUP))
        .and_then(|v| v.string_value());
    assert_eq!(group, Some("A"));
}

/// The provider committed, the answer was lost, and the provider then forgot the key: the
/// redelivery looks the payment up instead of charging it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_lost_then_key_forgotten_is_settled_by_lookup_not_a_second_charge() {
    let t = TestStack::with_env(
        "forgot",
        env(&[
            ("PROVIDER_MAX_ATTEMPTS", "1"),
            ("PROVIDER_KEY_RETENTION_SECONDS", "4"),
            // The least margin the configuration accepts (lease 5 + timeout 2 + allowance 1 +
            // 60 s of skew): longer than the retention, so every unknown outcome is looked up.
            ("PROVIDER_KEY_RETENTION_MARGIN_SECONDS", "68"),
        ]),
    )
    .await;
    let pid = t.pid("p1");
    t.fault(&pid, "drop_after_commit", Some(1), 0).await;
    t.fault(&pid, "forget_after", None, 4_000).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let response = t.invoke(t.receive_records(1).await).await;
    assert_eq!(response.batch_item_failures.len(), 1);
    let r = t.record(&pid).await.unwrap();
    assert!(r.status.as_str() == "FAILED" && r.unknown_outcome);
    assert_eq!(t.charges(&pid).await, 1, "the provider did charge");
    tokio::time::sleep(Duration::from_millis(4_500)).await; // the provider forgets the key
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    assert_eq!(
        t.calls(&pid).await,
        1,
        "settled by the lookup, no second call"
    );
}

/// The provider committed and then replays a cached 500 for the key: the lookup settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_500_is_settled_by_lookup_not_a_second_charge() {
    let t = TestStack::new("cached500").await;
    let pid = t.pid("p1");
    t.fault(&pid, "cached_500", Some(1), 0).await;
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    assert!(t.dead_letters().await.is_empty());
}

/// The conflict path validates the payload first: another payload under a key whose record is
/// in progress is key reuse, not "busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_reuse_against_an_in_progress_record_is_dead_lettered() {
    let t = TestStack::new("reuse-ip").await;
    let pid = t.pid("p1");
    t.hold_lease_elsewhere(&payment(&pid, 100, "pm_card_visa"))
        .await;
    let mid = t.send(&payment(&pid, 999, "pm_card_visa")).await;
    let response = t.invoke(t.receive_records(1).await).await;
    assert!(response.batch_item_failures.is_empty());
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0].source_message_id.as_str(),
            dead[0].error_code.as_str()
        ),
        (mid.as_str(), "idempotency_key_reused")
    );
}

/// A queue whose retention ends before the retry horizon (a user's own queue, 60 seconds):
/// a payment that keeps failing transiently is dead-lettered with a reason before SQS would
/// delete it without one, however long the horizon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_dead_lettered_with_a_reason_before_its_queues_retention_deletes_it() {
    let t = TestStack::with_env(
        "retention",
        env(&[
            ("RETRY_HORIZON_SECONDS", "3600"),
            ("REDELIVERY_BASE_DELAY_SECONDS", "3"),
            ("RETENTION_MARGIN_SECONDS", "15"),
        ]),
    )
    .await;
    t.sqs
        .set_queue_attributes()
        .queue_url(t.queue_url())
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::MessageRetentionPeriod,
            "60",
        )
        .send()
        .await
        .expect("a 60-second retention");
    // The template's functions name their source queue: such a horizon is refused at init.
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    assert!(t.config.source_queue_url.is_some());
    let refused = payment_core::edges::bootstrap::build_processor(&t.config, &sdk).await;
    let e = refused
        .err()
        .expect("a horizon beyond the retention refused at init");
    assert!(e.to_string().contains("RETRY_HORIZON_SECONDS"), "{e}");
    // A queue wired without SOURCE_QUEUE_URL: the processor still dead-letters in time.
    let mut config = t.config.clone();
    config.source_queue_url = None;
    let mut t = t;
    t.processor = payment_core::edges::bootstrap::build_processor(&config, &sdk)
        .await
        .expect("the processor");
    let pid = t.pid("p1");
    t.fault(&pid, "down", None, 0).await;
    let sent = now_ms();
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    t.drain(1).await;
    let out = t
        .sqs
        .receive_message()
        .queue_url(&t.config.dead_letter_queue_url)
        .message_attribute_names("All")
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp,
        )
        .wait_time_seconds(2)
        .send()
        .await
        .expect("receive from the DLQ");
    let dead = out.messages();
    assert_eq!(dead.len(), 1, "dead-lettered, not deleted by retention");
    let attr = |k: &str| {
        dead[0]
            .message_attributes()
            .and_then(|a| a.get(k))
            .and_then(|v| v.string_value())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(attr("error_code"), "retries_exhausted");
    assert!(
        attr("error_message").contains("retention"),
        "{}",
        attr("error_message")
    );
    let dead_at: i64 = dead[0]
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp))
        .and_then(|v| v.parse().ok())
        .expect("the dead letter's send time");
    assert!(
        dead_at < sent + 60_000,
        "dead-lettered {} ms after the send, after the retention",
        dead_at - sent
    );
    assert!(t.calls(&pid).await > 3, "retried while retention allowed");
    assert_eq!(t.charges(&pid).await, 0);
}

/// Only attempts spend the receive budget. On their last receive (`maxReceiveCount` 1), a
/// FIFO group that an invocation could not start before its deadline is requeued, head and
/// follower as fresh copies in their order, not dead-lettered; then each is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_never_attempted_on_their_last_receive_are_requeued_in_order_then_charged() {
    let t = TestStack::build("requeue", fast_settings(), true, 1).await;
    let (a1, a2) = (t.pid("a1"), t.pid("a2"));
    for pid in [&a1, &a2] {
        t.send_in_group(&payment(pid, 100, "pm_card_visa"), "A")
            .await;
    }
    let records = t.receive_records(2).await;
    assert_eq!(records.len(), 2);
    // An invocation whose deadline is already near: nothing can start.
    let (response, summary) = t.processor.handle_batch(records, now_ms() + 50).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "copies replace them"
    );
    assert_eq!(summary.retried, 2);
    assert!(
        t.dead_letters().await.is_empty(),
        "nothing dead-lettered unattempted"
    );
    assert_eq!(t.calls(&a1).await + t.calls(&a2).await, 0);
    let copies = t.receive_records(2).await;
    let order: Vec<String> = copies
        .iter()
        .map(|m| {
            let body: serde_json::Value =
                serde_json::from_str(m.body.as_deref().unwrap_or_default()).unwrap();
            body["payment_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(
        order,
        vec![a1.clone(), a2.clone()],
        "their group's order kept"
    );
    assert!(copies
        .iter()
        .all(|m| m.message_attributes.contains_key("first_sent_at")));
    let response = t.invoke(copies).await;
    assert!(response.batch_item_failures.is_empty());
    assert_charged_once(&t, &a1).await;
    assert_charged_once(&t, &a2).await;
    assert!(t.dead_letters().await.is_empty());
}

/// FIFO order when receive counts differ (`maxReceiveCount` 2): a1 and a2 were received once
/// before a3 was, so on a1's and a2's last receive a3 is on its first. An invocation that can
/// start none of them sends a1 and a2 to the group's end as fresh copies (only attempts spend
/// the budget), and a3 after them, not handed back in place where it would come first: the
/// group's order is still a1, a2, a3, each charged once, nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_group_keeps_its_order_when_receive_counts_differ() {
    let t = TestStack::build("fifo-counts", fast_settings(), true, 2).await;
    let (a1, a2, a3) = (t.pid("a1"), t.pid("a2"), t.pid("a3"));
    for pid in [&a1, &a2, &a3] {
        t.send_in_group(&payment(pid, 100, "pm_card_visa"), "A")
            .await;
    }
    // One delivery of the group's first two messages only, handed straight back.
    let out = t
        .sqs
        .receive_message()
        .queue_url(t.queue_url())
        .max_number_of_messages(2)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert_eq!(out.messages().len(), 2);
    for m in out.messages() {
        t.sqs
            .change_message_visibility()
            .queue_url(t.queue_url())
            .receipt_handle(m.receipt_handle().unwrap())
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }
    let records = t.receive_records(3).await;
    let counts: Vec<&str> = records
        .iter()
        .map(|r| r.attributes["ApproximateReceiveCount"].as_str())
        .collect();
    assert_eq!(counts, ["2", "2", "1"], "a3 received fewer times");
    // An invocation whose deadline is already near: nothing can start.
    let (response, summary) = t.processor.handle_batch(records, now_ms() + 50).await;
    assert!(response.batch_item_failures.is_empty(), "{summary:?}");
    let copies = t.receive_records(3).await;
    let order: Vec<String> = copies
        .iter()
        .map(|m| {
            let body: serde_json::Value =
                serde_json::from_str(m.body.as_deref().unwrap_or_default()).unwrap();
            body["payment_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(
        order,
        [a1.clone(), a2.clone(), a3.clone()],
        "the group's order kept"
    );
    let response = t.invoke(copies).await;
    assert!(response.batch_item_failures.is_empty());
    for pid in [&a1, &a2, &a3] {
        assert_charged_once(&t, pid).await;
    }
    assert!(t.dead_letters().await.is_empty());
}
