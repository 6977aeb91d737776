//! `payctl reconcile`: the completer that ends an unknown outcome without a person guessing.
//!
//! A record can be left unsettled: `FAILED` and marked unknown (the provider gave no definitive
//! answer, or replays an error for the key and its search showed nothing), or `IN_PROGRESS`
//! with an expired lease (a crashed worker whose message went to the DLQ). Reconcile looks each
//! such payment up at the provider by `metadata['payment_id']` and settles the record from what
//! it finds, with a conditional write that never touches a record a processor holds. When the
//! provider holds nothing it says so, and whether the provider still remembers the key, so the
//! operator knows what a redrive of the message will do. It never charges anything.

use std::time::Duration;

use anyhow::{Context, Result};
use payment_core::domain::PaymentId;
use payment_core::provider::PaymentProvider;
use payment_core::PaymentOutcome as Outcome;
use sqs_once::record::{IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError};
use sqs_once::runner::now_ms;
use sqs_once::DynamoStore;

use crate::time::in_words;

/// What reconcile did with one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The table has no record for the payment id.
    NoRecord,
    /// Already `COMPLETED`: nothing to settle.
    AlreadyCompleted(Outcome),
    /// A processor holds a live lease, or an earlier call may still land (`not_before`):
    /// left alone until this epoch ms.
    Held(i64),
    /// The record now holds what the provider holds (a charge, or an intent that did not
    /// charge, recorded as declined).
    Settled(Outcome),
    /// The provider holds nothing for the payment id.
    NothingAtProvider {
        /// A search this soon after the last call may lag: not proof until this epoch ms.
        proof_from_ms: Option<i64>,
        /// The provider remembers the key at least until this epoch ms (first attempt + its
        /// key retention): until then a redrive gets the provider's stored answer for it.
        key_remembered_until_ms: i64,
        /// An attempt may have reached the provider's execution (a timeout, a dropped
        /// connection or a `5xx`: the record is marked unknown), so the provider may hold an
        /// error for the key that it replays. `false`: every attempt was refused before
        /// execution (no connection, `429`, a refused key or URL), the provider stored nothing,
        /// and a redrive
        /// now is charged once.
        may_replay: bool,
    },
}

impl Action {
    /// The record is settled (or was already): nothing is left for a later run or an operator.
    pub fn is_final(&self) -> bool {
        matches!(self, Action::AlreadyCompleted(_) | Action::Settled(_))
    }
}

/// Settings of a reconcile run.
#[derive(Debug, Clone, Copy)]
pub struct ReconcileSettings {
    /// `PROVIDER_KEY_RETENTION_SECONDS` (Stripe: 24 h).
    pub key_retention: Duration,
    /// `PROVIDER_SEARCH_LAG_SECONDS`.
    pub search_lag: Duration,
    /// `REFUND_WINDOW_DAYS`: a charge settled here is kept that long from now, as a
    /// completion would keep it ([`payment_core::payments::charge::lifetime_after`]).
    pub refund_window: Duration,
}

/// True for a record reconcile should look at with `--all-unknown`: marked unknown, `FAILED`,
/// or `IN_PROGRESS` past its lease (no live attempt will finish it).
pub fn needs_reconciling(r: &IdempotencyRecord, now_ms: i64) -> bool {
    match r.status {
        RecordStatus::Completed => false,
        RecordStatus::Failed => true,
        RecordStatus::InProgress => r.unknown_outcome || r.lease_expires_at_ms < now_ms,
    }
}

/// Reconciles one payment.
pub async fn reconcile_one(
    store: &DynamoStore,
    provider: &dyn PaymentProvider,
    payment_id: &str,
    settings: ReconcileSettings,
) -> Result<Action> {
    reconcile_one_at(store, provider, payment_id, settings, now_ms()).await
}

