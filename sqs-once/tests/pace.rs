//! A paced downstream (`sqs_once::pace`): the runner books the slots of each message's
//! requests before claiming it, at the pace's rate, and hands back unclaimed what cannot start
//! before its invocation's deadline; a slot a message did not use is given back. On tokio's
//! paused clock: nothing here waits.
//!
//! Why ~640 lines: each test drives one batch through the same paced world (the toy work and
//! its pace), and the FIFO ones need their groups spelled out.

mod toy;

use sqs_once::pace::Pace;
use toy::*;

fn paced_world(per_second: f64, max_concurrency: usize) -> (World, Arc<Pace>) {
    let settings = Settings {
        max_concurrency,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(2));
    let pace = Arc::new(Pace::new(per_second));
    *w.downstream.pace.lock().unwrap() = Some(pace.clone());
    let processor = processor_paced(&w, pace.clone());
    (World { processor, ..w }, pace)
}

/// The world's processor, on its store and queues, paced by `pace`.
fn processor_paced(w: &World, pace: Arc<Pace>) -> Arc<Processor> {
    Arc::new(
        Processor::new(
            w.downstream.clone(),
            w.store.clone(),
            w.queues.clone(),
            w.processor.settings().clone(),
        )
        .with_clock(w.clock.clone())
        .with_pace(pace),
    )
}

#[tokio::test(start_paused = true)]
async fn a_batch_calls_at_the_pace_and_what_cannot_start_in_time_is_handed_back_unclaimed() {
    let (w, _pace) = paced_world(2.0, 10);
    let t0 = tokio::time::Instant::now();
    // Latest first call: the deadline less the safety (0.5 s), the call's window (2 s) and the
    // claim's allowance (measured: the in-memory store's claims take no time, so 100 ms):
    // 3.4 s from now, so slots at 0, 0.5, ..., 3 s: seven messages.
    let deadline = w.clock.now_ms() + 6_000;
    let batch: Vec<SqsMessage> = (0..10)
        .map(|i| msg(&format!("m{i}"), &body(&format!("p{i}"), 100), None))
        .collect();
    let (r, _) = w.processor.handle_batch(batch, deadline).await;
    let sent: Vec<Duration> = w
        .downstream
        .sent_at
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - t0)
        .collect();
    assert_eq!(
        sent,
        (0..7)
            .map(|i| Duration::from_millis(500 * i))
            .collect::<Vec<_>>(),
        "one call every half second, none sooner"
    );
    let handed_back = failures(&r);
    assert_eq!(handed_back.len(), 3, "{handed_back:?}");
    for m in &handed_back {
        let key = m.replace('m', "p");
        assert!(
            w.store.get(&key).await.unwrap().is_none(),
            "{m}: waited for the pace, so never claimed"
        );
    }
    assert!(w.queues.dead.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_message_that_makes_no_call_gives_its_slot_back() {
    let (w, pace) = paced_world(1.0, 1);
    // A completed record: the copy is acknowledged without a call.
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    let t1 = tokio::time::Instant::now();
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1-copy", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.downstream.calls("p1"), 1, "the copy made no call");
    // Its slot came back: the next booking is now, not a second from now.
    assert_eq!(pace.book(t1 + Duration::from_secs(10)).unwrap(), t1);
}

#[tokio::test(start_paused = true)]
async fn the_pace_is_shared_by_a_batch_s_concurrent_messages_and_by_retries() {
    let (w, _pace) = paced_world(4.0, 10);
    w.downstream.set(
        "p0",
        Behaviour::Fail(FailureKind::RateLimited, Some(Duration::from_millis(1))),
    );
    let t0 = tokio::time::Instant::now();
    let batch: Vec<SqsMessage> = (0..3)
        .map(|i| msg(&format!("m{i}"), &body(&format!("p{i}"), 100), None))
        .collect();
    let (r, _) = w
        .processor
        .handle_batch(batch, w.clock.now_ms() + 60_000)
        .await;
    assert_eq!(
        failures(&r),
        vec!["m0"],
        "the one the downstream kept refusing"
    );
    let sent = w.downstream.sent_at.lock().unwrap().clone();
    // p0's retries book their own slots behind the others': never two within 250 ms.
    for pair in sent.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(250),
            "{:?}",
            sent.iter().map(|t| *t - t0).collect::<Vec<_>>()
        );
    }
    assert_eq!(
        w.downstream.calls("p0"),
        3,
        "every attempt the settings allow"
    );
}

