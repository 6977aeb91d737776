//! The DynamoDB adapter of [`IdempotencyStore`].
//!
//! Every write is conditional. The claim is a single `UpdateItem` (not `PutItem`, so that
//! `attempts` counts and `first_attempt_at` / `expires_at` survive takeovers) with
//! `ReturnValues = ALL_OLD` on success (what was taken over) and
//! `ReturnValuesOnConditionCheckFailure = ALL_OLD` on conflict (what stopped us).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use aws_sdk_dynamodb::Client;

use crate::clock::Clock;
use crate::domain::PaymentId;
use crate::idempotency::{
    ClaimRequest, ClaimResult, DeadLetterMark, FailureNote, IdempotencyRecord, IdempotencyStore,
    Outcome, RecordStatus, StoreError,
};

/// The idempotency table, through the official SDK client.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    /// SDK client, built once per process.
    client: Client,
    /// `IDEMPOTENCY_TABLE`.
    table: String,
}

type Item = HashMap<String, AttributeValue>;

const OWNED_BY_ME: &str = "lease_owner = :me AND #s = :in_progress";

impl DynamoStore {
    /// Wraps a client and a table name.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    fn key(payment_id: &str) -> AttributeValue {
        AttributeValue::S(format!("{RECORD_PREFIX}{payment_id}"))
    }

    fn mark_key(payment_id: &str) -> AttributeValue {
        AttributeValue::S(format!("{MARK_PREFIX}{payment_id}"))
    }

    /// The payment's record and its dead-letter mark, in one consistent `BatchGetItem`.
    pub async fn progress(
        &self,
        payment_id: &str,
    ) -> Result<(Option<IdempotencyRecord>, Option<DeadLetterMark>), StoreError> {
        let unavailable = |e: String| StoreError::Unavailable(e);
        let mut keys = vec![
            HashMap::from([("pk".to_owned(), Self::key(payment_id))]),
            HashMap::from([("pk".to_owned(), Self::mark_key(payment_id))]),
        ];
        let (mut record, mut mark) = (None, None);
        // Unprocessed keys (throttling) are asked again, a bounded number of times.
        for _ in 0..5 {
            let request = KeysAndAttributes::builder()
                .set_keys(Some(keys.clone()))
                .consistent_read(true)
                .build()
                .map_err(|e| unavailable(e.to_string()))?;
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, request)
                .send()
                .await
                .map_err(|e| unavailable(DisplayErrorContext(&e).to_string()))?;
            for item in out
                .responses()
                .and_then(|r| r.get(&self.table))
                .into_iter()
                .flatten()
            {
                match get_s(item, "pk") {
                    Some(pk) if pk.starts_with(RECORD_PREFIX) => {
                        record = Some(record_from_item(item)?)
                    }
                    Some(pk) if pk.starts_with(MARK_PREFIX) => mark = Some(mark_from_item(item)?),
                    _ => {}
                }
            }
            keys = out
                .unprocessed_keys()
                .and_then(|u| u.get(&self.table))
                .map(|k| k.keys().to_vec())
                .unwrap_or_default();
            if keys.is_empty() {
                return Ok((record, mark));
            }
        }
        Err(unavailable(format!(
            "the table kept {} key(s) of {payment_id} unprocessed",
            keys.len()
        )))
    }

    /// Runs a write conditional on `owner` holding the lease; a failed condition is
    /// [`StoreError::LeaseLost`].
    async fn owned_update(
        &self,
        payment_id: &PaymentId,
        owner: &str,
        update: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> Result<(), StoreError> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", Self::key(payment_id.as_str()))
            .update_expression(update)
            .condition_expression(OWNED_BY_ME)
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
            .expression_attribute_values(
                ":in_progress",
                AttributeValue::S(RecordStatus::InProgress.as_str().to_owned()),
            );
        for (k, v) in values {
            req = req.expression_attribute_values(k, v);
        }
        match req.send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                if let SdkError::ServiceError(se) = &e {
                    if se.err().is_conditional_check_failed_exception() {
                        return Err(StoreError::LeaseLost);
                    }
                }
                Err(StoreError::Unavailable(DisplayErrorContext(&e).to_string()))
            }
        }
    }
}

impl DynamoStore {
    /// Records an outcome found at the provider for a record that no attempt holds (the
    /// operator's `payctl reconcile`): only while it is `FAILED`, or `IN_PROGRESS` with an
    /// expired lease, and past its `not_before`. Refused ([`StoreError::LeaseLost`]) when a
    /// processor holds it or completed it meanwhile. Clears the unknown-outcome mark.
    pub async fn settle(
        &self,
        payment_id: &PaymentId,
        outcome: &Outcome,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", Self::key(payment_id.as_str()))
            .update_expression(
                "SET #s = :completed, outcome = :o, unknown_outcome = :f, completed_at = :now \
                 REMOVE last_error, not_before, lease_owner",
            )
            .condition_expression(
                "(#s = :failed OR (#s = :in_progress AND lease_expires_at < :now)) AND \
                 (attribute_not_exists(not_before) OR not_before < :now)",
            )
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
            .expression_attribute_values(":failed", s(RecordStatus::Failed.as_str()))
            .expression_attribute_values(":in_progress", s(RecordStatus::InProgress.as_str()))
            .expression_attribute_values(":o", outcome_to_attr(outcome))
            .expression_attribute_values(":f", AttributeValue::Bool(false))
            .expression_attribute_values(":now", n(now_ms))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => match &e {
                SdkError::ServiceError(se) if se.err().is_conditional_check_failed_exception() => {
                    Err(StoreError::LeaseLost)
                }
                _ => Err(StoreError::Unavailable(DisplayErrorContext(&e).to_string())),
            },
        }
    }
}

