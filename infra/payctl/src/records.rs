//! Reading the idempotency table whole: every record of one work, by key (`payctl reconcile
//! --all-unknown`, and the proving ground's checkers).

use std::collections::HashMap;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use sqs_once::record::IdempotencyRecord;

/// Every payment record of the table.
pub async fn scan_records(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<HashMap<String, IdempotencyRecord>> {
    scan_records_of(ddb, &payment_core::payment_store(ddb.clone(), table)).await
}

/// Every record of one work in the store's table (by its key layout), by key.
pub async fn scan_records_of(
    ddb: &aws_sdk_dynamodb::Client,
    store: &sqs_once::DynamoStore,
) -> Result<HashMap<String, IdempotencyRecord>> {
    let table = store.table();
    let mut records = HashMap::new();
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    loop {
        let out = ddb
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .context("scanning the idempotency table")?;
        // The table also holds dead-letter marks, and other works' records.
        for item in out.items().iter().filter(|i| store.is_record_item(i)) {
            let r = store.record_from_item(item)?;
            records.insert(r.key.clone(), r);
        }
        match out.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Ok(records),
        }
    }
}
