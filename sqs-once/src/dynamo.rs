//! The DynamoDB adapter of [`IdempotencyStore`].
//!
//! One table holds the records of any number of works, told apart by a key prefix
//! ([`KeyLayout`]): a record's partition key is `<record_prefix><key>`, its dead-letter mark's
//! `<mark_prefix><key>`. The table needs only a string partition key (its name is
//! configurable) and, for retention, TTL on `expires_at`.
//!
//! Every write is conditional. The claim is a single `UpdateItem` (not `PutItem`, so that
//! `attempts` counts and `first_attempt_at` / `expires_at` survive takeovers) with
//! `ReturnValues = ALL_OLD` on success (what was taken over) and
//! `ReturnValuesOnConditionCheckFailure = ALL_OLD` on conflict (what stopped us).
//!
//! Why one file of ~530 lines: the DynamoDB adapter of [`crate::record::IdempotencyStore`];
//! each method is one conditional write whose condition expression is the protocol, read beside
//! the item layout it tests.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use aws_sdk_dynamodb::Client;

use crate::record::{
    ClaimRequest, ClaimResult, DeadLetterMark, FailureNote, IdempotencyRecord, IdempotencyStore,
    Outcome, RecordStatus, StoreError, Value,
};

/// Where a work's items live in the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    /// The table's partition key attribute (a string).
    pub attribute: String,
    /// Prefix of a record's partition key, e.g. `order#`.
    pub record_prefix: String,
    /// Prefix of a dead-letter mark's partition key, e.g. `order_dead_letter#`.
    pub mark_prefix: String,
}

impl KeyLayout {
    /// Partition key `pk`, records under `<name>#`, marks under `<name>_dead_letter#`.
    pub fn named(name: &str) -> Self {
        Self {
            attribute: "pk".to_owned(),
            record_prefix: format!("{name}#"),
            mark_prefix: format!("{name}_dead_letter#"),
        }
    }
}

/// The idempotency table, through the official SDK client.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    /// SDK client, built once per process.
    client: Client,
    /// The table's name.
    table: String,
    /// The partition key's name and this work's prefixes.
    layout: KeyLayout,
    /// What `completed_at` is read from (the runner's clock, in a run on another calendar).
    clock: std::sync::Arc<dyn crate::clock::Clock>,
}

type Item = HashMap<String, AttributeValue>;

/// The attribute a record carries from its first failure to its completion: its work's record
/// prefix. The partition key of the table's sparse index [`OPEN_INDEX`].
pub const OPEN: &str = "open_work";

/// The sparse index of the records that failed and are not completed (partition key
/// [`OPEN`], sort key `first_attempt_at`; projected: `status`, `unknown_outcome`,
/// `lease_expires_at`). The template defines it; a table without it works the same, and only
/// `payctl health`'s reading of such records needs it.
pub const OPEN_INDEX: &str = "OpenRecords";

const OWNED_BY_ME: &str = "lease_owner = :me AND #s = :in_progress";

impl DynamoStore {
    /// Wraps a client, a table name and the work's key layout. Makes no call.
    pub fn new(client: Client, table: impl Into<String>, layout: KeyLayout) -> Self {
        Self {
            client,
            table: table.into(),
            layout,
            clock: crate::clock::system(),
        }
    }

    /// Stamps completions from `clock` instead of the host's (give it the runner's clock).
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The key layout.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// The partition key value of `key`'s record (`<record_prefix><key>`), under the layout's
    /// attribute name, for other writes to the same item.
    pub fn record_key(&self, key: &str) -> AttributeValue {
        AttributeValue::S(format!("{}{key}", self.layout.record_prefix))
    }

    fn mark_key(&self, key: &str) -> AttributeValue {
        AttributeValue::S(format!("{}{key}", self.layout.mark_prefix))
    }

