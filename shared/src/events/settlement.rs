//! Where the provider's events settle what its first answers left open: the payment's and the
//! refund's records in the idempotency table, moved by conditional writes that name the state
//! they move from, so that two deliveries of one event, or two events racing, can never both
//! move a state (the second finds it changed and reads again).
//!
//! On the payment's record (`payment#<id>`):
//! - `outcome.status` (and `outcome.decline_code`): the payment's settled status;
//! - `dispute:<dp_id>`: a map of the dispute's `status` and `amount`; `disputed_amount`: what
//!   open and lost disputes hold (not refundable, see [`crate::refunds::ledger`]);
//! - `events`: a list of the events applied to the payment and its refunds, each
//!   `"<created>|<evt_id>|<type>|<what changed>"`, in the order applied (`payctl history`
//!   sorts them by `created`).
//!
//! On a refund's record (`refund#<id>`): `outcome.status`. A refund moving to `failed` or
//! `canceled` gives its reservation back in the same transaction
//! (`refunds.<refund_id>` moves to `released:<refund_id>`, `refunded_amount` goes down),
//! conditional on the reservation being the one read: exactly once, whatever repeats. When
//! the refund's record is gone, the payment's ledger alone is the truth: a refund that failed
//! gives back what the payment still holds for it ([`Settlements::settle_refund_on_payment`]).
//!
//! Every write keeps the records it changes (their TTL, `expires_at`) at least until the
//! lifetime the caller gives, and only ever raises it: each is conditional on the TTL read
//! being no later than the new one, so a write that raced and kept a record longer makes this
//! one read again. No record is deleted while the provider can still change what it holds.
//!
//! Why ~550 lines: the port and its DynamoDB adapter, whose every write spells out its
//! conditions; they are read together when a rule of the inbox changes.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use aws_sdk_dynamodb::Client;
use sqs_once::dynamo::{get_n, n, s, DynamoStore};
use sqs_once::record::{RecordStatus, StoreError};

/// One event applied, as the payment's record lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    /// Unix seconds the provider created the event.
    pub created: i64,
    /// `evt_...`.
    pub event_id: String,
    /// Its type.
    pub kind: String,
    /// What it changed, in words (`payment processing -> succeeded`).
    pub change: String,
    /// Whether the payment's record lists it: it listed fewer than [`MAX_EVENT_NOTES`] when
    /// read. Past that, an event applied is only counted (`events_unlisted`), so a payment
    /// with hundreds of refunds and their events stays within DynamoDB's item size. Not
    /// stored.
    pub listed: bool,
}

/// The most event notes a payment's record lists (the first ones; later ones are counted). A
/// note is under 1 KB (an event id of at most 255 bytes, a type cut at 100, a change cut at
/// 600), so the list stays under 100 KB: each write that lists one is conditional on the list
/// being shorter.
pub const MAX_EVENT_NOTES: usize = 100;

/// A string cut at `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl EventNote {
    fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.created,
            cut(&self.event_id, 255),
            cut(&self.kind, 100).replace('|', "/"),
            cut(&self.change, 600)
        )
    }

    /// Reads a note written by `EventNote::encode`.
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.splitn(4, '|');
        Some(Self {
            created: parts.next()?.parse().ok()?,
            event_id: parts.next()?.to_owned(),
            kind: parts.next()?.to_owned(),
            change: parts.next()?.to_owned(),
            listed: true,
        })
    }
}

/// A payment's record as the events see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentState {
    /// The record's status: events settle `COMPLETED` records only.
    pub record_status: RecordStatus,
    /// `outcome.status`.
    pub status: Option<String>,
    /// `outcome.provider_payment_id`.
    pub provider_payment_id: Option<String>,
    /// Disputes by id: (status, amount).
    pub disputes: BTreeMap<String, (String, i64)>,
    /// Each dispute's version: how many writes it has had (0 for one written before versions
    /// were kept). Every write of a dispute is conditioned on the version read and raises it.
    pub dispute_versions: BTreeMap<String, i64>,
    /// `disputed_amount`.
    pub disputed: i64,
    /// The record's TTL (epoch seconds).
    pub expires_at_s: i64,
    /// The payment's trace (the record's `traceparent`): an event's span links to it.
    pub traceparent: Option<String>,
    /// The events applied, in the order applied (the first [`MAX_EVENT_NOTES`]).
    pub events: Vec<EventNote>,
    /// The events applied past those listed (`events_unlisted`).
    pub events_unlisted: i64,
    /// The refunds' reservations held: refund id → amount.
    pub refunds: BTreeMap<String, i64>,
    /// The amounts given back by refunds that moved no money: refund id → amount.
    pub released: BTreeMap<String, i64>,
    /// Refunds held until the payment settles: refund id → the refund's message.
    pub held: BTreeMap<String, String>,
}

