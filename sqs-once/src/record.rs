//! The idempotency record and the claim, execute, complete state machine.
//!
//! One record per idempotency key. [`IdempotencyStore`] is the port; the DynamoDB adapter lives
//! in [`crate::dynamo`], an in-memory one in [`crate::memory`]. What to do after a claim is
//! decided here, by [`decide_conflict`], from the record that the failed conditional write
//! returned (`ALL_OLD`), so a conflict costs one round trip and no read.
//!
//! A claim succeeds, in one conditional write, when no record exists, or when the record has
//! the same fingerprint and is either `IN_PROGRESS` with a lease that ended, or `FAILED` and
//! past its `not_before`. Completions, failures and renewals are conditional on the claimant's
//! fencing token and `IN_PROGRESS`, so an attempt that lost its lease changes nothing.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordStatus {
    /// An attempt holds the lease and may be executing now.
    InProgress,
    /// A terminal outcome is stored; duplicates are acknowledged with it.
    Completed,
    /// The last attempt failed in a retryable way; the next delivery may claim it.
    Failed,
}

impl RecordStatus {
    /// The value of the `status` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::InProgress => "IN_PROGRESS",
            RecordStatus::Completed => "COMPLETED",
            RecordStatus::Failed => "FAILED",
        }
    }

    /// Parses the `status` attribute; `None` for a value this version does not know.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "IN_PROGRESS" => Some(RecordStatus::InProgress),
            "COMPLETED" => Some(RecordStatus::Completed),
            "FAILED" => Some(RecordStatus::Failed),
            _ => None,
        }
    }
}

/// One value of an [`Outcome`]: stored as a DynamoDB string or number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    /// A string (`S`).
    Text(String),
    /// An integer (`N`), e.g. an amount in minor units.
    Number(i64),
}

/// The stored result of one unit of work: a status word and named values, kept in the
/// record's `outcome` map. Duplicates are acknowledged with it, so it holds what a caller of
/// the work needs to know afterwards (an id the downstream gave, an amount, a reason).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// What happened, in one word (`succeeded`, `declined`, `rejected`, ...): the work decides
    /// the words and what each one means (see [`crate::Work::verdict`]).
    pub status: String,
    /// Everything else worth keeping, by name. `status` is not a valid name here.
    pub fields: BTreeMap<String, Value>,
}

impl Outcome {
    /// An outcome with this status and no values.
    pub fn new(status: impl Into<String>) -> Self {
        Self {
            status: status.into(),
            fields: BTreeMap::new(),
        }
    }

    /// Adds a string value.
    pub fn with_text(mut self, name: &str, value: impl Into<String>) -> Self {
        self.fields
            .insert(name.to_owned(), Value::Text(value.into()));
        self
    }

    /// Adds a string value when there is one.
    pub fn with_text_opt(self, name: &str, value: Option<impl Into<String>>) -> Self {
        match value {
            Some(v) => self.with_text(name, v),
            None => self,
        }
    }

    /// Adds a number value.
    pub fn with_number(mut self, name: &str, value: i64) -> Self {
        self.fields.insert(name.to_owned(), Value::Number(value));
        self
    }

    /// A string value, if present and a string.
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.fields.get(name) {
            Some(Value::Text(v)) => Some(v),
            _ => None,
        }
    }

    /// A number value, if present and a number.
    pub fn number(&self, name: &str) -> Option<i64> {
        match self.fields.get(name) {
            Some(Value::Number(v)) => Some(*v),
            _ => None,
        }
    }
}

