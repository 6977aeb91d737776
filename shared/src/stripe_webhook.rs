//! Stripe's webhook signature (`Stripe-Signature`), verified over the raw body bytes as
//! Stripe's own libraries verify it (`stripe.WebhookSignature.verify_header`): the header is
//! `t=<unix seconds>,v1=<hex>[,v1=<hex>...][,v0=...]`; a `v1` is HMAC-SHA256 of `"{t}.{body}"`
//! keyed by the endpoint's signing secret (`whsec_...`, used as its bytes). Any `v1` may match
//! any of the secrets held (Stripe signs with both the old and the new secret while one is
//! rolled), compared in constant time; a timestamp older than the tolerance is refused (a
//! replayed delivery), one in the future is not (Stripe's libraries accept it too). The test
//! `infra/provider-sim/test_webhook_signature.py` holds this to the official `stripe` package.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// Stripe's libraries' default tolerance.
pub const DEFAULT_TOLERANCE_SECONDS: i64 = 300;

/// Why a delivery's signature was refused (answered `400`, nothing stored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Stripe-Signature` header.
    #[error("no Stripe-Signature header")]
    Missing,
    /// The header has no timestamp, a timestamp that is not a number, or no `v1` signature.
    #[error("the Stripe-Signature header has no timestamp or no v1 signature")]
    Malformed,
    /// No `v1` signature matches the body under any of the secrets.
    #[error("no v1 signature matches the body under the endpoint's signing secrets")]
    NoMatch,
    /// The timestamp is older than the tolerance: a replay, or a clock far off.
    #[error("the signature's timestamp is {age_s} s old, over the {tolerance_s} s tolerance")]
    Stale {
        /// How old the timestamp is.
        age_s: i64,
        /// The tolerance.
        tolerance_s: i64,
    },
}

/// The endpoint's signing secrets and the timestamp tolerance.
#[derive(Clone)]
pub struct SignatureCheck {
    secrets: Vec<SecretString>,
    tolerance_s: i64,
}

impl std::fmt::Debug for SignatureCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignatureCheck")
            .field("secrets", &self.secrets.len())
            .field("tolerance_s", &self.tolerance_s)
            .finish()
    }
}

impl SignatureCheck {
    /// Checks against every secret in `secrets` (one, or two while one is rolled), refusing
    /// timestamps older than `tolerance_s` (0 or less: no age limit, as in Stripe's libraries).
    pub fn new(secrets: Vec<SecretString>, tolerance_s: i64) -> Self {
        Self {
            secrets,
            tolerance_s,
        }
    }

    /// The secrets held in one string: one per line or separated by commas, blanks ignored
    /// (how the signing secret is stored in Secrets Manager).
    pub fn parse_secrets(text: &str) -> Vec<SecretString> {
        text.split([',', '\n'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| SecretString::from(s.to_owned()))
            .collect()
    }

    /// Verifies `header` over the raw `body` at `now_s` (unix seconds).
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now_s: i64,
    ) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let mut timestamp: Option<&str> = None;
        let mut signatures = Vec::new();
        // As Stripe's libraries read it: the first `t`, every `v1`, each value up to a
        // further `=`; the signed timestamp is the number as read (`t=+5` signs `5.`).
        for item in header.split(',') {
            let mut parts = item.split('=');
            match (parts.next(), parts.next()) {
                (Some("t"), Some(t)) if timestamp.is_none() => timestamp = Some(t),
                (Some("t"), None) if timestamp.is_none() => return Err(SignatureError::Malformed),
                (Some("v1"), Some(v)) => signatures.push(v),
                _ => {}
            }
        }
        let t_s: i64 = timestamp
            .and_then(|t| t.trim().parse().ok())
            .ok_or(SignatureError::Malformed)?;
        if signatures.is_empty() {
            return Err(SignatureError::Malformed);
        }
        let signed_t = t_s.to_string();
        // Stripe compares lowercase hex strings: an uppercase signature matches nothing.
        let lowercase_hex = |v: &&&str| {
            v.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let matched = signatures
            .iter()
            .filter(lowercase_hex)
            .filter_map(|v| hex::decode(v).ok())
            .any(|sig| {
                self.secrets.iter().any(|secret| {
                    let mut mac = mac(secret.expose_secret());
                    mac.update(signed_t.as_bytes());
                    mac.update(b".");
                    mac.update(body);
                    // Constant-time comparison.
                    mac.verify_slice(&sig).is_ok()
                })
            });
        if !matched {
            return Err(SignatureError::NoMatch);
        }
        let age_s = now_s - t_s;
        if self.tolerance_s > 0 && age_s > self.tolerance_s {
            return Err(SignatureError::Stale {
                age_s,
                tolerance_s: self.tolerance_s,
            });
        }
        Ok(())
    }
}

