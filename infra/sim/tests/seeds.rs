//! The fixed seeds `make test` runs, and the run's determinism: a seed is one run, byte for byte.
//!
//! Why one file of ~520 lines: each test is one whole-system run with its options and what it
//! must (or, with a mutation put back, must not) keep; they are read side by side.

use simulator::world::{run, Options};

/// 300 payments arriving over the first 3.3 days, ten days in all.
fn small(seed: u64) -> Options {
    Options::new(seed, 300, 10.0)
}

/// Half the payments through the payments API and its outbox relay.
fn through_the_api(mut opts: Options) -> Options {
    opts.api_share = 0.5;
    opts
}

#[test]
fn a_seed_replays_byte_for_byte_and_another_seed_does_not() {
    let short = |seed| through_the_api(Options::new(seed, 60, 4.0));
    let a = run(short(11)).unwrap();
    let b = run(short(11)).unwrap();
    let c = run(short(12)).unwrap();
    assert!(
        a.aws_requests > 500 && a.relay_invocations > 10,
        "{} requests, {} relay invocations: the run did nothing",
        a.aws_requests,
        a.relay_invocations
    );
    assert_eq!(
        a.digest, b.digest,
        "seed 11 gave two runs:\n{:#?}\n{:#?}",
        a.trace, b.trace
    );
    assert_eq!(
        (a.invocations, a.killed, a.charged),
        (b.invocations, b.killed, b.charged)
    );
    assert_ne!(a.digest, c.digest);
}

/// One of the fixed seeds: every invariant kept. Three tests, not one loop, so that the test
/// threads share them (the longest runs of the suite; named to start first).
fn fixed_seed(seed: u64) {
    let r = run(through_the_api(small(seed))).unwrap();
    assert!(
        r.charged > 190,
        "seed {seed}: only {} of {} payments charged",
        r.charged,
        r.payments
    );
    assert!(
        r.api_accepted > 100 && r.relay_invocations > 0,
        "seed {seed}: the API accepted {} payments in {} relay invocations",
        r.api_accepted,
        r.relay_invocations
    );
    assert!(
        r.violations.is_empty(),
        "seed {seed} broke an invariant: {:#?}\nlast events:\n{}\nreplay: make sim FIRST_SEED={seed} SEEDS=1 DAYS=10 PAYMENTS=300 API_SHARE=0.5",
        r.violations,
        r.trace.join("\n")
    );
}

#[test]
fn a_fixed_seed_1_keeps_every_invariant() {
    fixed_seed(1);
}

#[test]
fn a_fixed_seed_2_keeps_every_invariant() {
    fixed_seed(2);
}

#[test]
fn a_fixed_seed_3_keeps_every_invariant() {
    fixed_seed(3);
}

#[test]
fn a_provider_that_ignores_its_keys_is_caught_charging_twice() {
    // The invariant's own teeth: retries after lost answers, with no key to absorb them.
    let mut opts = Options::new(5, 200, 4.0);
    opts.provider.ignores_keys = true;
    opts.provider.lost_answer_rate = 0.05;
    let r = run(opts).unwrap();
    let twice: Vec<_> = r
        .violations
        .iter()
        .filter(|v| v.invariant == "no payment charged twice")
        .collect();
    assert!(
        !twice.is_empty(),
        "no double charge found in {} payments: {:#?}",
        r.payments,
        r.violations
    );
}

#[test]
fn a_charged_record_kept_21_days_is_caught() {
    // Main before the lifetimes work: a charged payment's record lived the record retention.
    let mut opts = Options::new(21, 100, 24.0);
    opts.mutation = Some("charged_records_21_days".into());
    let r = run(opts).unwrap();
    let early: Vec<_> = r
        .violations
        .iter()
        .filter(|v| v.invariant == "no record deleted while the provider can still change it")
        .collect();
    assert!(!early.is_empty(), "nothing caught: {:#?}", r.violations);
    // Found as the first records expire: after 21 days, within TTL's 48 hours.
    let first = early.iter().map(|v| v.at_ms).min().unwrap() as f64 / 86_400_000.0;
    assert!(
        (21.0..23.5).contains(&first),
        "first found on day {first:.2}"
    );
}

