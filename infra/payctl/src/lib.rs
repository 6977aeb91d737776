//! # payctl: the operator's library
//!
//! What the `payctl` binary does, as functions the proving ground and the tests call too:
//!
//! - [`template`]: provisioning a local endpoint from `template.yaml` itself, and the stack it
//!   describes (queues, tables, each function's environment and event source);
//! - [`aws`]: where the SDK's calls go, and one-line errors that name the resource and the fix;
//! - [`send`]: putting messages on a queue; [`run`]: what `payctl run` prints while it works;
//! - [`status`], [`records`], [`refunds`]: a payment's record, dead letter and refunds, and
//!   every record of a table;
//! - [`dlq`]: listing, showing and redriving dead letters home;
//! - [`health`]: whether the system keeps up, in one view (`payctl health`);
//! - [`reconcile`]: settling unknown or stuck payments from the provider's records;
//! - [`relay`], [`republish`]: the outbox relay on a local stream mapping, and what it gave up on;
//! - [`api`], [`client`]: the payments API served locally, and its SigV4-signing client;
//! - [`conformance`]: whether an endpoint keeps what the protocol relies on;
//! - [`smoke`]: a provider account checked with the processors' own client;
//! - [`stop`]: how the long-running commands are stopped (a signal to finish, a second to stop);
//! - [`time`]: times as operators read them.
//!
//! It depends on [`lambda_local`] for the local event-source and stream mappings; never on the
//! proving ground.
//!
//! Why flat (20 files with `main.rs`): each file is the engine of one operator task, read as
//! the list above reads, with its arguments and `--help` text in `commands/`; the multi-file
//! ones (`template`, `conformance`) have folders, and the few uses between these files go one
//! way (the layout check's module rule holds them to it).

/// `eprintln!`, but the line (with its newline) reaches stderr in one write: stderr is not
/// buffered, so `eprintln!` writes each piece of its format on its own, and two processes that
/// share a terminal or a log (the API and the relay of the quick start, stopped together) cut
/// into each other's lines. One write to a pipe of at most `PIPE_BUF` bytes (4 KiB on Linux) is
/// never cut.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }};
}

pub mod api;
pub mod aws;
pub mod client;
pub mod conformance;
pub mod connect;
pub mod dead_letter_codes;
pub mod deployed;
pub mod dlq;
pub mod health;
pub mod preflight;
pub mod reconcile;
pub mod reconcile_refund;
pub mod records;
pub mod refunds;
pub mod relay;
pub mod republish;
pub mod run;
pub mod send;
pub mod smoke;
pub mod status;
pub mod stop;
pub mod template;
pub mod time;
