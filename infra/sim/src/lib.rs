//! The whole system on a simulated clock (issue: "The whole system on a simulated clock").
//!
//! The project's real code (the `sqs-once` runner, the payment, refund and inbox `Work`s, the
//! DynamoDB and SQS adapters and their condition and update expressions) runs against models of
//! the services it depends on, in one thread, on tokio's paused clock: one seed gives one run,
//! byte for byte, and a month of traffic passes in seconds.
//!
//! # Layout
//!
//! - [`dynamo`]: DynamoDB (tables, expressions, transactions, queries, time to live, streams).
//! - [`sqs`]: SQS (standard and FIFO queues, visibility, redrive, retention, duplicates).
//! - [`eventbridge`]: EventBridge's partner bus, its rule and the rule's target.
//! - [`wire`]: the AWS SDK's transport seam, answering the official clients from the models.
//! - [`provider`]: Stripe behind the project's provider port, and its books.
//! - [`world`]: one run: the stack, the processes, the producers, the invariants.
//! - [`cost`]: what the models visit per request (the scaling test reads it).
//!
//! Why its own crate: it links the SDK's transport internals and tokio's `test-util` (paused
//! time), which no shipped function and not the proving ground's live runs should carry.

pub mod cost;
pub mod dynamo;
pub mod eventbridge;
pub mod provider;
pub mod sqs;
pub mod wire;
pub mod world;

/// FNV-1a, 64 bits: what a run draws from its seed and a name rather than from its order of
/// events (an item's deletion by time to live, whether a charge is disputed).
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
