//! `payctl conformance`: does this AWS endpoint keep the promises the protocol relies on?
//!
//! The processor's exactly-once guarantee rests on a few semantics of DynamoDB and SQS. An
//! emulator that gets one of them wrong makes every test and demo on it meaningless (moto
//! 5.2's conditional `UpdateItem` is not atomic: two concurrent claims of one payment can both
//! win). Each check creates its own table or queues with a unique prefix, exercises one
//! promise, deletes what it created, and reports pass or fail with what it saw. `make demo`,
//! `make test` and `make chaos` run it first and refuse an endpoint that fails.
//!
//! [`run`] is the list of the checks, each with what the protocol needs of it: the document of
//! what the protocol asks of an endpoint. The probes themselves are in `dynamodb` and `sqs`.

use anyhow::{bail, Result};

mod dynamodb;
mod sqs;

use dynamodb::{
    all_old_on_failure, atomic_conditional_update, conditional_put_one_winner, consistent_read,
    create_table, stream_insert_images, transact_write_all_or_nothing,
};
use sqs::{fifo_group_blocking, redrive, visibility_and_receive_count};

/// The result of one check.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// Short name, as printed and as named in a refusal.
    pub name: &'static str,
    /// What the protocol needs from it.
    pub needs: &'static str,
    /// `Ok(what was seen)` or `Err(what went wrong)`.
    pub outcome: Result<String, String>,
}

/// Runs every check against the endpoint the SDK configuration names.
pub async fn run(sdk: &aws_config::SdkConfig) -> Vec<CheckResult> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let prefix = format!(
        "conformance-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let mut results = Vec::new();
    let table = format!("{prefix}-table");
    let table_ready = create_table(&ddb, &table).await;
    let with_table = |name, needs, r: Result<String>| CheckResult {
        name,
        needs,
        outcome: r.map_err(|e| format!("{e:#}")),
    };
    match &table_ready {
        Ok(()) => {
            results.push(with_table(
                "atomic-conditional-update",
                "one winner when several conditional UpdateItem calls race on one key",
                atomic_conditional_update(sdk, &table).await,
            ));
            results.push(with_table(
                "all-old-on-condition-failure",
                "a refused conditional write returns the item (ReturnValuesOnConditionCheckFailure=ALL_OLD)",
                all_old_on_failure(&ddb, &table).await,
            ));
            results.push(with_table(
                "consistent-read",
                "a consistent GetItem sees the write that just succeeded",
                consistent_read(&ddb, &table).await,
            ));
        }
        Err(e) => results.push(CheckResult {
            name: "dynamodb",
            needs: "CreateTable, DescribeTable",
            outcome: Err(format!("{e:#}")),
        }),
    }
    let _ = ddb.delete_table().table_name(&table).send().await;
    let payments = format!("{prefix}-payments");
    results.push(with_table(
        "conditional-put-one-winner",
        "of racing conditional PutItem creations of one payment exactly one commits, and the others get its row",
        conditional_put_one_winner(&ddb, &payments).await,
    ));
    results.push(with_table(
        "stream-insert-images",
        "a table's stream yields exactly one INSERT record with the whole NewImage and a sequence number per committed put, none for a refused one, and an update as MODIFY",
        stream_insert_images(sdk, &ddb, &payments).await,
    ));
    let _ = ddb.delete_table().table_name(&payments).send().await;
    let transactions = format!("{prefix}-transactions");
    results.push(with_table(
        "transact-write-all-or-nothing",
        "TransactWriteItems applies both puts or neither",
        transact_write_all_or_nothing(&ddb, &transactions).await,
    ));
    let _ = ddb.delete_table().table_name(&transactions).send().await;
    results.push(with_table(
        "visibility-and-receive-count",
        "ChangeMessageVisibility takes effect; ApproximateReceiveCount and ApproximateFirstReceiveTimestamp are kept",
        visibility_and_receive_count(&sqs, &prefix).await,
    ));
    results.push(with_table(
        "redrive-after-max-receive-count",
        "a message received more than maxReceiveCount times moves to the dead-letter queue",
        redrive(&sqs, &prefix).await,
    ));
    results.push(with_table(
        "fifo-group-blocking",
        "a FIFO group delivers nothing more while one of its messages is in flight",
        fifo_group_blocking(&sqs, &prefix).await,
    ));
    results
}

/// Prints the results; fails naming every check that did not pass.
pub fn report(endpoint: &str, results: &[CheckResult]) -> Result<()> {
    println!("conformance of {endpoint}:");
    for r in results {
        match &r.outcome {
            Ok(seen) => println!("  pass  {:<34} {seen}", r.name),
            Err(why) => println!("  FAIL  {:<34} {why}\n        needed: {}", r.name, r.needs),
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.outcome.is_err())
        .map(|r| r.name)
        .collect();
    if failed.is_empty() {
        println!(
            "all {} checks passed: the protocol's tests mean something here",
            results.len()
        );
        Ok(())
    } else {
        bail!(
            "{endpoint} fails {}: the exactly-once protocol cannot be tested or run on it",
            failed.join(", ")
        )
    }
}
