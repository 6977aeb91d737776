//! Charging a payment: the payment as a [`sqs_once::Work`] ([`charge`]: claim the
//! `payment_id`, charge with it as the `Idempotency-Key`, store the outcome), where its records
//! live in the idempotency table, and the outbox relay that moves payments the API accepted onto
//! the queue ([`outbox`]).
//!
//! May use: domain, provider.

pub mod charge;
pub mod outbox;

/// Where the payment processor's records live in the idempotency table: `payment#<id>`, and
/// its dead-letter marks at `dead_letter#<id>`.
pub fn payment_keys() -> sqs_once::KeyLayout {
    sqs_once::KeyLayout {
        attribute: "pk".to_owned(),
        record_prefix: "payment#".to_owned(),
        mark_prefix: "dead_letter#".to_owned(),
    }
}

/// The payment processor's records in the idempotency table `table`.
pub fn payment_store(client: aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(client, table, payment_keys())
}
