//! Stripe's webhook signature (`Stripe-Signature`), verified over the raw body bytes with the
//! verdict of Stripe's own library (`stripe.WebhookSignature.verify_header`, the pinned
//! `stripe` package): the header is `t=<unix seconds>,v1=<hex>[,v1=<hex>...][,v0=...]`; a `v1`
//! is HMAC-SHA256 of `"{t}.{body}"` keyed by the endpoint's signing secret (`whsec_...`, used
//! as its bytes). Any `v1` may match any of the secrets held (Stripe signs with both the old
//! and the new secret while one is rolled); a timestamp older than the tolerance is refused (a
//! replayed delivery), one in the future is not.
//!
//! The route is public, so what a request costs is bounded before anything is hashed: the
//! header's size and items are capped, its form and the timestamp's age are checked first, and
//! the body is then hashed once per secret (not once per `v1`), each `v1` compared with those
//! MACs in constant time. Where the verdict differs from the package's (headers over the caps,
//! non-ASCII headers), the README says so; the test `webhook_signature` asks the package about
//! every case.
//!
//! Why ~590 lines: half are unit tests, the table of headers read as Python reads them beside
//! the MAC counts; the reading, the caps and the MACs are one verdict, kept in one place.

use aws_lc_rs::{constant_time, hmac};
use secrecy::{ExposeSecret, SecretString};

/// Stripe's libraries' default tolerance.
pub const DEFAULT_TOLERANCE_SECONDS: u64 = 300;

/// The longest `Stripe-Signature` header read, bytes. Stripe's own is about 150 bytes (a
/// timestamp, a `v1` per secret, a `v0` in test mode); API Gateway caps all headers at 10 KiB.
pub const MAX_HEADER_BYTES: usize = 8192;

/// The most comma-separated items read in the header.
pub const MAX_HEADER_ITEMS: usize = 64;

/// Python's `int()` refuses a decimal of more digits than this (`sys.int_info`'s default
/// `str_digits_check_threshold`), and the package with it.
const MAX_TIMESTAMP_DIGITS: usize = 4300;

/// A `v1` signature: HMAC-SHA256, written as 64 lowercase hex digits.
const SIGNATURE_BYTES: usize = 32;

/// Why a delivery's signature was refused (answered `400`, nothing stored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Stripe-Signature` header, or an empty one.
    #[error("no Stripe-Signature header")]
    Missing,
    /// The header is over [`MAX_HEADER_BYTES`] or [`MAX_HEADER_ITEMS`].
    #[error(
        "the Stripe-Signature header is over {MAX_HEADER_BYTES} bytes or {MAX_HEADER_ITEMS} items"
    )]
    Oversized,
    /// The header holds a character outside ASCII.
    #[error("the Stripe-Signature header is not ASCII")]
    NotAscii,
    /// The header has no timestamp, a timestamp that is not a decimal integer, an item `t` or
    /// `v1` without a value, or no `v1` signature.
    #[error("the Stripe-Signature header has no readable timestamp or no v1 signature")]
    Malformed,
    /// The timestamp is older than the tolerance: a replay, or a clock far off.
    #[error("the signature's timestamp is {age_s} s old, over the {tolerance_s} s tolerance")]
    Stale {
        /// How old the timestamp is (saturated at `i64::MAX`).
        age_s: i64,
        /// The tolerance.
        tolerance_s: u64,
    },
    /// The body is not UTF-8 (the package decodes it before signing).
    #[error("the body is not UTF-8")]
    BodyNotUtf8,
    /// No `v1` signature matches the body under the endpoint's signing secrets.
    #[error("no v1 signature matches the body under the endpoint's signing secrets")]
    NoMatch,
}

/// The header's timestamp as Python's `int()` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Timestamp {
    /// How the package writes it into the signed payload (`"%d"`): no sign for zero or a
    /// positive number, no leading zeros, no underscores.
    decimal: String,
    /// Its value, when it fits in 64 bits.
    value: Option<i64>,
    negative: bool,
}