/// One idempotency record, as read back from the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// The idempotency key (the item's key is the store's prefix followed by it).
    pub key: String,
    /// Where the protocol stands.
    pub status: RecordStatus,
    /// SHA-256 of the canonical request that first claimed the key.
    pub payload_hash: String,
    /// Fencing token of the attempt that holds (or last held) the record.
    pub lease_owner: Option<String>,
    /// Epoch ms after which an `IN_PROGRESS` record may be taken over.
    pub lease_expires_at_ms: i64,
    /// Claims so far.
    pub attempts: i64,
    /// The terminal outcome, once `COMPLETED`.
    pub outcome: Option<Outcome>,
    /// DynamoDB TTL, epoch s.
    pub expires_at_s: i64,
    /// Epoch ms of the first claim; bounds how long the downstream may still remember the key.
    pub first_attempt_at_ms: i64,
    /// An earlier attempt's call may have taken effect without the record knowing (sticky until settled).
    pub unknown_outcome: bool,
    /// The last retryable error, for operators.
    pub last_error: Option<String>,
    /// Epoch ms of the completion (`completed_at`), for operators and latency measurements.
    pub completed_at_ms: Option<i64>,
    /// Epoch ms before which no claim may take a `FAILED` record over (`not_before`): the last
    /// call whose answer was not definitive may still land downstream until then (its
    /// send + the call timeout + the downstream's processing allowance). Kept across claims,
    /// so a later attempt knows when a lookup can prove that no effect exists.
    pub not_before_ms: Option<i64>,
    /// The W3C `traceparent` of the first claim's message span (`traceparent`, kept across
    /// claims): what the payment's later work (its refunds, the provider's events) links to,
    /// and how an operator finds its trace. `None` when no claim was traced.
    pub traceparent: Option<String>,
}

impl IdempotencyRecord {
    /// The latest time a call of the attempt that left this record may still land
    /// downstream: its `not_before`, or the end of an `IN_PROGRESS` lease (calls are sent
    /// only while the lease outlasts the call timeout plus the processing allowance).
    pub fn last_landing(&self) -> Option<i64> {
        let lease = (self.status == RecordStatus::InProgress).then_some(self.lease_expires_at_ms);
        match (self.not_before_ms, lease) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A fresh claim, written with one conditional write.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The idempotency key to claim.
    pub key: String,
    /// Hash of this message's canonical request.
    pub payload_hash: String,
    /// This attempt's random fencing token.
    pub owner: String,
    /// The claim's clock, epoch ms: leases that ended before it may be taken over.
    pub now_ms: i64,
    /// Where this attempt's lease ends, epoch ms.
    pub lease_expires_at_ms: i64,
    /// TTL for a new record, epoch s (an existing record keeps its own).
    pub expires_at_s: i64,
    /// The claiming message span's W3C `traceparent`, kept by a record that has none yet.
    pub traceparent: Option<String>,
}

/// What the conditional claim write found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// This attempt holds the lease. `previous` is the record it replaced (`None` when the
    /// key was new): an expired `IN_PROGRESS` or a `FAILED` record.
    Claimed {
        /// The record taken over, as `ALL_OLD` returned it.
        previous: Option<IdempotencyRecord>,
    },
    /// The condition failed; this is the record that stopped it.
    Conflict(IdempotencyRecord),
}

/// Why a retryable failure is recorded, and whether it leaves the outcome unknown.
#[derive(Debug, Clone)]
pub struct FailureNote {
    /// Human-readable last error (never a secret).
    pub error: String,
    /// The call may have taken effect (an answer that was not definitive), or an earlier attempt
    /// left the outcome unknown. `true` sets the record's mark; `false` leaves the stored mark
    /// as it is: only a completion clears it (the mark is sticky).
    pub unknown_outcome: bool,
    /// When set, the record refuses every claim until this epoch ms (`not_before`): a call of
    /// this attempt may still land downstream until then.
    pub not_before_ms: Option<i64>,
}

/// Errors of the store. Every one but [`StoreError::LeaseLost`] is retryable.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The record is no longer ours: another attempt took the lease over. Stop, do not complete.
    #[error("lease lost: another attempt owns the record")]
    LeaseLost,
    /// Throttling, a network error, or an endpoint error: try again later.
    #[error("idempotency store unavailable: {0}")]
    Unavailable(String),
    /// The stored record cannot be read by this version (a corrupt or foreign item).
    #[error("idempotency record is malformed: {0}")]
    Malformed(String),
}

/// Written beside a key's record when one of its messages is dead-lettered, so that a status
/// query can say so. It carries the
/// payload hash of the dead-lettered message: a reader shows it only for the request with that
/// hash. Informative only: no claim reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterMark {
    /// The idempotency key whose message was dead-lettered.
    pub key: String,
    /// Hash of the dead-lettered message's canonical request.
    pub payload_hash: String,
    /// The dead letter's `error_code`.
    pub error_code: String,
    /// The dead letter's `error_message`.
    pub error_message: String,
    /// Epoch ms of the dead-lettering.
    pub at_ms: i64,
    /// DynamoDB TTL, epoch s.
    pub expires_at_s: i64,
}

