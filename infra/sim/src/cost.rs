//! What the models cost: the elements they visit per request. A model that walks everything it
//! holds on each request makes a run's cost grow with the square of its payments; the scaling
//! test (`tests/scaling.rs`) runs one configuration at N and at 4N payments and bounds how much
//! the visits per request grow, so that such a walk fails `make test`, not a seventy-minute
//! capacity run. Each model counts where it reads a collection whose size grows with the run
//! (a query's candidates, a receive's messages, a stream read's records, the keys and due
//! changes the provider forgets or settles, a PaymentIntent's refunds).
//!
//! Two mutations put today's quadratic walks back (the test's teeth).

use std::cell::Cell;

/// The models' own mutations: the walks that made a run quadratic, put back.
pub const MUTATIONS: &[(&str, &str)] = &[
    (
        "query_reads_the_table",
        "a DynamoDB query reads every item of its table, not its partition (the model before its partition index)",
    ),
    (
        "provider_walks_keys",
        "the provider walks every idempotency key of the last 24 hours on each charge (the model before keys were forgotten in order)",
    ),
];

thread_local! {
    /// Elements visited on this thread (a run is one thread) since the last [`take`].
    static VISITS: Cell<u64> = const { Cell::new(0) };
    /// The model mutation put back on this thread.
    static PUT_BACK: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Counts `n` elements visited.
pub fn visit(n: usize) {
    VISITS.with(|v| v.set(v.get() + n as u64));
}

/// The elements visited since the last call, and starts again from zero.
pub fn take() -> u64 {
    VISITS.with(|v| v.replace(0))
}

/// Puts one of [`MUTATIONS`] back on this thread (or none, for any other name).
pub(crate) fn put_back(name: Option<&str>) {
    let known = name.and_then(|n| MUTATIONS.iter().find(|(m, _)| *m == n).map(|(m, _)| *m));
    PUT_BACK.with(|p| p.set(known));
}

/// Whether the model mutation `name` is put back on this thread.
pub(crate) fn on(name: &str) -> bool {
    PUT_BACK.with(|p| p.get() == Some(name))
}