fn mac(secret: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length")
}

/// The `Stripe-Signature` header Stripe would send for `body` at `t` under `secrets` (one
/// `v1` per secret): for tests and the local tools that deliver events.
pub fn sign(secrets: &[&str], t: i64, body: &[u8]) -> String {
    let mut header = format!("t={t}");
    for secret in secrets {
        let mut mac = mac(secret);
        mac.update(t.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        header.push_str(",v1=");
        header.push_str(&hex::encode(mac.finalize().into_bytes()));
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn check(secrets: &[&str]) -> SignatureCheck {
        SignatureCheck::new(
            secrets
                .iter()
                .map(|s| SecretString::from((*s).to_owned()))
                .collect(),
            DEFAULT_TOLERANCE_SECONDS,
        )
    }

    #[test]
    fn a_signed_body_is_accepted_and_any_change_refused() {
        let body = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
        let header = sign(&["whsec_a"], NOW, body);
        assert_eq!(check(&["whsec_a"]).verify(Some(&header), body, NOW), Ok(()));
        let tampered = br#"{"id":"evt_1","type":"payment_intent.canceled"}"#;
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&header), tampered, NOW),
            Err(SignatureError::NoMatch)
        );
        assert_eq!(
            check(&["whsec_b"]).verify(Some(&header), body, NOW),
            Err(SignatureError::NoMatch)
        );
        // The timestamp is signed: moving it breaks the signature.
        let moved = header.replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&moved), body, NOW),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn a_stale_timestamp_is_refused_and_a_future_one_is_not() {
        let body = b"{}";
        let old = sign(&["whsec_a"], NOW - 301, body);
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&old), body, NOW),
            Err(SignatureError::Stale {
                age_s: 301,
                tolerance_s: 300
            })
        );
        let edge = sign(&["whsec_a"], NOW - 300, body);
        assert_eq!(check(&["whsec_a"]).verify(Some(&edge), body, NOW), Ok(()));
        let ahead = sign(&["whsec_a"], NOW + 3600, body);
        assert_eq!(check(&["whsec_a"]).verify(Some(&ahead), body, NOW), Ok(()));
    }

    #[test]
    fn during_a_roll_either_secret_verifies() {
        let body = b"{\"id\":\"evt_2\"}";
        let both = sign(&["whsec_old", "whsec_new"], NOW, body);
        let only_new = sign(&["whsec_new"], NOW, body);
        for held in [
            &["whsec_old"][..],
            &["whsec_new"],
            &["whsec_old", "whsec_new"],
        ] {
            assert_eq!(check(held).verify(Some(&both), body, NOW), Ok(()));
        }
        assert_eq!(
            check(&["whsec_old", "whsec_new"]).verify(Some(&only_new), body, NOW),
            Ok(())
        );
        assert_eq!(
            check(&["whsec_old"]).verify(Some(&only_new), body, NOW),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        let body = b"{}";
        let c = check(&["whsec_a"]);
        assert_eq!(c.verify(None, body, NOW), Err(SignatureError::Missing));
        assert_eq!(
            c.verify(Some(""), body, NOW),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            c.verify(Some("v1=abcd"), body, NOW),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            c.verify(Some(&format!("t={NOW}")), body, NOW),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            c.verify(Some("t=x,v1=00"), body, NOW),
            Err(SignatureError::Malformed)
        );
        // A v0 (test-mode legacy scheme) alone is not a v1.
        let v0 = sign(&["whsec_a"], NOW, body).replace("v1=", "v0=");
        assert_eq!(
            c.verify(Some(&v0), body, NOW),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            c.verify(Some(&format!("t={NOW},v1=not-hex")), body, NOW),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn secrets_are_read_one_per_line_or_comma() {
        assert_eq!(
            SignatureCheck::parse_secrets(" whsec_a,\nwhsec_b \n\n").len(),
            2
        );
        assert!(SignatureCheck::parse_secrets("  ").is_empty());
    }
}
