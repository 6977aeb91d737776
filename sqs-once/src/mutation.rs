//! Mutations of the protocol that the whole-system simulator puts back, to show that its
//! invariants find them (its "teeth"). Each is a version of a rule that was, or would be,
//! wrong. They exist only in a build with the `sim-mutations` feature, which only the
//! simulator turns on (its tests, and `make sim MUTATION=...`); elsewhere its check (`on`) is `false`,
//! a constant, and [`put_back`] refuses. A crate built on `sqs-once` can keep mutations of its
//! own `Work`s on the same switch: it lists them and checks [`on`]; the simulator puts them
//! back with [`put_back_from`].

/// The mutations, by name, with what each undoes.
pub const ALL: &[(&str, &str)] = &[
    (
        "unknown_mark_not_sticky",
        "the unknown-outcome mark is not sticky: an attempt starts with a clear mark instead of the one it inherits, and a failure's write sets the record's mark to what that failure alone says (a refused connection clears it)",
    ),
    (
        "completion_unfenced",
        "a completion is written whoever holds the lease (the model's FENCED=0): an attempt whose lease ended completes over the record's next attempt, or over its completion",
    ),
    (
        "a_read_before_a_refused_write_spends_the_attempt",
        "a call that read and then had its write refused by the pace counts as an attempt (a work that reads before it writes spends its receive budget waiting for the pace)",
    ),
    (
        "a_done_copy_waits_for_the_pace",
        "a copy of a message whose record is completed waits for a slot of the pace before its claim finds the outcome: in a burst at a low rate, duplicates and requeued copies cycle through the queue with the messages that need the provider",
    ),
    (
        "requeued_only_on_the_last_receive",
        "a message never attempted (waiting for the pace, not started before the deadline) is copied afresh only on its last receive: a duplicate SQS delivers of it, or a crash there, finds it with no receive left, and SQS moves it to the DLQ without a reason",
    ),
    (
        "an_attempt_books_only_its_first_slot",
        "the runner books one slot before the claim whatever the work's requests per attempt: a refund's write, booked after the lookup, comes behind every other message's first slot and, at a low rate, past the lease",
    ),
];

#[cfg(feature = "sim-mutations")]
thread_local! {
    /// The mutations put back on this thread (the simulator runs on one).
    static ON: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Puts one of this crate's mutations ([`ALL`]) back on this thread; an unknown name, or a
/// build without the feature, is refused.
pub fn put_back(name: &str) -> Result<(), String> {
    put_back_from(ALL, name)
}

/// Puts a mutation of `list` (a crate's own, as [`ALL`] is this one's) back on this thread; a
/// name not in `list`, or a build without the feature, is refused.
pub fn put_back_from(
    list: &'static [(&'static str, &'static str)],
    name: &str,
) -> Result<(), String> {
    let Some((known, _)) = list.iter().find(|(n, _)| *n == name) else {
        return Err(format!(
            "no mutation {name}; the mutations are {:?}",
            list.iter().map(|(n, _)| n).collect::<Vec<_>>()
        ));
    };
    #[cfg(feature = "sim-mutations")]
    {
        ON.with(|on| on.borrow_mut().push(known));
        Ok(())
    }
    #[cfg(not(feature = "sim-mutations"))]
    {
        Err(format!(
            "{known}: this build has no mutations (the sim-mutations feature is off)"
        ))
    }
}

/// Takes every mutation off this thread again (a run that follows another on it starts clean).
pub fn clear() {
    #[cfg(feature = "sim-mutations")]
    ON.with(|on| on.borrow_mut().clear());
}

/// Whether a mutation is put back on this thread: always `false` (a constant) in a build
/// without the `sim-mutations` feature.
#[inline]
pub fn on(name: &str) -> bool {
    #[cfg(feature = "sim-mutations")]
    {
        ON.with(|on| on.borrow().contains(&name))
    }
    #[cfg(not(feature = "sim-mutations"))]
    {
        let _ = name;
        false
    }
}
