//! What has been refunded of a payment, kept on the payment's own idempotency record, so that
//! refunds never add up to more than the charge however many run at once.
//!
//! Why ~950 lines: the DynamoDB ledger and the in-memory one the unit tests use hold the same
//! conditions, side by side, so that a change to one is seen in the other.
//!
//! A refund first *reserves* its amount with one conditional write on the payment's record:
//! `refunds.<refund_id> = amount` and `refunded_amount = seen + amount`, only while the record
//! is `COMPLETED` with a `succeeded` outcome, the refund id is not there yet, the total is
//! still the one read, and the new total is within `outcome.amount`. Two refunds that read the
//! same total cannot both write: the second finds the total changed, reads again and is
//! refused if nothing is left. A refund the provider refuses *releases* its reservation. The
//! reservation outlives a crash: a retry of the same refund finds it and sends the same amount.
//!
//! Both writes are fenced by the refund's own lease: each runs in one `TransactWriteItems` with
//! a check that the refund's record is `IN_PROGRESS` under the attempt's fencing token, so an
//! attempt whose lease was taken over (a zombie) can neither reserve nor release: no
//! reservation is ever changed by an attempt that no longer holds its refund.
//!
//! Both writes also keep the payment's record (its TTL, `expires_at`) at least until the
//! lifetime the caller gives, never less than it was: the provider can fail a refund weeks
//! after `pending` or `succeeded`, and the ledger must still be there to take it back.
//!
//! A refund of a payment still settling at the provider (a bank debit `processing`, a
//! customer's `requires_action`) *holds*: the same reservation, conditional on the payment
//! still settling instead of `succeeded`, with `held_refunds.<refund_id>` = the refund's
//! message in the same write, and the record put in the sparse index's `refund_held` partition (its
//! `open_work`), where the catch-up's sweep and `payctl health` find it. The refund, resumed
//! once the payment settled, keeps its reservation (the payment succeeded) or gives it back
//! (it failed); its held entry is removed only by what resumes held refunds, once it reads the
//! refund's record completed ([`crate::refunds::held`]), and the last one removed takes the
//! record out of the partition. Until then the entry is what brings the refund back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use aws_sdk_dynamodb::Client;
use sqs_once::dynamo::{get_n, n, s, DynamoStore};
use sqs_once::record::{RecordStatus, StoreError};

use crate::payments::charge::PaymentOutcome;

/// The prefix of a refund's amount given back (its refund moved no money), kept on the
/// payment's record beside the reservations so that the refund still shows there.
pub const RELEASED_PREFIX: &str = "released:";

/// The sparse index partition (`open_work`) of the payment records that hold refunds waiting
/// for them to settle.
pub const HELD_PARTITION: &str = "refund_held";

/// The payment record's map of its held refunds: refund id → the refund's message.
pub const HELD: &str = "held_refunds";

/// The most refunds one payment takes (`refund_limit_reached` past it). Each refund leaves
/// its reservation (`refunds.<id>`, or `released:<id>` once given back) on the payment's
/// record, and a DynamoDB item holds 400 KB: with ids of up to 255 bytes that is at most
/// ~110 KB here, beside at most [`MAX_HELD_REFUNDS`] held messages (~30 KB each: a refund's
/// fields and Stripe's 50 metadata keys), the first
/// [`crate::events::settlement::MAX_EVENT_NOTES`] event notes (under 1 KB each) and the
/// payment's own outcome and disputes (a few KB): under 350 KB in the worst case. Stripe sets
/// no number; other processors do (150 partial captures and refunds at Checkout.com).
pub const MAX_REFUNDS_PER_PAYMENT: i64 = 200;

/// The most refunds one payment holds at once while it settles (`refund_limit_reached` past
/// it): each held refund keeps its whole message on the payment's record until it is resumed.
pub const MAX_HELD_REFUNDS: usize = 4;

/// The payment record's count of the refunds ever reserved on it.
pub const REFUND_COUNT: &str = "refund_count";

