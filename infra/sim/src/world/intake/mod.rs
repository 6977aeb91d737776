//! How payments come in: producers sending straight to the queue (`sender`), and clients of
//! the payments API (`api`) whose accepted payments the outbox relay sends on (`relay`, with
//! Lambda's stream mapping), mixed by the producer (`producer`).

pub(super) mod api;
pub(super) mod producer;
pub(super) mod relay;
pub(super) mod sender;
pub(super) mod shopper;
