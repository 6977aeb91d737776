//! What Stripe accepts in a PaymentIntent, in one table: the processor refuses anything
//! outside it before a call is made (`invalid_payment` on the queue, `parameter_invalid` at the
//! API), so a request that Stripe would refuse for its amount never reaches it.
//!
//! The currency rules are kept once, in `shared/data/stripe-currencies.json` (read by the
//! provider simulator and the contract check too); this file's tables are held equal to it by
//! a test. Sources, read on [`CHECKED_ON`] for API version
//! [`crate::stripe::DEFAULT_API_VERSION`]:
//! - amounts: <https://docs.stripe.com/currencies> ("Minimum and maximum charge amounts",
//!   "Zero-decimal currencies", "Three-decimal currencies", "Special cases": ISK and UGX are
//!   charged in whole units, given with two decimals that are always `00`; HUF's and TWD's
//!   special cases are payouts', not charges'), and Stripe's notice on fractional ISK (refunds
//!   of ISK are held to the same rule);
//! - metadata: <https://docs.stripe.com/api/metadata> (50 keys, keys up to 40 characters,
//!   values up to 500 characters, no square brackets in keys; an empty value *unsets* a key
//!   instead of storing it);
//! - description: the PaymentIntent's `description` is at most 1000 characters.
//!
//! Stripe's minimum is stated per *settlement* currency; for a charge in another currency it is
//! the equivalent of the account's settlement minimum at the day's rate, which no fixed table
//! can know. The processor enforces the stated minimum where the table has the currency and one
//! whole unit of the API's minor units elsewhere (ten for a three-decimal currency, a hundred
//! for a whole-units one); Stripe may still answer `amount_too_small` for such a charge
//! (dead-lettered as `provider_rejected`). The maximum is eight digits but where Stripe states
//! more for a currency (IDR, COP, INR); a card network may set less (American Express: nine
//! digits), which Stripe answers as a refusal.

/// When the table was last compared with Stripe's documentation.
pub const CHECKED_ON: &str = "2026-12-07";

/// The largest amount of a currency without a maximum of its own: "8 digits for all other
/// currencies" ([`maximum`]).
pub const MAX_AMOUNT: i64 = 99_999_999;

/// Currencies with a larger maximum than [`MAX_AMOUNT`], sorted by code.
pub const MAXIMUMS: [(&str, i64); 3] = [
    ("cop", 9_999_999_999),
    ("idr", 999_999_999_999),
    ("inr", 999_999_999),
];

/// The largest amount of any currency (a refund's bound before its payment's currency is known).
pub const LARGEST_AMOUNT: i64 = 999_999_999_999;

/// Stripe's metadata limit: keys per object (the processor's `payment_id` is one of them).
pub const MAX_METADATA_KEYS: usize = 50;
/// Longest metadata key, in characters.
pub const MAX_METADATA_KEY_LEN: usize = 40;
/// Longest metadata value, in characters.
pub const MAX_METADATA_VALUE_LEN: usize = 500;
/// Longest description, in characters.
pub const MAX_DESCRIPTION_LEN: usize = 1_000;

/// Currencies whose amount is in whole units (`500` is ¥500).
pub const ZERO_DECIMAL: [&str; 15] = [
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "vnd", "vuv", "xaf",
    "xof", "xpf",
];

/// Stripe's special cases: charged in whole units, but given with two decimals that are always
/// `00` (`500` is 5 ISK): the amount must be a multiple of 100, of a charge and of a refund.
pub const WHOLE_UNITS: [&str; 2] = ["isk", "ugx"];

/// Currencies with three decimals: Stripe requires the last digit of the amount to be `0`.
pub const THREE_DECIMAL: [&str; 5] = ["bhd", "jod", "kwd", "omr", "tnd"];