/// The condition and the removal that take `held_refunds.#rid` off a payment's record whose
/// map had `held_count` entries when read: the last one also takes the record out of the
/// [`HELD_PARTITION`]. The count is pinned, so a write that raced this one reads again.
pub(crate) fn take_held_clause(held_count: usize) -> (String, &'static str) {
    let remove = if held_count <= 1 {
        format!("held_refunds.#rid, {}", sqs_once::dynamo::OPEN)
    } else {
        "held_refunds.#rid".to_owned()
    };
    (
        remove,
        "attribute_exists(held_refunds.#rid) AND size(held_refunds) = :held_n",
    )
}

/// The write that gives back `amount` reserved for `refund_id` on a payment's record, shared by
/// every path that releases (the refund processor, reconcile, the inbox): `refunds.<rid>` moves
/// to `released:<rid>`, `refunded_amount` goes down and the record is kept until
/// `keep_until_s`, only while the reservation is that amount and the TTL is not lowered. `also`
/// joins the `SET` clause (an event's note).
pub(crate) fn release_write(
    update: aws_sdk_dynamodb::types::builders::UpdateBuilder,
    refund_id: &str,
    amount: i64,
    keep_until_s: i64,
    also: &str,
) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
    let also = if also.is_empty() {
        String::new()
    } else {
        format!("{also}, ")
    };
    update
        .update_expression(format!(
            "SET {also}refunded_amount = refunded_amount - :amount, #rel = :amount, \
             expires_at = :keep REMOVE refunds.#rid"
        ))
        .condition_expression(
            "refunds.#rid = :amount AND (attribute_not_exists(expires_at) OR expires_at <= :keep)",
        )
        .expression_attribute_names("#rid", refund_id)
        .expression_attribute_names("#rel", format!("{RELEASED_PREFIX}{refund_id}"))
        .expression_attribute_values(":amount", n(amount))
        .expression_attribute_values(":keep", n(keep_until_s))
}

pub(crate) fn n_usize(v: usize) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The held refunds on a payment's record item: refund id → the refund's message.
pub fn held_of(item: &HashMap<String, AttributeValue>) -> BTreeMap<String, String> {
    item.get(HELD)
        .and_then(|v| v.as_m().ok())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_s().ok()?.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// The reservations on a payment's record item: refund id → amount.
pub fn reservations_of(item: &HashMap<String, AttributeValue>) -> BTreeMap<String, i64> {
    item.get("refunds")
        .and_then(|v| v.as_m().ok())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_n().ok()?.parse().ok().map(|a| (k.clone(), a)))
                .collect()
        })
        .unwrap_or_default()
}

/// The amounts given back on a payment's record item: refund id → amount.
pub fn released_of(item: &HashMap<String, AttributeValue>) -> BTreeMap<String, i64> {
    item.iter()
        .filter_map(|(k, v)| {
            let rid = k.strip_prefix(RELEASED_PREFIX)?;
            Some((rid.to_owned(), v.as_n().ok()?.parse().ok()?))
        })
        .collect()
}

/// A payment as refunds see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundablePayment {
    /// The payment's record status: only `COMPLETED` payments are refunded.
    pub status: RecordStatus,
    /// What the provider said about the charge.
    pub outcome: Option<PaymentOutcome>,
    /// The total reserved by refunds so far, minor units.
    pub refunded: i64,
    /// Reservations by refund id.
    pub refunds: BTreeMap<String, i64>,
    /// The record carries the refund attributes (a first refund creates them).
    pub has_refunds: bool,
    /// The amount open or lost disputes hold (`disputed_amount`, set by the provider's
    /// dispute events): not refundable.
    pub disputed: i64,
    /// The record's TTL (`expires_at`, epoch seconds) as read: a write keeps at least this.
    pub expires_at_s: i64,
    /// The payment's trace (the record's `traceparent`): a refund's span links to it.
    pub traceparent: Option<String>,
    /// Refunds held until the payment settles: refund id → the refund's message.
    pub held: BTreeMap<String, String>,
    /// The record carries the `held` map (a first hold creates it).
    pub has_held: bool,
    /// Refunds ever reserved on the payment (`refund_count`; for a record written before it
    /// was kept, its reservations and releases counted): each leaves an entry on the record,
    /// so past [`MAX_REFUNDS_PER_PAYMENT`] a refund is refused.
    pub refunds_made: i64,
    /// The record carries `refund_count`.
    pub counts_refunds: bool,
}

impl RefundablePayment {
    /// What is left to refund of a charge of `charged`: neither refunded nor disputed.
    pub fn left(&self, charged: i64) -> i64 {
        charged - self.refunded - self.disputed
    }
}