/// A refund's record as the events see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundState {
    /// The record's status.
    pub record_status: RecordStatus,
    /// `outcome.status`.
    pub status: Option<String>,
    /// `outcome.payment_id`: the payment refunded.
    pub payment_id: Option<String>,
    /// `outcome.provider_refund_id`.
    pub provider_refund_id: Option<String>,
    /// The record's TTL (epoch seconds).
    pub expires_at_s: i64,
}

/// The port over the records the events settle. Each `settle_*` is `Ok(true)` when it moved
/// the state, `Ok(false)` when the state was no longer `from` (read again and decide again).
#[async_trait]
pub trait Settlements: Send + Sync {
    /// The payment's record, `None` without one.
    async fn payment(&self, payment_id: &str) -> Result<Option<PaymentState>, StoreError>;

    /// The refund's record, `None` without one.
    async fn refund(&self, refund_id: &str) -> Result<Option<RefundState>, StoreError>;

    /// The payment's reservation for `refund_id`, if it holds one.
    async fn reservation(
        &self,
        payment_id: &str,
        refund_id: &str,
    ) -> Result<Option<i64>, StoreError>;

    /// Moves the payment's status `from` → `to` (with the decline code of a failed payment),
    /// keeping the record at least until `keep_until_s`.
    #[allow(clippy::too_many_arguments)]
    async fn settle_payment(
        &self,
        payment_id: &str,
        from: &str,
        to: &str,
        decline_code: Option<&str>,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError>;

    /// Moves the refund's status `from` → `to`; with `release`, gives back the payment's
    /// reservation of that amount for the refund in the same transaction. Both records are
    /// kept at least until `keep_until_s`. Without a `payment_id` (its record is gone: past its
    /// lifetime, nothing holds its money) only the refund's record moves.
    #[allow(clippy::too_many_arguments)]
    async fn settle_refund(
        &self,
        refund_id: &str,
        payment_id: Option<&str>,
        from: &str,
        to: &str,
        release: Option<i64>,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError>;

    /// For a refund whose own record is gone: gives back the `amount` the payment's record
    /// still holds for `refund_id` (the refund moved no money), keeping the payment's record
    /// at least until `keep_until_s`. `Ok(false)` when the reservation is not that amount any
    /// more (read again).
    async fn settle_refund_on_payment(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError>;

    /// Records the dispute at `to` (from `from`: the status and version read, `None` when not
    /// recorded yet), raising its version, changing the payment's disputed amount by
    /// `held_change`, keeping the record at least until `keep_until_s`. `Ok(false)` when the
    /// dispute's status or version is not the one read: another write came in between.
    #[allow(clippy::too_many_arguments)]
    async fn settle_dispute(
        &self,
        payment_id: &str,
        dispute_id: &str,
        from: Option<(&str, i64)>,
        to: &str,
        amount: i64,
        held_change: i64,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError>;
}

/// The settlements on the idempotency table, through the official SDK client.
#[derive(Debug, Clone)]
pub struct DynamoSettlements {
    client: Client,
    payments: DynamoStore,
    refunds: DynamoStore,
}

/// The prefix of a dispute's attribute on the payment's record.
pub const DISPUTE_PREFIX: &str = "dispute:";

/// The condition of every settling write on the record's TTL: it is only ever raised (a write
/// that raced this one and kept the record longer makes this one read again).
const KEEP: &str = "(attribute_not_exists(expires_at) OR expires_at <= :keep)";

/// The `SET` part of every settling write that lists the event applied on the payment's record.
const APPEND: &str = "events = list_append(if_not_exists(events, :empty), :note)";

/// The payment record's count of the events applied and not listed.
pub const UNLISTED: &str = "events_unlisted";

/// The `SET` part that counts an event applied and not listed.
const COUNT: &str = "events_unlisted = if_not_exists(events_unlisted, :zero_notes) + :one_note";

/// A payment's record write that lists its note, made conditional on the list holding fewer
/// than [`MAX_EVENT_NOTES`]: writes that read the list short of it and raced each other do not
/// all pass it (the one refused reads again, and counts its note).
fn capped(
    req: aws_sdk_dynamodb::types::builders::UpdateBuilder,
) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
    if !req
        .get_update_expression()
        .as_deref()
        .is_some_and(|u| u.contains(APPEND))
    {
        return req;
    }
    let cap = "(attribute_not_exists(events) OR size(events) < :max_notes)";
    let condition = match req.get_condition_expression() {
        Some(c) => format!("({c}) AND {cap}"),
        None => cap.to_owned(),
    };
    req.condition_expression(condition)
        .expression_attribute_values(":max_notes", n(MAX_EVENT_NOTES as i64))
}

/// The event's note on a payment's record write: listed (`events`) while the record listed
/// fewer than [`MAX_EVENT_NOTES`] when read, else counted (`events_unlisted`). The clause for
/// the write's `SET`, and the write with its values.
fn noted(
    req: aws_sdk_dynamodb::types::builders::UpdateBuilder,
    note: &EventNote,
) -> (
    aws_sdk_dynamodb::types::builders::UpdateBuilder,
    &'static str,
) {
    if note.listed {
        (
            req.expression_attribute_values(":note", AttributeValue::L(vec![s(&note.encode())]))
                .expression_attribute_values(":empty", AttributeValue::L(vec![])),
            APPEND,
        )
    } else {
        (
            req.expression_attribute_values(":zero_notes", n(0))
                .expression_attribute_values(":one_note", n(1)),
            COUNT,
        )
    }
}

fn unavailable<E: std::error::Error + 'static, R: std::fmt::Debug>(
    e: SdkError<E, R>,
) -> StoreError {
    StoreError::Unavailable(DisplayErrorContext(&e).to_string())
}

fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, StoreError> {
    r.map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// The events list of a record item.
pub fn events_of(item: &HashMap<String, AttributeValue>) -> Vec<EventNote> {
    item.get("events")
        .and_then(|v| v.as_l().ok())
        .map(|l| {
            l.iter()
                .filter_map(|v| v.as_s().ok().and_then(|t| EventNote::decode(t)))
                .collect()
        })
        .unwrap_or_default()
}

/// The disputes of a payment's record item: id → (status, amount).
pub fn disputes_of(item: &HashMap<String, AttributeValue>) -> BTreeMap<String, (String, i64)> {
    item.iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix(DISPUTE_PREFIX)?;
            let m = v.as_m().ok()?;
            let status = m.get("status")?.as_s().ok()?.clone();
            Some((id.to_owned(), (status, get_n(m, "amount").unwrap_or(0))))
        })
        .collect()
}

/// The disputes' versions on a payment's record item: id → version (0 when none is written).
pub fn dispute_versions_of(item: &HashMap<String, AttributeValue>) -> BTreeMap<String, i64> {
    item.iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix(DISPUTE_PREFIX)?;
            Some((id.to_owned(), get_n(v.as_m().ok()?, "version").unwrap_or(0)))
        })
        .collect()
}

