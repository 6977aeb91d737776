//! The dead letters' `error_code`s as a redrive reads them: every code a dead letter carries,
//! and those never redriven without `--force` (their messages can only be dead-lettered again).

/// Every `error_code` a dead letter can carry (`max_receives`: SQS moved it, without one).
pub const KNOWN_CODES: [&str; 16] = [
    "invalid_json",
    "contract_unsupported",
    "invalid_event",
    "invalid_payment",
    "invalid_refund",
    "payment_unknown",
    "payment_not_refundable",
    "refund_exceeds_charge",
    "refund_limit_reached",
    "refund_failed",
    "idempotency_key_reused",
    "provider_rejected",
    "request_expired",
    "outcome_unknown",
    "retries_exhausted",
    "max_receives",
];

/// Codes a redrive skips unless forced, and why: their messages can only be dead-lettered
/// again (or, for a reused key, never belong to the payment their id names).
pub const NEVER_REDRIVEN: [(&str, &str); 12] = [
    ("invalid_event", "the body is not a provider event and can never be applied"),
    ("invalid_refund", "the body can never be processed; the producer sends a corrected refund"),
    ("payment_unknown", "the refund's record holds that its payment was known nowhere when it came (never accepted, or its record expired past the refund window); once a payment is charged, send the refund under a new refund_id"),
    ("payment_not_refundable", "the refund's record holds that its payment was not charged; a redrive is dead-lettered again"),
    ("refund_exceeds_charge", "the refund's record holds that nothing was left to refund; send a new refund_id for a smaller amount"),
    ("refund_limit_reached", "the refund's record holds that its payment took no more refunds (200 made, or 4 held while it settles); send a new refund_id once the payment has settled, or refund the rest by hand"),
    ("refund_failed", "the provider created the refund as failed; the refund's record holds it, a redrive is dead-lettered again"),
    ("invalid_json", "the body can never be processed; the producer sends a corrected payment"),
    ("invalid_payment", "the body can never be processed (card numbers in it are masked); the producer sends a corrected payment"),
    ("idempotency_key_reused", "its payment_id names another payment; this body is never charged under it"),
    ("provider_rejected", "the payment's record holds the provider's final refusal; a redrive is dead-lettered again"),
    ("request_expired", "it is older than the record retention and is refused again; charge it by hand if still wanted"),
];

/// Why a code is never redriven, if it is one of those.
pub fn never_redriven(code: &str) -> Option<&'static str> {
    NEVER_REDRIVEN
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, why)| *why)
}

/// Checks a redrive's filter before anything moves: an unknown code, or a code that is never
/// redriven without `force`, is an error that says so.
pub fn check_filter(error_code: Option<&str>, force: bool) -> anyhow::Result<()> {
    let Some(code) = error_code else {
        return Ok(());
    };
    if !KNOWN_CODES.contains(&code) {
        anyhow::bail!(
            "unknown error code {code:?}: dead letters carry one of {}",
            KNOWN_CODES.join(", ")
        );
    }
    if let (Some(why), false) = (never_redriven(code), force) {
        anyhow::bail!("{code} is never redriven: {why}. Add --force to move these messages anyway");
    }
    Ok(())
}