#[tokio::test(start_paused = true)]
async fn a_message_that_waited_for_the_pace_on_its_last_receive_is_requeued_not_dead_lettered() {
    let (w, pace) = paced_world(0.5, 10);
    *w.queues.max_receives.lock().unwrap() = Some(3);
    // The next two seconds' slot is taken (another message of the instance): with the deadline
    // 5 s away, the latest first call is 1.5 s from now.
    pace.book(tokio::time::Instant::now()).unwrap();
    let now = w.clock.now_ms();
    let mut last = msg_at("m-last", &body("p-last", 100), None, now - 60_000, 3);
    // Requeued as often as the queue allows receives already: waiting has no such cap.
    let mut copies = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
    copies.string_value = Some("3".into());
    copies.data_type = Some("Number".into());
    last.message_attributes.insert("requeued".into(), copies);
    let (r, s) = w.processor.handle_batch(vec![last], now + 5_000).await;
    assert_eq!(failures(&r), Vec::<String>::new(), "the copy replaces it");
    assert!(
        w.queues.dead().is_empty(),
        "never dead-lettered for waiting"
    );
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
    assert!(
        w.store.get("p-last").await.unwrap().is_none(),
        "never claimed"
    );
    assert_eq!(w.downstream.calls("p-last"), 0);
    assert_eq!(s.retried, 1);
}

#[tokio::test(start_paused = true)]
async fn a_message_that_waited_for_a_permit_past_its_latest_start_is_handed_back_unclaimed() {
    // One message at a time; the first answers in 3.5 s. Latest first call: the deadline (6 s)
    // less the safety, the call's window and the claim's allowance (measured: 100 ms): 3.4 s.
    // The second gets its permit at 3.5 s, still time enough for the runner to start it, too
    // late to call.
    let (w, _pace) = paced_world(100.0, 1);
    w.downstream
        .set("p0", Behaviour::Slow(Duration::from_millis(3500)));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    let batch = vec![
        msg("m0", &body("p0", 100), None),
        msg_at("m1", &body("p1", 100), None, now - 60_000, 3),
    ];
    let (r, _) = w.processor.handle_batch(batch, now + 6_000).await;
    assert_eq!(w.downstream.calls("p0"), 1);
    assert_eq!(w.downstream.calls("p1"), 0);
    assert!(
        w.store.get("p1").await.unwrap().is_none(),
        "never claimed: waiting is not an attempt"
    );
    assert!(
        w.queues.dead().is_empty(),
        "on its last receive, requeued rather than dead-lettered"
    );
    assert_eq!(failures(&r), Vec::<String>::new(), "the copy replaces it");
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
}

// ---- Waiting is never an attempt (and never a blind call after the key may be forgotten) ----

/// The pace's next slot is `secs` from now (another message of the instance took this one).
fn next_slot_in(secs: u64) -> Arc<Pace> {
    let pace = Arc::new(Pace::new(1.0 / secs as f64));
    pace.book(tokio::time::Instant::now()).unwrap();
    pace
}

fn copied(times: u32) -> aws_lambda_events::event::sqs::SqsMessageAttribute {
    let mut a = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
    a.string_value = Some(times.to_string());
    a.data_type = Some("Number".into());
    a
}