impl Timestamp {
    /// `int(text)` for ASCII text: surrounding whitespace, one sign, decimal digits with single
    /// underscores between them, at most [`MAX_TIMESTAMP_DIGITS`] digits.
    fn read(text: &str) -> Option<Self> {
        let text = text.trim();
        let (negative, digits) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let well_formed = !digits.is_empty()
            && digits
                .split('_')
                .all(|group| !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()));
        if !well_formed {
            return None;
        }
        let clean: String = digits.chars().filter(|c| *c != '_').collect();
        if clean.len() > MAX_TIMESTAMP_DIGITS {
            return None;
        }
        let magnitude = match clean.trim_start_matches('0') {
            "" => "0",
            m => m,
        };
        let negative = negative && magnitude != "0";
        let decimal = if negative {
            format!("-{magnitude}")
        } else {
            magnitude.to_owned()
        };
        Some(Self {
            value: decimal.parse().ok(),
            decimal,
            negative,
        })
    }

    /// The package's `timestamp < time.time() - tolerance`, at millisecond precision.
    fn older_than(&self, tolerance_s: u64, now_ms: i64) -> Option<i64> {
        let limit_ms = i128::from(now_ms) - i128::from(tolerance_s) * 1000;
        let age = |t: i64| {
            let age_ms = i128::from(now_ms) - i128::from(t) * 1000;
            i64::try_from(age_ms / 1000).unwrap_or(i64::MAX)
        };
        match self.value {
            Some(t) if i128::from(t) * 1000 < limit_ms => Some(age(t)),
            Some(_) => None,
            // Beyond 64 bits: far in the past or far in the future.
            None => self.negative.then_some(i64::MAX),
        }
    }
}

/// A `Stripe-Signature` header read and checked for everything but the MACs: its form, its
/// caps and its timestamp's age. Cheap: no hashing of the body.
#[derive(Debug, Clone)]
pub struct SignedHeader {
    timestamp: Timestamp,
    /// The `v1` values that can match: exactly 64 lowercase hex digits, decoded (the package
    /// compares the strings, so anything else matches nothing).
    signatures: Vec<[u8; SIGNATURE_BYTES]>,
}

impl SignedHeader {
    /// Reads `header` as the package does, refusing first what costs nothing to refuse.
    pub fn read(
        header: Option<&str>,
        body: &[u8],
        tolerance_s: u64,
        now_ms: i64,
    ) -> Result<Self, SignatureError> {
        let header = header
            .filter(|h| !h.is_empty())
            .ok_or(SignatureError::Missing)?;
        if header.len() > MAX_HEADER_BYTES || header.split(',').nth(MAX_HEADER_ITEMS).is_some() {
            return Err(SignatureError::Oversized);
        }
        if !header.is_ascii() {
            return Err(SignatureError::NotAscii);
        }
        // As the package reads it: items split on `,`, each on its first two `=`; the first
        // `t` is the timestamp, every `v1` a signature; a `t` or `v1` without a value makes
        // the whole header unreadable (Python's IndexError), wherever it is.
        let mut timestamp = None;
        let mut v1_seen = false;
        let mut signatures = Vec::new();
        for item in header.split(',') {
            let mut parts = item.splitn(3, '=');
            let key = parts.next().unwrap_or_default();
            let value = parts.next();
            match (key, value) {
                ("t" | "v1", None) => return Err(SignatureError::Malformed),
                ("t", Some(t)) if timestamp.is_none() => timestamp = Some(t),
                ("v1", Some(v)) => {
                    v1_seen = true;
                    if let Some(sig) = decode_lowercase_hex(v) {
                        signatures.push(sig);
                    }
                }
                _ => {}
            }
        }
        let timestamp = timestamp
            .and_then(Timestamp::read)
            .ok_or(SignatureError::Malformed)?;
        if !v1_seen {
            return Err(SignatureError::Malformed);
        }
        if tolerance_s > 0 {
            if let Some(age_s) = timestamp.older_than(tolerance_s, now_ms) {
                return Err(SignatureError::Stale { age_s, tolerance_s });
            }
        }
        if std::str::from_utf8(body).is_err() {
            return Err(SignatureError::BodyNotUtf8);
        }
        Ok(Self {
            timestamp,
            signatures,
        })
    }

