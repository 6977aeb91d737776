//! The provider port: what the works ask of a payment provider (charge, find, refund, with
//! the answers split into definitive ones and retryable errors), and the provider's events as
//! the inbox reads them (Stripe's published event shape), with the rules that decide what an
//! event changes. No HTTP, no signatures, no form bodies: the Stripe adapter
//! ([`crate::stripe`]) implements this port and is never named by it.
//!
//! May use: domain.

pub mod event;
mod port;

pub use port::*;
