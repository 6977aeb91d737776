//! The DynamoDB adapter of [`PaymentsStore`]: the payments table (payment rows, `pk` =
//! `payment#<id>`, each with its outbox fields) and read-only access to the processor's
//! idempotency table.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use crate::api::{Creation, PaymentsStore, StoredPayment, Unavailable};
use crate::payments::outbox::{OutboxEntry, PAYMENT_KIND, PAYMENT_PREFIX};
use sqs_once::dynamo::{get_n, get_s, n, s, DynamoStore};
use sqs_once::record::{DeadLetterMark, IdempotencyRecord};

type Item = HashMap<String, AttributeValue>;

/// A refused write whose row is then gone (it expired in between) is tried again this many
/// times.
const VANISHED_ATTEMPTS: u32 = 3;

/// The payments table and the idempotency table, through the official SDK client.
#[derive(Debug, Clone)]
pub struct DynamoPayments {
    client: Client,
    table: String,
    records: DynamoStore,
}

/// The payment row's item.
pub fn payment_to_item(p: &StoredPayment) -> Item {
    let mut item = HashMap::from([
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
    ]);
    if let Some(by) = &p.created_by {
        item.insert("created_by".to_owned(), s(by));
    }
    item
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
        created_by: get_s(item, "created_by"),
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
            records: crate::payments::payment_store(client.clone(), &idempotency_table.into()),
            client,
            table: table.into(),
        }
    }
}

#[async_trait]
impl PaymentsStore for DynamoPayments {
    async fn create(
        &self,
        payment: &StoredPayment,
        entry: &OutboxEntry,
    ) -> Result<Creation, Unavailable> {
        let mut item = payment_to_item(payment);
        item.extend(entry.attributes());
        for _ in 0..VANISHED_ATTEMPTS {
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item.clone()))
                .condition_expression("attribute_not_exists(pk)")
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            match put {
                Ok(_) => return Ok(Creation::Created),
                Err(SdkError::ServiceError(se)) => match se.err() {
                    PutItemError::ConditionalCheckFailedException(c) => {
                        // The row that holds the key came back with the refusal (ALL_OLD); an
                        // endpoint that returns none is read instead.
                        if let Some(old) = c.item() {
                            return Ok(Creation::Exists(payment_from_item(old)?));
                        }
                        if let Some(existing) = self.payment(&payment.id).await? {
                            return Ok(Creation::Exists(existing));
                        }
                        // Expired between the write and the read: the key is free again.
                    }
                    _ => {
                        return Err(Unavailable(
                            DisplayErrorContext(&SdkError::ServiceError(se)).to_string(),
                        ))
                    }
                },
                Err(e) => return Err(Unavailable(DisplayErrorContext(&e).to_string())),
            }
        }
        Err(Unavailable(format!(
            "gave up after {VANISHED_ATTEMPTS} attempts: the payment row vanished (expired) between the refused write and the read"
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
    ) -> Result<Option<crate::api::view::AfterCharge>, Unavailable> {
        crate::api::view::after_charge_of(&self.client, self.records.table(), id)
            .await
            .map_err(|e| Unavailable(e.to_string()))
    }
}