    /// Whether any signature is `body`'s under one of `secrets`, and how many MACs that took:
    /// one per distinct secret at most, none when no signature could match. A secret that is
    /// blank (only `" \t\r\n\f\v"`, as the package checks it) matches nothing.
    pub fn signed_by_any(&self, secrets: &[SecretString], body: &[u8]) -> Match {
        let mut macs = 0;
        if self.signatures.is_empty() {
            return Match {
                matched: false,
                macs,
            };
        }
        for (i, secret) in secrets.iter().enumerate() {
            let secret = secret.expose_secret();
            let blank = secret
                .trim_matches([' ', '\t', '\r', '\n', '\x0c', '\x0b'])
                .is_empty();
            let repeated = secrets[..i].iter().any(|s| s.expose_secret() == secret);
            if blank || repeated {
                continue;
            }
            macs += 1;
            let expected = mac(secret, &self.timestamp.decimal, body);
            // Every signature is compared, in constant time, whatever matched before it.
            let mut matched = false;
            for sig in &self.signatures {
                matched |= constant_time::verify_slices_are_equal(expected.as_ref(), sig).is_ok();
            }
            if matched {
                return Match {
                    matched: true,
                    macs,
                };
            }
        }
        Match {
            matched: false,
            macs,
        }
    }
}

/// The outcome of [`SignedHeader::signed_by_any`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// A signature matched.
    pub matched: bool,
    /// MACs computed over the body.
    pub macs: usize,
}

fn decode_lowercase_hex(v: &str) -> Option<[u8; SIGNATURE_BYTES]> {
    let lowercase_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if v.len() != 2 * SIGNATURE_BYTES || !v.bytes().all(lowercase_hex) {
        return None;
    }
    let mut out = [0u8; SIGNATURE_BYTES];
    hex::decode_to_slice(v, &mut out).ok()?;
    Some(out)
}

fn mac(secret: &str, timestamp: &str, body: &[u8]) -> hmac::Tag {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let mut context = hmac::Context::with_key(&key);
    context.update(timestamp.as_bytes());
    context.update(b".");
    context.update(body);
    context.sign()
}

/// The endpoint's signing secrets and the timestamp tolerance.
#[derive(Clone)]
pub struct SignatureCheck {
    secrets: Vec<SecretString>,
    tolerance_s: u64,
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
    /// timestamps older than `tolerance_s` (0: no age limit, as in Stripe's libraries).
    pub fn new(secrets: Vec<SecretString>, tolerance_s: u64) -> Self {
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

    /// Verifies `header` over the raw `body` at `now_ms` (unix milliseconds).
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now_ms: i64,
    ) -> Result<(), SignatureError> {
        let signed = SignedHeader::read(header, body, self.tolerance_s, now_ms)?;
        if signed.signed_by_any(&self.secrets, body).matched {
            Ok(())
        } else {
            Err(SignatureError::NoMatch)
        }
    }
}

