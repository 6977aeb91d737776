//! A paced downstream (`sqs_once::pace`): the runner books each message's first request
//! before claiming it, at the pace's rate, and hands back unclaimed what cannot start before
//! its invocation's deadline; a slot a message did not use is given back. On tokio's paused
//! clock: nothing here waits.

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
    let processor = Arc::new(
        Processor::new(
            w.downstream.clone(),
            w.store.clone(),
            w.queues.clone(),
            w.processor.settings().clone(),
        )
        .with_clock(w.clock.clone())
        .with_pace(pace.clone()),
    );
    (World { processor, ..w }, pace)
}

#[tokio::test(start_paused = true)]
async fn a_batch_calls_at_the_pace_and_what_cannot_start_in_time_is_handed_back_unclaimed() {
    let (w, _pace) = paced_world(2.0, 10);
    let t0 = tokio::time::Instant::now();
    // Latest first call: the deadline less the safety (0.5 s), the call's window (2 s) and the
    // claim's allowance (1 s): 2.5 s from now, so slots at 0, 0.5, ..., 2.5 s: six messages.
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
        (0..6)
            .map(|i| Duration::from_millis(500 * i))
            .collect::<Vec<_>>(),
        "one call every half second, none sooner"
    );
    let handed_back = failures(&r);
    assert_eq!(handed_back.len(), 4, "{handed_back:?}");
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
    // One message at a time; the first answers in 3 s. Latest first call: the deadline (6 s)
    // less the safety, the call's window and the claim's allowance: 2.5 s. The second gets its
    // permit at 3 s, still time enough for the runner to start it, too late to call.
    let (w, _pace) = paced_world(100.0, 1);
    w.downstream
        .set("p0", Behaviour::Slow(Duration::from_secs(3)));
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
