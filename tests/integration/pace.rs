//! The provider's pace against a provider that limits the account's rate as Stripe does (a
//! simulator of the test's own, `POST /_sim/rate_limit`: past the rate, `429` with
//! `Stripe-Rate-Limited-Reason: global-rate`): a backlog drains at the budget with almost no
//! refusals and nothing dead-lettered; a budget above what the account allows is brought down
//! by the refusals themselves.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::helpers::*;
use crate::own_simulator::OwnSimulator;

fn paced_env(sim: &OwnSimulator, per_second: &str) -> BTreeMap<String, String> {
    let mut env = fast_settings();
    for (k, v) in [
        ("PROVIDER_API_URL", sim.url.as_str()),
        ("PAYMENT_API_KEY", "sk_test_local"),
        // One local process stands for the event source's every instance.
        ("PROVIDER_REQUESTS_PER_SECOND", per_second),
        ("PROVIDER_SHARE_PERCENT", "100"),
        ("EVENT_SOURCE_MAX_CONCURRENCY", "1"),
        ("PROVIDER_MAX_ATTEMPTS", "3"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    env
}

/// The payments of `t` sent at once, drained by four concurrent batches; each charged once.
async fn drain_backlog(t: &TestStack, n: usize) -> Duration {
    let bodies: Vec<String> = (0..n)
        .map(|i| payment(&t.pid(&format!("b{i}")), 100 + i as i64, "pm_card_visa"))
        .collect();
    proving::load::send_all(&t.sqs, t.queue_url(), &bodies)
        .await
        .unwrap();
    let started = Instant::now();
    t.drain(4).await;
    let took = started.elapsed();
    for i in 0..n {
        let pid = t.pid(&format!("b{i}"));
        assert_eq!(t.charges(&pid).await, 1, "{pid} charged once");
    }
    assert!(
        t.dead_letters().await.is_empty(),
        "nothing dead-lettered for waiting"
    );
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_at_the_budget_with_almost_no_refusals() {
    let sim = OwnSimulator::start("budget");
    sim.limit(25).await;
    // The stack's budget within the account's limit: 20 of 25 a second.
    let t = TestStack::with_env("pace_budget", paced_env(&sim, "20")).await;
    let n = 120;
    let took = drain_backlog(&t, n).await;
    let (allowed, refused) = sim.counts().await;
    println!(
        "{n} payments: {allowed} requests let through, {refused} refused, drained in {took:?}"
    );
    assert!(
        refused <= 0.05 * (allowed + refused),
        "at most 5 % refused: {allowed} let through, {refused} refused"
    );
    assert!(
        took >= Duration::from_secs_f64(n as f64 / 20.0 * 0.9),
        "not faster than the budget: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_above_the_account_s_limit_is_brought_down_by_its_refusals() {
    let sim = OwnSimulator::start("over");
    sim.limit(5).await;
    // Told 20 a second where the account allows 5: the global-rate refusals halve the pace.
    let t = TestStack::with_env("pace_over", paced_env(&sim, "20")).await;
    let n = 60;
    drain_backlog(&t, n).await;
    let (allowed, refused) = sim.counts().await;
    println!("{n} payments at 20/s against 5/s: {allowed} let through, {refused} refused");
    // Unpaced by the refusals, 20 a second against 5 would be refused three times in four.
    assert!(
        refused < 0.5 * (allowed + refused),
        "the refusals slowed it down: {allowed} let through, {refused} refused"
    );
}
