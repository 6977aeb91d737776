//! A refund message: `{"refund_id", "payment_id", "amount"?, "reason"?}`, validated field by
//! field, and its versioned fingerprint (the same refund id for another refund is key reuse).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqs_once::Rejection;

use crate::domain::limits::LARGEST_AMOUNT;
use crate::domain::{check_id, MAX_BODY_BYTES};

/// Reasons Stripe accepts for a refund.
pub const REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];

/// A validated refund message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// The refund's id: its idempotency key end to end.
    pub refund_id: String,
    /// The payment to refund.
    pub payment_id: String,
    /// Minor units; `None`: what is left of the charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    /// One of [`REASONS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The message contract's version ([`crate::domain::contract`]; absent: 1; 2 adds nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_version: Option<u64>,
}

/// Names the field of a missing, unknown or wrongly typed value, never quoting a value (a
/// refused value may be a card number); an unknown field's name only when it is a plain name.
fn check_refund_shape(value: &serde_json::Value) -> Result<(), String> {
    use serde_json::Value;
    let Some(object) = value.as_object() else {
        return Err("the body must be a JSON object".to_owned());
    };
    const FIELDS: [&str; 5] = [
        "refund_id",
        "payment_id",
        "amount",
        "reason",
        "contract_version",
    ];
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(match crate::domain::text::shown_name(unknown) {
            Some(name) => format!("unknown field `{name}`"),
            None => "a field of an unknown name (not shown: it is not a plain name)".to_owned(),
        });
    }
    for field in FIELDS {
        let ok = match (field, object.get(field)) {
            ("refund_id" | "payment_id", Some(Value::String(_))) => true,
            ("refund_id" | "payment_id", None) => return Err(format!("missing field `{field}`")),
            (_, None | Some(Value::Null)) => true,
            ("amount", Some(Value::Number(n))) => n.is_i64(),
            ("reason", Some(Value::String(_))) => true,
            ("contract_version", Some(Value::Number(n))) => n.is_u64(),
            _ => false,
        };
        if !ok {
            let expected = match field {
                "amount" => "an integer (minor units)",
                "contract_version" => "a positive integer",
                _ => "a string",
            };
            return Err(format!("{field} must be {expected}"));
        }
    }
    Ok(())
}

impl RefundRequest {
    /// Parses and validates a body: `invalid_json`, or `invalid_refund` naming the field.
    pub fn parse(body: &str) -> Result<Self, Rejection> {
        let invalid = |m: String| Rejection::new("invalid_refund", m);
        if body.len() > MAX_BODY_BYTES {
            return Err(invalid(format!(
                "the body is larger than {MAX_BODY_BYTES} bytes"
            )));
        }
        let value: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| Rejection::new("invalid_json", format!("body is not valid JSON: {e}")))?;
        // A later version's refund is refused as such, before its fields are.
        let version = value
            .get(crate::domain::contract::FIELD)
            .and_then(|v| v.as_u64());
        if version.is_some() {
            crate::domain::contract::read(version)
                .map_err(|m| Rejection::new(crate::domain::contract::UNSUPPORTED, m))?;
        }
        check_refund_shape(&value).map_err(invalid)?;
        // Every field's type was checked: serde's own message may quote a value.
        let r: RefundRequest = serde_json::from_value(value)
            .map_err(|_| invalid("the body does not match the refund contract".to_owned()))?;
        for (field, id) in [("refund_id", &r.refund_id), ("payment_id", &r.payment_id)] {
            check_id(field, id).map_err(|e| invalid(e.to_string()))?;
        }
        if let Some(a) = r.amount {
            // The payment's currency sets the rest: its step here, its charge's size after.
            if !(1..=LARGEST_AMOUNT).contains(&a) {
                return Err(invalid(format!(
                    "amount must be 1 to {LARGEST_AMOUNT} minor units, got {a}"
                )));
            }
        }
        if let Some(reason) = &r.reason {
            if !REASONS.contains(&reason.as_str()) {
                return Err(invalid(format!(
                    "reason must be one of {}",
                    REASONS.join(", ")
                )));
            }
        }
        Ok(r)
    }

    /// The message body of this refund.
    pub fn to_message_body(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The canonical, versioned digest of the refund (`refund/v1:<sha-256>`, see
    /// [`sqs_once::Fingerprint`]): the same refund id for another refund is key reuse, never a
    /// second refund.
    pub fn fingerprint(&self) -> String {
        sqs_once::Fingerprint::new("refund/v1")
            .field("refund_id", &self.refund_id)
            .field("payment_id", &self.payment_id)
            .optional("amount", self.amount)
            .optional("reason", self.reason.as_deref())
            .finish()
    }

    /// Whether a stored digest is this refund's: the current form or the one of versions
    /// before `refund/v1` (SHA-256 of the serialized body, which had no contract version).
    pub fn has_fingerprint(&self, stored: &str) -> bool {
        let unversioned = RefundRequest {
            contract_version: None,
            ..self.clone()
        };
        stored == self.fingerprint()
            || stored == hex::encode(Sha256::digest(unversioned.to_message_body().as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_is_refused_naming_its_field_and_never_quoting_what_was_sent() {
        const CARD: &str = "4242424242424242";
        for body in [
            format!(r#"{{"refund_id":"r1","payment_id":"p1","reason":"{CARD}"}}"#),
            format!(r#"{{"refund_id":"r1","payment_id":"p1","amount":"{CARD}"}}"#),
            format!(r#"{{"refund_id":"r1","payment_id":"p1","{CARD}":1}}"#),
            format!(r#"{{"refund_id":"r1","payment_id":{CARD}}}"#),
        ] {
            let e = RefundRequest::parse(&body).unwrap_err();
            assert_eq!(e.code, "invalid_refund", "{body}");
            assert!(!e.message.contains("4242"), "{body}: {}", e.message);
        }
        let e =
            RefundRequest::parse(r#"{"refund_id":"r1","payment_id":"p1","amout":5}"#).unwrap_err();
        assert!(e.message.contains("unknown field `amout`"), "{}", e.message);
        let e = RefundRequest::parse(r#"{"refund_id":"r1","amount":5}"#).unwrap_err();
        assert!(
            e.message.contains("missing field `payment_id`"),
            "{}",
            e.message
        );
        // Ids are keys, held to their characters only: a refund or payment accepted before the
        // card rule (an id made of digits) stays reachable, its retries answered.
        assert!(RefundRequest::parse(
            r#"{"refund_id":"r-4242424242424242","payment_id":"order-42-1796624060"}"#
        )
        .is_ok());
        let ok = RefundRequest::parse(
            r#"{"refund_id":"r1","payment_id":"p1","amount":5,"reason":"duplicate"}"#,
        )
        .unwrap();
        assert_eq!(RefundRequest::parse(&ok.to_message_body()).unwrap(), ok);
    }
}
