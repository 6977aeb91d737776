//! Protocol tests of the batch runner with in-memory ports and a toy `Work` (`toy/`): GIVEN a
//! store state and a downstream behaviour, WHEN a batch is handled, THEN the calls, records and
//! batch response are what someone who must not do a thing twice expects. Fast and
//! deterministic; the same behaviours run against the real SDK and emulator in the
//! repository's `tests/integration`, with jobs.
//!
//! Why one file of ~530 lines: every test here checks one rule of the protocol against the
//! in-memory store; together they are the protocol's executable list.

mod toy;

use toy::*;
#[tokio::test]
async fn a_panic_in_one_message_fails_only_that_message() {
    let w = world(fast(), Duration::from_secs(1));
    w.downstream.set("boom", Behaviour::Panic);
    let batch = vec![
        msg("m1", &body("ok1", 100), None),
        msg("m2", &body("boom", 100), None),
        msg("m3", &body("ok2", 100), None),
    ];
    let (response, summary) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert_eq!(failures(&response), vec!["m2"]);
    assert_eq!(summary.done("done"), 2);
    assert_eq!(w.downstream.calls("ok1") + w.downstream.calls("ok2"), 2);
}

#[tokio::test]
async fn a_duplicate_costs_one_store_call_and_no_downstream_call() {
    let w = world(fast(), Duration::from_secs(1));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let before = w.store.calls();
    let (response, summary) = w
        .processor
        .handle_batch(vec![msg("m2", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(summary.duplicates, 1);
    assert_eq!(
        w.store.calls() - before,
        1,
        "one conditional write, no read"
    );
    assert_eq!(w.downstream.calls("p1"), 1);
}

#[tokio::test]
async fn no_downstream_call_is_sent_unless_the_lease_outlasts_the_client_timeout() {
    // Lease 3 s, client timeout 2 s, the downstream asks to wait 1 s: a retry would land past
    // the lease, so only the first call is sent.
    let settings = Settings {
        lease: Duration::from_secs(3),
        call_attempts: 5,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    w.downstream.set(
        "p1",
        Behaviour::Fail(FailureKind::RateLimited, Some(Duration::from_secs(1))),
    );
    let (response, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert_eq!(failures(&response), vec!["m1"]);
    assert_eq!(w.downstream.calls("p1"), 1);
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(r.status, RecordStatus::Failed);
    assert!(!r.unknown_outcome, "a 429 proves nothing was executed");
}

#[tokio::test]
async fn a_lease_shorter_than_the_client_timeout_never_calls_the_downstream() {
    let w = world(fast(), Duration::from_secs(5));
    // The invocation ends in 2 s, so the lease is capped at the deadline + 5 s = 7 s: with a
    // 10 s client timeout no call could finish inside it, so nothing is claimed or sent.
    let w2 = world(fast(), Duration::from_secs(10));
    let (r, _) = w2
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 2_000)
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert_eq!(w2.downstream.calls("p1"), 0);
    assert!(
        w2.store.get("p1").await.unwrap().is_none(),
        "nothing claimed"
    );
    // With time enough the same message is executed.
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
}

#[tokio::test(start_paused = true)]
async fn ambiguous_failures_mark_the_outcome_unknown_and_takeover_inherits_it() {
    let w = world(fast(), Duration::from_secs(1));
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::Timeout, None));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    tokio::time::advance(Duration::from_secs(2)).await;
    // A later 429 proves nothing: the mark stays.
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome, r.attempts),
        (RecordStatus::Failed, true, 2)
    );
    // A definitive answer settles it.
    tokio::time::advance(Duration::from_secs(2)).await;
    w.downstream.set("p1", Behaviour::Done);
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome),
        (RecordStatus::Completed, false)
    );
}