/// The `error_code` of a message refused because its key names another request. Its mark is
/// the refused request's (its own fingerprint), and yields to any mark of the key's own
/// request: it is written only where no mark of another code is.
pub const KEY_REUSED: &str = "idempotency_key_reused";

impl DeadLetterMark {
    /// Whether this mark is for a request that its key does not name ([`KEY_REUSED`]): it
    /// never replaces a mark of another code.
    pub fn yields(&self) -> bool {
        self.error_code == KEY_REUSED
    }
}

/// The port over the idempotency table.
///
/// Failure behaviour, for every method: [`StoreError::LeaseLost`] when a write conditional on
/// the lease finds another owner (or no `IN_PROGRESS` record), [`StoreError::Unavailable`]
/// for anything the caller may retry (throttling, the network), [`StoreError::Malformed`]
/// for an item this version cannot read. No method panics.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claims the key with one conditional write (the condition is in this module's docs),
    /// returning the old record on conflict in the same round trip.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimResult, StoreError>;
    /// Stores the terminal outcome, only while `owner` holds an `IN_PROGRESS` lease; with
    /// `expires_at_s`, the record's TTL becomes that epoch second (the runner passes one only
    /// later than the claim's, see [`crate::Work::retention_after`]).
    async fn complete(
        &self,
        key: &str,
        owner: &str,
        outcome: &Outcome,
        expires_at_s: Option<i64>,
    ) -> Result<(), StoreError>;
    /// Records a retryable failure and releases the lease, only while `owner` holds it. Never
    /// clears the unknown-outcome mark; sets `not_before` when the note carries one.
    async fn fail(
        &self,
        key: &str,
        owner: &str,
        now_ms: i64,
        note: &FailureNote,
    ) -> Result<(), StoreError>;
    /// Moves the lease end to `until_ms`, only while `owner` holds an `IN_PROGRESS` lease.
    async fn renew_lease(&self, key: &str, owner: &str, until_ms: i64) -> Result<(), StoreError>;
    /// Reads a record (status queries, expired messages and tests; the hot path never reads).
    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError>;
    /// Stores (or replaces) the key's dead-letter mark. Never touches the record.
    async fn mark_dead_lettered(&self, mark: &DeadLetterMark) -> Result<(), StoreError>;
}

/// What to do with a message whose claim met an existing record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictDecision {
    /// Completed with the same payload: acknowledge, execute nothing.
    Duplicate(Outcome),
    /// The key was used for another payload: terminal, to the DLQ.
    KeyReused,
    /// Another attempt holds a live lease: come back when it ends (epoch ms).
    Busy {
        /// When the other attempt's lease ends.
        lease_expires_at_ms: i64,
    },
    /// A `FAILED` record whose last ambiguous call may still land downstream: no claim
    /// before `not_before_ms`.
    NotYet {
        /// When the record may be claimed.
        not_before_ms: i64,
    },
    /// The record is `IN_PROGRESS` under this attempt's own fencing token: the claim write was
    /// applied, its answer was lost, and the SDK's retry was refused by the first write. This
    /// attempt holds the lease; what it replaced is unknown, so the outcome is treated as
    /// unknown.
    OwnClaim,
    /// The record allowed a claim yet the write was refused (it changed between the write and
    /// the read, or it is not a state this version knows): retry the message shortly.
    Retry,
}

/// Decides the next action from the record that refused the claim. Payload validation comes
/// first, on every path: a different payload is key reuse whatever the status.
pub fn decide_conflict(
    existing: &IdempotencyRecord,
    payload_hash: &str,
    owner: &str,
    now_ms: i64,
) -> ConflictDecision {
    if existing.payload_hash != payload_hash {
        return ConflictDecision::KeyReused;
    }
    if existing.status == RecordStatus::InProgress && existing.lease_owner.as_deref() == Some(owner)
    {
        return ConflictDecision::OwnClaim;
    }
    match existing.status {
        RecordStatus::Completed => match &existing.outcome {
            Some(outcome) => ConflictDecision::Duplicate(outcome.clone()),
            None => ConflictDecision::Retry,
        },
        RecordStatus::InProgress if existing.lease_expires_at_ms >= now_ms => {
            ConflictDecision::Busy {
                lease_expires_at_ms: existing.lease_expires_at_ms,
            }
        }
        RecordStatus::Failed => match existing.not_before_ms {
            Some(t) if t >= now_ms => ConflictDecision::NotYet { not_before_ms: t },
            _ => ConflictDecision::Retry,
        },
        RecordStatus::InProgress => ConflictDecision::Retry,
    }
}