#[tokio::test(start_paused = true)]
async fn a_paced_call_that_could_land_after_the_key_is_forgotten_is_looked_up_first() {
    // The downstream keeps keys 60 s, the margin is 30 s; the key's first attempt was 20 s ago
    // and its answer was lost (the effect happened): it may be forgotten 10 s from now. A blind
    // call now would land in time, but the client's next slot is 40 s away and the lease
    // (100 s) lets the call wait for it.
    let settings = Settings {
        key_retention_margin: Duration::from_secs(30),
        lease: Duration::from_secs(100),
        call_attempts: 1,
        ..fast()
    };
    let w = world(settings, Duration::from_secs(1));
    *w.downstream.key_retention.lock().unwrap() = Some(Duration::from_secs(60));
    w.downstream
        .consistent
        .store(true, std::sync::atomic::Ordering::SeqCst);
    *w.downstream.pace.lock().unwrap() = Some(next_slot_in(40));
    let now = w.clock.now_ms();
    let mut r = record("p1", RecordStatus::Failed, true, now - 20_000);
    r.not_before_ms = Some(now - 15_000);
    w.store.insert(r);
    w.downstream
        .found
        .lock()
        .unwrap()
        .insert("p1".into(), "r_p1".into());
    let (r, _) = w
        .processor
        .handle_batch(vec![msg("m1", &body("p1", 100), None)], now + 120_000)
        .await;
    assert!(r.batch_item_failures.is_empty());
    assert_eq!(w.downstream.lookups("p1"), 1, "looked up before any send");
    assert_eq!(
        w.downstream.calls("p1"),
        0,
        "no blind call: it would act twice"
    );
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(rec.status, RecordStatus::Completed);
    assert_eq!(rec.outcome.unwrap().text("receipt"), Some("r_p1"));
}

#[tokio::test(start_paused = true)]
async fn a_call_the_pace_refused_is_not_an_attempt_and_its_message_is_requeued_on_its_last_receive()
{
    // The runner is not paced (the work's client is): the call is refused for want of a slot
    // within the lease (next slot 30 s away, lease 10 s). On main this was a failed attempt,
    // backed off, and on the last receive dead-lettered `retries_exhausted`.
    let w = world(fast(), Duration::from_secs(2));
    *w.downstream.pace.lock().unwrap() = Some(next_slot_in(30));
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    let mut m = msg_at("m1", &body("p1", 100), None, now - 60_000, 3);
    // Waiting for the pace is not capped by earlier copies.
    m.message_attributes.insert("requeued".into(), copied(3));
    let (r, s) = w.processor.handle_batch(vec![m], now + 60_000).await;
    assert_eq!(failures(&r), Vec::<String>::new(), "the copy replaces it");
    assert!(
        w.queues.dead().is_empty(),
        "never dead-lettered for waiting"
    );
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
    assert_eq!(w.downstream.calls("p1"), 0);
    assert_eq!(s.retried, 1);
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert_eq!(
        rec.status,
        RecordStatus::Failed,
        "released, not left leased"
    );
    assert!(!rec.unknown_outcome, "nothing was sent: nothing unknown");
    // Not yet on its last receive: handed back for when the pace has a slot (30 s), not the
    // transient backoff.
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg_at("m2", &body("p2", 100), None, now, 1)],
            now + 60_000,
        )
        .await;
    assert_eq!(failures(&r), vec!["m2"]);
    let delay = w.queues.last_delay();
    assert!((29..=31).contains(&delay), "{delay} s");
}

