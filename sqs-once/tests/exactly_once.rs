//! The exactly-once holes, with the toy `Work` (`toy/`): receive budget, sticky mark,
//! `not_before`, lost claim answers, lookup lag, message age, every failure path's delay.
//!
//! Why one file of ~640 lines: the crash and race scenarios share one harness and read as one
//! catalogue of what may not double-charge.

mod toy;

use toy::*;
#[tokio::test(start_paused = true)]
async fn on_its_last_receive_a_failing_job_is_dead_lettered_with_a_reason_not_by_sqs() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    let first = w.clock.now_ms();
    for n in 1..=2 {
        let (failed, _) = deliver(&w, delivery("p1", n, first)).await;
        assert_eq!(failed.len(), 1, "receive {n} comes back");
        assert!(w.queues.dead().is_empty());
        tokio::time::advance(Duration::from_secs(w.queues.last_delay() as u64)).await;
    }
    let (failed, s) = deliver(&w, delivery("p1", 3, first)).await;
    assert!(
        failed.is_empty(),
        "the processor acknowledges what it dead-lettered"
    );
    assert_eq!(s.dead_lettered.get("retries_exhausted"), Some(&1));
    let dead = w.queues.dead();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "retries_exhausted");
    assert!(
        dead[0].error_message.contains("RateLimited") && dead[0].error_message.contains("3"),
        "{}",
        dead[0].error_message
    );
}

#[tokio::test(start_paused = true)]
async fn a_downstream_outage_as_long_as_the_horizon_dead_letters_nothing() {
    let settings = Settings {
        retry_horizon: Duration::from_secs(3600),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(4);
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::ServerError, None));
    let first = w.clock.now_ms();
    let mut n = 1;
    loop {
        if w.clock.now_ms() - first >= 3_600_000 {
            w.downstream.set("p1", Behaviour::Done);
        }
        let (failed, s) = deliver(&w, delivery("p1", n, first)).await;
        assert!(w.queues.dead().is_empty(), "dead-lettered on receive {n}");
        if failed.is_empty() {
            assert_eq!(s.done("done"), 1);
            break;
        }
        tokio::time::advance(Duration::from_secs(w.queues.last_delay() as u64)).await;
        n += 1;
    }
    assert!(n <= 4, "within maxReceiveCount");
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(r.status, RecordStatus::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_dead_workers_job_is_taken_over_after_one_lease_without_burning_the_budget() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    // A worker claimed p1 with a 60 s lease, the downstream executed, and the worker died.
    let mut held = record("p1", RecordStatus::InProgress, false, now);
    held.lease_expires_at_ms = now + 60_000;
    w.store.insert(held);
    w.downstream
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "pi_p1".into());
    let (failed, _) = deliver(&w, delivery("p1", 1, now)).await;
    assert_eq!(failed.len(), 1);
    assert!(
        w.queues.last_delay() <= 5,
        "the first look comes back quickly"
    );
    tokio::time::advance(Duration::from_secs(w.queues.last_delay() as u64)).await;
    let (failed, _) = deliver(&w, delivery("p1", 2, now)).await;
    assert_eq!(failed.len(), 1);
    let wait = w.queues.last_delay();
    assert!(
        (55..=62).contains(&wait),
        "then waits for the lease's end: {wait} s"
    );
    tokio::time::advance(Duration::from_secs(wait as u64)).await;
    let (failed, s) = deliver(&w, delivery("p1", 3, now)).await;
    assert!(failed.is_empty());
    assert_eq!(s.done("done"), 1);
    assert!(w.queues.dead().is_empty());
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.attempts), (RecordStatus::Completed, 2));
}