/// Stripe's minimum charge per settlement currency, in minor units, sorted by code.
pub const MINIMUMS: [(&str, i64); 31] = [
    ("aed", 200),
    ("ars", 50),
    ("aud", 50),
    ("brl", 50),
    ("cad", 50),
    ("chf", 50),
    ("cop", 50),
    ("czk", 1_500),
    ("dkk", 250),
    ("eur", 50),
    ("gbp", 30),
    ("hkd", 400),
    ("huf", 17_500),
    ("idr", 50),
    ("ils", 50),
    ("inr", 50),
    ("jpy", 50),
    ("krw", 50),
    ("mxn", 1_000),
    ("myr", 200),
    ("nok", 300),
    ("nzd", 50),
    ("php", 50),
    ("pln", 200),
    ("ron", 200),
    ("rub", 50),
    ("sek", 300),
    ("sgd", 50),
    ("thb", 1_000),
    ("usd", 50),
    ("zar", 50),
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

/// The step an amount of `currency` moves by: 100 for a whole-units currency (ISK), 10 for a
/// three-decimal one, else 1.
pub fn step(currency: &str) -> i64 {
    if WHOLE_UNITS.contains(&currency) {
        100
    } else if decimals(currency) == 3 {
        10
    } else {
        1
    }
}

/// The smallest amount of `currency` the processor sends, in minor units.
pub fn minimum(currency: &str) -> i64 {
    match MINIMUMS.binary_search_by(|(c, _)| c.cmp(&currency)) {
        Ok(i) => MINIMUMS[i].1,
        Err(_) => step(currency),
    }
}

/// The largest amount of `currency` the processor sends, in minor units.
pub fn maximum(currency: &str) -> i64 {
    match MAXIMUMS.binary_search_by(|(c, _)| c.cmp(&currency)) {
        Ok(i) => MAXIMUMS[i].1,
        Err(_) => MAX_AMOUNT,
    }
}

/// Why `amount` is not a multiple of `currency`'s step ([`step`]), if it is not.
fn off_step(amount: i64, currency: &str, what: &str) -> Option<String> {
    match step(currency) {
        100 if amount % 100 != 0 => Some(format!(
            "{what} of {currency} is in whole units: Stripe takes it with two decimals that are always 00, so it must be a multiple of 100, got {amount}"
        )),
        10 if amount % 10 != 0 => Some(format!(
            "{what} of the three-decimal currency {currency} must end in 0 (Stripe rounds to the nearest ten), got {amount}"
        )),
        _ => None,
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
    let max = maximum(currency);
    if amount > max {
        return Err(format!(
            "amount must be at most {max} minor units of {currency} (Stripe's maximum), got {amount}"
        ));
    }
    match off_step(amount, currency, "an amount") {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Checks a refund's amount for its currency: Stripe sets no minimum on a refund, but a
/// three-decimal currency's amount must end in 0 there too, and a whole-units currency's be a
/// multiple of 100.
pub fn check_refund_amount(amount: i64, currency: &str) -> Result<(), String> {
    match off_step(amount, currency, "a refund") {
        Some(why) => Err(why),
        None => Ok(()),
    }
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
        assert!(MAXIMUMS.windows(2).all(|w| w[0].0 < w[1].0));
        for c in ZERO_DECIMAL
            .iter()
            .chain(THREE_DECIMAL.iter())
            .chain(WHOLE_UNITS.iter())
            .chain(MAXIMUMS.iter().map(|(c, _)| c))
        {
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
            check_amount(1, "vnd").is_ok(),
            "no stated minimum: one unit"
        );
        assert!(check_amount(0, "vnd").is_err());
        assert!(check_amount(1_005, "kwd").unwrap_err().contains("end in 0"));
        assert!(check_amount(50, "krw").is_ok() && check_amount(49, "krw").is_err());
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

    /// The stored list, `shared/data/stripe-currencies.json`.
    fn stored() -> serde_json::Value {
        serde_json::from_str(include_str!("../../data/stripe-currencies.json")).unwrap()
    }

    fn codes(v: &serde_json::Value) -> Vec<String> {
        let mut c: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        c.sort();
        c
    }

    fn table(v: &serde_json::Value) -> Vec<(String, i64)> {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(c, a)| (c.clone(), a.as_i64().unwrap()))
            .collect()
    }

    #[test]
    fn the_tables_are_the_stored_list() {
        let s = stored();
        let own = |t: &[&str]| t.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert_eq!(codes(&s["zero_decimal"]), own(&ZERO_DECIMAL));
        assert_eq!(codes(&s["three_decimal"]), own(&THREE_DECIMAL));
        assert_eq!(codes(&s["whole_units"]), own(&WHOLE_UNITS));
        let pairs = |t: &[(&str, i64)]| {
            t.iter()
                .map(|(c, a)| (c.to_string(), *a))
                .collect::<Vec<_>>()
        };
        assert_eq!(table(&s["minimums"]), pairs(&MINIMUMS));
        assert_eq!(table(&s["maximums"]), pairs(&MAXIMUMS));
        assert_eq!(s["maximum"].as_i64(), Some(MAX_AMOUNT));
        assert_eq!(s["checked_on"].as_str(), Some(CHECKED_ON));
        assert_eq!(MAXIMUMS.iter().map(|(_, m)| *m).max(), Some(LARGEST_AMOUNT));
    }

    #[test]
    fn every_rule_of_the_stored_list_is_held_at_intake() {
        let s = stored();
        // Each currency's minimum: refused one step under it, taken at it.
        for (c, min) in table(&s["minimums"]) {
            assert!(check_amount(min, &c).is_ok(), "{c} at its minimum {min}");
            assert!(
                check_amount(min - step(&c), &c).is_err(),
                "{c} under its minimum"
            );
        }
        // Each maximum: taken at it, refused one step over it.
        for c in ["usd", "eur", "jpy", "cop", "idr", "inr", "isk", "kwd"] {
            let max = maximum(c) - maximum(c) % step(c);
            assert!(check_amount(max, c).is_ok(), "{c} at its maximum");
            assert!(
                check_amount(maximum(c) + 1, c).is_err(),
                "{c} over its maximum"
            );
        }
        assert_eq!(maximum("idr"), 999_999_999_999);
        assert_eq!(maximum("usd"), 99_999_999);
        // Whole units: ISK and UGX in multiples of 100, charges and refunds alike.
        for c in codes(&s["whole_units"]) {
            assert_eq!(decimals(&c), 2, "{c} is given with two decimals");
            assert!(check_amount(500, &c).is_ok(), "5 {c}");
            let e = check_amount(510, &c).unwrap_err();
            assert!(e.contains("multiple of 100"), "{c}: {e}");
            assert!(
                check_refund_amount(250, &c).is_err(),
                "a refund of 2.50 {c}"
            );
            assert!(check_refund_amount(200, &c).is_ok(), "a refund of 2 {c}");
            assert!(check_amount(99, &c).is_err(), "under one {c}");
        }
        // Three decimals: the last digit 0, charges and refunds alike.
        for c in codes(&s["three_decimal"]) {
            assert_eq!(decimals(&c), 3);
            assert!(check_amount(1_230, &c).is_ok(), "{c}");
            assert!(check_amount(1_234, &c).is_err(), "{c}");
            assert!(check_refund_amount(15, &c).is_err(), "{c}");
        }
        // Zero decimals: any whole amount from the minimum.
        for c in codes(&s["zero_decimal"]) {
            assert_eq!(decimals(&c), 0);
            assert!(check_amount(minimum(&c) + 1, &c).is_ok(), "{c}");
            assert!(check_refund_amount(1, &c).is_ok(), "{c}");
        }
        // HUF's and TWD's special cases are payouts': their charges are plain two-decimal.
        assert!(check_amount(17_501, "huf").is_ok());
        assert!(check_amount(1_001, "twd").is_ok());
    }
}
