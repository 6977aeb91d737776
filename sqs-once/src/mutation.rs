//! Mutations of the protocol that the whole-system simulator puts back, to show that its
//! invariants find them (its "teeth"). Each is a version of a rule that was, or would be,
//! wrong. They exist only in a build with the `sim-mutations` feature, which only the
//! simulator turns on (its tests, and `make sim MUTATION=...`); elsewhere its check (`on`) is `false`,
//! a constant, and [`put_back`] refuses.

/// The mutations, by name, with what each undoes.
pub const ALL: &[(&str, &str)] = &[(
    "unknown_mark_not_sticky",
    "the unknown-outcome mark is not sticky: an attempt starts with a clear mark instead of the one it inherits, and a failure's write sets the record's mark to what that failure alone says (a refused connection clears it)",
)];

#[cfg(feature = "sim-mutations")]
thread_local! {
    /// The mutations put back on this thread (the simulator runs on one).
    static ON: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Puts a mutation back on this thread; an unknown name, or a build without the feature, is
/// refused.
pub fn put_back(name: &str) -> Result<(), String> {
    let Some((known, _)) = ALL.iter().find(|(n, _)| *n == name) else {
        return Err(format!(
            "no mutation {name}; the mutations are {:?}",
            ALL.iter().map(|(n, _)| n).collect::<Vec<_>>()
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

/// Whether a mutation is put back on this thread.
#[inline]
pub(crate) fn on(name: &str) -> bool {
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