/// What a reservation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// The amount is reserved for the refund.
    Reserved,
    /// The payment changed since it was read (another refund, or it is no longer refundable
    /// within the total): read it again.
    Changed,
}

/// The port over the refunded totals.
///
/// Failure behaviour: [`StoreError::Unavailable`] for anything that may be retried,
/// [`StoreError::Malformed`] for a record this version cannot read.
#[async_trait]
pub trait RefundLedger: Send + Sync {
    /// The payment's record with its refunds (a consistent read), `None` without a record.
    async fn payment(&self, payment_id: &str) -> Result<Option<RefundablePayment>, StoreError>;

    /// When the payments API accepted the payment (its row's `created`, epoch s), if its row
    /// exists: without a record, it is still on its way to the processor, or (accepted longer
    /// ago than a message may wait for its first claim) its record has expired. `None` where
    /// no API runs.
    async fn accepted_at(&self, payment_id: &str) -> Result<Option<i64>, StoreError>;

    /// Reserves `amount` for `refund_id` on the payment as it was `seen`, only while the
    /// refund's own record is `IN_PROGRESS` under `owner`'s lease (its fencing token):
    /// [`StoreError::LeaseLost`] otherwise, and nothing is written. The payment's record is
    /// kept at least until `keep_until_s` (the refund can still fail for weeks).
    ///
    /// With `hold` (the refund's message), the payment must still be settling at the provider
    /// instead of `succeeded`, and the refund is held: `held_refunds.<refund_id>` = `hold` in the same
    /// write ([`HELD_PARTITION`]).
    #[allow(clippy::too_many_arguments)]
    async fn reserve(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        seen: &RefundablePayment,
        owner: &str,
        keep_until_s: i64,
        hold: Option<&str>,
    ) -> Result<Reservation, StoreError>;

    /// Gives back `amount` reserved for `refund_id` (nothing when it is not reserved), only
    /// while `owner` holds the refund's lease: a zombie attempt whose lease was taken over can
    /// never release what the new owner reserved ([`StoreError::LeaseLost`]). The payment's
    /// record is kept at least until `keep_until_s`.
    async fn release(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        owner: &str,
        keep_until_s: i64,
    ) -> Result<(), StoreError>;

    /// Keeps the payment's record at least until `keep_until_s` while `amount` is reserved for
    /// `refund_id`, only while `owner` holds the refund's lease ([`StoreError::LeaseLost`]
    /// otherwise): an attempt that goes on with a reservation made before its claim keeps the
    /// record as one that reserved would, and marks the refund's record as one that did
    /// ([`RefundLedger::reserved_by`]). `Ok(false)`: the reservation is not that amount any
    /// more (read the payment again); nothing written.
    async fn keep_reserved(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        owner: &str,
        keep_until_s: i64,
    ) -> Result<bool, StoreError>;

    /// Whether an attempt of the refund's record (as it is now) ever held a reservation on its
    /// payment: every fenced ledger write ([`RefundLedger::reserve`], `release`,
    /// `keep_reserved`) marks the refund's record in its own transaction, and an attempt calls
    /// the provider only after one. `false`: no attempt of this record can have called.
    async fn reserved_by(&self, refund_id: &str) -> Result<bool, StoreError>;
}

/// The refund record's attribute that says an attempt of it held a reservation on its payment
/// ([`RefundLedger::reserved_by`]).
pub const RESERVED_BY: &str = "reserved_on_payment";

/// The ledger on the idempotency table, through the official SDK client.
#[derive(Debug, Clone)]
pub struct DynamoRefundLedger {
    /// The payment records' store (for its key layout and record reader).
    records: DynamoStore,
    /// The refund records' store (for the key of the record whose lease fences each write).
    refund_records: DynamoStore,
    /// The SDK client.
    client: Client,
    /// The payments API's table, when there is one.
    payments_table: Option<String>,
}

impl DynamoRefundLedger {
    /// Also reads the payments API's table (`PAYMENTS_TABLE`) for payments accepted but not
    /// processed yet.
    pub fn with_payments_table(mut self, table: Option<String>) -> Self {
        self.payments_table = table;
        self
    }

