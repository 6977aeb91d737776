//! An in-memory [`IdempotencyStore`] with the same conditional semantics as the DynamoDB
//! adapter: for unit tests of code built on this crate, and for the protocol tests here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::record::{
    ClaimRequest, ClaimResult, DeadLetterMark, FailureNote, IdempotencyRecord, IdempotencyStore,
    Outcome, RecordStatus, StoreError,
};

/// Records in a map behind a mutex; every operation is atomic like a conditional write.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    /// Records by key.
    records: Mutex<HashMap<String, IdempotencyRecord>>,
    /// Store calls made (claims, completions, failures, renewals, reads), to assert costs.
    calls: AtomicU64,
    /// Lease renewals made (heartbeats).
    renewals: AtomicU64,
    /// Dead-letter marks by key.
    marks: Mutex<HashMap<String, DeadLetterMark>>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Store calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Lease renewals so far.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::SeqCst)
    }

    /// Puts a record as is (to set up a scenario).
    pub fn insert(&self, record: IdempotencyRecord) {
        if let Ok(mut m) = self.records.lock() {
            m.insert(record.key.clone(), record);
        }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut HashMap<String, IdempotencyRecord>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut m = self
            .records
            .lock()
            .map_err(|_| StoreError::Unavailable("store mutex poisoned".into()))?;
        f(&mut m)
    }

    fn owned<'m>(
        m: &'m mut HashMap<String, IdempotencyRecord>,
        id: &str,
        owner: &str,
    ) -> Result<&'m mut IdempotencyRecord, StoreError> {
        match m.get_mut(id) {
            Some(r)
                if r.status == RecordStatus::InProgress
                    && r.lease_owner.as_deref() == Some(owner) =>
            {
                Ok(r)
            }
            _ => Err(StoreError::LeaseLost),
        }
    }
}

#[async_trait]
impl IdempotencyStore for InMemoryStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimResult, StoreError> {
        self.with(|m| {
            let key = req.key.clone();
            let previous = m.get(&key).cloned();
            if let Some(r) = &previous {
                let takeover = r.payload_hash == req.payload_hash
                    && ((r.status == RecordStatus::InProgress
                        && r.lease_expires_at_ms < req.now_ms)
                        || (r.status == RecordStatus::Failed
                            && r.not_before_ms.is_none_or(|t| t < req.now_ms)));
                if !takeover {
                    return Ok(ClaimResult::Conflict(r.clone()));
                }
            }
            let base = previous.clone().unwrap_or(IdempotencyRecord {
                traceparent: None,
                key: key.clone(),
                status: RecordStatus::InProgress,
                payload_hash: req.payload_hash.clone(),
                lease_owner: None,
                lease_expires_at_ms: 0,
                attempts: 0,
                outcome: None,
                expires_at_s: req.expires_at_s,
                first_attempt_at_ms: req.now_ms,
                unknown_outcome: false,
                last_error: None,
                completed_at_ms: None,
                not_before_ms: None,
            });
            m.insert(
                key,
                IdempotencyRecord {
                    status: RecordStatus::InProgress,
                    lease_owner: Some(req.owner.clone()),
                    lease_expires_at_ms: req.lease_expires_at_ms,
                    attempts: base.attempts + 1,
                    traceparent: base.traceparent.clone().or_else(|| req.traceparent.clone()),
                    ..base
                },
            );
            Ok(ClaimResult::Claimed { previous })
        })
    }

    async fn complete(
        &self,
        id: &str,
        owner: &str,
        outcome: &Outcome,
        expires_at_s: Option<i64>,
    ) -> Result<(), StoreError> {
        self.with(|m| {
            let r = Self::owned(m, id, owner)?;
            if let Some(t) = expires_at_s {
                r.expires_at_s = t;
            }
            r.status = RecordStatus::Completed;
            r.outcome = Some(outcome.clone());
            r.unknown_outcome = false;
            r.last_error = None;
            Ok(())
        })
    }

    async fn fail(
        &self,
        id: &str,
        owner: &str,
        now_ms: i64,
        note: &FailureNote,
    ) -> Result<(), StoreError> {
        self.with(|m| {
            let r = Self::owned(m, id, owner)?;
            r.status = RecordStatus::Failed;
            r.last_error = Some(note.error.clone());
            // Sticky: a failure that proves nothing never clears the mark.
            r.unknown_outcome |= note.unknown_outcome;
            if let Some(t) = note.not_before_ms {
                r.not_before_ms = Some(t);
            }
            r.lease_expires_at_ms = now_ms;
            Ok(())
        })
    }

    async fn renew_lease(&self, id: &str, owner: &str, until_ms: i64) -> Result<(), StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.with(|m| {
            Self::owned(m, id, owner)?.lease_expires_at_ms = until_ms;
            Ok(())
        })
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.with(|m| Ok(m.get(key).cloned()))
    }

    async fn mark_dead_lettered(&self, mark: &DeadLetterMark) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut marks = self
            .marks
            .lock()
            .map_err(|_| StoreError::Unavailable("store mutex poisoned".into()))?;
        if mark.yields() && marks.get(&mark.key).is_some_and(|m| !m.yields()) {
            return Ok(());
        }
        marks.insert(mark.key.clone(), mark.clone());
        Ok(())
    }
}

impl InMemoryStore {
    /// The key's dead-letter mark, if one was written.
    pub fn dead_letter_mark(&self, key: &str) -> Option<DeadLetterMark> {
        self.marks.lock().ok().and_then(|m| m.get(key).cloned())
    }
}
