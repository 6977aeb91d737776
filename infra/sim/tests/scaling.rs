//! The simulator's cost grows with its payments, not with their square: one configuration at N
//! and at 4N payments, and what the models visit per request ([`simulator::cost`]) at most a
//! little more at 4N. A model that walks all it holds on each request (the provider's keys of
//! the last 24 hours, a table read whole for one partition: both put back below) visits about
//! four times as much a request at 4N, and fails here, in `make test`, instead of in a
//! seventy-minute capacity run.

use simulator::world::{run, Options, Report};

/// Half through the API, refunds and disputes on, at 4,000 payments a simulated day, for as long
/// as `payments` take: N payments arrive over 0.1 days of a 0.2-day run, 4N over 0.4 of 0.8 (so
/// that every key the provider keeps is still alive, and a table read whole on each sweep is
/// read four times as often at four times the size).
fn load(payments: usize, mutation: Option<&str>) -> Options {
    let days = payments as f64 / 4_000.0 * 2.0;
    let mut o = Options::new(3, payments, days);
    o.arrival_days = days / 2.0;
    o.api_share = 0.5;
    o.disputes = (0.05, (0.02, 0.1));
    o.mutation = mutation.map(str::to_owned);
    o
}

fn per_request(r: &Report) -> f64 {
    r.model_visits as f64 / (r.aws_requests + r.provider_requests).max(1) as f64
}

/// The growth of visits a request from N to 4N payments, with what each run did.
fn growth(n: usize, mutation: Option<&str>) -> (f64, String) {
    let (small, large) = (
        run(load(n, mutation)).unwrap(),
        run(load(4 * n, mutation)).unwrap(),
    );
    for r in [&small, &large] {
        assert!(
            r.violations.is_empty(),
            "{:?}: {:?}",
            mutation,
            r.violations
        );
        assert!(
            r.charged > r.payments / 2,
            "{} of {} charged",
            r.charged,
            r.payments
        );
    }
    let detail = format!(
        "{} payments: {} visits in {} requests ({:.2} a request); {} payments: {} visits in {} requests ({:.2} a request)",
        small.payments,
        small.model_visits,
        small.aws_requests + small.provider_requests,
        per_request(&small),
        large.payments,
        large.model_visits,
        large.aws_requests + large.provider_requests,
        per_request(&large),
    );
    (per_request(&large) / per_request(&small), detail)
}

/// At most this much more a request at 4N: linear models stay near 1; a walk of all the run
/// holds grows toward 4.
const BOUND: f64 = 1.5;

#[test]
fn the_models_visit_no_more_a_request_at_four_times_the_payments() {
    let (ratio, detail) = growth(400, None);
    println!("{ratio:.2}: {detail}");
    assert!(
        ratio < BOUND,
        "visits a request grew {ratio:.2} times: {detail}"
    );
}

#[test]
fn a_quadratic_model_put_back_fails_the_bound() {
    for mutation in ["query_reads_the_table", "provider_walks_keys"] {
        let (ratio, detail) = growth(400, Some(mutation));
        println!("{mutation}: {ratio:.2}: {detail}");
        assert!(
            ratio >= BOUND,
            "{mutation} put back, visits a request grew only {ratio:.2} times: {detail}"
        );
    }
}
