//! # payment-core: exactly-once payment processing for SQS-driven Rust Lambdas
//!
//! SQS delivers at least once; this crate makes the *effect* of a payment message exactly
//! once: claim the payment in an idempotency table with one conditional write, charge the
//! provider with `Idempotency-Key: <payment_id>`, complete the record only while still holding
//! the lease, and dead-letter what cannot be processed with a reason. See `docs/design.md`.
//!
//! ## Layout
//!
//! - Domain (no AWS, no Lambda): [`domain`] (the validated payment request), [`currency`],
//!   [`idempotency`] (record, store port, conflict decisions), [`provider`] (provider port).
//! - Use cases: [`processor`] (one message and the batch around it), [`redelivery`] (delays and
//!   the receive budget), [`api`] (accepting payments with an `Idempotency-Key`), [`outbox`]
//!   (relaying accepted payments to the queue).
//! - Adapters: [`dynamo`] (idempotency table), [`payments_table`] (payments and outbox),
//!   [`queue`] (SQS), [`stripe`] (provider HTTP),
//!   [`memory`] (an in-memory store with the same conditions, for tests).
//! - Edges: [`config`] (environment), [`bootstrap`] (wiring), [`telemetry`] (logs, metrics).

pub mod api;
pub mod bootstrap;
pub mod clock;
pub mod config;
pub mod currency;
pub mod domain;
pub mod dynamo;
pub mod idempotency;
pub mod memory;
pub mod outbox;
pub mod payments_table;
pub mod processor;
pub mod provider;
pub mod queue;
pub mod redelivery;
pub mod stripe;
pub mod telemetry;

pub use processor::{BatchSummary, Disposition, Processor, Settings};

/// A named crash point (`FAILPOINTS=after_charge=return` makes the process abort there, as a
/// crash would). Compiled to nothing unless the `failpoints` feature is on and the build has
/// debug assertions: the Lambda's release build never has it.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(all(feature = "failpoints", debug_assertions))]
        ::fail::fail_point!($name, |_| { ::std::process::abort() });
    };
}