/// [`reconcile_one`] at the epoch ms `now` (a compressed calendar runs it months ahead).
pub async fn reconcile_one_at(
    store: &DynamoStore,
    provider: &dyn PaymentProvider,
    payment_id: &str,
    settings: ReconcileSettings,
    now: i64,
) -> Result<Action> {
    let Some(record) = store.get(payment_id).await? else {
        return Ok(Action::NoRecord);
    };
    match record.status {
        RecordStatus::Completed => {
            return Ok(Action::AlreadyCompleted(Outcome::from_outcome(
                record
                    .outcome
                    .as_ref()
                    .context("a COMPLETED record without an outcome")?,
            )))
        }
        RecordStatus::InProgress if record.lease_expires_at_ms >= now => {
            return Ok(Action::Held(record.lease_expires_at_ms))
        }
        _ => {}
    }
    if let Some(t) = record.not_before_ms.filter(|t| *t >= now) {
        return Ok(Action::Held(t));
    }
    let id = PaymentId::parse(payment_id)
        .map_err(|e| anyhow::anyhow!("{payment_id} is not a payment id: {e}"))?;
    // The record keeps no customer, so reconcile searches (which may lag: see
    // `proof_from_ms`); the processors themselves list the customer's intents.
    let query = payment_core::provider::PaymentQuery {
        payment_id: id.clone(),
        customer: None,
        created_from_s: None,
    };
    let found = provider
        .find_payments(&query)
        .await
        .with_context(|| format!("looking {payment_id} up at the provider"))?;
    let pick = payment_core::provider::FoundPayment::pick(&found);
    let Some(f) = pick else {
        let landing = record.not_before_ms.unwrap_or(record.lease_expires_at_ms);
        let proof_from = landing + settings.search_lag.as_millis() as i64;
        return Ok(Action::NothingAtProvider {
            proof_from_ms: (proof_from > now).then_some(proof_from),
            key_remembered_until_ms: record.first_attempt_at_ms
                + settings.key_retention.as_millis() as i64,
            // An attempt that died mid-call (`IN_PROGRESS` past its lease) may have reached the
            // provider too: the claim never writes the mark, the next claim inherits it.
            may_replay: record.unknown_outcome || record.status == RecordStatus::InProgress,
        });
    };
    // What the intent stands for, recorded as if its answer had been heard (the amount and
    // currency are the provider's: reconcile has no request).
    let mut outcome = payment_core::payments::charge::outcome_of_found(f);
    if outcome.is_declined() {
        outcome.reason = Some(format!("found at the provider as {}", f.status));
    }
    let keep = payment_core::payments::charge::lifetime_after(&outcome, settings.refund_window)
        .map(|d| (now / 1000 + d.as_secs() as i64).max(record.expires_at_s));
    match store
        .settle(id.as_str(), &outcome.to_outcome(), now, keep)
        .await
    {
        Ok(()) => Ok(Action::Settled(outcome)),
        // A processor claimed it between the read and the write: it will finish it.
        Err(StoreError::LeaseLost) => match store.get(payment_id).await? {
            Some(r) if r.status == RecordStatus::Completed => {
                Ok(Action::AlreadyCompleted(Outcome::from_outcome(
                    r.outcome
                        .as_ref()
                        .context("a COMPLETED record without an outcome")?,
                )))
            }
            Some(r) => Ok(Action::Held(
                r.lease_expires_at_ms.max(r.not_before_ms.unwrap_or(0)),
            )),
            None => Ok(Action::NoRecord),
        },
        Err(e) => Err(e.into()),
    }
}

/// One line an operator reads: what was done, and what a redrive of the message will do.
pub fn describe(payment_id: &str, action: &Action, now_ms: i64) -> String {
    match action {
        Action::NoRecord => format!("{payment_id}: no record in the table; nothing to settle"),
        Action::AlreadyCompleted(o) => format!(
            "{payment_id}: already COMPLETED ({}{}); nothing to do",
            o.status,
            o.provider_payment_id.as_deref().map(|p| format!(", {p}")).unwrap_or_default()
        ),
        Action::Held(until) => format!(
            "{payment_id}: left alone: a processor holds it or an earlier call may still land, for {} more",
            in_words(until - now_ms)
        ),
        Action::Settled(o) => format!(
            "{payment_id}: settled from the provider: COMPLETED, {} {}{}; a redrive of its message is acknowledged as a duplicate",
            o.status,
            o.provider_payment_id.as_deref().unwrap_or("-"),
            if o.amount > 0 { format!(" ({} {})", o.amount, o.currency) } else { String::new() }
        ),
        Action::NothingAtProvider {
            proof_from_ms,
            key_remembered_until_ms,
            may_replay,
        } => {
            let key = if !may_replay {
                "no attempt reached the provider's execution (every one was refused before it: no connection, 429, a refused key or URL), so the provider holds nothing for the key: a redrive now is charged once".to_owned()
            } else if *key_remembered_until_ms > now_ms {
                format!(
                    "the provider still remembers the key for at least {}: until then a redrive gets its stored answer (a replayed error ends as outcome_unknown again); after it, a redrive is charged once",
                    in_words(key_remembered_until_ms - now_ms)
                )
            } else {
                "the provider may have forgotten the key: a redrive is looked up again and charged once if still nothing is found".into()
            };
            match proof_from_ms {
                Some(t) => format!(
                    "{payment_id}: nothing found at the provider yet, but its search may lag the last call: run again in {}; {key}",
                    in_words(t - now_ms)
                ),
                None => format!(
                    "{payment_id}: no payment exists at the provider for this id (no charge was made); record left unsettled; {key}"
                ),
            }
        }
    }
}

/// The payment ids `--all-unknown` covers: every record that [`needs_reconciling`].
pub async fn unsettled_ids(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<String>> {
    unsettled_keys(ddb, &payment_core::payment_store(ddb.clone(), table)).await
}

/// The keys of one work's records in `store` that [`needs_reconciling`], sorted.
pub async fn unsettled_keys(
    ddb: &aws_sdk_dynamodb::Client,
    store: &DynamoStore,
) -> Result<Vec<String>> {
    let now = now_ms();
    let mut ids: Vec<String> = crate::records::scan_records_of(ddb, store)
        .await?
        .into_values()
        .filter(|r| needs_reconciling(r, now))
        .map(|r| r.key)
        .collect();
    ids.sort();
    Ok(ids)
}
