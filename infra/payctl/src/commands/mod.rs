//! The command families of `payctl`, one module each: its options and what it does.

pub mod api;
pub mod checks;
pub mod dlq;
pub mod outbox;
pub mod reconcile;
pub mod run;
pub mod send;
pub mod stack;
pub mod status;
