//! # payment-core: exactly-once payments on top of `sqs-once`
//!
//! SQS delivers at least once; [`sqs_once`] makes the *effect* of a message exactly once for
//! any [`sqs_once::Work`]. This crate is the payment side: the validated payment request, a
//! Stripe-wire provider client, the payment as a `Work` (claim the `payment_id`, charge with
//! `Idempotency-Key: <payment_id>`, store what the provider said), refunds of those payments,
//! the payments API with its outbox, and the environment contract of the functions. See
//! `docs/design.md`.
//!
//! ## Layout
//!
//! - Domain (no AWS, no Lambda): [`domain`] (the validated payment request), [`currency`],
//!   [`provider`] (provider port), [`stripe_limits`] (what Stripe accepts, with its sources).
//! - Works: [`charge`] (payments), [`refund`] (refunds of charged payments),
//!   [`event_inbox`] (the provider's events, by event id; rules in [`provider_event`]).
//! - The catch-up of missed events: [`event_catch_up`], its place in [`event_checkpoint`];
//!   the provider-events queue both feed: [`event_queue`].
//! - Use cases: [`api`] (accepting payments with an `Idempotency-Key`), [`outbox`]
//!   (relaying accepted payments to the queue).
//! - Adapters: [`stripe`] (provider HTTP), [`payments_table`] (payments and outbox),
//!   [`refund_ledger`] (the refunded total on a payment's record), [`settlement`] (what the
//!   provider's events change on the records), [`stripe_webhook`] (event signatures).
//! - Edges: [`config`] (environment), [`bootstrap`] (wiring), [`telemetry`] (logs, metrics).

pub mod api;
pub mod bootstrap;
pub mod charge;
pub mod config;
pub mod currency;
pub mod domain;
pub mod event_catch_up;
pub mod event_checkpoint;
pub mod event_inbox;
pub mod event_queue;
pub mod event_receiver;
pub mod outbox;
pub mod payments_table;
pub mod provider;
pub mod provider_event;
pub mod refund;
pub mod refund_ledger;
pub mod refund_view;
pub mod settlement;
pub mod stripe;
pub mod stripe_limits;
pub mod stripe_objects;
pub mod stripe_refund;
pub mod stripe_webhook;
pub mod telemetry;

pub use charge::{PaymentOutcome, PaymentWork, Processor};
pub use sqs_once::{BatchSummary, Disposition, Settings};

/// Where the payment processor's records live in the idempotency table: `payment#<id>`, and
/// its dead-letter marks at `dead_letter#<id>`.
pub fn payment_keys() -> sqs_once::KeyLayout {
    sqs_once::KeyLayout {
        attribute: "pk".to_owned(),
        record_prefix: "payment#".to_owned(),
        mark_prefix: "dead_letter#".to_owned(),
    }
}

/// Where refund records live in the idempotency table: `refund#<id>`, dead-letter marks at
/// `refund_dead_letter#<id>` (beside [`payment_keys`]: the refund ledger fences its writes by a
/// refund's record, so both works' layouts sit below both).
pub fn refund_keys() -> sqs_once::KeyLayout {
    sqs_once::KeyLayout::named("refund")
}

/// The refund processor's records in the idempotency table `table`.
pub fn refund_store(client: aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(client, table, refund_keys())
}

/// Where the events inbox's records live in the idempotency table: `event#<evt_id>`, marks at
/// `event_dead_letter#<evt_id>`.
pub fn event_keys() -> sqs_once::KeyLayout {
    sqs_once::KeyLayout::named("event")
}

/// The events inbox's records in the idempotency table `table`.
pub fn event_store(client: aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(client, table, event_keys())
}

/// The payment processor's records in the idempotency table `table`.
pub fn payment_store(client: aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(client, table, payment_keys())
}

/// A named crash point of payment code (`api_after_write`, `relay_after_send`); see
/// `sqs_once`'s own for the runner's (`after_claim`, `after_execute`, ...).
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(all(feature = "failpoints", debug_assertions))]
        ::fail::fail_point!($name, |_| { ::std::process::abort() });
    };
}