#[test]
fn users_own_queues_keep_every_invariant() {
    // The shortest visibility Lambda maps (the longest function's timeout, 60 s) with a small
    // maxReceiveCount (six days: it is the claims and leases under test), and FIFO queues (ten:
    // seed 32's held refunds are made on day 5).
    for (seed, visibility, receives, fifo, days) in [
        (31, Some(60), Some(2), false, 6.0),
        (32, None, None, true, 10.0),
    ] {
        let mut opts = Options::new(seed, 300, days);
        opts.visibility_timeout = visibility;
        opts.max_receive_count = receives;
        opts.fifo = fifo;
        let r = run(opts).unwrap();
        assert!(r.charged > 190, "seed {seed}: only {} charged", r.charged);
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:#?}\n{}",
            r.violations,
            r.trace.join("\n")
        );
    }
}

#[test]
fn a_provider_down_for_thirty_hours_loses_and_doubles_nothing() {
    // Longer than the retry horizon and than the provider keeps its keys: what was dead-lettered
    // is redriven by the operator after the outage, and an unknown outcome is looked up.
    let mut opts = Options::new(41, 100, 6.0);
    opts.provider_outage = Some((1.0, 30.0));
    let r = run(opts).unwrap();
    assert!(r.charged > 60, "only {} charged", r.charged);
    assert!(
        r.violations.is_empty(),
        "{:#?}\n{}",
        r.violations,
        r.trace.join("\n")
    );
}

#[test]
fn an_unknown_outcome_mark_that_is_not_sticky_is_caught_charging_twice() {
    // The outage's first hour loses answers (outcomes unknown), the rest refuses connections
    // (nothing sent): with the mark cleared by such a failure, the first call after the outage,
    // once the provider forgot the key, charges again. With the rule as it is, the seeds of
    // the outage test above keep every invariant.
    let mut found = None;
    for seed in 51..=55 {
        let mut opts = Options::new(seed, 100, 6.0);
        opts.provider_outage = Some((1.0, 30.0));
        opts.mutation = Some("unknown_mark_not_sticky".into());
        let r = run(opts).unwrap();
        if r.violations
            .iter()
            .any(|v| v.invariant == "no payment charged twice")
        {
            found = Some(seed);
            break;
        }
    }
    assert!(found.is_some(), "five seeds did not find it");
    eprintln!("found by seed {}", found.unwrap_or_default());
}

#[test]
fn an_early_refund_dead_lettered_after_the_retry_horizon_is_caught() {
    // Main before held refunds: a refund of a debit still processing was handed back until its
    // retry horizon (an hour) and then dead-lettered, paging the operator for a normal wait.
    // Whether a seed refunds a debit before it settles is the seed's (a debit is one payment in
    // fourteen, its refund asked 2 h to 10 days after it): with half the payments refunded,
    // seeds 1 to 3 of 200 payments did not when this was written, seed 4 did on day 0.93. The
    // test starts there and tries five.
    let mut found = None;
    for seed in 4..=8 {
        let mut opts = Options::new(seed, 200, 10.0);
        opts.refund_share = 0.5;
        opts.mutation = Some("early_refund_not_held".into());
        let r = run(opts).unwrap();
        let first = r
            .violations
            .iter()
            .filter(|v| v.invariant == "no message dead-lettered only for waiting")
            .map(|v| v.at_ms)
            .min();
        if let Some(at) = first {
            found = Some((seed, at as f64 / 86_400_000.0));
            break;
        }
    }
    let (seed, day) = found.expect("five seeds did not find it");
    eprintln!("found by seed {seed} on day {day:.2}");
    // The first early refund's horizon, days before the debits settle.
    assert!(day < 5.0, "first found on day {day:.2}");
}

