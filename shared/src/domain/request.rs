//! The payment request as the queue carries it, parsed and validated at the boundary.
//!
//! Nothing here knows about AWS or Lambda. A [`PaymentRequest`] can only be built through
//! [`PaymentRequest::parse`], so every value the rest of the crate sees has passed the message
//! contract: a bad body is turned into an [`InputError`] with the `error_code` that the
//! dead-letter message carries, and it is never charged.
//!
//! Why one file of ~880 lines: the payment contract (every field's rule and its error) and
//! the text rule that guards it are read together; ~420 lines are their tests.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::currency::is_known_currency;
use crate::domain::text;
pub use crate::domain::text::{looks_like_card_number, mask_card_numbers};

/// Largest body the processor accepts; larger bodies are `invalid_payment` (SQS allows 256 KiB,
/// a valid payment with maximal metadata is well under this).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest amount in minor units, for every currency (Stripe's eight digits); the smallest
/// depends on the currency ([`crate::domain::limits`]).
pub use crate::domain::limits::MAX_AMOUNT;
use crate::domain::limits::{
    check_amount, MAX_DESCRIPTION_LEN, MAX_METADATA_KEY_LEN, MAX_METADATA_VALUE_LEN,
};
const MAX_ID_LEN: usize = 255;
/// Stripe accepts at most 50 metadata keys and the processor adds `metadata[payment_id]`, so a
/// message may carry 49.
const MAX_METADATA_KEYS: usize = crate::domain::limits::MAX_METADATA_KEYS - 1;
/// The prefix of the refunds' idempotency keys at the provider (`refund:<refund_id>`): Stripe's
/// keys are account-wide, so no payment id may begin with it.
pub const REFUND_KEY_PREFIX: &str = "refund:";

/// A refund's `Idempotency-Key` at the provider: `refund:<refund_id>`, stable for the life of
/// the refund (every retry and takeover sends the same).
pub fn refund_key(refund_id: &str) -> String {
    format!("{REFUND_KEY_PREFIX}{refund_id}")
}

/// Why a message body cannot be processed. Always terminal: the message goes to the DLQ.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The body is not a JSON object.
    #[error("body is not valid JSON: {0}")]
    InvalidJson(String),
    /// The body is JSON but breaks the payment contract (a missing field, a wrong type, a
    /// value out of range, an unknown field, card data).
    #[error("{message}")]
    InvalidPayment {
        /// The field at fault (`amount`, `metadata`, ...), when one is.
        field: Option<String>,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The message is of a contract version this release does not read
    /// ([`crate::domain::contract`]).
    #[error("{0}")]
    ContractUnsupported(String),
}

impl InputError {
    /// The `error_code` message attribute of the dead-letter message.
    pub fn code(&self) -> &'static str {
        match self {
            InputError::InvalidJson(_) => "invalid_json",
            InputError::InvalidPayment { .. } => "invalid_payment",
            InputError::ContractUnsupported(_) => crate::domain::contract::UNSUPPORTED,
        }
    }

    /// The field at fault, for an API's `param`.
    pub fn field(&self) -> Option<&str> {
        match self {
            InputError::InvalidJson(_) => None,
            InputError::InvalidPayment { field, .. } => field.as_deref(),
            InputError::ContractUnsupported(_) => Some(crate::domain::contract::FIELD),
        }
    }
}

/// Checks an id that is an idempotency key (`payment_id`, `refund_id`): 1 to 255 characters of
/// `A-Z a-z 0-9 _ - : .`, the error naming `field`.
pub fn check_id(field: &str, value: &str) -> Result<(), InputError> {
    if value.is_empty() || value.len() > MAX_ID_LEN {
        return Err(invalid(
            field,
            format!("{field} must be 1 to {MAX_ID_LEN} characters"),
        ));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':' | b'.'))
    {
        return Err(invalid(
            field,
            format!("{field} may contain only A-Z a-z 0-9 _ - : ."),
        ));
    }
    Ok(())
}

/// The idempotency key end to end: 1 to 255 characters of `A-Z a-z 0-9 _ - : .`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct PaymentId(String);

impl PaymentId {
    /// Parses a payment id, naming the rule it breaks.
    pub fn parse(value: &str) -> Result<Self, InputError> {
        check_id("payment_id", value)?;
        if value.starts_with(REFUND_KEY_PREFIX) {
            return Err(invalid(
                "payment_id",
                format!("payment_id may not begin with {REFUND_KEY_PREFIX:?}: the provider's idempotency keys of refunds begin so"),
            ));
        }
        Ok(Self(value.to_owned()))
    }

