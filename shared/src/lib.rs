//! # payment-core: exactly-once payments on top of `sqs-once`
//!
//! SQS delivers at least once; [`sqs_once`] makes the *effect* of a message exactly once for
//! any [`sqs_once::Work`]. This crate is the payment side: the validated payment request, a
//! Stripe-wire provider client, the payment as a `Work` (claim the `payment_id`, charge with
//! `Idempotency-Key: <payment_id>`, store what the provider said), refunds of those payments,
//! the provider's events applied once each, the payments API with its outbox, and the
//! environment contract of the functions. See `docs/design.md`, "Where things live".
//!
//! ## Map: one folder per thing the product does, each using only folders above it here
//!
//! - [`domain`]: the payment request, its currencies and Stripe's published limits (pure).
//! - [`provider`]: the provider port (charge, find, refund) and its events' rules; no wire.
//! - [`telemetry`]: JSON logs, EMF metrics and traces (a floor that logs says so).
//! - [`payments`]: the charge as a `Work`, where its records live, the outbox relay.
//! - [`refunds`]: the refund as a `Work` and the refund ledger on the payment's record.
//! - [`events`]: the inbox, settlements, the provider-events queue and the catch-up.
//! - [`api`]: the payments API, its table, and a payment's view after the charge.
//! - [`stripe`]: the Stripe adapter (wire client, objects, refunds, webhook signatures and route).
//! - [`edges`]: the functions' configuration and wiring (the top floor).
//!
//! `infra/layout/check_layout.py` holds the tree to it: each room's root file (a folder's
//! `mod.rs`) names the rooms it may use, and no two rooms use each other,
//! directly or around a loop. Unit tests aside: a test may build its fixture from a floor above.

pub mod api;
pub mod domain;
pub mod edges;
pub mod events;
pub mod payments;
pub mod provider;
pub mod refunds;
pub mod stripe;
pub mod telemetry;

pub use events::{event_keys, event_store};
pub use payments::charge::{PaymentOutcome, PaymentWork, Processor};
pub use payments::{payment_keys, payment_store};
pub use refunds::{refund_keys, refund_store};
pub use sqs_once::{BatchSummary, Disposition, Settings};

/// A named crash point of payment code (`api_after_write`, `relay_after_send`); see
/// `sqs_once`'s own for the runner's (`after_claim`, `after_execute`, ...).
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(all(feature = "failpoints", debug_assertions))]
        ::fail::fail_point!($name, |_| { ::std::process::abort() });
    };
}

/// [`failpoint!`] in async code, to be awaited: `return(MS)` pauses the task MS milliseconds
/// without holding its thread (`sleep(MS)` blocks the worker, and with it the runtime's I/O
/// and signal driver when that worker holds it: a Ctrl-C sent meanwhile is seen only after the
/// pause); `return` aborts the process; every other action is `fail`'s.
#[macro_export]
macro_rules! failpoint_async {
    ($name:literal) => {
        #[cfg(all(feature = "failpoints", debug_assertions))]
        if let Some(pause) = ::fail::eval($name, |arg| arg.and_then(|ms| ms.parse::<u64>().ok())) {
            match pause {
                Some(ms) => ::tokio::time::sleep(::std::time::Duration::from_millis(ms)).await,
                None => ::std::process::abort(),
            }
        }
    };
}