impl DynamoSettlements {
    /// The settlements of the records in the idempotency table `table`.
    pub fn new(client: Client, table: &str) -> Self {
        Self {
            payments: crate::payments::payment_store(client.clone(), table),
            refunds: crate::refunds::refund_store(client.clone(), table),
            client,
        }
    }

    async fn item(
        &self,
        store: &DynamoStore,
        key: &str,
    ) -> Result<Option<HashMap<String, AttributeValue>>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(store.table())
            .key(store.layout().attribute.clone(), store.record_key(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.item().cloned())
    }

    fn payment_update(&self, payment_id: &str) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
        Update::builder().table_name(self.payments.table()).key(
            self.payments.layout().attribute.clone(),
            self.payments.record_key(payment_id),
        )
    }

    /// Runs one conditional update: `Ok(false)` when its condition refused it.
    async fn update(&self, update: Update) -> Result<bool, StoreError> {
        let mut req = self
            .client
            .update_item()
            .table_name(update.table_name())
            .set_key(Some(update.key().clone()))
            .update_expression(update.update_expression())
            .set_condition_expression(update.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(update.expression_attribute_names().cloned())
            .set_expression_attribute_values(update.expression_attribute_values().cloned());
        req = req.return_values(aws_sdk_dynamodb::types::ReturnValue::None);
        match req.send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se))
                if matches!(
                    se.err(),
                    UpdateItemError::ConditionalCheckFailedException(_)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(unavailable(e)),
        }
    }
}