#[test]
fn a_held_refund_canceled_on_a_decline_is_caught_when_the_customer_pays_after_all() {
    // Issue 65, bug 3: a decline counted as a settlement, so a held refund was canceled when
    // its debit failed and never made when the customer paid the same PaymentIntent later.
    // Every failed debit is paid again here, half the payments refunded; the first seed that
    // holds a refund of a debit that fails finds it (the check runs at the end).
    let opts = |seed, mutation: Option<&str>| {
        let mut o = Options::new(seed, 300, 25.0);
        o.refund_share = 0.5;
        o.repay_share = 1.0;
        o.mutation = mutation.map(str::to_owned);
        o
    };
    let canceled = |r: &simulator::world::Report| {
        r.violations
            .iter()
            .filter(|v| v.invariant == "no refund canceled of a payment charged")
            .count()
    };
    let found = (1..=6).find(|&seed| {
        canceled(&run(opts(seed, Some("held_refund_canceled_on_decline"))).unwrap()) > 0
    });
    let seed = found.expect("six seeds did not find it");
    eprintln!("found by seed {seed}");
    let r = run(opts(seed, None)).unwrap();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn a_completion_without_the_leases_fence_is_caught() {
    // A user's queue with the shortest visibility Lambda maps to these functions (60 s, their
    // longest timeout) and requests held in the network up to two minutes: an
    // attempt's completion stalls past its lease, the message comes back, a second attempt
    // takes the record over and completes it; the first completion then lands. With the fence
    // it is refused, and the seed that finds the mutation keeps every invariant; without it,
    // the late completion writes its older outcome over the newer one.
    let stalling = |seed| {
        let mut opts = Options::new(seed, 300, 1.0);
        opts.visibility_timeout = Some(60);
        opts.max_receive_count = Some(5);
        opts.aws.stall_rate = 0.005;
        opts.aws.stall_max_ms = 120_000;
        opts
    };
    // Seeds 1 to 4 did not find it when this was written, seed 5 did: the test starts there and
    // tries eight.
    let mut found = None;
    for seed in 5..=12 {
        let mut opts = stalling(seed);
        opts.mutation = Some("completion_unfenced".into());
        let r = run(opts).unwrap();
        if r.violations
            .iter()
            .any(|v| v.invariant == "each record completed once per claim")
        {
            found = Some(seed);
            break;
        }
    }
    let seed = found.expect("eight seeds did not find it");
    eprintln!("found by seed {seed}");
    let fenced = run(stalling(seed)).unwrap();
    assert!(
        fenced.violations.is_empty(),
        "seed {seed} with the fence: {:#?}",
        fenced.violations
    );
}

#[test]
fn dynamodb_and_sqs_down_for_hours_lose_and_double_nothing() {
    // DynamoDB down six hours while payments arrive (claims, completions and the DLQ's marks
    // refused; the API answers 500 and its clients retry), then SQS down four hours (producers
    // back off, the mapping can neither receive nor delete, the relay's sends are refused until
    // its mapping gives three rows up and the operator republishes them on its alarm): what
    // could not be done is done after, once each.
    // Not one tuned seed: the first of a few where the relay gives rows up (every run keeps
    // every invariant).
    let mut found = None;
    for seed in 61..69 {
        let mut opts = through_the_api(Options::new(seed, 200, 4.0));
        opts.dynamo_outage = Some((0.5, 6.0));
        opts.sqs_outage = Some((1.0, 4.0));
        let r = run(opts).unwrap();
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:#?}\n{}",
            r.violations,
            r.trace.join("\n")
        );
        if r.relay_given_up > 0 && r.republished > 0 {
            found = Some(r);
            break;
        }
    }
    let r = found.expect("in eight seeds the relay never gave a row up to be republished");
    assert!(
        r.aws_outage_refusals > 300,
        "only {} requests met the outages",
        r.aws_outage_refusals
    );
    assert!(r.charged > 140, "only {} charged", r.charged);
    assert!(
        r.violations.is_empty(),
        "{:#?}\n{}",
        r.violations,
        r.trace.join("\n")
    );
    eprintln!(
        "{} requests refused by the outages, {} charged",
        r.aws_outage_refusals, r.charged
    );
}