    /// The key's record and its dead-letter mark, in one consistent `BatchGetItem`.
    /// [`StoreError::Unavailable`] when the table cannot be read (or keeps keys unprocessed
    /// after five tries); [`StoreError::Malformed`] for an item this version cannot read.
    pub async fn record_and_mark(
        &self,
        key: &str,
    ) -> Result<(Option<IdempotencyRecord>, Option<DeadLetterMark>), StoreError> {
        let unavailable = |e: String| StoreError::Unavailable(e);
        let pk = &self.layout.attribute;
        let mut keys = vec![
            HashMap::from([(pk.clone(), self.record_key(key))]),
            HashMap::from([(pk.clone(), self.mark_key(key))]),
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
                if self.is_record_item(item) {
                    record = Some(self.record_from_item(item)?);
                } else if self.is_mark_item(item) {
                    mark = Some(self.mark_from_item(item)?);
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
            "the table kept {} key(s) of {key} unprocessed",
            keys.len()
        )))
    }

    /// Runs a write conditional on `owner` holding the lease; a failed condition is
    /// [`StoreError::LeaseLost`]. Every write is `fenced` but where the simulator takes a
    /// completion's fence off (the `completion_unfenced` mutation).
    async fn owned_update(
        &self,
        key: &str,
        owner: &str,
        update: &str,
        values: Vec<(&str, AttributeValue)>,
        fenced: bool,
    ) -> Result<(), StoreError> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(&self.layout.attribute, self.record_key(key))
            .update_expression(update)
            .expression_attribute_names("#s", "status");
        if fenced {
            req = req
                .condition_expression(OWNED_BY_ME)
                .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
                .expression_attribute_values(
                    ":in_progress",
                    AttributeValue::S(RecordStatus::InProgress.as_str().to_owned()),
                );
        }
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
    /// Reopens a record that was completed as waiting for an outside event (its work stored
    /// `waiting` as the outcome's status, and made no downstream call: a refund held until
    /// its payment settles): the record becomes `FAILED` with `reason` as its last error, so
    /// the next message of the same request claims it and runs the work again. `Ok(false)`
    /// when the record is not completed with that outcome (reopened before, claimed since, or
    /// never held): nothing is written. A completion that may have reached downstream
    /// (`unknown_outcome`) is never reopened. The record is kept at least until
    /// `keep_until_s` (its lifetime from now, as its wait's completion gave it from then: a
    /// record reopened near its end does not expire under the attempt that runs it again);
    /// the next completion sets the one its outcome gives.
    pub async fn reopen(
        &self,
        key: &str,
        waiting: &str,
        reason: &str,
        now_ms: i64,
        keep_until_s: i64,
    ) -> Result<bool, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(&self.layout.attribute, self.record_key(key))
            .update_expression(format!(
                "SET #s = :failed, last_error = :e, lease_expires_at = :now, {OPEN} = :open, \
                 expires_at = :keep REMOVE outcome, completed_at"
            ))
            .condition_expression(
                "#s = :completed AND outcome.#st = :waiting AND \
                 (attribute_not_exists(unknown_outcome) OR unknown_outcome = :f)",
            )
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
            .expression_attribute_values(":failed", s(RecordStatus::Failed.as_str()))
            .expression_attribute_values(":waiting", s(waiting))
            .expression_attribute_values(":f", AttributeValue::Bool(false))
            .expression_attribute_values(":e", s(reason))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":open", s(&self.layout.record_prefix))
            .expression_attribute_values(":keep", n(keep_until_s))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(StoreError::Unavailable(DisplayErrorContext(&e).to_string())),
        }
    }
}

impl DynamoStore {
    /// Records an outcome found downstream for a record that no attempt holds (an operator's
    /// reconciliation): only while it is `FAILED`, or `IN_PROGRESS` with an expired lease, and
    /// past its `not_before`. Refused ([`StoreError::LeaseLost`]) when an attempt holds it or
    /// completed it meanwhile. Clears the unknown-outcome mark. With `keep_until_s` (the
    /// work's [`crate::Work::retention_after`] for this outcome, as a completion would keep
    /// it), the record is kept at least until then.
    pub async fn settle(
        &self,
        key: &str,
        outcome: &Outcome,
        now_ms: i64,
        keep_until_s: Option<i64>,
    ) -> Result<(), StoreError> {
        // A record no attempt holds was written by its claims only, whose TTL is the record
        // retention from the first claim: a lifetime from now is never shorter. (The values
        // map is set first: `set_expression_attribute_values` replaces the map, and the
        // `expression_attribute_values` calls below add to it.)
        let (keep, values) = match keep_until_s {
            Some(t) => (
                ", expires_at = :keep",
                Some(HashMap::from([(":keep".to_owned(), n(t))])),
            ),
            None => ("", None),
        };
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(&self.layout.attribute, self.record_key(key))
            .update_expression(format!(
                "SET #s = :completed, outcome = :o, unknown_outcome = :f, completed_at = :now{keep} \
                 REMOVE last_error, not_before, lease_owner, {OPEN}"
            ))
            .set_expression_attribute_values(values)
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
pub fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A string attribute.
pub fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

/// A string attribute of an item (`None` when absent or not a string).
pub fn get_s(item: &Item, k: &str) -> Option<String> {
    item.get(k).and_then(|v| v.as_s().ok()).cloned()
}

/// A number attribute of an item (`None` when absent, not a number or not an `i64`).
pub fn get_n(item: &Item, k: &str) -> Option<i64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

/// The `outcome` map attribute: `status` and every value.
pub fn outcome_to_attr(o: &Outcome) -> AttributeValue {
    let mut m: Item = o
        .fields
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::Text(t) => s(t),
                Value::Number(x) => n(*x),
            };
            (k.clone(), v)
        })
        .collect();
    m.insert("status".to_owned(), s(&o.status));
    AttributeValue::M(m)
}