    /// The ledger of the payments in the idempotency table `table`.
    pub fn new(client: Client, table: &str) -> Self {
        Self {
            records: crate::payments::payment_store(client.clone(), table),
            refund_records: crate::refunds::refund_store(client.clone(), table),
            client,
            payments_table: None,
        }
    }

    /// Runs `update` on the payment's record in one transaction with a check that the
    /// refund's record is `IN_PROGRESS` under `owner`'s lease.
    async fn fenced(
        &self,
        refund_id: &str,
        owner: &str,
        update: Update,
    ) -> Result<Fenced, StoreError> {
        // The refund's record, fenced by the lease, is marked as one whose attempt held a
        // reservation ([`RefundLedger::reserved_by`]), in the same transaction.
        let check = Update::builder()
            .table_name(self.records.table())
            .key(
                self.refund_records.layout().attribute.clone(),
                self.refund_records.record_key(refund_id),
            )
            .update_expression(format!("SET {RESERVED_BY} = :t"))
            .condition_expression("lease_owner = :me AND #s = :in_progress")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":me", s(owner))
            .expression_attribute_values(":in_progress", s(RecordStatus::InProgress.as_str()))
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(check).build())
            .transact_items(TransactWriteItem::builder().update(update).build())
            .send()
            .await;
        match result {
            Ok(_) => Ok(Fenced::Applied),
            Err(SdkError::ServiceError(se)) => match se.err() {
                TransactWriteItemsError::TransactionCanceledException(c) => {
                    let code = |i: usize| {
                        c.cancellation_reasons()
                            .get(i)
                            .and_then(|r| r.code())
                            .unwrap_or("None")
                    };
                    match (code(0), code(1)) {
                        ("ConditionalCheckFailed", _) => Ok(Fenced::LeaseLost),
                        (_, "ConditionalCheckFailed") => Ok(Fenced::Refused),
                        // Another write of the payment's record was in flight (a racing
                        // refund): nothing was written; read again and retry.
                        (a, b) if a == "TransactionConflict" || b == "TransactionConflict" => {
                            Ok(Fenced::Conflict)
                        }
                        (a, b) => Err(StoreError::Unavailable(format!(
                            "the refund's ledger transaction was cancelled ({a}, {b})"
                        ))),
                    }
                }
                _ => Err(StoreError::Unavailable(
                    DisplayErrorContext(&SdkError::ServiceError(se)).to_string(),
                )),
            },
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Settles a refund's unsettled record (`FAILED`, or `IN_PROGRESS` past its lease, and
    /// past its `not_before`: no attempt holds it, none can still land) as `outcome` (what an
    /// operator's reconcile found: the provider holds the refund failed or canceled), and gives
    /// back the payment's reservation of `amount` for it, in one transaction, keeping both
    /// records at least until `keep_until_s`. `Ok(false)`: refused, nothing written (a
    /// processor holds or finished the refund, or the reservation is no longer that amount).
    #[allow(clippy::too_many_arguments)]
    pub async fn settle_failed(
        &self,
        refund_id: &str,
        payment_id: &str,
        amount: Option<i64>,
        outcome: &sqs_once::Outcome,
        now_ms: i64,
        keep_until_s: i64,
    ) -> Result<bool, StoreError> {
        let refund = Update::builder()
            .table_name(self.records.table())
            .key(
                self.refund_records.layout().attribute.clone(),
                self.refund_records.record_key(refund_id),
            )
            .update_expression(format!(
                "SET #s = :completed, outcome = :o, unknown_outcome = :f, completed_at = :now, \
                 expires_at = :keep REMOVE last_error, not_before, lease_owner, {}",
                sqs_once::dynamo::OPEN
            ))
            .condition_expression(
                "(#s = :failed OR (#s = :in_progress AND lease_expires_at < :now)) AND \
                 (attribute_not_exists(not_before) OR not_before < :now) AND \
                 (attribute_not_exists(expires_at) OR expires_at <= :keep)",
            )
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
            .expression_attribute_values(":failed", s(RecordStatus::Failed.as_str()))
            .expression_attribute_values(":in_progress", s(RecordStatus::InProgress.as_str()))
            .expression_attribute_values(":o", sqs_once::dynamo::outcome_to_attr(outcome))
            .expression_attribute_values(":f", AttributeValue::Bool(false))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":keep", n(keep_until_s))
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(refund).build());
        if let Some(amount) = amount {
            let (k, v) = self.key(payment_id);
            let payment = release_write(
                Update::builder().table_name(self.records.table()).key(k, v),
                refund_id,
                amount,
                keep_until_s,
                "",
            )
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            request = request.transact_items(TransactWriteItem::builder().update(payment).build());
        }
        match request.send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se))
                if matches!(
                    se.err(),
                    TransactWriteItemsError::TransactionCanceledException(_)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    fn key(&self, payment_id: &str) -> (String, AttributeValue) {
        (
            self.records.layout().attribute.clone(),
            self.records.record_key(payment_id),
        )
    }
}