    /// The id as sent to the provider and stored in the record.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PaymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An amount of money: integer minor units and a lowercase ISO 4217 code. Never a float.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Money {
    /// Minor units (cents for `usd`), within Stripe's limits for the currency
    /// ([`crate::domain::limits::check_amount`]).
    pub amount: i64,
    /// Lowercase ISO 4217 code from the project's list.
    pub currency: String,
}

/// A validated payment request. Field order is the canonical order used for the payload hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentRequest {
    /// The idempotency key of the payment, end to end.
    pub payment_id: PaymentId,
    /// What to charge.
    pub money: Money,
    /// The provider's customer id.
    pub customer_id: String,
    /// The provider's payment method id (never raw card data).
    pub payment_method: String,
    /// Free text shown on the provider's dashboard.
    pub description: Option<String>,
    /// Caller's string map, passed to the provider as `metadata[...]`; sorted so that the hash
    /// does not depend on the order of keys in the body.
    pub metadata: BTreeMap<String, String>,
    /// The card statement's dynamic suffix (contract 2): after the account's prefix, `*` and a
    /// space, at most 22 characters in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statement_descriptor_suffix: Option<String>,
    /// The message contract's version the request came in (1 unless the message said 2).
    /// Not serialised: the struct's serialised form is the digest of records written before
    /// `payment/v1`, which no version changes.
    #[serde(skip)]
    pub contract_version: u64,
    /// Why this release's intake rules (the text rule, the currency rules) refuse a request an
    /// earlier release accepted (`None`: they take it). Such a request is read (as
    /// [`PaymentRequest::parse_as_before`]) so that a payment accepted before is answered, looked
    /// up and finished, never charged anew: its first attempt refuses it
    /// (`invalid_payment`). Not part of the request's digest.
    #[serde(skip)]
    pub refused_now: Option<InputError>,
}

/// The wire shape, before validation. Unknown fields are an error so a typo is never ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPayment {
    payment_id: String,
    amount: i64,
    currency: String,
    customer_id: String,
    payment_method: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    statement_descriptor_suffix: Option<String>,
    #[serde(default)]
    contract_version: Option<u64>,
}

impl PaymentRequest {
    /// Parses and validates a message body against the message contract.
    pub fn parse(body: &str) -> Result<Self, InputError> {
        Self::from_value(Self::json_of(body)?)
    }

    /// Reads a body this release refuses by the rules earlier releases did not have (the text
    /// rule, the currency rules) as those releases did, with why it is refused now in
    /// [`PaymentRequest::refused_now`]; a body this release takes reads as [`Self::parse`]
    /// reads it. Only for a payment that may have been accepted before: its retry is answered,
    /// its record finished; never to accept a new one.
    pub fn parse_as_before(body: &str) -> Result<Self, InputError> {
        Self::from_value_as_before(Self::json_of(body)?)
    }

    /// [`Self::parse_as_before`] of a parsed JSON value (the API's body and key).
    pub fn from_value_as_before(value: serde_json::Value) -> Result<Self, InputError> {
        match Self::from_value(value.clone()) {
            Ok(r) => Ok(r),
            Err(now) => {
                let mut before = Self::from_value_with(value, false).map_err(|_| now.clone())?;
                before.refused_now = Some(now);
                Ok(before)
            }
        }
    }