#[tokio::test(start_paused = true)]
async fn a_read_before_a_write_the_pace_refused_is_not_an_attempt() {
    // A work that reads, then writes (a refund looks its earlier reservation up first): the
    // read takes the slot the runner booked, the write's slot is 30 s away, past the lease
    // (10 s). Nothing changed downstream: on its last receive the message is requeued, never
    // dead-lettered `retries_exhausted` for waiting (issue 65: resumed and retried refunds at
    // a low pace were).
    let (w, _pace) = paced_world(1.0 / 30.0, 1);
    w.downstream
        .reads_first
        .store(true, std::sync::atomic::Ordering::SeqCst);
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    let m = msg_at("m1", &body("p1", 100), None, now - 60_000, 3);
    let (r, s) = w.processor.handle_batch(vec![m], now + 60_000).await;
    assert_eq!(*w.downstream.reads.lock().unwrap().get("p1").unwrap(), 1);
    assert_eq!(w.downstream.calls("p1"), 0, "the write was never sent");
    assert!(
        w.queues.dead().is_empty(),
        "never dead-lettered for waiting: {:?}",
        w.queues.dead()
    );
    assert_eq!(failures(&r), Vec::<String>::new(), "the copy replaces it");
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
    assert_eq!(s.retried, 1);
    let rec = w.store.get("p1").await.unwrap().unwrap();
    assert!(
        !rec.unknown_outcome,
        "only a read was sent: nothing unknown"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_works_that_read_then_write_makes_both_for_each_message_it_claims() {
    // A slot every 5 s, a lease of 10 s, a call window of 2 s: a write must start within 8 s of
    // its claim. The runner books each message's read and write together (0 and 5 s, 10 and
    // 15 s); a third pair would end past the latest start (22.4 s), so the other eight are
    // handed back unclaimed. Booked one by one, five messages took the first five slots and
    // each write came at 25 s or later, past its lease: every claimed message read and never
    // wrote, at every delivery (issue 65: refunds at a low pace only ever waited).
    let (w, _pace) = paced_world(0.2, 10);
    for flag in [&w.downstream.reads_first, &w.downstream.declares_its_read] {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let t0 = tokio::time::Instant::now();
    let deadline = w.clock.now_ms() + 25_000;
    let batch: Vec<SqsMessage> = (0..10)
        .map(|i| msg(&format!("m{i}"), &body(&format!("p{i}"), 100), None))
        .collect();
    let (r, _) = w.processor.handle_batch(batch, deadline).await;
    let writes: Vec<Duration> = w
        .downstream
        .sent_at
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - t0)
        .collect();
    assert_eq!(
        writes,
        [Duration::from_secs(5), Duration::from_secs(15)],
        "each claimed message's write at its second slot"
    );
    let reads = w.downstream.reads.lock().unwrap().clone();
    assert_eq!(reads.values().sum::<u64>(), 2, "{reads:?}");
    assert_eq!(failures(&r).len(), 8);
    for i in 0..10 {
        let rec = w.store.get(&format!("p{i}")).await.unwrap();
        if w.downstream.calls(&format!("p{i}")) == 1 {
            assert_eq!(rec.unwrap().status, RecordStatus::Completed);
        } else {
            assert!(rec.is_none(), "p{i}: waited for the pace, so never claimed");
        }
    }
    assert!(w.queues.dead.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_message_waiting_for_the_pace_is_copied_afresh_once_half_its_receives_are_spent() {
    // The next slot is 30 s away, past every latest start (deadline 5 s): each message waits.
    // With six receives, the third delivery copies it afresh: a duplicate SQS delivers later
    // with its receive count, or a crash in the invocation holding it, would otherwise find it
    // on its last receive, and SQS would move it to the DLQ without a reason (issue 65:
    // refunds sent in a nightly batch at a low pace were). With two, the first is handed back
    // as it is.
    let processor = |w: &World| processor_paced(w, next_slot_in(30));
    let (w, _) = paced_world(1.0, 1);
    *w.queues.max_receives.lock().unwrap() = Some(6);
    let now = w.clock.now_ms();
    let (r, _) = processor(&w)
        .handle_batch(
            vec![msg_at("m3", &body("p3", 100), None, now, 2)],
            now + 5_000,
        )
        .await;
    assert_eq!(failures(&r), ["m3"], "four receives left: handed back");
    assert!(w.queues.requeued.lock().unwrap().is_empty());
    let (r, _) = processor(&w)
        .handle_batch(
            vec![msg_at("m4", &body("p4", 100), None, now, 3)],
            now + 5_000,
        )
        .await;
    assert_eq!(failures(&r), Vec::<String>::new(), "the copy replaces it");
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
    assert!(w.store.get("p4").await.unwrap().is_none(), "never claimed");

    let (w, _) = paced_world(1.0, 1);
    *w.queues.max_receives.lock().unwrap() = Some(2);
    let (r, _) = processor(&w)
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, now, 1)],
            now + 5_000,
        )
        .await;
    assert_eq!(
        failures(&r),
        ["m1"],
        "with two receives the first is handed back"
    );
    assert!(w.queues.requeued.lock().unwrap().is_empty());
    assert!(w.queues.dead().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_copy_of_a_message_already_done_ends_without_waiting_for_the_pace() {
    // p1 was charged; the pace's next slot is 30 s away, past the latest start. Its duplicate
    // makes no request: acknowledged now, not handed back to wait with the messages that
    // need the downstream; a message not done yet still waits.
    let (w, _) = paced_world(1.0, 1);
    let (r, _) = w
        .processor
        .handle_batch(
            vec![msg("m1", &body("p1", 100), None)],
            w.clock.now_ms() + 60_000,
        )
        .await;
    assert!(failures(&r).is_empty());
    assert_eq!(w.downstream.calls("p1"), 1);
    let processor = processor_paced(&w, next_slot_in(30));
    let now = w.clock.now_ms();
    let (r, s) = processor
        .handle_batch(
            vec![
                msg("m1-again", &body("p1", 100), None),
                msg("m2", &body("p2", 100), None),
            ],
            now + 5_000,
        )
        .await;
    assert_eq!(failures(&r), ["m2"], "{s:?}");
    assert_eq!(s.duplicates, 1, "{s:?}");
    assert_eq!(w.downstream.calls("p1"), 1, "no second call");
}

#[tokio::test(start_paused = true)]
async fn the_followers_of_a_fifo_head_that_waits_for_the_pace_wait_with_it_on_their_own_budget() {
    // The next slot is 10 s away, past every latest start (deadline 5 s): each group's head
    // waits for the pace. Its followers are on their last receive and were copied as often as
    // the queue allows receives: on main they were dead-lettered (or handed back in place,
    // ahead of a head that went to its group's end) without ever being attempted.
    let (w, _) = paced_world(0.1, 10);
    let pace = next_slot_in(10);
    let processor = processor_paced(&w, pace);
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    let follower = |id: &str, pid: &str, g: &str, n: u32| {
        let mut m = msg_at(id, &body(pid, 100), Some(g), now - 60_000, n);
        m.message_attributes.insert("requeued".into(), copied(3));
        m
    };
    let batch = vec![
        // Group a: the head and its follower are handed back in place, the follower as late as
        // its head.
        msg_at("a1", &body("pa1", 100), Some("a"), now - 60_000, 1),
        follower("a2", "pa2", "a", 1),
        // Group c: the head is handed back in place; its follower, on its last receive, goes to
        // the group's end as a fresh copy (behind the head), and the one after it follows.
        msg_at("c1", &body("pc1", 100), Some("c"), now - 60_000, 1),
        follower("c2", "pc2", "c", 3),
        follower("c3", "pc3", "c", 1),
        // Group b: the head is on its last receive and goes to the group's end as a fresh
        // copy; its follower follows it there.
        msg_at("b1", &body("pb1", 100), Some("b"), now - 60_000, 3),
        follower("b2", "pb2", "b", 3),
    ];
    let (r, _) = processor.handle_batch(batch, now + 5_000).await;
    assert!(w.queues.dead().is_empty(), "{:?}", w.queues.dead());
    let requeued = |group: char| -> Vec<String> {
        w.queues
            .requeued
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.source_message_id.clone())
            .filter(|id| id.starts_with(group))
            .collect()
    };
    assert_eq!(requeued('a'), Vec::<String>::new());
    assert_eq!(requeued('c'), ["c2", "c3"], "in group order");
    assert_eq!(requeued('b'), ["b1", "b2"], "in group order");
    assert_eq!(failures(&r), ["a1", "a2", "c1"]);
    // a2 waits as long as its head (10 s), not the two seconds of a follower of a failure.
    let delays: HashMap<String, i32> = w
        .queues
        .visibility
        .lock()
        .unwrap()
        .iter()
        .cloned()
        .collect();
    assert_eq!(delays["rh-a1"], 10);
    assert_eq!(delays["rh-a2"], 10);
    for pid in ["pa1", "pa2", "pc1", "pc2", "pc3", "pb1", "pb2"] {
        assert!(
            w.store.get(pid).await.unwrap().is_none(),
            "{pid} was claimed"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_message_that_only_waited_is_requeued_at_the_retention_margin_not_dead_lettered() {
    // The queue keeps messages an hour; the retention margin (390 s) is reached half a second
    // from now, and the pace's next slot is 10 s away.
    let (w, _) = paced_world(0.1, 10);
    let pace = next_slot_in(10);
    let processor = processor_paced(&w, pace);
    *w.queues.max_receives.lock().unwrap() = Some(10);
    *w.queues.retention.lock().unwrap() = Some(Duration::from_secs(3600));
    let now = w.clock.now_ms();
    let sent = now - (3600 - 390) * 1000 + 500;
    let (r, _) = processor
        .handle_batch(
            vec![msg_at("m1", &body("p1", 100), None, sent, 2)],
            now + 5_000,
        )
        .await;
    assert!(w.queues.dead().is_empty(), "{:?}", w.queues.dead());
    assert_eq!(failures(&r), Vec::<String>::new());
    let copies = w.queues.requeued.lock().unwrap().clone();
    assert_eq!(copies.len(), 1, "a fresh copy: a new retention");
    assert!(
        copies[0]
            .attributes
            .iter()
            .any(|(k, v)| k == "first_sent_at" && v == &sent.to_string()),
        "its age travels with it: {:?}",
        copies[0].attributes
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_slower_than_its_allowance_is_not_an_attempt_and_widens_the_next_allowance() {
    // Claims take 2 s (a throttled table). Pace 0.4/s; deadline 6 s: the latest first call is
    // 6 - 0.5 (safety) - 2 (call window) - 1 (allowance before any claim is measured) = 2.5 s.
    let settings = Settings {
        max_concurrency: 10,
        ..fast()
    };
    let scripted = Mutex::new(None);
    let w = world_wrapped(settings, Duration::from_secs(2), |inner| {
        let s = Arc::new(ScriptedStore::new(inner));
        *scripted.lock().unwrap() = Some(s.clone());
        s
    });
    let scripted = scripted.lock().unwrap().take().unwrap();
    *scripted.claim_delay.lock().unwrap() = Duration::from_secs(2);
    let pace = Arc::new(Pace::new(0.4));
    *w.downstream.pace.lock().unwrap() = Some(pace.clone());
    let processor = Arc::new(
        Processor::new(
            w.downstream.clone(),
            scripted.clone(),
            w.queues.clone(),
            w.processor.settings().clone(),
        )
        .with_clock(w.clock.clone())
        .with_pace(pace.clone()),
    );
    *w.queues.max_receives.lock().unwrap() = Some(3);
    let now = w.clock.now_ms();
    // m0 takes the slot at 0 and calls at 2 s; m1's slot is at 2.5 s, its claim ends at 4.5 s,
    // and the call would end after the 5.5 s cut-off: nothing is sent. On its last receive it
    // is requeued (on main: a failed attempt, dead-lettered `retries_exhausted`).
    let batch = vec![
        msg("m0", &body("p0", 100), None),
        msg_at("m1", &body("p1", 100), None, now - 60_000, 3),
    ];
    let (r, _) = processor.handle_batch(batch, now + 6_000).await;
    assert_eq!(w.downstream.calls("p0"), 1);
    assert_eq!(w.downstream.calls("p1"), 0);
    assert!(w.queues.dead().is_empty(), "{:?}", w.queues.dead());
    assert_eq!(failures(&r), Vec::<String>::new());
    assert_eq!(w.queues.requeued.lock().unwrap().len(), 1);
    // Later, the slot is 2.5 s away and the deadline 7 s: with the 1 s allowance its claim
    // would be written, and released for want of time; with the allowance measured (2 s
    // claims) the slot is past the latest start and the message is not claimed at all.
    tokio::time::advance(Duration::from_secs(20)).await;
    pace.book(tokio::time::Instant::now()).unwrap();
    let now = w.clock.now_ms();
    let (r, _) = processor
        .handle_batch(vec![msg("m2", &body("p2", 100), None)], now + 7_000)
        .await;
    assert_eq!(failures(&r), ["m2"]);
    assert!(w.store.get("p2").await.unwrap().is_none(), "never claimed");
}