fn unavailable<E: std::error::Error + 'static, R>(e: SdkError<E, R>) -> StoreError
where
    R: std::fmt::Debug,
{
    StoreError::Unavailable(DisplayErrorContext(&e).to_string())
}

#[async_trait]
impl RefundLedger for DynamoRefundLedger {
    async fn payment(&self, payment_id: &str) -> Result<Option<RefundablePayment>, StoreError> {
        let (k, v) = self.key(payment_id);
        let out = self
            .client
            .get_item()
            .table_name(self.records.table())
            .key(k, v)
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let record = self.records.record_from_item(item)?;
        let refunds = reservations_of(item);
        let refunds_len = refunds.len();
        Ok(Some(RefundablePayment {
            status: record.status,
            outcome: record.outcome.as_ref().map(PaymentOutcome::from_outcome),
            refunded: get_n(item, "refunded_amount").unwrap_or(0),
            has_refunds: item.contains_key("refunds"),
            refunds,
            disputed: get_n(item, "disputed_amount").unwrap_or(0),
            expires_at_s: record.expires_at_s,
            traceparent: record.traceparent.clone(),
            held: held_of(item),
            has_held: item.contains_key(HELD),
            refunds_made: get_n(item, REFUND_COUNT)
                .unwrap_or_else(|| (refunds_len + released_of(item).len()) as i64),
            counts_refunds: item.contains_key(REFUND_COUNT),
        }))
    }