#[async_trait]
impl Settlements for DynamoSettlements {
    async fn payment(&self, payment_id: &str) -> Result<Option<PaymentState>, StoreError> {
        let Some(item) = self.item(&self.payments, payment_id).await? else {
            return Ok(None);
        };
        let record = self.payments.record_from_item(&item)?;
        Ok(Some(PaymentState {
            record_status: record.status,
            status: record.outcome.as_ref().map(|o| o.status.clone()),
            provider_payment_id: record
                .outcome
                .as_ref()
                .and_then(|o| o.text("provider_payment_id").map(str::to_owned)),
            disputes: disputes_of(&item),
            dispute_versions: dispute_versions_of(&item),
            disputed: get_n(&item, "disputed_amount").unwrap_or(0),
            expires_at_s: record.expires_at_s,
            traceparent: record.traceparent.clone(),
            events: events_of(&item),
            events_unlisted: get_n(&item, UNLISTED).unwrap_or(0),
            refunds: crate::refunds::ledger::reservations_of(&item),
            released: crate::refunds::ledger::released_of(&item),
            held: crate::refunds::ledger::held_of(&item),
        }))
    }

    async fn refund(&self, refund_id: &str) -> Result<Option<RefundState>, StoreError> {
        let Some(item) = self.item(&self.refunds, refund_id).await? else {
            return Ok(None);
        };
        let record = self.refunds.record_from_item(&item)?;
        let text = |f: &str| {
            record
                .outcome
                .as_ref()
                .and_then(|o| o.text(f).map(str::to_owned))
        };
        Ok(Some(RefundState {
            record_status: record.status,
            status: record.outcome.as_ref().map(|o| o.status.clone()),
            payment_id: text("payment_id"),
            provider_refund_id: text("provider_refund_id"),
            expires_at_s: record.expires_at_s,
        }))
    }

    async fn reservation(
        &self,
        payment_id: &str,
        refund_id: &str,
    ) -> Result<Option<i64>, StoreError> {
        Ok(self
            .item(&self.payments, payment_id)
            .await?
            .and_then(|item| {
                let m = item.get("refunds")?.as_m().ok()?;
                m.get(refund_id)?.as_n().ok()?.parse().ok()
            }))
    }