#[tokio::test]
async fn declines_are_recorded_once_and_never_retried() {
    let w = world(fast(), Duration::from_secs(1));
    w.downstream.set("p1", Behaviour::Decline);
    let (r, s) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(s.done("declined"), 1);
    assert_eq!(w.downstream.calls("p1"), 1);
    assert!(w.queues.dead.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_zombie_whose_lease_was_taken_over_cannot_complete() {
    let w = world(fast(), Duration::from_secs(1));
    let req = Job::parse(&body("p1", 100)).unwrap();
    let claim = |owner: &str, now: i64| ClaimRequest {
        traceparent: None,
        key: req.id.clone(),
        payload_hash: req.fingerprint(),
        owner: owner.to_owned(),
        now_ms: now,
        lease_expires_at_ms: now + 1_000,
        expires_at_s: now / 1000 + 86_400,
    };
    let t0 = now_ms();
    w.store.claim(&claim("zombie", t0)).await.unwrap();
    // The zombie's lease ends; a new attempt takes over.
    w.store.claim(&claim("new", t0 + 2_000)).await.unwrap();
    let outcome = done("p1");
    assert!(matches!(
        w.store.complete(&req.id, "zombie", &outcome, None).await,
        Err(sqs_once::record::StoreError::LeaseLost)
    ));
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.lease_owner.as_deref()),
        (RecordStatus::InProgress, Some("new"))
    );
}

#[tokio::test]
async fn fifo_failure_blocks_the_rest_of_its_group_only() {
    let w = world(fast(), Duration::from_secs(1));
    w.downstream
        .set("a1", Behaviour::Fail(FailureKind::ServerError, None));
    let batch = vec![
        msg("a1", &body("a1", 100), Some("A")),
        msg("b1", &body("b1", 100), Some("B")),
        msg("a2", &body("a2", 100), Some("A")),
        msg("a3", &body("a3", 100), Some("A")),
        msg("b2", &body("b2", 100), Some("B")),
    ];
    let (r, _) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert_eq!(failures(&r), vec!["a1", "a2", "a3"]);
    assert_eq!(
        w.downstream.calls("a2") + w.downstream.calls("a3"),
        0,
        "not processed after the failure"
    );
    assert_eq!(w.downstream.calls("b1") + w.downstream.calls("b2"), 2);
}

#[tokio::test]
async fn bad_input_is_dead_lettered_then_deleted_and_never_executed() {
    let w = world(fast(), Duration::from_secs(1));
    let batch = vec![msg("m1", "{nope", None), msg("m2", &body("p1", 0), None)];
    let (r, s) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(s.dead_lettered.get("invalid_json"), Some(&1));
    assert_eq!(s.dead_lettered.get("invalid_job"), Some(&1));
    assert_eq!(w.queues.deleted.load(Ordering::SeqCst), 2);
    let dead = w.queues.dead.lock().unwrap();
    assert_eq!(
        dead.iter()
            .find(|d| d.source_message_id == "m1")
            .unwrap()
            .body,
        "{nope"
    );
    assert_eq!(w.downstream.calls("p1"), 0);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_extends_visibility_and_lease_together_on_one_schedule() {
    // Lease 30 s, visibility 9 s: one beat every 3 s. A 10 s effect gets beats at 3, 6, 9 s.
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(9),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(20));
    w.downstream
        .set("slow", Behaviour::Slow(Duration::from_secs(10)));
    let start = w.clock.now_ms();
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("slow", 100), None)], start + 60_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.store.renewals(), 3);
    let vis = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(
        vis,
        vec![("rh-m1".to_owned(), 9); 3],
        "each beat extends the message by the visibility timeout"
    );
    assert_eq!(
        w.store.get("slow").await.unwrap().unwrap().status,
        RecordStatus::Completed
    );
}