    async fn accepted_at(&self, payment_id: &str) -> Result<Option<i64>, StoreError> {
        let Some(table) = &self.payments_table else {
            return Ok(None);
        };
        let found = self
            .client
            .get_item()
            .table_name(table)
            .key(
                "pk",
                s(&format!(
                    "{}{payment_id}",
                    crate::payments::outbox::PAYMENT_PREFIX
                )),
            )
            .projection_expression("pk, created")
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "reading the payments table {table}: {}",
                    aws_sdk_dynamodb::error::DisplayErrorContext(&e)
                ))
            })?;
        // A row without a readable `created` is taken as accepted now: waited for, never
        // refused on a guess.
        Ok(found
            .item()
            .map(|item| get_n(item, "created").unwrap_or(i64::MAX)))
    }

    async fn reserve(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        seen: &RefundablePayment,
        owner: &str,
        keep_until_s: i64,
        hold: Option<&str>,
    ) -> Result<Reservation, StoreError> {
        let (k, v) = self.key(payment_id);
        let total = seen.refunded + amount;
        // What is refunded and what disputes hold never pass the charge; the disputed amount
        // is pinned to the one read, so a dispute applied meanwhile makes this read again.
        // The record's lifetime is only ever raised: a write that raced ours and kept it longer
        // makes this one read again. A hold needs a payment that may still be charged
        // (settling, or declined and open to its customer's confirming it again,
        // `provider::event::payment_may_still_charge`): the write that settles it names the
        // state it moves from, so one of the two reads again.
        let state = if hold.is_some() {
            "outcome.#st IN (:processing, :requires_action, :requires_confirmation, :declined)"
        } else {
            "outcome.#st = :succeeded"
        };
        let refundable = format!(
            "#s = :completed AND {state} AND :held <= outcome.#amt \
            AND (attribute_not_exists(disputed_amount) OR disputed_amount = :disputed) \
            AND (attribute_not_exists(expires_at) OR expires_at <= :keep)"
        );
        let mut req = Update::builder()
            .table_name(self.records.table())
            .key(k, v)
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#st", "status")
            .expression_attribute_names("#amt", "amount")
            .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
            .expression_attribute_values(":total", n(total))
            .expression_attribute_values(":held", n(total + seen.disputed))
            .expression_attribute_values(":disputed", n(seen.disputed))
            .expression_attribute_values(":keep", n(keep_until_s.max(seen.expires_at_s)));
        req = match hold {
            None => req.expression_attribute_values(":succeeded", s("succeeded")),
            Some(_) => req
                .expression_attribute_values(":processing", s("processing"))
                .expression_attribute_values(":requires_action", s("requires_action"))
                .expression_attribute_values(":requires_confirmation", s("requires_confirmation"))
                .expression_attribute_values(":declined", s("declined")),
        };
        // The held entry, in the same write: the map's first entry creates it.
        let (held_set, held_condition) = match hold {
            // Already held: an earlier hold of this refund whose reservation a cancel gave back
            // before its record completed (the payment went back to settling since). The
            // entry is this refund's message; it stays as it is.
            None => ("", ""),
            Some(_) if seen.held.contains_key(refund_id) => ("", ""),
            Some(body) if seen.has_held => {
                req = req
                    .expression_attribute_names("#hid", refund_id)
                    .expression_attribute_values(":body", s(body))
                    .expression_attribute_values(":partition", s(HELD_PARTITION));
                (
                    ", held_refunds.#hid = :body, open_work = :partition",
                    " AND attribute_not_exists(held_refunds.#hid)",
                )
            }
            Some(body) => {
                req = req
                    .expression_attribute_values(
                        ":first_held",
                        AttributeValue::M(HashMap::from([(refund_id.to_owned(), s(body))])),
                    )
                    .expression_attribute_values(":partition", s(HELD_PARTITION));
                (
                    ", held_refunds = :first_held, open_work = :partition",
                    " AND attribute_not_exists(held_refunds)",
                )
            }
        };
        // The count of refunds made, pinned to the one read: two refunds that read the same
        // count cannot both write it, so the count (and what the record holds) stays exact.
        // (DynamoDB refuses a value no expression uses: `:made` only where it is compared.)
        let counted = if seen.counts_refunds {
            req = req.expression_attribute_values(":made", n(seen.refunds_made));
            "#made = :made"
        } else {
            "attribute_not_exists(#made)"
        };
        req = req
            .expression_attribute_names("#made", REFUND_COUNT)
            .expression_attribute_values(":made_next", n(seen.refunds_made + 1));
        let held_condition = format!("{held_condition} AND {counted}");
        let held_set = format!("{held_set}, #made = :made_next");
        req = if seen.has_refunds {
            req.update_expression(format!(
                "SET refunds.#rid = :amount, refunded_amount = :total, expires_at = :keep{held_set}"
            ))
            .condition_expression(format!(
                "{refundable} AND attribute_not_exists(refunds.#rid) AND refunded_amount = :seen{held_condition}"
            ))
            .expression_attribute_names("#rid", refund_id)
            .expression_attribute_values(":amount", n(amount))
            .expression_attribute_values(":seen", n(seen.refunded))
        } else {
            req.update_expression(format!(
                "SET refunds = :first, refunded_amount = :total, expires_at = :keep{held_set}"
            ))
                .condition_expression(format!(
                    "{refundable} AND attribute_not_exists(refunds) AND attribute_not_exists(refunded_amount){held_condition}"
                ))
                .expression_attribute_values(
                    ":first",
                    AttributeValue::M(HashMap::from([(refund_id.to_owned(), n(amount))])),
                )
        };
        let update = req
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        match self.fenced(refund_id, owner, update).await? {
            Fenced::Applied => Ok(Reservation::Reserved),
            // The caller reads the payment again and retries (a bounded number of times).
            Fenced::Refused | Fenced::Conflict => Ok(Reservation::Changed),
            Fenced::LeaseLost => Err(StoreError::LeaseLost),
        }
    }

    async fn release(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        owner: &str,
        keep_until_s: i64,
    ) -> Result<(), StoreError> {
        let (k, v) = self.key(payment_id);
        let mut keep = keep_until_s;
        for wait_ms in [0, 20, 50, 100, 200] {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
            let update = release_write(
                Update::builder()
                    .table_name(self.records.table())
                    .key(k.clone(), v.clone()),
                refund_id,
                amount,
                keep,
                "",
            )
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            match self.fenced(refund_id, owner, update).await? {
                Fenced::Applied => return Ok(()),
                Fenced::LeaseLost => return Err(StoreError::LeaseLost),
                Fenced::Conflict => continue,
                Fenced::Refused => {
                    // Not reserved (released before, or never): nothing to give back. Still
                    // reserved: the record's lifetime was raised after it was read; keep that.
                    match self.payment(payment_id).await? {
                        Some(p) if p.refunds.get(refund_id) == Some(&amount) => {
                            keep = keep.max(p.expires_at_s);
                        }
                        _ => return Ok(()),
                    }
                }
            }
        }
        Err(StoreError::Unavailable(
            "releasing the refund's reservation kept conflicting with other writes".into(),
        ))
    }

    async fn keep_reserved(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        owner: &str,
        keep_until_s: i64,
    ) -> Result<bool, StoreError> {
        let (k, v) = self.key(payment_id);
        let mut keep = keep_until_s;
        for wait_ms in [0, 20, 50, 100, 200] {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
            let update = Update::builder()
                .table_name(self.records.table())
                .key(k.clone(), v.clone())
                .update_expression("SET expires_at = :keep")
                .condition_expression(
                    "refunds.#rid = :amount AND (attribute_not_exists(expires_at) OR expires_at <= :keep)",
                )
                .expression_attribute_names("#rid", refund_id)
                .expression_attribute_values(":amount", n(amount))
                .expression_attribute_values(":keep", n(keep))
                .build()
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            match self.fenced(refund_id, owner, update).await? {
                Fenced::Applied => return Ok(true),
                Fenced::LeaseLost => return Err(StoreError::LeaseLost),
                Fenced::Conflict => continue,
                // No longer reserved so (read again), or kept longer since the read: keep that
                // (the write marks the refund's record too, so it is made all the same).
                Fenced::Refused => match self.payment(payment_id).await? {
                    Some(p) if p.refunds.get(refund_id) == Some(&amount) => {
                        keep = keep.max(p.expires_at_s);
                    }
                    _ => return Ok(false),
                },
            }
        }
        Err(StoreError::Unavailable(
            "keeping the payment's record for its reservation kept conflicting with other writes"
                .into(),
        ))
    }

    async fn reserved_by(&self, refund_id: &str) -> Result<bool, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(self.refund_records.table())
            .key(
                self.refund_records.layout().attribute.clone(),
                self.refund_records.record_key(refund_id),
            )
            .projection_expression(RESERVED_BY)
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out
            .item()
            .and_then(|i| i.get(RESERVED_BY))
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false))
    }
}

