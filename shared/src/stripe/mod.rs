//! The Stripe adapter: the wire client of the provider port ([`StripeClient`]: payments,
//! refunds, the objects and the event list, each request with `Stripe-Version` and an
//! `Idempotency-Key`), Stripe's webhook signature scheme ([`webhook`]), and the webhook route
//! that verifies a delivery and queues it ([`receiver`]). Every request to Stripe, every form
//! body and every signature check is here; the works only know the port (and the event's
//! published shape, which `provider::event` reads).
//!
//! May use: domain, provider, events (it implements the ports the inbox and the catch-up
//! declare, and the receiver queues onto the events' queue), telemetry.

mod client;
pub mod endpoints;
pub mod objects;
pub mod permissions;
pub mod receiver;
pub mod refund;
pub mod webhook;

pub use client::*;
