//! Refunds held until their payment settles, resumed when it has.
//!
//! A refund of a payment still settling at the provider is held ([`crate::refunds::work`]): its
//! amount reserved, its message kept on the payment's record (`held_refunds.<refund_id>`), its
//! own record completed `held` and its message acknowledged. Nothing is waiting in a queue: the
//! payment's record is where the refund waits, for as long as the record lives.
//!
//! "Settled" here means the provider can no longer charge the payment otherwise than it has:
//! succeeded, or ended without a charge for good (`canceled`, refused). A decline is not such an
//! end: the PaymentIntent is back at `requires_payment_method`, and its customer may confirm it
//! again with another payment method days later and be charged. A payment recorded `declined`
//! keeps its held refunds held ([`crate::provider::event::payment_may_still_charge`]), to be made
//! if it succeeds, canceled if it is canceled; past `HeldRefundHorizonDays` the sweep counts it
//! overdue, for an operator to cancel the PaymentIntent or wait (issue 65: a held refund
//! canceled on the decline was never made when the customer paid after all).
//!
//! Once the payment is settled so, [`HeldRefunds::resume`] reads each held refund's
//! record: one still completed `held` is reopened (`COMPLETED`/`held` → `FAILED`,
//! [`sqs_once::DynamoStore::reopen`]) and its message sent to the refunds queue again; one
//! completed otherwise (made, canceled, refused) is done, and its entry removed; one an attempt
//! holds (or handed back until a later time) is left to that attempt's message; any other
//! (failed and due, claimed by an attempt that died, gone) is sent again. The refund processor then runs the refund once more
//! and makes it (the payment succeeded) or cancels it and gives its amount back (it failed).
//! The entry goes only once the refund's record says it is done: a refund taken up and then
//! lost (its worker crashed, its message deleted by a late acknowledgement of a copy) is sent
//! again by the next resume. The SPIN model's `SETTLE=3` checks this resume (S1–S5 and L1,
//! model/README.md), and `SETTLE=2` shows the design that removed the entry before the
//! refund's call losing the refund.
//!
//! Who resumes, so that a crash at any point strands nothing:
//! - the inbox, after it applied (or found applied) the payment's settlement, before its own
//!   record completes: a crash after the settlement's write and before the send leaves the
//!   event's message to come back, and the redelivery finds the payment settled and resumes;
//! - the scheduled catch-up, every run: it reads the payments that hold refunds from the sparse
//!   index's `refund_held` partition ([`HeldRefunds::sweep`]) and resumes each that settled, so a
//!   settlement applied by any path (an operator's reconcile, an event dead-lettered and
//!   redriven later) is followed; and it counts those still settling past the horizon
//!   ([`HeldSweep::overdue`], the `HeldRefundsOverdue` alarm).

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::AttributeValue;
use sqs_once::dynamo::{s, DynamoStore};
use sqs_once::record::StoreError;
use sqs_once::IdempotencyStore;

use crate::refunds::ledger::{held_of, HELD_PARTITION};
use crate::refunds::queue::RefundQueue;
use crate::refunds::work::HELD;

/// What one sweep of the held refunds found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HeldSweep {
    /// Payments that hold refunds, read by this sweep.
    pub payments: usize,
    /// The refunds they hold.
    pub held: usize,
    /// Held refunds sent again because their payment settled.
    pub resumed: usize,
    /// Payments still settling longer than the horizon after their charge began: payment id
    /// and how long, seconds.
    pub overdue: Vec<(String, i64)>,
    /// Payments in the partition this sweep did not read: its time ran out first (the next
    /// sweep starts elsewhere in the partition).
    pub unread: usize,
    /// Payments whose reading or resuming failed (each logged with its error; the sweep goes
    /// on with the others, and the run reports the failure).
    pub failed: Vec<(String, String)>,
}

impl HeldSweep {
    /// The sweep's EMF line (namespace `ProviderEvents`, dimensions `Stack`, `Service`):
    /// `HeldRefunds` (the refunds payments hold until they settle), `HeldRefundsOverdue` (the
    /// payments holding refunds still settling past the horizon), which the template alarms
    /// on, and `HeldSweepFailed` (payments the sweep could not read or resume).
    pub fn emf_line(&self, now_ms: i64) -> String {
        let line = serde_json::json!({
            "_aws": {
                "Timestamp": now_ms,
                "CloudWatchMetrics": [{
                    "Namespace": "ProviderEvents",
                    "Dimensions": [["Service"]],
                    "Metrics": [
                        {"Name": "HeldRefunds", "Unit": "Count"},
                        {"Name": "HeldRefundsOverdue", "Unit": "Count"},
                        {"Name": "HeldSweepFailed", "Unit": "Count"}
                    ]
                }]
            },
            "Service": "event-processor",
            "HeldRefunds": self.held,
            "HeldRefundsOverdue": self.overdue.len(),
            "HeldSweepFailed": self.failed.len(),
            "held_payments": self.payments,
            "held_resumed": self.resumed,
            "held_unread": self.unread,
        });
        crate::telemetry::with_dimensions(line, crate::telemetry::dimensions()).to_string()
    }
}