    /// A body's JSON, within the size a message may have.
    fn json_of(body: &str) -> Result<serde_json::Value, InputError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(InputError::InvalidPayment {
                field: None,
                message: format!(
                    "body is {} bytes, more than the {MAX_BODY_BYTES} allowed",
                    body.len()
                ),
            });
        }
        serde_json::from_str(body).map_err(|e| InputError::InvalidJson(e.to_string()))
    }

    /// Validates a parsed JSON value against the message contract (the API builds the value
    /// from its body and the `Idempotency-Key`).
    pub fn from_value(value: serde_json::Value) -> Result<Self, InputError> {
        Self::from_value_with(value, true)
    }

    fn from_value_with(value: serde_json::Value, strict: bool) -> Result<Self, InputError> {
        let Some(object) = value.as_object() else {
            return Err(InputError::InvalidJson(
                "body must be a JSON object".to_owned(),
            ));
        };
        // A later version's message is refused as such, before its fields are (a field that
        // version adds would read as unknown here).
        if let Some(v) = object
            .get(crate::domain::contract::FIELD)
            .and_then(|v| v.as_u64())
        {
            crate::domain::contract::read(Some(v)).map_err(InputError::ContractUnsupported)?;
        }
        check_shape(object)?;
        let raw: RawPayment =
            // Every field's type was checked above; serde's own message may quote a value.
            serde_json::from_value(value).map_err(|_| InputError::InvalidPayment {
                field: None,
                message: "the body does not match the payment contract".to_owned(),
            })?;
        Self::validate(raw, strict)
    }

    /// The message body of the contract (what a producer sends to the queue), canonical: the
    /// same request always gives the same bytes.
    pub fn to_message_body(&self) -> String {
        let mut body = serde_json::Map::new();
        body.insert("payment_id".into(), self.payment_id.as_str().into());
        body.insert("amount".into(), self.money.amount.into());
        body.insert("currency".into(), self.money.currency.clone().into());
        body.insert("customer_id".into(), self.customer_id.clone().into());
        body.insert("payment_method".into(), self.payment_method.clone().into());
        if let Some(d) = &self.description {
            body.insert("description".into(), d.clone().into());
        }
        if let Some(suffix) = &self.statement_descriptor_suffix {
            body.insert("statement_descriptor_suffix".into(), suffix.clone().into());
        }
        if self.contract_version != 1 {
            body.insert(
                crate::domain::contract::FIELD.into(),
                self.contract_version.into(),
            );
        }
        if !self.metadata.is_empty() {
            body.insert(
                "metadata".into(),
                serde_json::Value::Object(
                    self.metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone().into()))
                        .collect(),
                ),
            );
        }
        serde_json::Value::Object(body).to_string()
    }

    /// `strict`: this release's rules; else only those of the releases before the text rule and
    /// the currency rules (a payment they accepted is read, never refused for them).
    fn validate(raw: RawPayment, strict: bool) -> Result<Self, InputError> {
        let text_rule = |what: &str, field: &str, value: &str, kind: text::Kind| {
            if strict {
                text::check(what, value, kind).map_err(|m| invalid(field, m))
            } else {
                Ok(())
            }
        };
        // A version present was read before the shape (`from_value`).
        let contract_version = raw.contract_version.unwrap_or(1);
        let payment_id = PaymentId::parse(&raw.payment_id)?;
        text_rule("payment_id", "payment_id", &raw.payment_id, text::Kind::Id)?;
        if let Some(suffix) = &raw.statement_descriptor_suffix {
            if contract_version < 2 {
                return Err(invalid(
                    "statement_descriptor_suffix",
                    "statement_descriptor_suffix is contract 2: send it with contract_version 2",
                ));
            }
            check_statement_suffix(suffix, strict)?;
        }
        let currency = raw.currency.to_ascii_lowercase();
        if !is_known_currency(&currency) {
            return Err(invalid(
                "currency",
                "currency is not a known ISO 4217 code (three letters: usd, eur, jpy, ...)",
            ));
        }
        if strict {
            check_amount(raw.amount, &currency).map_err(|m| invalid("amount", m))?;
        } else if !(1..=crate::domain::limits::LARGEST_AMOUNT).contains(&raw.amount) {
            return Err(invalid("amount", "amount out of range"));
        }
        check_len("customer_id", &raw.customer_id, 1, MAX_ID_LEN)?;
        check_len("payment_method", &raw.payment_method, 1, MAX_ID_LEN)?;
        for (field, value) in [
            ("customer_id", &raw.customer_id),
            ("payment_method", &raw.payment_method),
        ] {
            text_rule(field, field, value, text::Kind::Id)?;
        }
        if let Some(d) = &raw.description {
            check_len("description", d, 0, MAX_DESCRIPTION_LEN)?;
            text_rule("description", "description", d, text::Kind::Free)?;
        }
        let metadata = raw.metadata.unwrap_or_default();
        if metadata.len() > MAX_METADATA_KEYS {
            return Err(invalid(
                "metadata",
                format!(
                    "metadata has {} keys, at most {MAX_METADATA_KEYS} allowed",
                    metadata.len()
                ),
            ));
        }
        for (k, v) in &metadata {
            // A key is the sender's text: named only when it is a plain name.
            let value_of = match text::shown_name(k) {
                Some(name) => format!("metadata value of {name}"),
                None => "a metadata value".to_owned(),
            };
            check_len_of("metadata", "metadata key", k, 1, MAX_METADATA_KEY_LEN)?;
            text_rule("a metadata key", "metadata", k, text::Kind::Line)?;
            check_len_of("metadata", &value_of, v, 1, MAX_METADATA_VALUE_LEN).map_err(|e| {
                match v.is_empty() {
                    true => invalid(
                        "metadata",
                        format!("{value_of} is empty: Stripe would unset the key instead of storing it; leave the key out"),
                    ),
                    false => e,
                }
            })?;
            text_rule(&value_of, "metadata", v, text::Kind::Free)?;
            if k.contains(['[', ']']) {
                return Err(invalid(
                    "metadata",
                    "metadata keys may not contain '[' or ']'",
                ));
            }
        }
        if metadata.contains_key("payment_id") {
            return Err(invalid(
                "metadata",
                "metadata key payment_id is reserved: the processor sets it",
            ));
        }
        Ok(Self {
            payment_id,
            money: Money {
                amount: raw.amount,
                currency,
            },
            customer_id: raw.customer_id,
            payment_method: raw.payment_method,
            description: raw.description,
            metadata,
            statement_descriptor_suffix: raw.statement_descriptor_suffix,
            contract_version,
            refused_now: None,
        })
    }

    /// The canonical, versioned digest of what the payment means ([`sqs_once::Fingerprint`],
    /// `payment/v1:<sha-256>`): the same payment id with another payload has another digest
    /// and is a conflict, never a charge. Key order, currency case and the code's serde shape
    /// do not change it; an absent optional field adds nothing.
    pub fn payload_hash(&self) -> String {
        let mut f = sqs_once::Fingerprint::new(PAYMENT_FINGERPRINT_VERSION)
            .field("payment_id", self.payment_id.as_str())
            .field("amount", self.money.amount)
            .field("currency", &self.money.currency)
            .field("customer_id", &self.customer_id)
            .field("payment_method", &self.payment_method)
            .optional("description", self.description.as_deref())
            .optional(
                "statement_descriptor_suffix",
                self.statement_descriptor_suffix.as_deref(),
            );
        for (k, v) in &self.metadata {
            f = f.field(&format!("metadata[{k}]"), v);
        }
        f.finish()
    }

    /// Whether a stored digest is this payment's: the current form, or the form before
    /// versioned digests (SHA-256 of the serialized struct), which records and payment rows
    /// written by earlier versions carry.
    pub fn has_payload_hash(&self, stored: &str) -> bool {
        stored == self.payload_hash() || stored == self.unversioned_payload_hash()
    }

    /// The digest of versions before `payment/v1`, accepted for what they stored.
    fn unversioned_payload_hash(&self) -> String {
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&canonical))
    }
}

