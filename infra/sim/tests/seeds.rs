//! The fixed seeds `make test` runs, and the run's determinism: a seed is one run, byte for byte.

use simulator::world::{run, Options};

fn small(seed: u64) -> Options {
    Options::new(seed, 400, 12.0)
}

#[test]
fn a_seed_replays_byte_for_byte_and_another_seed_does_not() {
    let a = run(small(11)).unwrap();
    let b = run(small(11)).unwrap();
    let c = run(small(12)).unwrap();
    assert!(
        a.aws_requests > 1000,
        "{} requests: the run did nothing",
        a.aws_requests
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

#[test]
fn the_fixed_seeds_keep_every_invariant() {
    for seed in 1..=3 {
        let r = run(small(seed)).unwrap();
        assert!(
            r.charged > 250,
            "seed {seed}: only {} of {} payments charged",
            r.charged,
            r.payments
        );
        assert!(
            r.violations.is_empty(),
            "seed {seed} broke an invariant: {:#?}\nlast events:\n{}\nreplay: make sim FIRST_SEED={seed} SEEDS=1 DAYS=12 PAYMENTS=400",
            r.violations,
            r.trace.join("\n")
        );
    }
}

#[test]
fn a_provider_that_ignores_its_keys_is_caught_charging_twice() {
    // The invariant's own teeth: retries after lost answers, with no key to absorb them.
    let mut opts = small(5);
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