/// What one resume of a payment's held refunds did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Held refunds sent to the refunds queue.
    pub sent: usize,
    /// Held refunds an attempt holds now (claimed, its lease running): not sent, since the
    /// attempt's own message is in flight. One that is holding the refund (it read the
    /// payment settling) completes it `held` after this read: whoever resumed must resume
    /// again once that attempt is over (the inbox fails its event, which comes back).
    pub busy: usize,
}

/// The held refunds of the idempotency table, resumed through the refunds queue.
pub struct HeldRefunds {
    client: aws_sdk_dynamodb::Client,
    payments: DynamoStore,
    refunds: DynamoStore,
    queue: Arc<dyn RefundQueue>,
    clock: Arc<dyn sqs_once::clock::Clock>,
    refund_window: Duration,
}

impl HeldRefunds {
    /// The held refunds of the table `table`, resumed into `queue`; a refund record reopened
    /// is kept `refund_window` from then (as its completion kept it).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: &str,
        queue: Arc<dyn RefundQueue>,
        refund_window: Duration,
    ) -> Self {
        Self {
            payments: crate::payments::payment_store(client.clone(), table),
            refunds: crate::refunds::refund_store(client.clone(), table),
            client,
            queue,
            clock: sqs_once::clock::system(),
            refund_window,
        }
    }

    /// The same on another clock.
    pub fn with_clock(mut self, clock: Arc<dyn sqs_once::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The payment's status and its held refunds (a consistent read); `None` without a record.
    async fn held(
        &self,
        payment_id: &str,
    ) -> Result<Option<(String, std::collections::BTreeMap<String, String>)>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(self.payments.table())
            .key(
                self.payments.layout().attribute.clone(),
                self.payments.record_key(payment_id),
            )
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(DisplayErrorContext(&e).to_string()))?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let record = self.payments.record_from_item(item)?;
        let status = record.outcome.map(|o| o.status).unwrap_or_default();
        Ok(Some((status, held_of(item))))
    }

    /// Resumes the payment's held refunds if it has settled (succeeded, or ended for good: not
    /// settling, not declined).
    /// Each one's record:
    /// - completed `held`: reopened, and its message sent;
    /// - completed otherwise (made, canceled, refused): done; its entry is removed;
    /// - claimed by an attempt whose lease runs, or handed back until a later time (its
    ///   message comes back then): left to that attempt ([`Resumed::busy`] counts the first);
    /// - anything else (failed and due, claimed by an attempt that died, gone): sent again.
    ///
    /// Nothing is done while the payment may still be charged (settling, or declined) or holds
    /// none.
    pub async fn resume(&self, payment_id: &str) -> Result<Resumed, StoreError> {
        let Some((status, held)) = self.held(payment_id).await? else {
            return Ok(Resumed::default());
        };
        if held.is_empty()
            || crate::provider::event::payment_may_still_charge(&status)
            || sqs_once::mutation::on("held_refunds_never_resumed")
        {
            return Ok(Resumed::default());
        }
        let now_ms = self.clock.now_ms();
        let keep_s = now_ms / 1000 + self.refund_window.as_secs() as i64;
        let mut bodies = Vec::new();
        let mut busy = 0;
        let mut left = held.len();
        for (refund_id, body) in held {
            let record = self.refunds.get(&refund_id).await?;
            if let Some(r) = &record {
                use sqs_once::record::RecordStatus;
                match r.status {
                    RecordStatus::Completed
                        if r.outcome.as_ref().is_some_and(|o| o.status != HELD) =>
                    {
                        // Made, canceled or refused: nothing brings it back any more.
                        if self.forget(payment_id, &refund_id, left).await? {
                            left -= 1;
                        }
                        continue;
                    }
                    RecordStatus::InProgress if r.lease_expires_at_ms > now_ms => {
                        busy += 1;
                        continue;
                    }
                    RecordStatus::Failed if r.not_before_ms.is_some_and(|t| t > now_ms) => {
                        continue;
                    }
                    _ => {}
                }
            }
            self.refunds
                .reopen(
                    &refund_id,
                    HELD,
                    &format!(
                        "payment {payment_id} settled {status}: the held refund is decided again"
                    ),
                    now_ms,
                    keep_s,
                )
                .await?;
            bodies.push(body);
        }
        if !bodies.is_empty() {
            self.queue
                .send(&bodies)
                .await
                .map_err(StoreError::Unavailable)?;
            tracing::info!(
                payment_id,
                status,
                sent = bodies.len(),
                busy,
                "held refunds resumed"
            );
        }
        Ok(Resumed {
            sent: bodies.len(),
            busy,
        })
    }

    /// Removes a done refund's held entry from the payment whose `held_refunds` map has
    /// `count` entries (the last one takes the record out of the `refund_held` partition).
    /// `Ok(false)`: the map changed since it was read (another resume removed an entry); the
    /// entry is left for the next resume.
    async fn forget(
        &self,
        payment_id: &str,
        refund_id: &str,
        count: usize,
    ) -> Result<bool, StoreError> {
        let (remove, condition) = crate::refunds::ledger::take_held_clause(count);
        let result = self
            .client
            .update_item()
            .table_name(self.payments.table())
            .key(
                self.payments.layout().attribute.clone(),
                self.payments.record_key(payment_id),
            )
            .update_expression(format!("REMOVE {remove}"))
            .condition_expression(condition)
            .expression_attribute_names("#rid", refund_id)
            .expression_attribute_values(":held_n", crate::refunds::ledger::n_usize(count))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(aws_sdk_dynamodb::error::SdkError::ServiceError(se))
                if se.err().is_conditional_check_failed_exception() =>
            {
                Ok(false)
            }
            Err(e) => Err(StoreError::Unavailable(DisplayErrorContext(&e).to_string())),
        }
    }

    /// The payments of the sparse index's `refund_held` partition (read page by page, keys
    /// only), each with the start of its charge (epoch ms).
    async fn holding(&self) -> Result<Vec<(String, Option<i64>)>, StoreError> {
        let prefix = self.payments.layout().record_prefix.clone();
        let attribute = self.payments.layout().attribute.clone();
        let mut found = Vec::new();
        let mut start: Option<std::collections::HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(self.payments.table())
                .index_name(sqs_once::dynamo::OPEN_INDEX)
                .key_condition_expression("#o = :p")
                .expression_attribute_names("#o", sqs_once::dynamo::OPEN)
                .expression_attribute_values(":p", s(HELD_PARTITION))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(DisplayErrorContext(&e).to_string()))?;
            for item in page.items() {
                if let Some(payment_id) = item
                    .get(&attribute)
                    .and_then(|v| v.as_s().ok())
                    .and_then(|k| k.strip_prefix(&prefix))
                {
                    found.push((
                        payment_id.to_owned(),
                        sqs_once::dynamo::get_n(item, "first_attempt_at"),
                    ));
                }
            }
            match page.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok(found),
            }
        }
    }

    /// Every payment that holds refunds (the sparse index's `refund_held` partition): each
    /// that settled is resumed; each still settling longer than `horizon` after its charge
    /// began is counted overdue. No payment is started after `until`: the sweep starts at a
    /// random place in the partition and goes round, so that sweeps cut short by their time
    /// still reach every payment in turn. A payment that cannot be read or resumed is logged
    /// and counted ([`HeldSweep::failed`]) and the sweep goes on; only a partition that cannot
    /// be listed fails it.
    pub async fn sweep(
        &self,
        horizon: Duration,
        until: tokio::time::Instant,
    ) -> Result<HeldSweep, StoreError> {
        let mut out = HeldSweep::default();
        let now_ms = self.clock.now_ms();
        let mut payments = self.holding().await?;
        if !payments.is_empty() {
            let from = (sqs_once::token::bits() % payments.len() as u128) as usize;
            payments.rotate_left(from);
        }
        let total = payments.len();
        for (n, (payment_id, since)) in payments.into_iter().enumerate() {
            if tokio::time::Instant::now() >= until {
                out.unread = total - n;
                tracing::warn!(
                    unread = out.unread,
                    total,
                    "the sweep of the held refunds ran out of time; the next one goes on"
                );
                break;
            }
            match self.sweep_one(&payment_id, since, horizon, now_ms).await {
                Ok(None) => {}
                Ok(Some((held, settling_s, sent))) => {
                    out.payments += 1;
                    out.held += held;
                    out.resumed += sent;
                    if let Some(age_s) = settling_s {
                        out.overdue.push((payment_id, age_s));
                    }
                }
                Err(e) => {
                    tracing::error!(payment_id, error = %e, "sweeping a payment's held refunds");
                    out.failed.push((payment_id, e.to_string()));
                }
            }
        }
        Ok(out)
    }

    /// One payment of the sweep: how many refunds it holds, how long it has settled when that
    /// is past the horizon, and how many of its refunds were sent. `None`: no record.
    async fn sweep_one(
        &self,
        payment_id: &str,
        since: Option<i64>,
        horizon: Duration,
        now_ms: i64,
    ) -> Result<Option<(usize, Option<i64>, usize)>, StoreError> {
        let Some((status, held)) = self.held(payment_id).await? else {
            return Ok(None);
        };
        if !crate::provider::event::payment_may_still_charge(&status) {
            let sent = self.resume(payment_id).await?.sent;
            return Ok(Some((held.len(), None, sent)));
        }
        let age_s = (now_ms - since.unwrap_or(now_ms)).max(0) / 1000;
        if age_s <= horizon.as_secs() as i64 {
            return Ok(Some((held.len(), None, 0)));
        }
        tracing::warn!(
            payment_id,
            status,
            age_s,
            held = held.len(),
            "a payment holding refunds has not settled within the horizon"
        );
        Ok(Some((held.len(), Some(age_s), 0)))
    }
}