/// A FIFO follower blocked behind a failure on its own last receive was never attempted: it is
/// requeued as a fresh copy at the end of its group (its age carried), never dead-lettered as
/// `retries_exhausted`, and never executed out of order.
#[tokio::test]
async fn a_fifo_message_blocked_on_its_last_receive_is_requeued_not_dead_lettered() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(2);
    w.downstream
        .set("a", Behaviour::Fail(FailureKind::RateLimited, None));
    let now = now_ms();
    let first = msg_at("m1", &body("a", 100), Some("g"), now, 1);
    let second = msg_at("m2", &body("b", 100), Some("g"), now - 5_000, 2);
    let (r, s) = w
        .processor
        .handle_batch(vec![first, second], now + 60_000)
        .await;
    assert_eq!(failures(&r), vec!["m1"], "the requeued copy replaces m2");
    assert!(
        w.queues.dead().is_empty(),
        "nothing dead-lettered unexplained"
    );
    assert_eq!(s.retried, 2);
    let copies = w.queues.requeued.lock().unwrap().clone();
    assert_eq!(copies.len(), 1);
    let copy = &copies[0];
    assert_eq!(copy.body, body("b", 100));
    assert_eq!(copy.message_group_id.as_deref(), Some("g"));
    assert_eq!(copy.deduplication_id.as_deref(), Some("m2-requeued-1"));
    let attr = |k: &str| {
        copy.attributes
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(attr("first_sent_at"), Some((now - 5_000).to_string()));
    assert_eq!(attr("requeued"), Some("1".into()));
    assert_eq!(
        w.queues.deleted.load(Ordering::SeqCst),
        1,
        "the original deleted"
    );
    assert_eq!(w.downstream.calls("b"), 0, "never processed out of order");
}

/// FIFO order holds when receive counts differ: behind a failing head, a follower on its last
/// receive goes to the end of its group as a fresh copy, and a later follower received fewer
/// times goes after it (not handed back in place, where it would come before the copy).
#[tokio::test]
async fn a_fifo_group_keeps_its_order_when_its_followers_were_received_unequally() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    w.downstream
        .set("a", Behaviour::Fail(FailureKind::RateLimited, None));
    let now = now_ms();
    let batch = vec![
        msg_at("m1", &body("a", 100), Some("g"), now, 1),
        msg_at("m2", &body("b", 100), Some("g"), now, 3),
        msg_at("m3", &body("c", 100), Some("g"), now, 1),
    ];
    let (r, _) = w.processor.handle_batch(batch, now + 60_000).await;
    assert_eq!(failures(&r), vec!["m1"], "the head comes back in place");
    let copies: Vec<String> = w
        .queues
        .requeued
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.body.clone())
        .collect();
    assert_eq!(
        copies,
        vec![body("b", 100), body("c", 100)],
        "both followers at the group's end, in their order"
    );
    assert!(w.queues.dead().is_empty());
    assert_eq!(w.downstream.calls("b") + w.downstream.calls("c"), 0);
}

/// A message not started before the invocation deadline on its last receive is requeued; one
/// that was never attempted in as many requeues as the queue allows receives is dead-lettered,
/// saying so.
#[tokio::test]
async fn a_message_never_started_is_requeued_until_a_whole_budget_of_requeues() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = now_ms();
    // The deadline has (nearly) passed: nothing can start.
    let (r, _) = w
        .processor
        .handle_batch(vec![msg_at("m1", &body("a", 100), None, now, 3)], now + 100)
        .await;
    assert!(failures(&r).is_empty());
    assert!(w.queues.dead().is_empty());
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
    let mut tired = msg_at("m2", &body("b", 100), None, now, 3);
    let mut a = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
    a.string_value = Some("3".into());
    a.data_type = Some("String".into());
    tired.message_attributes.insert("requeued".into(), a);
    w.processor.handle_batch(vec![tired], now + 100).await;
    let dead = w.queues.dead();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_code, "retries_exhausted");
    assert!(
        dead[0].error_message.contains("not started"),
        "{}",
        dead[0].error_message
    );
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1, "no second copy");
    assert_eq!(w.downstream.calls("a") + w.downstream.calls("b"), 0);
}

#[tokio::test]
async fn the_unknown_outcome_mark_is_sticky_in_the_store() {
    let store = InMemoryStore::new();
    let req = Job::parse(&body("p1", 100)).unwrap();
    let now = now_ms();
    store.insert(record("p1", RecordStatus::Failed, true, now - 10));
    let claim = ClaimRequest {
        traceparent: None,
        key: req.id.clone(),
        payload_hash: req.fingerprint(),
        owner: "me".into(),
        now_ms: now,
        lease_expires_at_ms: now + 10_000,
        expires_at_s: now / 1000 + 86_400,
    };
    store.claim(&claim).await.unwrap();
    let note = sqs_once::record::FailureNote {
        error: "429".into(),
        unknown_outcome: false,
        not_before_ms: None,
    };
    store.fail(&req.id, "me", now, &note).await.unwrap();
    assert!(store.get("p1").await.unwrap().unwrap().unknown_outcome);
}