/// A number attribute.
pub(crate) fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A string attribute.
pub(crate) fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

/// A string attribute of an item.
pub(crate) fn get_s(item: &Item, k: &str) -> Option<String> {
    item.get(k).and_then(|v| v.as_s().ok()).cloned()
}

/// A number attribute of an item.
pub(crate) fn get_n(item: &Item, k: &str) -> Option<i64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

/// The `outcome` map attribute.
pub fn outcome_to_attr(o: &Outcome) -> AttributeValue {
    let mut m = HashMap::new();
    m.insert("status".to_owned(), s(&o.status));
    m.insert("amount".to_owned(), n(o.amount));
    m.insert("currency".to_owned(), s(&o.currency));
    if let Some(id) = &o.provider_payment_id {
        m.insert("provider_payment_id".to_owned(), s(id));
    }
    if let Some(c) = &o.decline_code {
        m.insert("decline_code".to_owned(), s(c));
    }
    if let Some(r) = &o.reason {
        m.insert("reason".to_owned(), s(r));
    }
    AttributeValue::M(m)
}

fn outcome_from_attr(v: &AttributeValue) -> Result<Outcome, StoreError> {
    let m = v
        .as_m()
        .map_err(|_| StoreError::Malformed("outcome is not a map".into()))?;
    Ok(Outcome {
        status: get_s(m, "status")
            .ok_or_else(|| StoreError::Malformed("outcome without status".into()))?,
        provider_payment_id: get_s(m, "provider_payment_id"),
        decline_code: get_s(m, "decline_code"),
        amount: get_n(m, "amount").unwrap_or(0),
        currency: get_s(m, "currency").unwrap_or_default(),
        reason: get_s(m, "reason"),
    })
}

/// Reads a record from a raw item.
/// Prefix of a record's key: `payment#<payment_id>`.
pub const RECORD_PREFIX: &str = "payment#";
/// Prefix of a dead-letter mark's key: `dead_letter#<payment_id>`.
pub const MARK_PREFIX: &str = "dead_letter#";

/// Reads a dead-letter mark.
pub fn mark_from_item(item: &Item) -> Result<DeadLetterMark, StoreError> {
    let id = get_s(item, "payment_id")
        .ok_or_else(|| StoreError::Malformed("mark without payment_id".into()))?;
    Ok(DeadLetterMark {
        payment_id: PaymentId::parse(&id).map_err(|e| StoreError::Malformed(e.to_string()))?,
        payload_hash: get_s(item, "payload_hash").unwrap_or_default(),
        error_code: get_s(item, "error_code").unwrap_or_default(),
        error_message: get_s(item, "error_message").unwrap_or_default(),
        at_ms: get_n(item, "dead_lettered_at").unwrap_or(0),
        expires_at_s: get_n(item, "expires_at").unwrap_or(0),
    })
}

/// True for the key of an idempotency record (the table also holds dead-letter marks).
pub fn is_record_item(item: &Item) -> bool {
    get_s(item, "pk").is_some_and(|pk| pk.starts_with(RECORD_PREFIX))
}

/// Reads an idempotency record.
pub fn record_from_item(item: &Item) -> Result<IdempotencyRecord, StoreError> {
    let pk = get_s(item, "pk").ok_or_else(|| StoreError::Malformed("no pk".into()))?;
    let status_s = get_s(item, "status").unwrap_or_default();
    let status = RecordStatus::parse(&status_s)
        .ok_or_else(|| StoreError::Malformed(format!("unknown status {status_s:?} on {pk}")))?;
    Ok(IdempotencyRecord {
        payment_id: pk.strip_prefix(RECORD_PREFIX).unwrap_or(&pk).to_owned(),
        status,
        payload_hash: get_s(item, "payload_hash").unwrap_or_default(),
        lease_owner: get_s(item, "lease_owner"),
        lease_expires_at_ms: get_n(item, "lease_expires_at").unwrap_or(0),
        attempts: get_n(item, "attempts").unwrap_or(0),
        outcome: item.get("outcome").map(outcome_from_attr).transpose()?,
        expires_at_s: get_n(item, "expires_at").unwrap_or(0),
        first_attempt_at_ms: get_n(item, "first_attempt_at").unwrap_or(0),
        unknown_outcome: item
            .get("unknown_outcome")
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false),
        last_error: get_s(item, "last_error"),
        completed_at_ms: get_n(item, "completed_at"),
        not_before_ms: get_n(item, "not_before"),
    })
}

