//! Applying what the provider finishes later, once per event, in any order: the inbox
//! ([`inbox`], a [`sqs_once::Work`] keyed by the event id, and what it keeps of what it read:
//! [`known`]), what an event settles on the
//! payment's and the refund's records ([`settlement`]), the provider-events queue that the
//! receiver and the catch-up feed ([`queue`]), and the catch-up of missed events with its place
//! ([`catch_up`], [`checkpoint`], the list it reads: [`listing`]). The ports the provider's adapter implements for it
//! ([`inbox::ProviderObjects`], [`listing::EventLister`]) are declared here, by their user.
//!
//! May use: domain (a card number an event's payload quotes is masked), provider, payments,
//! refunds (a settled refund gives its amount back through the refund ledger), telemetry (the
//! catch-up's metric line).

pub mod catch_up;
pub mod checkpoint;
pub mod inbox;
pub mod known;
pub mod listing;
pub mod queue;
pub mod settlement;

/// Where the events inbox's records live in the idempotency table: `event#<evt_id>`, marks at
/// `event_dead_letter#<evt_id>`.
pub fn event_keys() -> sqs_once::KeyLayout {
    sqs_once::KeyLayout::named("event")
}

/// The events inbox's records in the idempotency table `table`.
pub fn event_store(client: aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(client, table, event_keys())
}
