//! Accepting payments and showing where they stand: the payments API with Stripe's
//! idempotency semantics ([`PaymentsApi`], HTTP-agnostic), its DynamoDB store (the payments
//! table, each row its own outbox entry: [`table`]), and a payment after its charge as people
//! read it, with its refunds, disputes and events ([`view`], also `payctl status`'s).
//!
//! May use: domain, payments, refunds, events (the view reads what the refund ledger and the
//! settlements wrote on the payment's record), telemetry (the request's span).

mod service;
pub mod table;
pub mod view;

pub use service::*;
