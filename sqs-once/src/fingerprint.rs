//! A canonical, versioned digest of a request's meaning, for [`crate::Work::fingerprint`].
//!
//! A fingerprint must not change when the request's meaning does not: not with the order of
//! keys in a body, not with a deploy that adds an optional field or renames a struct member.
//! Hashing a serializer's output ties the fingerprint to the code's shape, and a deploy that
//! changed that shape would turn every message in flight into "key reuse". So the digest is
//! built from named fields, each written as its length-prefixed name and value, in the order
//! the work gives them; an absent optional field writes nothing, so adding one changes no
//! existing fingerprint. The version (`"payment/v1"`) is part of the digest and of its text:
//! a work that must change what it hashes names a new version and accepts the old one in
//! [`crate::Work::same_request`].

use sha2::{Digest, Sha256};

/// Builds a fingerprint: `Fingerprint::new("job/v1").field("id", "a").finish()`.
#[derive(Clone)]
pub struct Fingerprint {
    /// The version, written first and kept as the text's prefix.
    version: String,
    /// The digest so far.
    hasher: Sha256,
}

impl Fingerprint {
    /// Starts a fingerprint of this version (no `:` in it).
    pub fn new(version: &str) -> Self {
        let mut f = Self {
            version: version.replace(':', "_"),
            hasher: Sha256::new(),
        };
        let v = f.version.clone();
        f.write("version", &v);
        f
    }

    fn write(&mut self, name: &str, value: &str) {
        for part in [name, value] {
            self.hasher.update((part.len() as u64).to_be_bytes());
            self.hasher.update(part.as_bytes());
        }
    }

    /// Adds a field.
    pub fn field(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        let value = value.to_string();
        self.write(name, &value);
        self
    }

    /// Adds an optional field; `None` adds nothing, as if the field did not exist.
    pub fn optional(self, name: &str, value: Option<impl std::fmt::Display>) -> Self {
        match value {
            Some(v) => self.field(name, v),
            None => self,
        }
    }

    /// `"<version>:<sha-256 in hex>"`.
    pub fn finish(self) -> String {
        let digest = self.hasher.finalize();
        let mut out = String::with_capacity(self.version.len() + 1 + 64);
        out.push_str(&self.version);
        out.push(':');
        for b in digest {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_optional_field_changes_nothing_and_every_value_counts() {
        let base = || {
            Fingerprint::new("job/v1")
                .field("id", "a")
                .field("amount", 100)
        };
        let plain = base().finish();
        assert!(plain.starts_with("job/v1:") && plain.len() == "job/v1:".len() + 64);
        assert_eq!(base().optional("note", None::<&str>).finish(), plain);
        assert_ne!(base().optional("note", Some("")).finish(), plain);
        assert_ne!(base().field("amount", 101).finish(), plain);
        assert_ne!(
            Fingerprint::new("job/v2")
                .field("id", "a")
                .field("amount", 100)
                .finish(),
            plain
        );
        // Length prefixes: no two field lists run together into the same bytes.
        assert_ne!(
            Fingerprint::new("v").field("ab", "c").finish(),
            Fingerprint::new("v").field("a", "bc").finish()
        );
    }
}