/// What a fenced ledger write did.
enum Fenced {
    /// Written.
    Applied,
    /// The refund's record is not `IN_PROGRESS` under this owner: nothing written.
    LeaseLost,
    /// The payment's record refused the write's own condition: nothing written.
    Refused,
    /// Another write of the payment's record was in flight: nothing written, try again.
    Conflict,
}

/// The ledger in memory, with the same conditions (tests).
#[derive(Debug, Default)]
pub struct InMemoryRefundLedger {
    /// Payments by id.
    payments: Mutex<HashMap<String, RefundablePayment>>,
    /// Payments the API accepted that have no record, and when (epoch s).
    accepted: Mutex<HashMap<String, i64>>,
    /// Refunds whose record an attempt held a reservation for ([`RefundLedger::reserved_by`]).
    reserved_by: Mutex<std::collections::HashSet<String>>,
}

impl InMemoryRefundLedger {
    /// Puts a payment as is.
    pub fn insert(&self, payment_id: &str, payment: RefundablePayment) {
        if let Ok(mut m) = self.payments.lock() {
            m.insert(payment_id.to_owned(), payment);
        }
    }

    /// Takes a payment's record away (its TTL ran out).
    pub fn expire(&self, payment_id: &str) {
        if let Ok(mut m) = self.payments.lock() {
            m.remove(payment_id);
        }
    }

    /// Marks a payment as accepted by the API at `created_s` (epoch s): a row, no record.
    pub fn accept(&self, payment_id: &str, created_s: i64) {
        if let Ok(mut a) = self.accepted.lock() {
            a.insert(payment_id.to_owned(), created_s);
        }
    }