/// The `Stripe-Signature` header Stripe would send for `body` at `t` under `secrets` (one
/// `v1` per secret): for tests and the local tools that deliver events.
pub fn sign(secrets: &[&str], t: i64, body: &[u8]) -> String {
    let mut header = format!("t={t}");
    for secret in secrets {
        header.push_str(",v1=");
        header.push_str(&hex::encode(mac(secret, &t.to_string(), body)));
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;
    const NOW_MS: i64 = NOW * 1000;

    fn secrets(held: &[&str]) -> Vec<SecretString> {
        held.iter()
            .map(|s| SecretString::from((*s).to_owned()))
            .collect()
    }

    fn check(held: &[&str]) -> SignatureCheck {
        SignatureCheck::new(secrets(held), DEFAULT_TOLERANCE_SECONDS)
    }

    #[test]
    fn a_signed_body_is_accepted_and_any_change_refused() {
        let body = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
        let header = sign(&["whsec_a"], NOW, body);
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&header), body, NOW_MS),
            Ok(())
        );
        let tampered = br#"{"id":"evt_1","type":"payment_intent.canceled"}"#;
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&header), tampered, NOW_MS),
            Err(SignatureError::NoMatch)
        );
        assert_eq!(
            check(&["whsec_b"]).verify(Some(&header), body, NOW_MS),
            Err(SignatureError::NoMatch)
        );
        // The timestamp is signed: moving it breaks the signature.
        let moved = header.replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&moved), body, NOW_MS),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn a_stale_timestamp_is_refused_and_a_future_one_is_not() {
        let body = b"{}";
        let old = sign(&["whsec_a"], NOW - 301, body);
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&old), body, NOW_MS),
            Err(SignatureError::Stale {
                age_s: 301,
                tolerance_s: 300
            })
        );
        // The package compares with time.time(): exactly at the tolerance is still fresh, a
        // millisecond later is not.
        let edge = sign(&["whsec_a"], NOW - 300, body);
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&edge), body, NOW_MS),
            Ok(())
        );
        assert!(matches!(
            check(&["whsec_a"]).verify(Some(&edge), body, NOW_MS + 1),
            Err(SignatureError::Stale { .. })
        ));
        let ahead = sign(&["whsec_a"], NOW + 3600, body);
        assert_eq!(
            check(&["whsec_a"]).verify(Some(&ahead), body, NOW_MS),
            Ok(())
        );
        // No age limit: any age.
        assert_eq!(
            SignatureCheck::new(secrets(&["whsec_a"]), 0).verify(Some(&old), body, NOW_MS),
            Ok(())
        );
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
            assert_eq!(check(held).verify(Some(&both), body, NOW_MS), Ok(()));
        }
        assert_eq!(
            check(&["whsec_old", "whsec_new"]).verify(Some(&only_new), body, NOW_MS),
            Ok(())
        );
        assert_eq!(
            check(&["whsec_old"]).verify(Some(&only_new), body, NOW_MS),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        let body = b"{}";
        let c = check(&["whsec_a"]);
        let good = sign(&["whsec_a"], NOW, body);
        let sig = good.split("v1=").nth(1).unwrap();
        let refused = |header: &str| c.verify(Some(header), body, NOW_MS);
        assert_eq!(c.verify(None, body, NOW_MS), Err(SignatureError::Missing));
        assert_eq!(refused(""), Err(SignatureError::Missing));
        for malformed in [
            format!("v1={sig}"),
            format!("t={NOW}"),
            "t=x,v1=00".to_owned(),
            // Bare items, wherever they are: the package's IndexError.
            format!("{good},v1"),
            format!("{good},t"),
            format!("t,{good}"),
            // Not Python integers.
            format!("t=_{NOW},v1={sig}"),
            format!("t={NOW}_,v1={sig}"),
            format!("t=1__{NOW},v1={sig}"),
            format!("t=+-{NOW},v1={sig}"),
            format!("t=- {NOW},v1={sig}"),
            format!("t=0x10,v1={sig}"),
            format!("t={},v1={sig}", "1".repeat(MAX_TIMESTAMP_DIGITS + 1)),
            // A v0 (test-mode legacy scheme) alone is not a v1; nor is V1.
            good.replace("v1=", "v0="),
            good.replace("v1=", "V1="),
        ] {
            assert_eq!(
                refused(&malformed),
                Err(SignatureError::Malformed),
                "{malformed}"
            );
        }
        assert_eq!(
            refused(&format!("t={NOW},v1=not-hex")),
            Err(SignatureError::NoMatch)
        );
        assert_eq!(
            refused(&format!("{good},v1=caf\u{e9}")),
            Err(SignatureError::NotAscii)
        );
        assert_eq!(
            c.verify(Some(&good), b"\xff\xfe", NOW_MS),
            Err(SignatureError::BodyNotUtf8)
        );
    }

    #[test]
    fn the_timestamp_is_read_as_python_reads_an_integer() {
        let body = b"{}";
        let c = SignatureCheck::new(secrets(&["whsec_a"]), 0);
        // (as written in the header, as the package signs it)
        for (written, signed) in [
            ("+1800000000", "1800000000"),
            ("001800000000", "1800000000"),
            ("1_800_000_000", "1800000000"),
            (" 1800000000\t", "1800000000"),
            ("-0", "0"),
            ("-5", "-5"),
            (
                "1796233098123456789012345678901234567890",
                "1796233098123456789012345678901234567890",
            ),
            ("-99999999999999999999999", "-99999999999999999999999"),
        ] {
            let sig = hex::encode(mac("whsec_a", signed, body));
            let header = format!("t={written},v1={sig}");
            assert_eq!(c.verify(Some(&header), body, NOW_MS), Ok(()), "{header}");
        }
        // Beyond 64 bits: far in the future is fresh, far in the past stale.
        let t = |written: &str| Timestamp::read(written).unwrap();
        assert_eq!(t("99999999999999999999999").older_than(300, NOW_MS), None);
        assert_eq!(
            t("-99999999999999999999999").older_than(300, NOW_MS),
            Some(i64::MAX)
        );
    }

    #[test]
    fn a_forged_request_costs_one_mac_per_secret_at_most() {
        let body = vec![b'x'; 256 * 1024];
        let two = secrets(&["whsec_old", "whsec_new"]);
        // A header as full of signatures as the caps allow, none of them right.
        let mut forged = format!("t={NOW}");
        while forged.len() + 68 <= MAX_HEADER_BYTES && forged.split(',').count() < MAX_HEADER_ITEMS
        {
            forged.push_str(&format!(",v1={}", "ab".repeat(32)));
        }
        let signed = SignedHeader::read(Some(&forged), &body, 300, NOW_MS).unwrap();
        assert_eq!(signed.signatures.len(), MAX_HEADER_ITEMS - 1);
        assert_eq!(
            signed.signed_by_any(&two, &body),
            Match {
                matched: false,
                macs: 2
            }
        );
        // Empty or non-hex signatures cost no MAC at all.
        let empty = format!("t={NOW}{}", ",v1=".repeat(MAX_HEADER_ITEMS - 1));
        let signed = SignedHeader::read(Some(&empty), &body, 300, NOW_MS).unwrap();
        assert_eq!(signed.signed_by_any(&two, &body).macs, 0);
        // A stale, oversized or malformed header is refused before any MAC.
        let stale = forged.replace(&format!("t={NOW}"), &format!("t={}", NOW - 301));
        assert!(SignedHeader::read(Some(&stale), &body, 300, NOW_MS).is_err());
        let oversized = format!("{forged},v1=00");
        assert_eq!(
            SignedHeader::read(Some(&oversized), &body, 300, NOW_MS).unwrap_err(),
            SignatureError::Oversized
        );
        // A secret held twice is hashed with once.
        let twice = secrets(&["whsec_old", "whsec_old"]);
        assert_eq!(
            signed.signed_by_any(&twice, &body).macs,
            0,
            "no candidate: none"
        );
        let full = SignedHeader::read(Some(&forged), &body, 300, NOW_MS).unwrap();
        assert_eq!(full.signed_by_any(&twice, &body).macs, 1);
        // A genuine signature by the second secret: two MACs, and a match.
        let genuine = sign(&["whsec_new"], NOW, &body);
        let signed = SignedHeader::read(Some(&genuine), &body, 300, NOW_MS).unwrap();
        assert_eq!(
            signed.signed_by_any(&two, &body),
            Match {
                matched: true,
                macs: 2
            }
        );
    }

    #[test]
    fn blank_secrets_match_nothing() {
        let body = b"{}";
        let header = sign(&[" \t"], NOW, body);
        assert_eq!(
            check(&[" \t"]).verify(Some(&header), body, NOW_MS),
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