#[async_trait]
impl IdempotencyStore for DynamoStore {
    async fn claim(&self, r: &ClaimRequest) -> Result<ClaimResult, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", Self::key(r.payment_id.as_str()))
            .update_expression(
                "SET #s = :in_progress, payload_hash = :h, lease_owner = :me, \
                 lease_expires_at = :lease, expires_at = if_not_exists(expires_at, :ttl), \
                 first_attempt_at = if_not_exists(first_attempt_at, :now) ADD attempts :one",
            )
            .condition_expression(
                "attribute_not_exists(pk) OR (payload_hash = :h AND \
                 ((#s = :in_progress AND lease_expires_at < :now) OR \
                  (#s = :failed AND (attribute_not_exists(not_before) OR not_before < :now))))",
            )
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":in_progress", s(RecordStatus::InProgress.as_str()))
            .expression_attribute_values(":failed", s(RecordStatus::Failed.as_str()))
            .expression_attribute_values(":h", s(&r.payload_hash))
            .expression_attribute_values(":me", s(&r.owner))
            .expression_attribute_values(":lease", n(r.lease_expires_at_ms))
            .expression_attribute_values(":ttl", n(r.expires_at_s))
            .expression_attribute_values(":now", n(r.now_ms))
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let previous = match out.attributes() {
                    Some(old) if !old.is_empty() => Some(record_from_item(old)?),
                    _ => None,
                };
                Ok(ClaimResult::Claimed { previous })
            }
            Err(e) => {
                if let SdkError::ServiceError(se) = &e {
                    if let aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) = se.err() {
                        return match c.item() {
                            Some(old) => Ok(ClaimResult::Conflict(record_from_item(old)?)),
                            // An endpoint that ignores ReturnValuesOnConditionCheckFailure: read.
                            None => match self.get(r.payment_id.as_str()).await? {
                                Some(rec) => Ok(ClaimResult::Conflict(rec)),
                                None => Err(StoreError::Unavailable(
                                    "claim refused but no record found".into(),
                                )),
                            },
                        };
                    }
                }
                Err(StoreError::Unavailable(DisplayErrorContext(&e).to_string()))
            }
        }
    }

    async fn complete(
        &self,
        payment_id: &PaymentId,
        owner: &str,
        outcome: &Outcome,
    ) -> Result<(), StoreError> {
        self.owned_update(
            payment_id,
            owner,
            "SET #s = :completed, outcome = :o, unknown_outcome = :f, completed_at = :t \
             REMOVE last_error, not_before",
            vec![
                (":completed", s(RecordStatus::Completed.as_str())),
                (":o", outcome_to_attr(outcome)),
                (":f", AttributeValue::Bool(false)),
                (":t", n(crate::clock::SystemClock.now_ms())),
            ],
        )
        .await
    }

    async fn fail(
        &self,
        payment_id: &PaymentId,
        owner: &str,
        now_ms: i64,
        note: &FailureNote,
    ) -> Result<(), StoreError> {
        // The mark is sticky: a note that proves nothing leaves the stored mark alone, so only
        // a completion ever writes `false` over `true`.
        let mut update = String::from("SET #s = :failed, last_error = :e, lease_expires_at = :now");
        let mut values = vec![
            (":failed", s(RecordStatus::Failed.as_str())),
            (":e", s(&note.error)),
            (":now", n(now_ms)),
        ];
        if note.unknown_outcome {
            update.push_str(", unknown_outcome = :u");
            values.push((":u", AttributeValue::Bool(true)));
        }
        if let Some(t) = note.not_before_ms {
            update.push_str(", not_before = :nb");
            values.push((":nb", n(t)));
        }
        self.owned_update(payment_id, owner, &update, values).await
    }

    async fn renew_lease(
        &self,
        payment_id: &PaymentId,
        owner: &str,
        until_ms: i64,
    ) -> Result<(), StoreError> {
        self.owned_update(
            payment_id,
            owner,
            "SET lease_expires_at = :lease",
            vec![(":lease", n(until_ms))],
        )
        .await
    }

    async fn mark_dead_lettered(&self, mark: &DeadLetterMark) -> Result<(), StoreError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", Self::mark_key(mark.payment_id.as_str()))
            .update_expression(
                "SET payment_id = :id, payload_hash = :h, error_code = :c, error_message = :m, \
                 dead_lettered_at = :t, expires_at = :ttl",
            )
            .expression_attribute_values(":id", s(mark.payment_id.as_str()))
            .expression_attribute_values(":h", s(&mark.payload_hash))
            .expression_attribute_values(":c", s(&mark.error_code))
            .expression_attribute_values(":m", s(&mark.error_message))
            .expression_attribute_values(":t", n(mark.at_ms))
            .expression_attribute_values(":ttl", n(mark.expires_at_s))
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(DisplayErrorContext(&e).to_string()))?;
        Ok(())
    }

    async fn get(&self, payment_id: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", Self::key(payment_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(DisplayErrorContext(&e).to_string()))?;
        out.item().map(record_from_item).transpose()
    }
}