    /// Marks the refund's record as one whose attempt held a reservation.
    fn mark(&self, refund_id: &str) {
        if let Ok(mut r) = self.reserved_by.lock() {
            r.insert(refund_id.to_owned());
        }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut HashMap<String, RefundablePayment>) -> T,
    ) -> Result<T, StoreError> {
        let mut m = self
            .payments
            .lock()
            .map_err(|_| StoreError::Unavailable("ledger mutex poisoned".into()))?;
        Ok(f(&mut m))
    }
}

#[async_trait]
impl RefundLedger for InMemoryRefundLedger {
    async fn payment(&self, payment_id: &str) -> Result<Option<RefundablePayment>, StoreError> {
        self.with(|m| m.get(payment_id).cloned())
    }

    async fn accepted_at(&self, payment_id: &str) -> Result<Option<i64>, StoreError> {
        self.accepted
            .lock()
            .map(|a| a.get(payment_id).copied())
            .map_err(|_| StoreError::Unavailable("ledger mutex poisoned".into()))
    }

    /// The in-memory ledger keeps no refund records: it fences nothing (`owner` is unused).
    async fn reserve(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        seen: &RefundablePayment,
        _owner: &str,
        keep_until_s: i64,
        hold: Option<&str>,
    ) -> Result<Reservation, StoreError> {
        self.with(|m| {
            let Some(p) = m.get_mut(payment_id) else {
                return Reservation::Changed;
            };
            let charged = p
                .outcome
                .as_ref()
                .filter(|o| match hold {
                    None => o.status == "succeeded",
                    Some(_) => crate::provider::event::payment_may_still_charge(&o.status),
                })
                .map(|o| o.amount);
            let total = seen.refunded + amount;
            let fits = p.status == RecordStatus::Completed
                && charged.is_some_and(|c| total + seen.disputed <= c);
            // As the conditional write: a new entry only where none is (an entry already there
            // when this attempt read the payment is left as it is).
            let entry_taken = hold.is_some()
                && !seen.held.contains_key(refund_id)
                && p.held.contains_key(refund_id);
            if !fits
                || entry_taken
                || p.refunds_made != seen.refunds_made
                || p.counts_refunds != seen.counts_refunds
                || p.held.len() != seen.held.len()
                || p.refunds.contains_key(refund_id)
                || p.refunded != seen.refunded
                || p.disputed != seen.disputed
                || p.expires_at_s > keep_until_s.max(seen.expires_at_s)
            {
                return Reservation::Changed;
            }
            p.refunds.insert(refund_id.to_owned(), amount);
            p.refunded = total;
            p.has_refunds = true;
            p.refunds_made += 1;
            p.counts_refunds = true;
            if let Some(body) = hold {
                p.held.insert(refund_id.to_owned(), body.to_owned());
                p.has_held = true;
            }
            p.expires_at_s = p.expires_at_s.max(keep_until_s);
            Reservation::Reserved
        })
        .inspect(|r| {
            if *r == Reservation::Reserved {
                self.mark(refund_id);
            }
        })
    }

    async fn release(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        _owner: &str,
        keep_until_s: i64,
    ) -> Result<(), StoreError> {
        self.with(|m| {
            if let Some(p) = m.get_mut(payment_id) {
                if p.refunds.get(refund_id) == Some(&amount) {
                    p.refunds.remove(refund_id);
                    p.refunded -= amount;
                    p.expires_at_s = p.expires_at_s.max(keep_until_s);
                }
            }
        })
    }

    async fn keep_reserved(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        _owner: &str,
        keep_until_s: i64,
    ) -> Result<bool, StoreError> {
        let kept = self.with(|m| match m.get_mut(payment_id) {
            Some(p) if p.refunds.get(refund_id) == Some(&amount) => {
                p.expires_at_s = p.expires_at_s.max(keep_until_s);
                true
            }
            _ => false,
        })?;
        if kept {
            self.mark(refund_id);
        }
        Ok(kept)
    }

    async fn reserved_by(&self, refund_id: &str) -> Result<bool, StoreError> {
        self.reserved_by
            .lock()
            .map(|r| r.contains(refund_id))
            .map_err(|_| StoreError::Unavailable("ledger mutex poisoned".into()))
    }
}
