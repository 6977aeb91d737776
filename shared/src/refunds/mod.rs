//! Refunding charged payments: the refund as a second [`sqs_once::Work`] ([`work`]), and the
//! ledger on the payment's own record that keeps refunds from adding up to more than the charge
//! however many run at once ([`ledger`]).
//!
//! May use: domain, provider, telemetry (the held refunds' sweep writes its EMF line), payments
//! (a refund reads the charge's stored outcome and fences its writes by the payment's record).

pub mod held;
pub mod ledger;
pub mod queue;
pub mod request;
pub mod work;

/// Mutations of the refunds that the whole-system simulator puts back
/// (`sqs_once::mutation::put_back_from`) to show that it finds them; in a build without
/// `sqs-once`'s `sim-mutations` feature they are never on.
pub const MUTATIONS: &[(&str, &str)] = &[
    (
        "early_refund_not_held",
        "a refund of a payment still settling at the provider is handed back until its retry horizon and then dead-lettered retries_exhausted, as before held refunds",
    ),
    (
        "inherited_unknown_skips_refund_lookup",
        "an attempt that inherits an unknown outcome skips the lookup of a reservation older than its claim, leaving it to the runner, whose key horizon starts at the record's first attempt (issue 65: a refund made twice after its record expired)",
    ),
    (
        "expired_payment_record_waited_for",
        "a refund of a payment the API accepted whose record has expired waits for a record that never comes, until its retries are spent, and is dead-lettered retries_exhausted again after each redrive",
    ),
    (
        "held_refunds_never_resumed",
        "a held refund is never resumed once its payment settles: its record stays completed held, its amount reserved, the customer never refunded",
    ),
    (
        "held_refund_canceled_on_decline",
        "a payment declined counts as settled for its held refunds: they are resumed and canceled, their amounts given back, and never made when the customer pays the same PaymentIntent after all (issue 65, bug 3)",
    ),
    (
        "refund_with_no_payment_record_not_searched",
        "a refund whose payment has no record is not looked up at the provider: a merchant's resend of a refund made before the records expired is dead-lettered payment_unknown, asking a person to refund by hand what was refunded (issue 65)",
    ),
    (
        "unknown_refund_of_a_gone_payment_waits",
        "an attempt that inherits an unknown outcome, of a refund whose payment has no record, waits for a lookup that can never be made, although no attempt of its record can have reserved (a reservation keeps the payment's record the refund window): dead-lettered retries_exhausted after each redrive",
    ),
];

/// Where refund records live in the idempotency table: `refund#<id>`, dead-letter marks at
/// `refund_dead_letter#<id>` (the same table as [`crate::payments::payment_keys`]'s; the
/// refund ledger writes on both records, so it stands on this floor, above payments).
pub fn refund_keys() -> sqs_once::KeyLayout {
    sqs_once::KeyLayout::named("refund")
}

/// The refund processor's records in the idempotency table `table`.
pub fn refund_store(client: aws_sdk_dynamodb::Client, table: &str) -> sqs_once::DynamoStore {
    sqs_once::DynamoStore::new(client, table, refund_keys())
}