#[test]
fn a_webhook_down_past_stripes_retries_loses_no_event() {
    // The events route down four days from day 4, as the bank debits of the first three days
    // settle: Stripe retries each delivery for three days and then gives up. What it never
    // delivered only the scheduled catch-up finds (it lists the undelivered events hourly), and
    // the inbox applies each once: every ledger equals the provider's books at the end. Without
    // the catch-up, the same seed ends with debits recorded `processing` that the provider
    // settled.
    let down = || {
        let mut opts = Options::new(71, 200, 10.0);
        opts.webhook_outage = Some((4.0, 96.0));
        opts
    };
    let r = run(down()).unwrap();
    assert!(
        r.events_undelivered > 2,
        "only {} events went undelivered",
        r.events_undelivered
    );
    assert!(
        r.catch_up_runs.0 > 200,
        "catch-up runs {:?}",
        r.catch_up_runs
    );
    assert!(
        r.violations.is_empty(),
        "{:#?}\n{}",
        r.violations,
        r.trace.join("\n")
    );
    eprintln!(
        "{} events never delivered; catch-up runs {:?}, lag at most {} s",
        r.events_undelivered, r.catch_up_runs, r.catch_up_worst_lag_s
    );
    let mut off = down();
    off.mutation = Some("catch_up_off".into());
    let r = run(off).unwrap();
    assert!(
        r.violations
            .iter()
            .any(|v| v.invariant == "every ledger equals the provider's books"),
        "without the catch-up nothing was missed: {:#?}",
        r.violations
    );
}

#[test]
fn a_catch_up_listing_every_event_at_one_instances_share_is_caught_falling_behind() {
    // Main before the events-at-pace work: the scheduled catch-up listed every event, not only
    // the undelivered, paced at one instance's share of the event function's rate (its part
    // divided by MaximumConcurrency) instead of the function's whole part. A stack given 1
    // request a second of the account (ProviderRequestsPerSecond=1: the event function's 20 %
    // is 0.2 a second, one instance's 0.02): a run's 35 s then hold no slot, and the
    // checkpoint never moves; at the function's share the same seed keeps every invariant.
    let small_share = || {
        let mut opts = Options::new(1, 300, 1.0);
        opts.parameters
            .insert("ProviderRequestsPerSecond".into(), "1".into());
        opts
    };
    let kept = run(small_share()).unwrap();
    assert!(
        kept.violations.is_empty(),
        "at the function's share: {:#?}",
        kept.violations
    );
    assert!(
        kept.catch_up_runs.0 > 20,
        "catch-up runs {:?}",
        kept.catch_up_runs
    );
    let mut old = small_share();
    old.mutation = Some("catch_up_every_event_at_instance_share".into());
    let r = run(old).unwrap();
    let first = r
        .violations
        .iter()
        .filter(|v| v.invariant == "the catch-up's lag bounded")
        .map(|v| v.at_ms)
        .min()
        .expect("the lag stayed bounded");
    eprintln!("found on day {:.2}", first as f64 / 86_400_000.0);
}

#[test]
fn disputes_opened_decided_and_appealed_are_each_recorded_as_the_provider_holds_them() {
    // A fifth of the charges disputed 1 to 5 days after them (the course of each compressed
    // in the same ratio: decided within three days, appealed and decided again within two
    // more), the provider's events applied by the inbox, half the disputes naming only their
    // charge: each payment's record ends holding its disputes as the provider does, and as
    // disputed what the chargebacks hold; refunds of a charged-back charge are refused.
    let mut opts = Options::new(81, 150, 9.0);
    opts.disputes = (0.2, (1.0, 5.0));
    let r = run(opts).unwrap();
    assert!(r.disputes > 20, "only {} disputes opened", r.disputes);
    assert!(r.disputes_appealed > 0, "no dispute appealed");
    assert!(
        r.violations.is_empty(),
        "{:#?}\n{}",
        r.violations,
        r.trace.join("\n")
    );
    eprintln!(
        "{} disputes opened, {} appealed",
        r.disputes, r.disputes_appealed
    );
}

