//! # proving: the project's proving ground
//!
//! What the project runs to prove itself, on one machine against any endpoint the SDK reaches
//! (`AWS_ENDPOINT_URL`), with the stack provisioned from `template.yaml` by
//! [`payctl::template`] and the functions run by [`lambda_local`]:
//!
//! - [`demo`]: the local end-to-end run (`make demo`); [`e2e`]: the same load and checks
//!   against a deployed stack (`make e2e-sam`);
//! - [`chaos`]: processor processes crashing at failpoints against a faulty provider and,
//!   through [`aws_faults`], a faulty AWS (`make chaos`);
//! - [`bench`](mod@bench): the benchmark (`make bench`), with [`compare`] (the Powertools peer),
//!   [`prices`], `bench::retries` (how long a failure delays a payment) and [`wire_count`] (AWS
//!   calls counted on the wire);
//! - the loads and checkers they share: [`load`] and [`api_load`] generate payments with known
//!   outcomes, [`check`] and [`refund_check`] verify a run from the outside (the provider's
//!   ledger through [`sim`], the table, the dead-letter queues); [`events_check`] settles a
//!   scenario through the provider's events;
//! - [`otlp`]: the local OTLP receiver the runs and the tests export their traces to;
//! - [`partner`]: Stripe's side of its EventBridge destination, for local runs;
//! - [`webhook`]: the public events route under forged requests (its costs in the benchmark,
//!   a flood in `make test` and `make chaos`).
//!
//! Nothing here ships to users, and the operator's `payctl` never depends on it.
//!
//! Why flat (17 files with `main.rs`): each file is one load or one outside check that the
//! runs above combine, named as the list names them; the multi-file runs (`chaos`, `compare`,
//! `bench`) have folders.

pub mod api_load;
pub mod aws_faults;
pub mod bench;
pub mod chaos;
pub mod check;
pub mod compare;
pub mod demo;
pub mod e2e;
pub mod events_check;
pub mod functions;
pub mod load;
pub mod otlp;
pub mod partner;
pub mod prices;
pub mod refund_check;
pub mod sim;
pub mod webhook;
pub mod wire_count;
