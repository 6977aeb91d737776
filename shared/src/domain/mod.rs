//! The payment as the queue carries it, and what the provider accepts of it: the validated
//! request ([`PaymentRequest`], its ids and its errors), the currencies, and Stripe's published
//! limits with their sources. Pure: no AWS, no Lambda, no I/O.
//!
//! May use: nothing else (every other folder stands on this one).

pub mod contract;
pub mod currency;
pub mod limits;
mod request;
pub mod text;

pub use request::*;
