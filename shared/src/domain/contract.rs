//! The message contract's versions: what a processor reads, and what a producer may write.
//!
//! A message says its version in `contract_version` (absent: 1; this release's producers never
//! write the field for version 1, so that a processor of a release before versions existed,
//! which refuses unknown fields, still reads what they send). A processor reads the version before its own and the one
//! after it: each release reads one version ahead of what any producer of that release writes,
//! and producers move to the next version only by configuration (`MESSAGE_CONTRACT_VERSION`,
//! the template's `MessageContractVersion`), once every processor deployed reads it. So a
//! deploy in either direction, forwards or rolled back, finds every message in flight readable:
//!
//! | version | payments add | refunds add |
//! |---|---|---|
//! | 1 | (the contract as it was first written) | (the same) |
//! | 2 | `statement_descriptor_suffix`, optional | nothing |
//!
//! A later version is refused with `contract_unsupported` (the dead letter says which version
//! came and which are read; it is redriven once processors that read it are deployed). A
//! field a version adds is optional and changes no fingerprint while absent: the same payment
//! sent as version 1 or 2 is the same request.

use std::ops::RangeInclusive;

/// The versions this release's processors read.
pub const READS: RangeInclusive<u64> = 1..=2;

/// The versions a producer of this release may be configured to write.
pub const WRITES: RangeInclusive<u64> = 1..=2;

/// The message field that names the version.
pub const FIELD: &str = "contract_version";

/// The dead-letter code of a message of a version this release does not read.
pub const UNSUPPORTED: &str = "contract_unsupported";

/// A message's version (`None`: the field is absent, version 1), checked against [`READS`]:
/// the version, or why it cannot be read.
pub fn read(given: Option<u64>) -> Result<u64, String> {
    let version = given.unwrap_or(1);
    if version == 0 {
        return Err(format!("{FIELD} 0 does not exist: versions start at 1"));
    }
    if READS.contains(&version) {
        Ok(version)
    } else {
        Err(format!(
            "{FIELD} {version}: this processor reads {} to {}; deploy processors that read it, then redrive",
            READS.start(),
            READS.end()
        ))
    }
}

/// The version a producer writes, from its configuration (`None`: 1).
pub fn writes(configured: Option<&str>) -> Result<u64, String> {
    let Some(text) = configured.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(1);
    };
    match text.parse::<u64>() {
        Ok(v) if WRITES.contains(&v) => Ok(v),
        _ => Err(format!(
            "MESSAGE_CONTRACT_VERSION must be {} to {}, got {text:?}",
            WRITES.start(),
            WRITES.end()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_processor_reads_the_first_version_and_the_next_and_refuses_later_ones() {
        assert_eq!(read(None), Ok(1));
        assert_eq!(read(Some(2)), Ok(2));
        assert_eq!(read(Some(1)), Ok(1));
        let later = read(Some(3)).unwrap_err();
        assert!(
            later.contains("reads 1 to 2") && later.contains("redrive"),
            "{later}"
        );
        assert!(read(Some(0)).unwrap_err().contains("start at 1"));
    }

    #[test]
    fn a_producer_writes_a_version_of_its_release_only() {
        assert_eq!(writes(None), Ok(1));
        assert_eq!(writes(Some(" 2 ")), Ok(2));
        assert!(writes(Some("3")).is_err());
        assert!(writes(Some("two")).is_err());
    }
}
