//! The DynamoDB adapter of [`PaymentsStore`]: the payments table (payment rows and outbox
//! entries, `pk` = `payment#<id>` / `outbox#<id>`) and read-only access to the processor's
//! idempotency table.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use aws_sdk_dynamodb::Client;

use crate::api::{Creation, PaymentsStore, StoredPayment, Unavailable};
use crate::outbox::{OutboxEntry, PAYMENT_KIND, PAYMENT_PREFIX};
use sqs_once::dynamo::{get_n, get_s, n, s, DynamoStore};
use sqs_once::record::{DeadLetterMark, IdempotencyRecord};

type Item = HashMap<String, AttributeValue>;

/// Transactions that lose a race to a concurrent transaction on the same key are tried again
/// this many times (the winner's row is then found and replayed).
const CONFLICT_ATTEMPTS: u32 = 8;

/// The payments table and the idempotency table, through the official SDK client.
#[derive(Debug, Clone)]
pub struct DynamoPayments {
    client: Client,
    table: String,
    records: DynamoStore,
}

/// The payment row's item.
pub fn payment_to_item(p: &StoredPayment) -> Item {
    HashMap::from([
        ("pk".to_owned(), s(&format!("{PAYMENT_PREFIX}{}", p.id))),
        ("kind".to_owned(), s(PAYMENT_KIND)),
        ("id".to_owned(), s(&p.id)),
        ("amount".to_owned(), n(p.amount)),
        ("currency".to_owned(), s(&p.currency)),
        ("customer_id".to_owned(), s(&p.customer_id)),
        ("created".to_owned(), n(p.created)),
        ("request_hash".to_owned(), s(&p.request_hash)),
        (
            "response_status".to_owned(),
            n(i64::from(p.response_status)),
        ),
        ("response_body".to_owned(), s(&p.response_body)),
        ("expires_at".to_owned(), n(p.expires_at_s)),
    ])
}

/// Reads a payment row.
pub fn payment_from_item(item: &Item) -> Result<StoredPayment, Unavailable> {
    let field =
        |k: &str| get_s(item, k).ok_or_else(|| Unavailable(format!("payment row without {k}")));
    let number =
        |k: &str| get_n(item, k).ok_or_else(|| Unavailable(format!("payment row without {k}")));
    Ok(StoredPayment {
        id: field("id")?,
        amount: number("amount")?,
        currency: field("currency")?,
        customer_id: field("customer_id")?,
        created: number("created")?,
        request_hash: field("request_hash")?,
        response_status: u16::try_from(number("response_status")?)
            .map_err(|_| Unavailable("payment row with a bad response_status".into()))?,
        response_body: field("response_body")?,
        expires_at_s: get_n(item, "expires_at").unwrap_or(0),
    })
}

impl DynamoPayments {
    /// The payments table `table` and the processor's idempotency table `idempotency_table`.
    pub fn new(
        client: Client,
        table: impl Into<String>,
        idempotency_table: impl Into<String>,
    ) -> Self {
        Self {
            records: crate::payment_store(client.clone(), &idempotency_table.into()),
            client,
            table: table.into(),
        }
    }

    async fn transact(
        &self,
        payment: &StoredPayment,
        entry: &OutboxEntry,
        entry_expires_at_s: i64,
    ) -> Result<(), SdkError<TransactWriteItemsError>> {
        let put = |item: Item| {
            Put::builder()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(pk)")
                .build()
        };
        let (row, outbox) = match (
            put(payment_to_item(payment)),
            put(entry.to_item(entry_expires_at_s)),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return Err(SdkError::construction_failure(e)),
        };
        self.client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(row).build())
            .transact_items(TransactWriteItem::builder().put(outbox).build())
            .send()
            .await
            .map(|_| ())
    }
}

/// Why a transaction was cancelled: the codes of its two items (payment row, outbox entry).
fn cancellation_codes(e: &SdkError<TransactWriteItemsError>) -> Option<(String, String)> {
    let SdkError::ServiceError(se) = e else {
        return None;
    };
    let TransactWriteItemsError::TransactionCanceledException(c) = se.err() else {
        return None;
    };
    let code = |i: usize| {
        c.cancellation_reasons()
            .get(i)
            .and_then(|r| r.code())
            .unwrap_or("None")
            .to_owned()
    };
    Some((code(0), code(1)))
}

#[async_trait]
impl PaymentsStore for DynamoPayments {
    async fn create(
        &self,
        payment: &StoredPayment,
        entry: &OutboxEntry,
        entry_expires_at_s: i64,
    ) -> Result<Creation, Unavailable> {
        let mut last = String::new();
        for attempt in 0..CONFLICT_ATTEMPTS {
            match self.transact(payment, entry, entry_expires_at_s).await {
                Ok(()) => return Ok(Creation::Created),
                Err(e) => match cancellation_codes(&e) {
                    Some((row, _)) if row == "ConditionalCheckFailed" => {
                        if let Some(existing) = self.payment(&payment.id).await? {
                            return Ok(Creation::Exists(existing));
                        }
                        last = "the payment row vanished (expired) between the write and the read"
                            .into();
                    }
                    Some((_, outbox)) if outbox == "ConditionalCheckFailed" => {
                        return Err(Unavailable(format!(
                            "an outbox entry for {} is still stored although its payment is not (an expired payment whose entry has not expired yet); retry later",
                            payment.id
                        )));
                    }
                    Some((row, outbox)) => {
                        // TransactionConflict: a concurrent request with the same key.
                        last = format!("transaction cancelled ({row}, {outbox})");
                    }
                    None => return Err(Unavailable(DisplayErrorContext(&e).to_string())),
                },
            }
            let pause = 10 * 2u64.pow(attempt.min(5)) + fastrand::u64(0..20);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        Err(Unavailable(format!(
            "gave up after {CONFLICT_ATTEMPTS} attempts: {last}"
        )))
    }

    async fn payment(&self, id: &str) -> Result<Option<StoredPayment>, Unavailable> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(&format!("{PAYMENT_PREFIX}{id}")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| Unavailable(DisplayErrorContext(&e).to_string()))?;
        out.item().map(payment_from_item).transpose()
    }

    async fn progress(
        &self,
        id: &str,
    ) -> Result<(Option<IdempotencyRecord>, Option<DeadLetterMark>), Unavailable> {
        self.records
            .record_and_mark(id)
            .await
            .map_err(|e| Unavailable(e.to_string()))
    }

    async fn after_charge(
        &self,
        id: &str,
    ) -> Result<Option<crate::refund_view::AfterCharge>, Unavailable> {
        crate::refund_view::after_charge_of(&self.client, self.records.table(), id)
            .await
            .map_err(|e| Unavailable(e.to_string()))
    }
}