#[tokio::test(start_paused = true)]
async fn a_409_marks_the_outcome_unknown_and_a_retry_loop_of_409s_keeps_it() {
    let w = world(fast(), Duration::from_secs(1));
    w.downstream
        .set("fresh", Behaviour::Fail(FailureKind::KeyInUse, None));
    deliver(&w, delivery("fresh", 1, w.clock.now_ms())).await;
    let r = w.store.get("fresh").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    assert_eq!(w.downstream.calls("fresh"), 3, "retried inside the lease");
    // Taken over with the mark: three more 409s end with the mark still set.
    tokio::time::advance(Duration::from_secs(5)).await;
    deliver(&w, delivery("fresh", 2, w.clock.now_ms())).await;
    let r = w.store.get("fresh").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome, r.attempts),
        (RecordStatus::Failed, true, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn no_claim_before_the_last_ambiguous_call_could_have_landed() {
    let settings = Settings {
        processing_allowance: Duration::from_secs(3),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::Timeout, None));
    let sent = w.clock.now_ms();
    deliver(&w, delivery("p1", 1, sent)).await;
    let r = w.store.get("p1").await.unwrap().unwrap();
    let nb = r
        .not_before_ms
        .expect("a not_before after an ambiguous call");
    assert!(
        nb >= sent + 4_000,
        "last send + 1 s timeout + 3 s allowance"
    );
    w.downstream.set("p1", Behaviour::Done);
    tokio::time::advance(Duration::from_secs(2)).await;
    let (failed, _) = deliver(&w, delivery("p1", 2, sent)).await;
    assert_eq!(failed.len(), 1, "refused before not_before");
    assert_eq!(
        w.downstream.calls("p1"),
        1,
        "no call while the first may still land"
    );
    assert_eq!(w.store.get("p1").await.unwrap().unwrap().attempts, 1);
    let wait = w.queues.last_delay();
    assert!(
        (2..=4).contains(&wait),
        "comes back at not_before: {wait} s"
    );
    tokio::time::advance(Duration::from_secs(wait as u64)).await;
    let (failed, s) = deliver(&w, delivery("p1", 3, sent)).await;
    assert!(failed.is_empty());
    assert_eq!(s.done("done"), 1);
}

#[tokio::test]
async fn a_lost_claim_answer_whose_retry_meets_our_own_lease_is_claimed_with_an_unknown_outcome() {
    let w = world_wrapped(fast(), Duration::from_secs(1), |s| {
        let scripted = ScriptedStore::new(s);
        *scripted.lose_claim_answer.lock().unwrap() = true;
        Arc::new(scripted)
    });
    // The call fails before execution, so the record shows what the attempt believed.
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    let (failed, _) = deliver(&w, delivery("p1", 1, now_ms())).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(
        w.downstream.calls("p1"),
        3,
        "claimed: it called the downstream"
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.attempts, r.unknown_outcome),
        (RecordStatus::Failed, 1, true),
        "the previous state is unknown, so the outcome is"
    );
}

#[tokio::test]
async fn a_lost_claim_answer_still_executes_once() {
    let w = world_wrapped(fast(), Duration::from_secs(1), |s| {
        let scripted = ScriptedStore::new(s);
        *scripted.lose_claim_answer.lock().unwrap() = true;
        Arc::new(scripted)
    });
    let (failed, s) = deliver(&w, delivery("p1", 1, now_ms())).await;
    assert!(failed.is_empty(), "not Busy on its own lease");
    assert_eq!((s.done("done"), w.downstream.calls("p1")), (1, 1));
}
#[tokio::test(start_paused = true)]
async fn lookup_finds_the_effect_and_records_it_without_a_call() {
    let w = forgotten_world();
    w.downstream
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "pi_found".into());
    let (failed, s) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert!(failed.is_empty());
    assert_eq!(
        (
            s.done("done"),
            w.downstream.calls("p1"),
            w.downstream.lookups("p1")
        ),
        (1, 0, 1)
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(r.outcome.unwrap().text("receipt"), Some("pi_found"));
}