#[tokio::test(start_paused = true)]
async fn work_shorter_than_the_first_beat_makes_no_heartbeat_call() {
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(9),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(20));
    w.downstream
        .set("quick", Behaviour::Slow(Duration::from_millis(2_900)));
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("quick", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.store.renewals(), 0);
    assert!(w.queues.visibility.lock().unwrap().is_empty());
    // A new job costs two store writes: the claim and the completion.
    assert_eq!(w.store.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_stops_extending_before_the_deadline() {
    // Beats every 1 s; the deadline is 4.5 s away: no beat is sent within a beat of it.
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(3),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.downstream
        .set("slow", Behaviour::Slow(Duration::from_secs(60)));
    let start = w.clock.now_ms();
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("slow", 100), None)], start + 4_500)
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert_eq!(
        w.store.renewals(),
        3,
        "beats at 1, 2, 3 s; none at 4 s, a beat from the deadline"
    );
    let r = w.store.get("slow").await.unwrap().unwrap();
    assert!(
        r.lease_expires_at_ms <= start + 4_500 + 5_000,
        "never past the deadline plus the margin"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_stops_the_work_and_completes_nothing() {
    let settings = Settings {
        lease: Duration::from_secs(30),
        visibility_timeout: Duration::from_secs(3),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(20));
    w.downstream
        .set("p1", Behaviour::Slow(Duration::from_secs(15)));
    let store = w.store.clone();
    let thief = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let mut r = store.get("p1").await.unwrap().unwrap();
        r.lease_owner = Some("someone-else".into());
        store.insert(r);
    });
    let t0 = tokio::time::Instant::now();
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    thief.await.unwrap();
    assert_eq!(failures(&r), vec!["m1"]);
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "stopped at the first beat after the loss, not after the 15 s call"
    );
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.lease_owner.as_deref()),
        (RecordStatus::InProgress, Some("someone-else"))
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_reports_unfinished_and_unstarted_messages_in_time() {
    let settings = Settings {
        max_concurrency: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    w.downstream
        .set("slow", Behaviour::Slow(Duration::from_secs(60)));
    let t0 = tokio::time::Instant::now();
    let deadline = w.clock.now_ms() + 5_000;
    let batch = vec![
        msg("m1", &body("slow", 100), None),
        msg("m2", &body("next", 100), None),
    ];
    let (r, _) = w.processor.handle_batch(batch, deadline).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "answered before the deadline"
    );
    assert_eq!(failures(&r), vec!["m1", "m2"]);
    assert_eq!(w.downstream.calls("next"), 0, "not started");
    assert!(w.store.get("next").await.unwrap().is_none());
    // The unfinished attempt's lease ends by the deadline plus the margin: the next delivery
    // after that takes it over instead of finding it blocked forever.
    let rec = w.store.get("slow").await.unwrap().unwrap();
    assert!(rec.lease_expires_at_ms <= deadline + 5_000);
    tokio::time::advance(Duration::from_secs(11)).await;
    w.downstream.set("slow", Behaviour::Done);
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("slow", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.store.get("slow").await.unwrap().unwrap().attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn no_time_left_means_no_claim() {
    // The remaining time reads zero: nothing is claimed, so nothing can be left in progress.
    let w = world(fast(), Duration::from_secs(2));
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], w.clock.now_ms())
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert!(w.store.get("p1").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn redelivery_backoff_grows_with_the_receive_count() {
    let settings = Settings {
        redelivery_base_delay: Duration::from_secs(10),
        redelivery_max_delay: Duration::from_secs(300),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    // A 429 is refused before execution: no `not_before`, every delivery claims again.
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    for n in 1..=7u32 {
        let m = msg_at(
            &format!("m{n}"),
            &body("p1", 100),
            None,
            w.clock.now_ms(),
            n,
        );
        w.processor
            .handle_batch(vec![m], w.clock.now_ms() + 60_000)
            .await;
    }
    let vis = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(vis.len(), 7);
    for (i, (_, secs)) in vis.iter().enumerate() {
        let full = (10u64 << i).min(300) as i32;
        assert!(
            *secs >= full / 2 - 1 && *secs <= full,
            "receive {}: {secs} s not in [{}, {full}]",
            i + 1,
            full / 2
        );
    }
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempts), (RecordStatus::Failed, 7));
    assert!(rec.last_error.unwrap().contains("RateLimited"));
}

#[tokio::test(start_paused = true)]
async fn a_worker_paused_past_its_lease_does_not_send() {
    // The downstream asks to retry after 4 s; by then the lease (5 s) has less than the client
    // timeout (2 s) left, so the retry is not sent although attempts remain.
    let settings = Settings {
        lease: Duration::from_secs(5),
        call_attempts: 5,
        visibility_timeout: Duration::from_secs(60),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    w.downstream.set(
        "p1",
        Behaviour::Fail(FailureKind::RateLimited, Some(Duration::from_secs(4))),
    );
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert_eq!(failures(&r), vec!["m1"]);
    assert_eq!(
        w.downstream.calls("p1"),
        1,
        "a retry would have landed after the lease"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_is_looked_up_before_the_downstream_may_have_forgotten_the_key() {
    // Key retention 60 s, margin 10 s. The first attempt's answer is lost (the effect happened).
    let settings = Settings {
        key_retention_margin: Duration::from_secs(10),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    *w.downstream.key_retention.lock().unwrap() = Some(Duration::from_secs(60));
    w.downstream.set("p1", Behaviour::LostAnswer);
    let sent = w.clock.now_ms();
    w.processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 1)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(w.store.get("p1").await.unwrap().unwrap().unknown_outcome);
    // Soon after, the key is remembered: a blind retry with it is safe, no lookup.
    w.downstream.set("p1", Behaviour::LostAnswer);
    tokio::time::advance(Duration::from_secs(5)).await;
    w.processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 2)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert_eq!(w.downstream.lookups.lock().unwrap().get("p1"), None);
    // Past retention - margin - timeout, no blind call: the lookup finds the effect.
    tokio::time::advance(Duration::from_secs(45)).await;
    w.downstream.set("p1", Behaviour::Done);
    let calls = w.downstream.calls("p1");
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 3)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.downstream.calls("p1"), calls, "no new effect");
    assert_eq!(w.downstream.lookups.lock().unwrap().get("p1"), Some(&1));
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(rec.outcome.unwrap().text("receipt"), Some("r_p1"));
    assert!(!rec.unknown_outcome);
}

#[tokio::test]
async fn a_failed_attempt_cannot_touch_a_record_it_does_not_own() {
    let w = world(fast(), Duration::from_secs(1));
    w.processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now_ms() + 60_000)
        .await;
    let req = Job::parse(&body("p1", 100)).unwrap();
    let note = sqs_once::record::FailureNote {
        error: "late zombie".into(),
        unknown_outcome: false,
        not_before_ms: None,
    };
    assert!(w
        .store
        .fail(&req.id, "zombie", now_ms(), &note)
        .await
        .is_err());
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        rec.status,
        RecordStatus::Completed,
        "the completed record is untouched"
    );
}

#[tokio::test]
async fn the_record_and_the_dead_letter_say_who_sent_the_message() {
    // SQS's own `SenderId` (the IAM principal that sent it, never the body's word): kept on
    // the completed record and on a dead letter, whose own sender is the function.
    let w = world(fast(), Duration::from_secs(1));
    let sent_by = |m: SqsMessage| {
        let mut m = m;
        m.attributes
            .insert("SenderId".into(), "AROAEXAMPLE:order-service".into());
        m
    };
    let batch = vec![
        sent_by(msg("m1", &body("p1", 100), None)),
        sent_by(msg("m2", "not json", None)),
    ];
    let (response, _) = w.processor.handle_batch(batch, now_ms() + 60_000).await;
    assert!(response.batch_item_failures.is_empty());
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        r.outcome.unwrap().text(sqs_once::SENDER_ID),
        Some("AROAEXAMPLE:order-service")
    );
    let dead = w.queues.dead.lock().unwrap().clone();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].extra_attributes.contains(&(
        "sender_id".to_owned(),
        "AROAEXAMPLE:order-service".to_owned()
    )));
}
