//! Unique tokens (a claim's lease owner), injectable: production draws them at random (UUID
//! v4, from the OS); a run that must be the same each time (the whole-system simulator) seeds
//! its thread's source, so that its tokens, and every request carrying one, repeat.

use std::cell::RefCell;

thread_local! {
    /// The seeded source of this thread, when a deterministic run set one.
    static SEEDED: RefCell<Option<fastrand::Rng>> = const { RefCell::new(None) };
}

/// Draws this thread's tokens from `seed` from now on (a deterministic run's setup).
pub fn seed_this_thread(seed: u64) {
    SEEDED.with(|s| *s.borrow_mut() = Some(fastrand::Rng::with_seed(seed)));
}

/// 128 random bits: the OS's, or the seeded source's.
pub fn bits() -> u128 {
    SEEDED
        .with(|s| s.borrow_mut().as_mut().map(|rng| rng.u128(..)))
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u128())
}

/// A new unique token in UUID v4 form.
pub fn new() -> String {
    uuid::Builder::from_random_bytes(bits().to_le_bytes())
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_seeded_thread_repeats_its_tokens_and_an_unseeded_one_does_not() {
        let run = |seed| {
            std::thread::spawn(move || {
                super::seed_this_thread(seed);
                (super::new(), super::new())
            })
            .join()
            .unwrap()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let (a, b) = std::thread::spawn(|| (super::new(), super::new()))
            .join()
            .unwrap();
        assert_ne!(a, b);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 4);
    }
}
