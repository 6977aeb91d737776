//! What Stripe accepts in a PaymentIntent, in one table: the processor refuses anything
//! outside it before a call is made (`invalid_payment` on the queue, `parameter_invalid` at the
//! API), so a request that Stripe would refuse never reaches it.
//!
//! Sources, read on [`CHECKED_ON`] for API version [`crate::stripe::DEFAULT_API_VERSION`]:
//! - amounts: <https://docs.stripe.com/currencies> ("Minimum and maximum charge amounts",
//!   "Zero-decimal currencies", "Three-decimal currencies");
//! - metadata: <https://docs.stripe.com/api/metadata> (50 keys, keys up to 40 characters,
//!   values up to 500 characters, no square brackets in keys; an empty value *unsets* a key
//!   instead of storing it);
//! - description: the PaymentIntent's `description` is at most 1000 characters.
//!
//! Stripe's minimum is stated per *settlement* currency; for a charge in another currency it is
//! the equivalent of the account's settlement minimum at the day's rate, which no fixed table
//! can know. The processor enforces the stated minimum where the table has the currency and one
//! minor unit (ten for a three-decimal currency) elsewhere; Stripe may still answer
//! `amount_too_small` for such a charge (dead-lettered as `provider_rejected`).

/// When the table was last compared with Stripe's documentation.
pub const CHECKED_ON: &str = "2026-12-01";

/// The largest amount of any currency: "The amount value supports up to eight digits".
pub const MAX_AMOUNT: i64 = 99_999_999;

/// Stripe's metadata limit: keys per object (the processor's `payment_id` is one of them).
pub const MAX_METADATA_KEYS: usize = 50;
/// Longest metadata key, in characters.
pub const MAX_METADATA_KEY_LEN: usize = 40;
/// Longest metadata value, in characters.
pub const MAX_METADATA_VALUE_LEN: usize = 500;
/// Longest description, in characters.
pub const MAX_DESCRIPTION_LEN: usize = 1_000;

/// Currencies whose amount is in whole units (`500` is ¥500).
pub const ZERO_DECIMAL: [&str; 16] = [
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
];

/// Currencies with three decimals: Stripe requires the last digit of the amount to be `0`.
pub const THREE_DECIMAL: [&str; 5] = ["bhd", "jod", "kwd", "omr", "tnd"];

/// Stripe's minimum charge per settlement currency, in minor units, sorted by code.
pub const MINIMUMS: [(&str, i64); 24] = [
    ("aed", 200),
    ("aud", 50),
    ("bgn", 100),
    ("brl", 50),
    ("cad", 50),
    ("chf", 50),
    ("czk", 1_500),
    ("dkk", 250),
    ("eur", 50),
    ("gbp", 30),
    ("hkd", 400),
    ("huf", 17_500),
    ("inr", 50),
    ("jpy", 50),
    ("mxn", 1_000),
    ("myr", 200),
    ("nok", 300),
    ("nzd", 50),
    ("pln", 200),
    ("ron", 200),
    ("sek", 300),
    ("sgd", 50),
    ("thb", 1_000),
    ("usd", 50),
];

/// How many decimals a currency's minor unit has (lowercase code).
pub fn decimals(currency: &str) -> u32 {
    if ZERO_DECIMAL.contains(&currency) {
        0
    } else if THREE_DECIMAL.contains(&currency) {
        3
    } else {
        2
    }
}

/// The smallest amount of `currency` the processor sends, in minor units.
pub fn minimum(currency: &str) -> i64 {
    match MINIMUMS.binary_search_by(|(c, _)| c.cmp(&currency)) {
        Ok(i) => MINIMUMS[i].1,
        Err(_) if decimals(currency) == 3 => 10,
        Err(_) => 1,
    }
}

/// An amount in major units for a message (`0.50 usd`, `50 jpy`).
pub fn display(amount: i64, currency: &str) -> String {
    let d = decimals(currency);
    if d == 0 {
        return format!("{amount} {currency}");
    }
    let unit = 10i64.pow(d);
    format!(
        "{}.{:0width$} {currency}",
        amount / unit,
        amount % unit,
        width = d as usize
    )
}

/// Checks a charge's or a refund's amount against Stripe's rules for its currency, naming the
/// limit it breaks.
pub fn check_amount(amount: i64, currency: &str) -> Result<(), String> {
    let min = minimum(currency);
    if amount < min {
        return Err(format!(
            "amount must be at least {min} minor units of {currency} ({}, Stripe's minimum charge), got {amount}",
            display(min, currency)
        ));
    }
    if amount > MAX_AMOUNT {
        return Err(format!(
            "amount must be at most {MAX_AMOUNT} minor units (Stripe's eight digits), got {amount}"
        ));
    }
    if decimals(currency) == 3 && amount % 10 != 0 {
        return Err(format!(
            "amount of the three-decimal currency {currency} must end in 0 (Stripe rounds to the nearest ten), got {amount}"
        ));
    }
    Ok(())
}

/// Checks a refund's amount for its currency: Stripe sets no minimum on a refund, but a
/// three-decimal currency's amount must end in 0 there too.
pub fn check_refund_amount(amount: i64, currency: &str) -> Result<(), String> {
    if decimals(currency) == 3 && amount % 10 != 0 {
        return Err(format!(
            "a refund of the three-decimal currency {currency} must end in 0 (Stripe rounds to the nearest ten), got {amount}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_table_is_sorted_and_every_code_is_known() {
        assert!(MINIMUMS.windows(2).all(|w| w[0].0 < w[1].0));
        for (c, _) in MINIMUMS {
            assert!(crate::domain::currency::is_known_currency(c), "{c}");
        }
        for c in ZERO_DECIMAL.iter().chain(THREE_DECIMAL.iter()) {
            assert!(crate::domain::currency::is_known_currency(c), "{c}");
        }
    }

    #[test]
    fn minimums_per_currency_and_decimals() {
        assert!(check_amount(49, "usd").unwrap_err().contains("0.50 usd"));
        assert!(check_amount(50, "usd").is_ok());
        assert!(check_amount(29, "gbp").is_err());
        assert!(check_amount(30, "gbp").is_ok());
        assert!(check_amount(49, "jpy").unwrap_err().contains("50 jpy"));
        assert!(check_amount(50, "jpy").is_ok());
        assert!(
            check_amount(1, "krw").is_ok(),
            "no stated minimum: one unit"
        );
        assert!(check_amount(0, "krw").is_err());
        assert!(check_amount(1_005, "kwd").unwrap_err().contains("end in 0"));
        assert!(check_amount(1_000, "kwd").is_ok());
        assert!(check_amount(5, "bhd").is_err());
        assert!(check_amount(MAX_AMOUNT, "usd").is_ok());
        assert!(check_amount(MAX_AMOUNT + 1, "usd").is_err());
        assert!(
            check_refund_amount(5, "usd").is_ok(),
            "no minimum on a refund"
        );
        assert!(check_refund_amount(15, "kwd").is_err());
        assert_eq!(display(1_234, "kwd"), "1.234 kwd");
        assert_eq!(display(17_500, "huf"), "175.00 huf");
    }
}