/// The version of [`PaymentRequest::payload_hash`]: what it hashes never changes under it.
pub const PAYMENT_FINGERPRINT_VERSION: &str = "payment/v1";

fn invalid(field: &str, msg: impl Into<String>) -> InputError {
    InputError::InvalidPayment {
        field: Some(field.to_owned()),
        message: msg.into(),
    }
}

fn check_len(field: &str, value: &str, min: usize, max: usize) -> Result<(), InputError> {
    check_len_of(field, field, value, min, max)
}

fn check_len_of(
    field: &str,
    what: &str,
    value: &str,
    min: usize,
    max: usize,
) -> Result<(), InputError> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(invalid(
            field,
            format!("{what} must be {min} to {max} characters, got {n}"),
        ));
    }
    Ok(())
}

/// The JSON type each field of the contract must have.
#[derive(Clone, Copy)]
enum Shape {
    Text,
    Integer,
    OptionalText,
    OptionalInteger,
    TextMap,
}

const FIELDS: [(&str, Shape); 9] = [
    ("payment_id", Shape::Text),
    ("amount", Shape::Integer),
    ("currency", Shape::Text),
    ("customer_id", Shape::Text),
    ("payment_method", Shape::Text),
    ("description", Shape::OptionalText),
    ("metadata", Shape::TextMap),
    ("statement_descriptor_suffix", Shape::OptionalText),
    ("contract_version", Shape::OptionalInteger),
];

