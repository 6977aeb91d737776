//! # payment-infra: the local stack and operations
//!
//! Runs the deployed shape on one machine: [`template`] creates the queues and the table from
//! `template.yaml` on any endpoint the SDK reaches (`AWS_ENDPOINT_URL`), [`esm`] polls the queue
//! like Lambda's SQS trigger and runs the real handler, [`sim`] talks to the provider
//! simulator, [`load`] generates payments with known outcomes, [`check`] verifies a run from the
//! outside, and [`demo`] ties them together. The `payctl` binary is the CLI over all of it.

pub mod api_load;
pub mod aws_faults;
pub mod bench;
pub mod chaos;
pub mod check;
pub mod client;
pub mod compare;
pub mod conformance;
pub mod demo;
pub mod dlq;
pub mod e2e;
pub mod esm;
pub mod load;
pub mod local_api;
pub mod operate;
pub mod prices;
pub mod reconcile;
pub mod refund_check;
pub mod republish;
pub mod retries;
pub mod runtime_api;
pub mod sim;
pub mod smoke;
pub mod status;
pub mod stream;
pub mod template;
pub mod wire_count;