#[tokio::test(start_paused = true)]
async fn lookup_finds_a_declined_effect_and_records_the_decline() {
    let w = forgotten_world();
    w.downstream
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "pi_declined".into());
    *w.downstream.found_status.lock().unwrap() = Some("declined".into());
    let (failed, s) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert!(failed.is_empty());
    assert_eq!((s.done("declined"), w.downstream.calls("p1")), (1, 0));
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.outcome.unwrap().status.as_str()),
        (RecordStatus::Completed, "declined")
    );
}

#[tokio::test(start_paused = true)]
async fn lookup_finds_nothing_long_after_the_last_call_then_executes_once() {
    let w = forgotten_world();
    let (failed, s) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert!(failed.is_empty());
    assert_eq!(
        (
            s.done("done"),
            w.downstream.calls("p1"),
            w.downstream.lookups("p1")
        ),
        (1, 1, 1)
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.unknown_outcome),
        (RecordStatus::Completed, false)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_lookup_leaves_the_mark_and_calls_nothing() {
    let w = forgotten_world();
    *w.downstream.lookup_fails.lock().unwrap() = true;
    let (failed, _) = deliver(&w, delivery("p1", 1, w.clock.now_ms())).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(w.downstream.calls("p1"), 0);
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    assert!(w.queues.last_delay() > 0, "comes back after a backoff");
}

#[tokio::test(start_paused = true)]
async fn nothing_found_after_a_replayed_500_is_looked_up_again_after_the_search_lag() {
    let settings = Settings {
        search_lag: Duration::from_secs(60),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.downstream.set("p1", Behaviour::Replayed500);
    let now = w.clock.now_ms();
    // The first call's 500 came moments ago; the downstream now replays it for the key.
    let mut r = record("p1", RecordStatus::Failed, true, now - 2_000);
    r.not_before_ms = Some(now - 1_000);
    w.store.insert(r);
    let (failed, _) = deliver(&w, delivery("p1", 1, now)).await;
    assert_eq!(
        failed.len(),
        1,
        "an empty search right after the call is no proof"
    );
    assert!(w.queues.dead().is_empty());
    let wait = w.queues.last_delay();
    assert!(
        (58..=61).contains(&wait),
        "looks again after the lag: {wait} s"
    );
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
    tokio::time::advance(Duration::from_secs(wait as u64)).await;
    let (failed, s) = deliver(&w, delivery("p1", 2, now)).await;
    assert!(failed.is_empty());
    assert_eq!(s.dead_lettered.get("outcome_unknown"), Some(&1));
    assert_eq!(w.downstream.lookups("p1"), 2);
    let dead = w.queues.dead();
    assert!(
        dead[0].error_message.contains("settle the record of p1"),
        "{}",
        dead[0].error_message
    );
    assert!(!dead[0].error_message.contains("new key"));
    let r = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
}

#[tokio::test]
async fn an_expired_message_says_that_its_key_has_a_record() {
    let settings = Settings {
        record_ttl: Duration::from_secs(3600),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    let now = now_ms();
    let mut r = record("p1", RecordStatus::Completed, false, now - 7_200_000);
    r.outcome = Some(done("p1"));
    w.store.insert(r);
    // SentTimestamp is two hours old; a first_sent_at attribute claiming "now" cannot make it
    // younger.
    let mut m = msg_at("m1", &body("p1", 100), None, now - 7_200_000, 1);
    let mut young = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
    young.string_value = Some(now.to_string());
    young.data_type = Some("String".into());
    m.message_attributes.insert("first_sent_at".into(), young);
    let (r, s) = w.processor.handle_batch(vec![m], now + 60_000).await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(s.dead_lettered.get("request_expired"), Some(&1));
    let why = &w.queues.dead()[0].error_message;
    assert!(why.contains("has a record (status COMPLETED"), "{why}");
    assert!(!why.contains("never executed"), "{why}");
    assert_eq!(w.downstream.calls("p1"), 0);
}

#[tokio::test]
async fn a_message_without_an_id_that_must_come_back_fails_the_invocation_not_an_empty_id() {
    let w = world(fast(), Duration::from_secs(1));
    w.downstream
        .set("p1", Behaviour::Fail(FailureKind::RateLimited, None));
    let mut m = msg("m1", &body("p1", 100), None);
    m.message_id = None;
    let (r, s) = w.processor.handle_batch(vec![m], now_ms() + 60_000).await;
    assert!(r
        .batch_item_failures
        .iter()
        .all(|f| !f.item_identifier.is_empty()));
    assert_eq!(s.unreportable, 1);
}

#[tokio::test]
async fn every_failure_path_sets_a_redelivery_delay() {
    // A claim that fails: backoff.
    let scripted = Arc::new(Mutex::new(None::<Arc<ScriptedStore>>));
    let keep = scripted.clone();
    let w = world_wrapped(fast(), Duration::from_secs(1), move |s| {
        let st = Arc::new(ScriptedStore::new(s));
        *keep.lock().unwrap() = Some(st.clone());
        st
    });
    let st = scripted.lock().unwrap().clone().unwrap();
    *st.claims_fail.lock().unwrap() = true;
    deliver(&w, delivery("p1", 1, now_ms())).await;
    assert_eq!(
        w.queues.visibility.lock().unwrap().len(),
        1,
        "claim failure"
    );
    *st.claims_fail.lock().unwrap() = false;
    // A completion that fails: backoff.
    *st.completes_fail.lock().unwrap() = true;
    let (failed, _) = deliver(&w, delivery("p2", 1, now_ms())).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(
        w.queues.visibility.lock().unwrap().len(),
        2,
        "completion failure"
    );
    *st.completes_fail.lock().unwrap() = false;
    // A lease lost before completion: a few seconds.
    w.downstream
        .set("p3", Behaviour::Slow(Duration::from_millis(300)));
    let worker = {
        let w2 = w.processor.clone();
        tokio::spawn(async move {
            w2.handle_batch(vec![delivery("p3", 1, now_ms())], now_ms() + 60_000)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut taken = w.store.get("p3").await.unwrap().unwrap();
    taken.lease_owner = Some("another".into());
    w.store.insert(taken);
    let (r, _) = worker.await.unwrap();
    assert_eq!(failures(&r).len(), 1);
    let vis = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(vis.len(), 3, "lost lease");
    assert!(
        (1..=3).contains(&vis[2].1),
        "a lost race looks again in seconds: {:?}",
        vis[2]
    );
}

#[tokio::test(start_paused = true)]
async fn a_consistent_lookup_that_finds_nothing_after_a_replayed_500_is_proof_at_once() {
    let settings = Settings {
        search_lag: Duration::from_secs(60),
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    w.downstream
        .consistent
        .store(true, std::sync::atomic::Ordering::SeqCst);
    w.downstream.set("p1", Behaviour::Replayed500);
    let now = w.clock.now_ms();
    let mut r = record("p1", RecordStatus::Failed, true, now - 2_000);
    r.not_before_ms = Some(now - 1_000);
    w.store.insert(r);
    // The same case as above, but a list shows every write at once: no wait for a lag.
    let (failed, s) = deliver(&w, delivery("p1", 1, now)).await;
    assert!(failed.is_empty());
    assert_eq!(s.dead_lettered.get("outcome_unknown"), Some(&1));
    assert_eq!(w.downstream.lookups("p1"), 1);
    let dead = w.queues.dead();
    assert!(
        dead[0]
            .error_message
            .contains("at once (a consistent listing)"),
        "{}",
        dead[0].error_message
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_whose_every_message_comes_back_is_a_partial_batch_response_not_an_error() {
    let w = world(fast(), Duration::from_secs(1));
    *w.queues.max_receives.lock().unwrap() = Some(5);
    for id in ["a", "b"] {
        w.downstream
            .set(id, Behaviour::Fail(FailureKind::RateLimited, None));
    }
    let now = w.clock.now_ms();
    let mut event = aws_lambda_events::event::sqs::SqsEvent::default();
    event.records = vec![
        msg_at("m1", &body("a", 100), None, now, 1),
        msg_at("m2", &body("b", 100), None, now, 1),
    ];
    let mut context = lambda_runtime::Context::default();
    context.deadline = (now + 60_000) as u64;
    let response = w
        .processor
        .handle_event(lambda_runtime::LambdaEvent::new(event, context))
        .await
        .expect("a partial batch response: an invocation error would trip the Errors alarm");
    assert_eq!(failures(&response), vec!["m1", "m2"]);
    let delays = w.queues.visibility.lock().unwrap().clone();
    assert_eq!(delays.len(), 2, "each message got its redelivery delay");
    assert!(
        delays.iter().all(|(_, s)| (1..=3).contains(s)),
        "{delays:?}"
    );
}

/// A record written before the work changed its fingerprint (the toy's earlier form is
/// `old-<fingerprint>`): the same request, not key reuse; claimed under the stored form.
#[tokio::test(start_paused = true)]
async fn a_record_with_an_earlier_fingerprint_of_the_same_request_is_not_key_reuse() {
    let w = world(fast(), Duration::from_secs(1));
    let now = w.clock.now_ms();
    let job = Job::parse(&body("p1", 100)).unwrap();
    let mut r = record("p1", RecordStatus::Failed, false, now - 10);
    r.payload_hash = format!("old-{}", job.fingerprint());
    w.store.insert(r);
    let (failed, s) = deliver(&w, delivery("p1", 2, now)).await;
    assert!(failed.is_empty() && s.dead_lettered.is_empty(), "{s:?}");
    assert_eq!(w.downstream.calls("p1"), 1, "executed once");
    let done = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(done.status, RecordStatus::Completed);
    assert_eq!(done.payload_hash, format!("old-{}", job.fingerprint()));
    // Another request's earlier form is still key reuse.
    let mut other = record("p2", RecordStatus::Failed, false, now - 10);
    other.payload_hash = "old-p2:999".into();
    w.store.insert(other);
    deliver(&w, delivery("p2", 2, now)).await;
    assert_eq!(w.queues.dead()[0].error_code, "idempotency_key_reused");
    assert_eq!(w.downstream.calls("p2"), 0);
}

/// A message whose key names another request is dead-lettered with a mark of its own
/// fingerprint (whoever tracks that request learns it was refused); the mark never replaces a
/// mark of the key's own request.
#[tokio::test(start_paused = true)]
async fn a_key_reuse_mark_is_the_refused_request_s_and_yields_to_the_key_s_own() {
    let w = world(fast(), Duration::from_secs(1));
    let now = w.clock.now_ms();
    deliver(&w, msg_at("m1", &body("p1", 100), None, now, 1)).await;
    assert_eq!(w.downstream.calls("p1"), 1);
    deliver(&w, msg_at("m2", &body("p1", 999), None, now, 1)).await;
    let mark = w.store.dead_letter_mark("p1").expect("a mark");
    assert_eq!(mark.error_code, "idempotency_key_reused");
    assert_eq!(
        mark.payload_hash,
        Job::parse(&body("p1", 999)).unwrap().fingerprint()
    );
    // The key's own request was dead-lettered: a later reuse leaves its mark alone.
    let own = Job::parse(&body("p2", 100)).unwrap();
    let mut r = record("p2", RecordStatus::Failed, false, now - 10);
    r.payload_hash = own.fingerprint();
    w.store.insert(r);
    w.store
        .mark_dead_lettered(&sqs_once::record::DeadLetterMark {
            key: "p2".into(),
            payload_hash: own.fingerprint(),
            error_code: "retries_exhausted".into(),
            error_message: "gave up".into(),
            at_ms: now,
            expires_at_s: now / 1000 + 3600,
        })
        .await
        .unwrap();
    deliver(&w, msg_at("m3", &body("p2", 999), None, now, 1)).await;
    assert_eq!(
        w.queues.dead().last().unwrap().error_code,
        "idempotency_key_reused"
    );
    let kept = w.store.dead_letter_mark("p2").unwrap();
    assert_eq!(
        (kept.error_code.as_str(), kept.payload_hash),
        ("retries_exhausted", own.fingerprint())
    );
    assert_eq!(w.downstream.calls("p2"), 0);
}