/// Whether the attempt that just claimed inherits an unknown outcome from the record it took
/// over: an expired `IN_PROGRESS` (its owner may have executed and died) or a `FAILED` record
/// still marked unknown.
pub fn inherits_unknown_outcome(previous: Option<&IdempotencyRecord>) -> bool {
    match previous {
        None => false,
        Some(r) => match r.status {
            RecordStatus::InProgress => true,
            RecordStatus::Failed => r.unknown_outcome,
            RecordStatus::Completed => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: RecordStatus, hash: &str, lease: i64) -> IdempotencyRecord {
        IdempotencyRecord {
            traceparent: None,
            key: "k_1".into(),
            status,
            payload_hash: hash.into(),
            lease_owner: Some("owner".into()),
            lease_expires_at_ms: lease,
            attempts: 1,
            outcome: (status == RecordStatus::Completed)
                .then(|| Outcome::new("succeeded").with_text("receipt", "r_1")),
            expires_at_s: 0,
            first_attempt_at_ms: 0,
            unknown_outcome: false,
            last_error: None,
            completed_at_ms: None,
            not_before_ms: None,
        }
    }

    #[test]
    fn completed_same_payload_is_a_duplicate() {
        let r = record(RecordStatus::Completed, "h", 0);
        assert!(matches!(
            decide_conflict(&r, "h", "me", 10),
            ConflictDecision::Duplicate(o) if o.text("receipt") == Some("r_1")
        ));
    }

    #[test]
    fn another_payload_is_key_reuse_in_every_status() {
        for s in [
            RecordStatus::Completed,
            RecordStatus::InProgress,
            RecordStatus::Failed,
        ] {
            assert_eq!(
                decide_conflict(&record(s, "h", i64::MAX), "other", "me", 10),
                ConflictDecision::KeyReused
            );
        }
    }

    #[test]
    fn live_lease_is_busy_until_it_ends() {
        let r = record(RecordStatus::InProgress, "h", 5_000);
        assert_eq!(
            decide_conflict(&r, "h", "me", 1_000),
            ConflictDecision::Busy {
                lease_expires_at_ms: 5_000
            }
        );
    }

    #[test]
    fn expired_lease_or_failed_that_refused_a_claim_is_retried() {
        assert_eq!(
            decide_conflict(&record(RecordStatus::InProgress, "h", 5), "h", "me", 10),
            ConflictDecision::Retry
        );
        assert_eq!(
            decide_conflict(&record(RecordStatus::Failed, "h", 0), "h", "me", 10),
            ConflictDecision::Retry
        );
    }

    #[test]
    fn a_refused_retry_of_our_own_applied_claim_is_ours() {
        // The SDK retried a claim whose first write was applied: the refusal returns our lease.
        let mut r = record(RecordStatus::InProgress, "h", i64::MAX);
        r.lease_owner = Some("me".into());
        assert_eq!(
            decide_conflict(&r, "h", "me", 10),
            ConflictDecision::OwnClaim
        );
        // Someone else's live lease is still busy.
        assert!(matches!(
            decide_conflict(&r, "h", "another", 10),
            ConflictDecision::Busy { .. }
        ));
    }

    #[test]
    fn a_failed_record_is_not_claimed_before_its_not_before() {
        let mut r = record(RecordStatus::Failed, "h", 0);
        r.not_before_ms = Some(5_000);
        assert_eq!(
            decide_conflict(&r, "h", "me", 1_000),
            ConflictDecision::NotYet {
                not_before_ms: 5_000
            }
        );
        assert_eq!(
            decide_conflict(&r, "h", "me", 6_000),
            ConflictDecision::Retry
        );
    }

    #[test]
    fn takeover_of_expired_in_progress_is_unknown_and_sticky_through_failed() {
        assert!(!inherits_unknown_outcome(None));
        let ip = record(RecordStatus::InProgress, "h", 5);
        assert!(inherits_unknown_outcome(Some(&ip)));
        let mut failed = record(RecordStatus::Failed, "h", 0);
        assert!(!inherits_unknown_outcome(Some(&failed)));
        failed.unknown_outcome = true;
        assert!(inherits_unknown_outcome(Some(&failed)));
    }
}