    async fn settle_payment(
        &self,
        payment_id: &str,
        from: &str,
        to: &str,
        decline_code: Option<&str>,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError> {
        let (req, listed) = noted(self.payment_update(payment_id), note);
        let mut set = vec!["outcome.#st = :to", listed, "expires_at = :keep"];
        let mut req = req
            .condition_expression(format!(
                "#s = :completed AND outcome.#st = :from AND {KEEP}"
            ))
            .expression_attribute_values(":keep", n(keep_until_s))
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
            .expression_attribute_values(":from", s(from))
            .expression_attribute_values(":to", s(to));
        if let Some(code) = decline_code {
            set.push("outcome.decline_code = :code");
            req = req.expression_attribute_values(":code", s(code));
        }
        let update =
            built(capped(req.update_expression(format!("SET {}", set.join(", ")))).build())?;
        self.update(update).await
    }

    async fn settle_refund(
        &self,
        refund_id: &str,
        payment_id: Option<&str>,
        from: &str,
        to: &str,
        release: Option<i64>,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError> {
        let refund = built(
            Update::builder()
                .table_name(self.refunds.table())
                .key(
                    self.refunds.layout().attribute.clone(),
                    self.refunds.record_key(refund_id),
                )
                .update_expression("SET outcome.#st = :to, expires_at = :keep")
                .condition_expression(format!(
                    "#s = :completed AND outcome.#st = :from AND {KEEP}"
                ))
                .expression_attribute_names("#s", "status")
                .expression_attribute_names("#st", "status")
                .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
                .expression_attribute_values(":from", s(from))
                .expression_attribute_values(":to", s(to))
                .expression_attribute_values(":keep", n(keep_until_s))
                .build(),
        )?;
        let Some(payment_id) = payment_id else {
            return self.update(refund).await;
        };
        let (payment, listed) = noted(self.payment_update(payment_id), note);
        let mut payment = payment.expression_attribute_values(":keep", n(keep_until_s));
        payment = match release {
            Some(amount) => crate::refunds::ledger::release_write(
                payment,
                refund_id,
                amount,
                keep_until_s,
                listed,
            ),
            None => payment
                .update_expression(format!("SET {listed}, expires_at = :keep"))
                .condition_expression(format!("attribute_exists(#pk) AND {KEEP}"))
                .expression_attribute_names("#pk", self.payments.layout().attribute.clone()),
        };
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(refund).build())
            .transact_items(
                TransactWriteItem::builder()
                    .update(built(capped(payment).build())?)
                    .build(),
            )
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) => match se.err() {
                // A condition refused it, or another write of these records was in flight:
                // nothing was written; read again.
                TransactWriteItemsError::TransactionCanceledException(c)
                    if c.cancellation_reasons().iter().any(|r| {
                        matches!(
                            r.code(),
                            Some("ConditionalCheckFailed" | "TransactionConflict")
                        )
                    }) =>
                {
                    Ok(false)
                }
                _ => Err(StoreError::Unavailable(
                    DisplayErrorContext(&SdkError::ServiceError(se)).to_string(),
                )),
            },
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn settle_refund_on_payment(
        &self,
        payment_id: &str,
        refund_id: &str,
        amount: i64,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError> {
        let (payment, listed) = noted(self.payment_update(payment_id), note);
        let update =
            crate::refunds::ledger::release_write(payment, refund_id, amount, keep_until_s, listed);
        self.update(built(capped(update).build())?).await
    }

    async fn settle_dispute(
        &self,
        payment_id: &str,
        dispute_id: &str,
        from: Option<(&str, i64)>,
        to: &str,
        amount: i64,
        held_change: i64,
        keep_until_s: i64,
        note: &EventNote,
    ) -> Result<bool, StoreError> {
        let version = from.map_or(0, |(_, v)| v);
        let dispute = AttributeValue::M(HashMap::from([
            ("status".to_owned(), s(to)),
            ("amount".to_owned(), n(amount)),
            ("version".to_owned(), n(version + 1)),
        ]));
        let (req, listed) = noted(self.payment_update(payment_id), note);
        let mut req = req
            .update_expression(format!(
                "SET #d = :dispute, disputed_amount = if_not_exists(disputed_amount, :zero) + :held, \
                 {listed}, expires_at = :keep"
            ))
            .expression_attribute_values(":keep", n(keep_until_s))
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#d", format!("{DISPUTE_PREFIX}{dispute_id}"))
            .expression_attribute_values(":completed", s(RecordStatus::Completed.as_str()))
            .expression_attribute_values(":dispute", dispute)
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":held", n(held_change));
        req = match from {
            None => req.condition_expression(format!(
                "#s = :completed AND attribute_not_exists(#d) AND {KEEP}"
            )),
            // A dispute written before versions were kept has none: version 0.
            Some((f, 0)) => req
                .condition_expression(format!(
                    "#s = :completed AND #d.#st = :from AND attribute_not_exists(#d.#v) AND {KEEP}"
                ))
                .expression_attribute_names("#st", "status")
                .expression_attribute_names("#v", "version")
                .expression_attribute_values(":from", s(f)),
            Some((f, v)) => req
                .condition_expression(format!(
                    "#s = :completed AND #d.#st = :from AND #d.#v = :version AND {KEEP}"
                ))
                .expression_attribute_names("#st", "status")
                .expression_attribute_names("#v", "version")
                .expression_attribute_values(":from", s(f))
                .expression_attribute_values(":version", n(v)),
        };
        self.update(built(capped(req).build())?).await
    }
}