/// Stripe's rules of a card statement's suffix: Latin letters, digits, spaces and punctuation
/// but none of `< > \\ ' " *`, at least one letter, and with the account's prefix (2 to 10
/// characters), `*` and a space, 22 characters at most: so 18 at most here, and 20 less the
/// prefix's length at Stripe (a longer one is Stripe's to refuse: `provider_rejected`, never
/// charged).
fn check_statement_suffix(suffix: &str, strict: bool) -> Result<(), InputError> {
    // The prefix is 2 to 10 characters, and "* " joins them: 18 at most, whatever the prefix.
    check_len("statement_descriptor_suffix", suffix, 1, 18)?;
    if strict {
        text::check("statement_descriptor_suffix", suffix, text::Kind::Line)
            .map_err(|m| invalid("statement_descriptor_suffix", m))?;
    }
    let printable = suffix.chars().all(|c| c.is_ascii_graphic() || c == ' ');
    let forbidden = suffix.contains(['<', '>', '\\', '\'', '"', '*']);
    if !printable || forbidden || !suffix.chars().any(|c| c.is_ascii_alphabetic()) {
        return Err(invalid(
            "statement_descriptor_suffix",
            "statement_descriptor_suffix must be Latin letters, digits, spaces and punctuation without < > \\ ' \" *, with at least one letter",
        ));
    }
    Ok(())
}