/// Reads an `outcome` map attribute. [`StoreError::Malformed`] when it is not a map or has no
/// `status`; values that are neither strings nor integers are skipped.
pub fn outcome_from_attr(v: &AttributeValue) -> Result<Outcome, StoreError> {
    let m = v
        .as_m()
        .map_err(|_| StoreError::Malformed("outcome is not a map".into()))?;
    let status =
        get_s(m, "status").ok_or_else(|| StoreError::Malformed("outcome without status".into()))?;
    let mut outcome = Outcome::new(status);
    for (k, v) in m.iter().filter(|(k, _)| k.as_str() != "status") {
        if let Ok(t) = v.as_s() {
            outcome = outcome.with_text(k, t.clone());
        } else if let Some(x) = v.as_n().ok().and_then(|x| x.parse().ok()) {
            outcome = outcome.with_number(k, x);
        }
    }
    Ok(outcome)
}

impl DynamoStore {
    fn pk_of(&self, item: &Item) -> Option<String> {
        get_s(item, &self.layout.attribute)
    }

    /// True for an item that is one of this layout's records (a table may hold other works'
    /// records and dead-letter marks too).
    pub fn is_record_item(&self, item: &Item) -> bool {
        self.pk_of(item)
            .is_some_and(|pk| pk.starts_with(&self.layout.record_prefix))
    }

    /// True for an item that is one of this layout's dead-letter marks.
    pub fn is_mark_item(&self, item: &Item) -> bool {
        self.pk_of(item)
            .is_some_and(|pk| pk.starts_with(&self.layout.mark_prefix))
    }

    /// Reads a dead-letter mark. [`StoreError::Malformed`] without its `key` attribute.
    pub fn mark_from_item(&self, item: &Item) -> Result<DeadLetterMark, StoreError> {
        let key = get_s(item, "key")
            .or_else(|| {
                self.pk_of(item)
                    .and_then(|pk| pk.strip_prefix(&self.layout.mark_prefix).map(str::to_owned))
            })
            .ok_or_else(|| StoreError::Malformed("dead-letter mark without a key".into()))?;
        Ok(DeadLetterMark {
            key,
            payload_hash: get_s(item, "payload_hash").unwrap_or_default(),
            error_code: get_s(item, "error_code").unwrap_or_default(),
            error_message: get_s(item, "error_message").unwrap_or_default(),
            at_ms: get_n(item, "dead_lettered_at").unwrap_or(0),
            expires_at_s: get_n(item, "expires_at").unwrap_or(0),
        })
    }

    /// Reads an idempotency record. [`StoreError::Malformed`] without a partition key, with a
    /// status this version does not know, or with an unreadable outcome.
    pub fn record_from_item(&self, item: &Item) -> Result<IdempotencyRecord, StoreError> {
        let pk = self
            .pk_of(item)
            .ok_or_else(|| StoreError::Malformed("no partition key".into()))?;
        let status_s = get_s(item, "status").unwrap_or_default();
        let status = RecordStatus::parse(&status_s)
            .ok_or_else(|| StoreError::Malformed(format!("unknown status {status_s:?} on {pk}")))?;
        Ok(IdempotencyRecord {
            key: pk
                .strip_prefix(&self.layout.record_prefix)
                .unwrap_or(&pk)
                .to_owned(),
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
            traceparent: get_s(item, "traceparent"),
        })
    }
}

