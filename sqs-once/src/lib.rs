#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
//!
//! ## Layout
//!
//! - What you write: [`work`] (the [`Work`] trait and the answers it gives), with
//!   [`fingerprint`] for its canonical request digest.
//! - The protocol: [`record`] (the idempotency record, the store port, conflict decisions),
//!   [`redelivery`] (delays and the receive budget), [`settings`].
//! - The runner: [`runner`] (the batch), one message's claim and completion and its calls
//!   with the heartbeat (private modules `attempt` and `call`), the claim's measured
//!   allowance (`claim_times`), [`lambda`] (the handler).
//! - Adapters: [`dynamo`] (the record store on DynamoDB), [`queue`] (SQS), [`memory`] (an
//!   in-memory store with the same conditions, for tests), [`clock`].
//! - Edges: [`metrics`] (CloudWatch EMF), [`pace`] (the downstream's request rate),
//!   [`trace`] (trace context on messages, the spans' attributes).
//!
//! Why flat (18 files): the crate is one capability, a message's effect once, and each file is
//! one of its public modules, the path its users import (`sqs_once::pace::Pace`); the floors
//! above are kept by the layout check's module rule (no circle) instead of by folders.
//!
//! ## Failure behaviour, in one place
//!
//! Nothing here panics on bad input or a failing dependency. A body [`Work::parse`] refuses
//! is dead-lettered with its code; a store or queue error hands the message back with a delay
//! (the batch response lists it); a panic inside one message's work hands that message back;
//! a lost lease stops the work and completes nothing; a message that cannot be explained
//! after its receive budget is dead-lettered as `retries_exhausted` with the last error.

mod attempt;
mod call;
mod claim_times;
pub mod clock;
pub mod dynamo;
pub mod fingerprint;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod memory;
pub mod metrics;
pub mod mutation;
pub mod pace;
pub mod queue;
pub mod record;
pub mod redelivery;
pub mod runner;
pub mod settings;
pub mod token;
pub mod trace;
pub mod work;

pub use attempt::SENDER_ID;
pub use dynamo::{DynamoStore, KeyLayout};
pub use fingerprint::Fingerprint;
pub use queue::{QueueOps, SqsQueues};
pub use record::{IdempotencyStore, Outcome, Value};
pub use runner::{BatchRunner, BatchSummary, Disposition};
pub use settings::Settings;
pub use work::{AttemptContext, CallError, Redaction, Rejection, Verdict, Work};

/// A named crash point (`FAILPOINTS=after_execute=return` makes the process abort there, as a
/// crash would): `after_claim`, `after_execute`, `after_complete`, `in_heartbeat`. Compiled to
/// nothing unless the `failpoints` feature is on and the build has debug assertions: a release
/// build never has it.
#[macro_export]
#[doc(hidden)]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(all(feature = "failpoints", debug_assertions))]
        ::fail::fail_point!($name, |_| { ::std::process::abort() });
    };
}