#[test]
fn an_inbox_whose_waits_for_the_pace_are_attempts_is_caught_losing_disputes() {
    // Main before the events were paced: a dispute's event was claimed before its first read
    // had a slot, and a read the pace refused was an attempt. A stack given one request a
    // second of the account (the event function's part 0.2 a second, one instance's 0.02),
    // its own queues at `maxReceiveCount` 3, half the charges disputed within an hour of
    // them: the events that waited for the pace were dead-lettered and their disputes ended
    // behind the provider's. As it is, the same seed keeps every invariant.
    let tight = || {
        let mut opts = Options::new(2, 150, 2.0);
        opts.parameters
            .insert("ProviderRequestsPerSecond".into(), "1".into());
        opts.max_receive_count = Some(3);
        opts.disputes = (0.5, (0.01, 0.05));
        opts
    };
    let kept = run(tight()).unwrap();
    assert!(kept.disputes > 40, "only {} disputes", kept.disputes);
    assert!(
        kept.violations.is_empty(),
        "{:#?}\n{}",
        kept.violations,
        kept.trace.join("\n")
    );
    let mut old = tight();
    old.mutation = Some("inbox_reads_not_booked".into());
    let r = run(old).unwrap();
    // The events that waited for the pace are dead-lettered: disputes behind the provider's
    // until the operator, paged, redrives them (the runbook), or for good.
    let exhausted = |r: &simulator::world::Report| {
        r.event_dead_letters
            .get("retries_exhausted")
            .copied()
            .unwrap_or(0)
    };
    assert!(
        r.violations
            .iter()
            .any(|v| v.invariant == "every ledger equals the provider's books")
            || exhausted(&r) > exhausted(&kept),
        "the disputes were recorded all the same, {:?} events dead-lettered (as it is: {:?}): {:#?}",
        r.event_dead_letters,
        kept.event_dead_letters,
        r.violations
    );
}

#[test]
fn disputes_are_applied_at_one_request_a_second() {
    // Found by seed 81: at ProviderRequestsPerSecond=1 an instance of the event function has
    // one slot every 50 s, an invocation one slot, and a dispute's event needs up to three
    // reads; its second read had no slot, the event was handed back with nothing kept, and an
    // event that needs more than one read was never applied (3,600 invocations for 100
    // payments; 10,169 AWS requests with the batching window modelled, 975 now). What never changes (a
    // charge's PaymentIntent, an intent's payment) is kept by the process now
    // (`payment_core::events::known`), so each invocation goes one read further. Disputes open
    // from half a day after their charge (1 to 5 days before the insider's forgeries moved the
    // run's draws and left 2 in its two days).
    let mut opts = Options::new(81, 100, 2.0);
    opts.parameters
        .insert("ProviderRequestsPerSecond".into(), "1".into());
    opts.disputes = (0.3, (0.5, 3.0));
    let r = run(opts).unwrap();
    assert!(r.disputes >= 3, "only {} disputes", r.disputes);
    assert!(
        r.violations.is_empty(),
        "{:#?}\n{}",
        r.violations,
        r.trace.join("\n")
    );
    assert!(r.invocations < 1_000, "{} invocations", r.invocations);
}