#[async_trait]
impl IdempotencyStore for DynamoStore {
    async fn claim(&self, r: &ClaimRequest) -> Result<ClaimResult, StoreError> {
        // The first traced claim's traceparent stays: the payment's trace is where it began.
        let (traced, tp) = match &r.traceparent {
            Some(tp) => (
                ", traceparent = if_not_exists(traceparent, :tp)",
                Some(s(tp)),
            ),
            None => ("", None),
        };
        let mut claim = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(&self.layout.attribute, self.record_key(&r.key))
            .update_expression(format!(
                "SET #s = :in_progress, payload_hash = :h, lease_owner = :me, \
                 lease_expires_at = :lease, expires_at = if_not_exists(expires_at, :ttl), \
                 first_attempt_at = if_not_exists(first_attempt_at, :now){traced} ADD attempts :one"
            ))
            .condition_expression(
                "attribute_not_exists(#pk) OR (payload_hash = :h AND \
                 ((#s = :in_progress AND lease_expires_at < :now) OR \
                  (#s = :failed AND (attribute_not_exists(not_before) OR not_before < :now))))",
            )
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#pk", &self.layout.attribute)
            .expression_attribute_values(":in_progress", s(RecordStatus::InProgress.as_str()))
            .expression_attribute_values(":failed", s(RecordStatus::Failed.as_str()))
            .expression_attribute_values(":h", s(&r.payload_hash))
            .expression_attribute_values(":me", s(&r.owner))
            .expression_attribute_values(":lease", n(r.lease_expires_at_ms))
            .expression_attribute_values(":ttl", n(r.expires_at_s))
            .expression_attribute_values(":now", n(r.now_ms))
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(tp) = tp {
            claim = claim.expression_attribute_values(":tp", tp);
        }
        let result = claim.send().await;
        match result {
            Ok(out) => {
                let previous = match out.attributes() {
                    Some(old) if !old.is_empty() => Some(self.record_from_item(old)?),
                    _ => None,
                };
                Ok(ClaimResult::Claimed { previous })
            }
            Err(e) => {
                if let SdkError::ServiceError(se) = &e {
                    if let aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) = se.err() {
                        return match c.item() {
                            Some(old) => Ok(ClaimResult::Conflict(self.record_from_item(old)?)),
                            // An endpoint that ignores ReturnValuesOnConditionCheckFailure: read.
                            None => match self.get(&r.key).await? {
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
        key: &str,
        owner: &str,
        outcome: &Outcome,
        expires_at_s: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut values = vec![
            (":completed", s(RecordStatus::Completed.as_str())),
            (":o", outcome_to_attr(outcome)),
            (":f", AttributeValue::Bool(false)),
            (":t", n(self.clock.now_ms())),
        ];
        let update = match expires_at_s {
            Some(ttl) => {
                values.push((":ttl", n(ttl)));
                "SET #s = :completed, outcome = :o, unknown_outcome = :f, completed_at = :t, \
                 expires_at = :ttl REMOVE last_error, not_before, open_work"
            }
            None => {
                "SET #s = :completed, outcome = :o, unknown_outcome = :f, completed_at = :t \
                 REMOVE last_error, not_before, open_work"
            }
        };
        let fenced = !crate::mutation::on("completion_unfenced");
        self.owned_update(key, owner, update, values, fenced).await
    }

    async fn fail(
        &self,
        key: &str,
        owner: &str,
        now_ms: i64,
        note: &FailureNote,
    ) -> Result<(), StoreError> {
        // The mark is sticky: a note that proves nothing leaves the stored mark alone, so only
        // a completion ever writes `false` over `true`.
        // From its first failure to its completion a record carries `open_work` (its work's
        // prefix): the sparse index `OpenRecords` holds exactly these, so an operator's reading
        // of what needs attention queries them instead of scanning a year of records.
        let mut update =
            format!("SET #s = :failed, last_error = :e, lease_expires_at = :now, {OPEN} = :open");
        let mut values = vec![
            (":failed", s(RecordStatus::Failed.as_str())),
            (":e", s(&note.error)),
            (":now", n(now_ms)),
            (":open", s(&self.layout.record_prefix)),
        ];
        if note.unknown_outcome || crate::mutation::on("unknown_mark_not_sticky") {
            update.push_str(", unknown_outcome = :u");
            values.push((":u", AttributeValue::Bool(note.unknown_outcome)));
        }
        if let Some(t) = note.not_before_ms {
            update.push_str(", not_before = :nb");
            values.push((":nb", n(t)));
        }
        self.owned_update(key, owner, &update, values, true).await
    }

    async fn renew_lease(&self, key: &str, owner: &str, until_ms: i64) -> Result<(), StoreError> {
        self.owned_update(
            key,
            owner,
            "SET lease_expires_at = :lease",
            vec![(":lease", n(until_ms))],
            true,
        )
        .await
    }

    async fn mark_dead_lettered(&self, mark: &DeadLetterMark) -> Result<(), StoreError> {
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(&self.layout.attribute, self.mark_key(&mark.key))
            .update_expression(
                "SET #key = :id, payload_hash = :h, error_code = :c, error_message = :m, \
                 dead_lettered_at = :t, expires_at = :ttl",
            );
        if mark.yields() {
            // Never over the mark of the key's own request.
            update = update.condition_expression("attribute_not_exists(#key) OR error_code = :c");
        }
        let result = update
            .expression_attribute_names("#key", "key")
            .expression_attribute_values(":id", s(&mark.key))
            .expression_attribute_values(":h", s(&mark.payload_hash))
            .expression_attribute_values(":c", s(&mark.error_code))
            .expression_attribute_values(":m", s(&mark.error_message))
            .expression_attribute_values(":t", n(mark.at_ms))
            .expression_attribute_values(":ttl", n(mark.expires_at_s))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(se))
                if mark.yields() && se.err().is_conditional_check_failed_exception() =>
            {
                Ok(())
            }
            Err(e) => Err(StoreError::Unavailable(DisplayErrorContext(&e).to_string())),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(&self.layout.attribute, self.record_key(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(DisplayErrorContext(&e).to_string()))?;
        out.item().map(|i| self.record_from_item(i)).transpose()
    }
}