/// Names the field of a missing, unknown or wrongly typed value (serde's own messages do not
/// always name it).
fn check_shape(object: &serde_json::Map<String, serde_json::Value>) -> Result<(), InputError> {
    use serde_json::Value;
    if let Some(unknown) = object
        .keys()
        .find(|k| !FIELDS.iter().any(|(name, _)| name == k))
    {
        // The name is the sender's text: shown only when it is a plain name.
        return Err(match text::shown_name(unknown) {
            Some(name) => invalid(name, format!("unknown field `{name}`")),
            None => InputError::InvalidPayment {
                field: None,
                message: "a field of an unknown name (not shown: it is not a plain name)"
                    .to_owned(),
            },
        });
    }
    for (name, shape) in FIELDS {
        let value = object.get(name);
        let ok = match (shape, value) {
            (Shape::Text, Some(Value::String(_))) => true,
            (Shape::Integer, Some(Value::Number(n))) => n.is_i64(),
            (Shape::OptionalText, None | Some(Value::Null | Value::String(_))) => true,
            (Shape::OptionalInteger, None | Some(Value::Null)) => true,
            (Shape::OptionalInteger, Some(Value::Number(n))) => n.is_u64(),
            (Shape::TextMap, None | Some(Value::Null)) => true,
            (Shape::TextMap, Some(Value::Object(m))) => m.values().all(Value::is_string),
            (Shape::Text | Shape::Integer, None) => {
                return Err(invalid(name, format!("missing field `{name}`")))
            }
            _ => false,
        };
        if !ok {
            let expected = match shape {
                Shape::Text | Shape::OptionalText => "a string",
                Shape::Integer => "an integer (minor units)",
                Shape::OptionalInteger => "a positive integer",
                Shape::TextMap => "an object of string values",
            };
            return Err(invalid(name, format!("{name} must be {expected}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refund_keys_cannot_be_payment_ids() {
        assert_eq!(refund_key("rf-1"), "refund:rf-1");
        assert!(PaymentId::parse(&refund_key("rf-1")).is_err());
    }

    fn body(overrides: serde_json::Value) -> String {
        let mut base = serde_json::json!({
            "payment_id": "pay_7Hq2", "amount": 1999, "currency": "usd", "customer_id": "cus_42",
            "payment_method": "pm_card_visa", "description": "Order 1234",
            "metadata": {"order_id": "1234"}
        });
        if let (Some(b), Some(o)) = (base.as_object_mut(), overrides.as_object()) {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        base.to_string()
    }

    fn code_of(b: &str) -> &'static str {
        PaymentRequest::parse(b).unwrap_err().code()
    }

    #[test]
    fn the_contract_example_parses() {
        let p = PaymentRequest::parse(&body(serde_json::json!({}))).unwrap();
        assert_eq!(p.payment_id.as_str(), "pay_7Hq2");
        assert_eq!(p.money.amount, 1999);
        assert_eq!(p.metadata["order_id"], "1234");
    }

    #[test]
    fn currency_any_case_in_lowercase_out() {
        let p = PaymentRequest::parse(&body(serde_json::json!({"currency": "EuR"}))).unwrap();
        assert_eq!(p.money.currency, "eur");
    }

    #[test]
    fn malformed_json_is_invalid_json() {
        assert_eq!(code_of("{not json"), "invalid_json");
        assert_eq!(code_of("[1,2]"), "invalid_json");
        assert_eq!(code_of(""), "invalid_json");
    }

    #[test]
    fn each_contract_breach_is_invalid_payment() {
        let cases = [
            serde_json::json!({"payment_id": null}),
            serde_json::json!({"payment_id": ""}),
            serde_json::json!({"payment_id": "pay 1"}),
            serde_json::json!({"payment_id": "x".repeat(256)}),
            serde_json::json!({"amount": 0}),
            serde_json::json!({"amount": 30}),
            serde_json::json!({"amount": 49, "currency": "jpy"}),
            serde_json::json!({"amount": 1005, "currency": "kwd"}),
            serde_json::json!({"metadata": {"k": ""}}),
            serde_json::json!({"payment_id": "refund:rf-1"}),
            serde_json::json!({"amount": -5}),
            serde_json::json!({"amount": 100_000_000}),
            serde_json::json!({"amount": 19.99}),
            serde_json::json!({"amount": "1999"}),
            serde_json::json!({"currency": "xyz"}),
            serde_json::json!({"currency": null}),
            serde_json::json!({"customer_id": ""}),
            serde_json::json!({"payment_method": null}),
            serde_json::json!({"payment_method": "4242 4242 4242 4242"}),
            serde_json::json!({"payment_method": "4000-0566-5566-5556"}),
            serde_json::json!({"description": "d".repeat(1001)}),
            serde_json::json!({"metadata": {"k": 1}}),
            serde_json::json!({"metadata": {"k".repeat(41): "v"}}),
            serde_json::json!({"metadata": {"k": "v".repeat(501)}}),
            serde_json::json!({"ammount": 1999}),
        ];
        for case in cases {
            let b = body(case.clone());
            assert_eq!(code_of(&b), "invalid_payment", "{case}");
        }
        let keys = |n: usize| -> serde_json::Map<String, serde_json::Value> {
            (0..n)
                .map(|i| (format!("k{i}"), serde_json::Value::from("v")))
                .collect()
        };
        // 50 keys + the processor's metadata[payment_id] would be 51 at the provider.
        let e =
            PaymentRequest::parse(&body(serde_json::json!({ "metadata": keys(50) }))).unwrap_err();
        assert_eq!(e.code(), "invalid_payment");
        assert!(e.to_string().contains("at most 49"), "{e}");
        let ok = PaymentRequest::parse(&body(serde_json::json!({ "metadata": keys(49) })))
            .expect("49 keys are accepted");
        assert_eq!(
            crate::stripe::StripeClient::form_fields(&ok)
                .iter()
                .filter(|(k, _)| k.starts_with("metadata["))
                .count(),
            50,
            "Stripe's limit, with the processor's payment_id"
        );
        assert_eq!(code_of(&" ".repeat(MAX_BODY_BYTES + 1)), "invalid_payment");
    }

    #[test]
    fn each_breach_names_its_field_and_the_message_body_round_trips() {
        let field_of = |o: serde_json::Value| {
            PaymentRequest::parse(&body(o))
                .unwrap_err()
                .field()
                .map(str::to_owned)
        };
        assert_eq!(
            field_of(serde_json::json!({"amount": "1999"})).as_deref(),
            Some("amount")
        );
        assert_eq!(
            field_of(serde_json::json!({"amount": 19.99})).as_deref(),
            Some("amount")
        );
        assert_eq!(
            field_of(serde_json::json!({"currency": null})).as_deref(),
            Some("currency")
        );
        assert_eq!(
            field_of(serde_json::json!({"metadata": {"k": 1}})).as_deref(),
            Some("metadata")
        );
        assert_eq!(
            field_of(serde_json::json!({"ammount": 1})).as_deref(),
            Some("ammount")
        );
        assert_eq!(
            field_of(serde_json::json!({"customer_id": ""})).as_deref(),
            Some("customer_id")
        );
        let e = PaymentRequest::parse(&body(serde_json::json!({"amount": 30}))).unwrap_err();
        assert_eq!(e.field(), Some("amount"));
        assert!(
            e.to_string().contains("at least 50 minor units of usd"),
            "{e}"
        );
        let e = PaymentRequest::parse(&body(serde_json::json!({"metadata": {"note": ""}})))
            .unwrap_err();
        assert_eq!(e.field(), Some("metadata"));
        assert!(e.to_string().contains("unset"), "{e}");
        assert!(
            PaymentRequest::parse(&body(serde_json::json!({"amount": 50, "currency": "jpy"})))
                .is_ok(),
            "¥50 is Stripe's minimum"
        );
        let p = PaymentRequest::parse(&body(serde_json::json!({}))).unwrap();
        let again = PaymentRequest::parse(&p.to_message_body()).unwrap();
        assert_eq!(again, p);
        assert_eq!(again.to_message_body(), p.to_message_body());
        let bare = PaymentRequest::parse(&body(
            serde_json::json!({"description": null, "metadata": null}),
        ))
        .unwrap();
        assert_eq!(
            PaymentRequest::parse(&bare.to_message_body()).unwrap(),
            bare
        );
    }

    #[test]
    fn text_sqs_or_stripe_refuses_or_a_card_number_in_any_field_is_refused_naming_the_field_only() {
        const CARD: &str = "4242 4242 4242 4242";
        let cases: [(serde_json::Value, &str); 14] = [
            (
                serde_json::json!({"description": "pasted \u{FFFF}"}),
                "description",
            ),
            (
                serde_json::json!({"description": "odd \u{FFFE}"}),
                "description",
            ),
            (
                serde_json::json!({"description": "bell \u{7}"}),
                "description",
            ),
            (
                serde_json::json!({"description": format!("card {CARD}")}),
                "description",
            ),
            (
                serde_json::json!({"metadata": {"note": "\u{FFFF}"}}),
                "metadata",
            ),
            (serde_json::json!({"metadata": {"note": CARD}}), "metadata"),
            (serde_json::json!({"metadata": {CARD: "v"}}), "metadata"),
            (serde_json::json!({"metadata": {"a\nb": "v"}}), "metadata"),
            (
                serde_json::json!({"customer_id": "cus \u{FFFF}"}),
                "customer_id",
            ),
            (
                serde_json::json!({"customer_id": "4242424242424242"}),
                "customer_id",
            ),
            (
                serde_json::json!({"payment_method": "pm_\u{FFFE}"}),
                "payment_method",
            ),
            (
                serde_json::json!({"payment_method": "4000-0566-5566-5556"}),
                "payment_method",
            ),
            (
                serde_json::json!({"payment_id": "4242424242424242"}),
                "payment_id",
            ),
            (
                serde_json::json!({"contract_version": 2, "statement_descriptor_suffix": "501800000009"}),
                "statement_descriptor_suffix",
            ),
        ];
        for (case, field) in cases {
            let b = body(case.clone());
            let e = PaymentRequest::parse(&b).unwrap_err();
            assert_eq!(
                (e.code(), e.field()),
                ("invalid_payment", Some(field)),
                "{case}"
            );
            let said = e.to_string();
            for secret in ["4242", "5556", "0009", "\u{FFFF}", "\u{FFFE}"] {
                assert!(!said.contains(secret), "{case}: {said}");
            }
        }
        // What shoppers type is taken: any script, emoji, line breaks, digits that fail Luhn.
        let ok = PaymentRequest::parse(&body(serde_json::json!({
            "description": "Bestellung für Müller 🎁\n注文 4242 4242 4242 4241",
            "metadata": {"Order note": "مرحبا\tworld"}
        })))
        .unwrap();
        assert_eq!(PaymentRequest::parse(&ok.to_message_body()).unwrap(), ok);
    }

    #[test]
    fn no_reason_quotes_what_the_sender_wrote() {
        const CARD: &str = "4242424242424242";
        for case in [
            serde_json::json!({"currency": CARD}),
            serde_json::json!({ CARD: 1 }),
            serde_json::json!({"metadata": {CARD: ""}}),
            serde_json::json!({"metadata": {"x".repeat(41) + CARD: "v"}}),
        ] {
            let e = PaymentRequest::parse(&body(case.clone())).unwrap_err();
            assert!(!e.to_string().contains("4242"), "{case}: {e}");
            assert!(
                !e.field().unwrap_or_default().contains("4242"),
                "{case}: {e:?}"
            );
        }
        // A plain name is still named, for the sender's sake.
        let e = PaymentRequest::parse(&body(serde_json::json!({"ammount": 1}))).unwrap_err();
        assert_eq!(e.field(), Some("ammount"));
        let e = PaymentRequest::parse(&body(serde_json::json!({"metadata": {"note": ""}})))
            .unwrap_err();
        assert!(e.to_string().contains("metadata value of note"), "{e}");
    }

    #[test]
    fn hash_ignores_key_order_and_currency_case_but_not_amount() {
        let a = PaymentRequest::parse(&body(serde_json::json!({}))).unwrap();
        let b = PaymentRequest::parse(
            r#"{"metadata":{"order_id":"1234"},"description":"Order 1234","payment_method":"pm_card_visa",
               "customer_id":"cus_42","currency":"USD","amount":1999,"payment_id":"pay_7Hq2"}"#,
        )
        .unwrap();
        let c = PaymentRequest::parse(&body(serde_json::json!({"amount": 2000}))).unwrap();
        assert_eq!(a.payload_hash(), b.payload_hash());
        assert_ne!(a.payload_hash(), c.payload_hash());
    }

    #[test]
    fn the_fingerprint_is_versioned_pinned_and_blind_to_the_code_s_shape() {
        let a = PaymentRequest::parse(&body(serde_json::json!({}))).unwrap();
        // Pinned: a change of what payment/v1 hashes fails here, and needs a new version
        // that accepts this one (has_payload_hash), or every message in flight is key reuse.
        assert_eq!(a.payload_hash(), PINNED_V1);
        // An optional field the request does not carry adds nothing: a version that adds a
        // field (absent from old messages) keeps every existing fingerprint.
        let without =
            PaymentRequest::parse(&body(serde_json::json!({"description": null}))).unwrap();
        let mut f = sqs_once::Fingerprint::new(PAYMENT_FINGERPRINT_VERSION)
            .field("payment_id", "pay_7Hq2")
            .field("amount", 1999)
            .field("currency", "usd")
            .field("customer_id", "cus_42")
            .field("payment_method", "pm_card_visa")
            .optional("description", None::<&str>)
            .optional("statement_descriptor", None::<&str>);
        f = f.field("metadata[order_id]", "1234");
        assert_eq!(without.payload_hash(), f.finish());
        assert_ne!(without.payload_hash(), a.payload_hash());
        // What earlier versions stored is still this payment, and only this one.
        assert!(a.has_payload_hash(&a.unversioned_payload_hash()));
        assert!(!without.has_payload_hash(&a.unversioned_payload_hash()));
    }

    const PINNED_V1: &str =
        "payment/v1:b394b721bdbbd4d9d3d681ba0bffc65dae6058074268bc552561ec9ed0f8321b";

    #[test]
    fn contract_2_is_read_beside_1_changes_no_fingerprint_and_later_versions_are_refused_as_such() {
        let base = r#""payment_id":"p1","amount":1999,"currency":"usd","customer_id":"c","payment_method":"pm_card_visa""#;
        let one = PaymentRequest::parse(&format!("{{{base}}}")).unwrap();
        let two = PaymentRequest::parse(&format!("{{{base},\"contract_version\":2}}")).unwrap();
        assert_eq!((one.contract_version, two.contract_version), (1, 2));
        assert_eq!(one.payload_hash(), two.payload_hash());
        // Version 1 is written without the field (a release before versions refuses it), and
        // the struct's serialised form (the digest before payment/v1) is as it was.
        assert!(!one.to_message_body().contains("contract_version"));
        assert!(!serde_json::to_string(&one)
            .unwrap()
            .contains("contract_version"));
        assert_eq!(PaymentRequest::parse(&two.to_message_body()).unwrap(), two);

        let suffixed = PaymentRequest::parse(&format!(
            "{{{base},\"contract_version\":2,\"statement_descriptor_suffix\":\"ORDER 1234\"}}"
        ))
        .unwrap();
        assert_ne!(suffixed.payload_hash(), two.payload_hash());
        assert_eq!(
            PaymentRequest::parse(&suffixed.to_message_body()).unwrap(),
            suffixed
        );
        let early = PaymentRequest::parse(&format!(
            "{{{base},\"statement_descriptor_suffix\":\"ORDER 1234\"}}"
        ))
        .unwrap_err();
        assert_eq!(
            (early.code(), early.field()),
            ("invalid_payment", Some("statement_descriptor_suffix"))
        );
        assert!(!serde_json::to_string(&two)
            .unwrap()
            .contains("contract_version"));
        for bad in ["1234", "A*B", "ORDER \\\"1\\\"", "NINETEEN CHARACTERS"] {
            let body = format!(
                "{{{base},\"contract_version\":2,\"statement_descriptor_suffix\":\"{bad}\"}}"
            );
            assert_eq!(
                PaymentRequest::parse(&body).unwrap_err().field(),
                Some("statement_descriptor_suffix"),
                "{bad}"
            );
        }
        // A later version, with a field this release does not know: refused as a version.
        let later = PaymentRequest::parse(&format!(
            "{{{base},\"contract_version\":3,\"capture\":\"manual\"}}"
        ))
        .unwrap_err();
        assert_eq!(later.code(), "contract_unsupported");
        assert!(later.to_string().contains("reads 1 to 2"), "{later}");
    }
}