#[test]
fn events_through_eventbridge_with_sqs_down_past_its_retries_lose_nothing() {
    // The provider's events through EventBridge (`ProviderEventsDelivery=eventbridge`, the
    // template's bus, rule and target as provisioned), SQS down 48 hours from day 4.2, as the
    // first bank debits settle: what EventBridge could not send within its day of retries it
    // puts in the target's dead-letter queue, which SQS refuses too, so only the scheduled
    // catch-up (listing every event of the inbox's types: Stripe's filter of the undelivered
    // knows nothing of EventBridge) finds it; the inbox applies each once. (Without the
    // catch-up the same seed ends with records behind the provider's books: `make sim
    // MUTATION=catch_up_off`, as the webhook's test shows in `make test`.)
    let mut opts = Options::new(61, 100, 6.5);
    opts.parameters
        .insert("ProviderEventsDelivery".into(), "eventbridge".into());
    opts.sqs_outage = Some((4.2, 48.0));
    // The events' path alone: the seed's outage meets the bank debits as they settle only on
    // the draws it had before shoppers' text (the intake's draws and refusals move it).
    opts.shopper_text_share = 0.0;
    let r = run(opts).unwrap();
    assert!(
        r.events_undelivered > 1 && r.events_bridged > 80,
        "{} events missed their target, {} reached it",
        r.events_undelivered,
        r.events_bridged
    );
    assert!(
        r.violations.is_empty(),
        "{:#?}\n{}",
        r.violations,
        r.trace.join("\n")
    );
}

#[test]
fn a_row_the_queue_refuses_is_set_aside_and_reads_failed_never_pending() {
    // Main before issue 63 took any text at the API: a payment holding U+FFFF was answered
    // 202, the relay's send was refused, and nothing ever said so. Rows written before the
    // fix can still hold such text: the relay sets them aside with a mark that GET reads.
    let mut opts = through_the_api(Options::new(4, 200, 4.0));
    opts.shopper_text_share = 0.5;
    opts.mutation = Some("intake_takes_any_text".into());
    let r = run(opts).unwrap();
    assert!(
        r.relay_set_aside > 0,
        "no row was refused: {:#?}",
        r.violations
    );
    let expected = [
        // What the mutation itself lets through.
        "text no door may take is refused at the API (400)",
        "text no door may take is never sent to the provider",
    ];
    let other: Vec<_> = r
        .violations
        .iter()
        .filter(|v| !expected.contains(&v.invariant))
        .collect();
    assert!(other.is_empty(), "{other:#?}\n{}", r.trace.join("\n"));
}

#[test]
fn an_insider_s_forged_events_settle_nothing() {
    // One who may send to the events queue (no signature is asked there) copies the provider's
    // events under new ids with their objects at a final state they never reached: a
    // PaymentIntent `canceled`, a refund `failed`, a dispute `won`. Main before the inbox read
    // what it applies took the payload for the provider's word: a bank debit still
    // `processing` was recorded canceled (and its `succeeded` then ignored), a refund's amount
    // given back, a chargeback released. As it is, each forgery makes the inbox read the
    // object, and the records stay the provider's books.
    let forged = || {
        let mut opts = Options::new(6, 200, 14.0);
        opts.forged_event_share = 0.3;
        opts.refund_share = 0.3;
        opts.disputes = (0.2, (0.2, 2.0));
        opts
    };
    let kept = run(forged()).unwrap();
    assert!(
        kept.events_forged > 60 && kept.disputes > 5 && kept.refunds_made > 5,
        "{} events forged, {} disputes, {} refunds",
        kept.events_forged,
        kept.disputes,
        kept.refunds_made
    );
    assert!(
        kept.violations.is_empty(),
        "{:#?}\n{}",
        kept.violations,
        kept.trace.join("\n")
    );
    let mut old = forged();
    old.mutation = Some("inbox_applies_payload".into());
    let r = run(old).unwrap();
    // Each forgery shows: a payment canceled, a refund's amount given back, a chargeback's.
    for (what, shows) in [
        ("payment", "record says Some(\"canceled\")"),
        ("refund", "refunded, the provider"),
        ("dispute", "as disputed, the provider's chargebacks"),
    ] {
        assert!(
            r.violations.iter().any(|v| {
                v.invariant == "every ledger equals the provider's books"
                    && v.detail.contains(shows)
            }),
            "no forged {what} event was seen applied: {:#?}",
            r.violations
        );
    }
}
