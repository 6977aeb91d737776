//! `payctl conformance`: does this AWS endpoint keep the promises the protocol relies on?
//!
//! The processor's exactly-once guarantee rests on a few semantics of DynamoDB and SQS. An
//! emulator that gets one of them wrong makes every test and demo on it meaningless (moto
//! 5.2's conditional `UpdateItem` is not atomic: two concurrent claims of one payment can both
//! win). Each check creates its own table or queues with a unique prefix, exercises one
//! promise, deletes what it created, and reports pass or fail with what it saw. `make demo`,
//! `make test` and `make chaos` run it first and refuse an endpoint that fails.
//!
//! Why one file of ~660 lines: each check is a short, independent probe, and the list of them
//! is the document of what the protocol asks of an endpoint; splitting them would scatter it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, StreamSpecification, StreamViewType,
};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use sqs_once::record::{ClaimRequest, ClaimResult, IdempotencyStore, StoreError};
use sqs_once::DynamoStore;

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

/// Concurrency of the atomicity check: writers racing per key, and keys.
const WRITERS: usize = 6;
const KEYS: usize = 60;

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
        "transact-write-all-or-nothing",
        "TransactWriteItems applies both puts or neither, and of racing creations of one payment exactly one commits",
        transact_write_all_or_nothing(&ddb, &payments).await,
    ));
    results.push(with_table(
        "stream-insert-images",
        "a table's stream yields each new item as an INSERT record with its NewImage and sequence number, and an update as MODIFY",
        stream_insert_images(sdk, &ddb, &payments).await,
    ));
    let _ = ddb.delete_table().table_name(&payments).send().await;
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

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

async fn create_table(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<()> {
    create_table_with(ddb, table, None).await
}

async fn create_table_with(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    stream: Option<StreamSpecification>,
) -> Result<()> {
    ddb.create_table()
        .table_name(table)
        .set_stream_specification(stream)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()?,
        )
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("CreateTable {table}: {}", DisplayErrorContext(&e)))?;
    for _ in 0..100 {
        let d = ddb.describe_table().table_name(table).send().await?;
        if d.table().and_then(|t| t.table_status()).map(|s| s.as_str()) == Some("ACTIVE") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("table {table} never became ACTIVE")
}

/// The claim's shape: `SET owner = :me` only if the key does not exist yet.
async fn conditional_claim(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    me: &str,
) -> Result<bool> {
    match ddb
        .update_item()
        .table_name(table)
        .key("pk", s(key))
        .update_expression("SET lease_owner = :me ADD attempts :one")
        .condition_expression("attribute_not_exists(pk)")
        .expression_attribute_values(":me", s(me))
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
    {
        Ok(_) => Ok(true),
        Err(e) => match e.as_service_error() {
            Some(se) if se.is_conditional_check_failed_exception() => Ok(false),
            _ => bail!("UpdateItem: {}", DisplayErrorContext(&e)),
        },
    }
}

async fn atomic_conditional_update(sdk: &aws_config::SdkConfig, table: &str) -> Result<String> {
    // The processor's own claim write, by writers with a client (a connection pool) each.
    let stores: Vec<Arc<DynamoStore>> = (0..WRITERS)
        .map(|_| {
            Arc::new(payment_core::payment_store(
                aws_sdk_dynamodb::Client::new(sdk),
                table,
            ))
        })
        .collect();
    let mut doubled = 0;
    let mut none = 0;
    // Key by key, the writers wait at a barrier and send together: the narrowest race a
    // conditional write must win, as concurrent claims of one payment make.
    for k in 0..KEYS {
        let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
        let mut tasks = Vec::new();
        for (w, store) in stores.iter().enumerate() {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let now = sqs_once::runner::now_ms();
                let claim = ClaimRequest {
                    key: format!("race-{k}"),
                    payload_hash: "h".into(),
                    owner: format!("w{w}"),
                    now_ms: now,
                    lease_expires_at_ms: now + 60_000,
                    expires_at_s: now / 1000 + 3600,
                };
                barrier.wait().await;
                let won = match store.claim(&claim).await {
                    Ok(r) => matches!(r, ClaimResult::Claimed { .. }),
                    Err(StoreError::Malformed(e)) => bail!(
                        "a racing claim saw a half-written item ({e}): the update is not atomic"
                    ),
                    Err(e) => return Err(e.into()),
                };
                anyhow::Ok(won)
            }));
        }
        let mut winners = 0;
        for t in tasks {
            if t.await?? {
                winners += 1;
            }
        }
        match winners {
            1 => {}
            0 => none += 1,
            _ => doubled += 1,
        }
    }
    if doubled > 0 || none > 0 {
        bail!("{doubled} of {KEYS} keys had two or more winners among {WRITERS} racing claims, {none} had none");
    }
    Ok(format!(
        "{KEYS} keys x {WRITERS} racing claims: one winner each"
    ))
}

async fn all_old_on_failure(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<String> {
    conditional_claim(ddb, table, "all-old", "first").await?;
    let e = ddb
        .update_item()
        .table_name(table)
        .key("pk", s("all-old"))
        .update_expression("SET lease_owner = :me")
        .condition_expression("attribute_not_exists(pk)")
        .expression_attribute_values(":me", s("second"))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await
        .err()
        .context("the second conditional write was not refused")?;
    let item = match e.as_service_error() {
        Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c)) => c.item().cloned(),
        _ => bail!("unexpected error: {}", DisplayErrorContext(&e)),
    };
    match item.and_then(|i| i.get("lease_owner").cloned()) {
        Some(AttributeValue::S(owner)) if owner == "first" => {
            Ok("the refusal carries the blocking item".into())
        }
        other => bail!("the refusal carried {other:?} instead of the item"),
    }
}

async fn consistent_read(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<String> {
    for i in 0..20 {
        let key = format!("read-{i}");
        conditional_claim(ddb, table, &key, "writer").await?;
        let got = ddb
            .get_item()
            .table_name(table)
            .key("pk", s(&key))
            .consistent_read(true)
            .send()
            .await?;
        if got.item().is_none() {
            bail!("a consistent read missed the write just made to {key}");
        }
    }
    Ok("20 writes, each read back at once".into())
}

async fn queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    attrs: &[(QueueAttributeName, String)],
) -> Result<String> {
    let mut req = sqs.create_queue().queue_name(name);
    for (k, v) in attrs {
        req = req.attributes(k.clone(), v);
    }
    let out = req.send().await.map_err(|e| {
        anyhow::anyhow!(
            "CreateQueue {name}: {}",
            aws_sdk_sqs::error::DisplayErrorContext(&e)
        )
    })?;
    out.queue_url().map(str::to_owned).context("no queue URL")
}

async fn arn_of(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String> {
    let a = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?;
    a.attributes()
        .and_then(|m| m.get(&QueueAttributeName::QueueArn))
        .cloned()
        .context("no QueueArn")
}

/// Receives up to one message, waiting at most `wait` seconds.
async fn receive_one(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    wait: i32,
) -> Result<Option<aws_sdk_sqs::types::Message>> {
    let out = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(1)
        .wait_time_seconds(wait)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await?;
    Ok(out.messages().first().cloned())
}

/// Runs a check on its queues, then deletes them whatever the check found.
async fn with_queues<F, Fut>(sqs: &aws_sdk_sqs::Client, urls: Vec<String>, f: F) -> Result<String>
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    let r = f(urls.clone()).await;
    for u in &urls {
        let _ = sqs.delete_queue().queue_url(u).send().await;
    }
    r
}

async fn visibility_and_receive_count(sqs: &aws_sdk_sqs::Client, prefix: &str) -> Result<String> {
    let url = queue(
        sqs,
        &format!("{prefix}-vis"),
        &[(QueueAttributeName::VisibilityTimeout, "60".into())],
    )
    .await?;
    let urls = vec![url];
    with_queues(sqs, urls, |urls| async move {
        let url = &urls[0];
        sqs.send_message()
            .queue_url(url)
            .message_body("v")
            .send()
            .await?;
        let m = receive_one(sqs, url, 2)
            .await?
            .context("the message was not received")?;
        let rh = m.receipt_handle().context("no receipt handle")?;
        if receive_one(sqs, url, 0).await?.is_some() {
            bail!("the message was received again while hidden for 60 s");
        }
        sqs.change_message_visibility()
            .queue_url(url)
            .receipt_handle(rh)
            .visibility_timeout(0)
            .send()
            .await?;
        let again = receive_one(sqs, url, 2)
            .await?
            .context("ChangeMessageVisibility 0 did not make the message visible")?;
        let attr =
            |k: MessageSystemAttributeName| again.attributes().and_then(|a| a.get(&k)).cloned();
        let count = attr(MessageSystemAttributeName::ApproximateReceiveCount);
        if count.as_deref() != Some("2") {
            bail!("ApproximateReceiveCount is {count:?} on the second receive, not 2");
        }
        if attr(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp).is_none() {
            bail!("no ApproximateFirstReceiveTimestamp");
        }
        Ok("hidden for its visibility, visible again at 0, received twice = count 2".into())
    })
    .await
}

async fn redrive(sqs: &aws_sdk_sqs::Client, prefix: &str) -> Result<String> {
    let dlq = queue(sqs, &format!("{prefix}-dlq"), &[]).await?;
    let mut urls = vec![dlq.clone()];
    let dlq_arn = arn_of(sqs, &dlq).await?;
    let policy =
        serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}).to_string();
    let src = queue(
        sqs,
        &format!("{prefix}-src"),
        &[
            (QueueAttributeName::VisibilityTimeout, "1".into()),
            (QueueAttributeName::RedrivePolicy, policy),
        ],
    )
    .await?;
    urls.push(src.clone());
    with_queues(sqs, urls, |_| async move {
        sqs.send_message().queue_url(&src).message_body("r").send().await?;
        for n in 1..=2 {
            receive_one(sqs, &src, 3).await?.with_context(|| format!("receive {n} of 2 got nothing"))?;
            tokio::time::sleep(Duration::from_millis(1_300)).await;
        }
        // The third receive must find the message moved, not deliver it a third time.
        if let Some(m) = receive_one(sqs, &src, 2).await? {
            let count = m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount)).cloned();
            bail!("received a third time (ApproximateReceiveCount {count:?}) instead of moving to the DLQ");
        }
        receive_one(sqs, &dlq, 3).await?.context("the message is in neither queue")?;
        Ok("moved to the DLQ after maxReceiveCount 2".into())
    })
    .await
}

async fn fifo_group_blocking(sqs: &aws_sdk_sqs::Client, prefix: &str) -> Result<String> {
    let url = queue(
        sqs,
        &format!("{prefix}-group.fifo"),
        &[
            (QueueAttributeName::FifoQueue, "true".into()),
            (QueueAttributeName::VisibilityTimeout, "30".into()),
        ],
    )
    .await?;
    let urls = vec![url];
    with_queues(sqs, urls, |urls| async move {
        let url = &urls[0];
        for (i, body) in ["first", "second"].iter().enumerate() {
            sqs.send_message()
                .queue_url(url)
                .message_body(*body)
                .message_group_id("g")
                .message_deduplication_id(format!("d{i}"))
                .send()
                .await?;
        }
        let first = receive_one(sqs, url, 2)
            .await?
            .context("nothing received")?;
        if first.body() != Some("first") {
            bail!("received {:?} before \"first\"", first.body());
        }
        if let Some(m) = receive_one(sqs, url, 1).await? {
            bail!(
                "received {:?} while \"first\" of its group was in flight",
                m.body()
            );
        }
        sqs.delete_message()
            .queue_url(url)
            .receipt_handle(first.receipt_handle().context("no receipt handle")?)
            .send()
            .await?;
        let second = receive_one(sqs, url, 2)
            .await?
            .context("\"second\" never came after \"first\" was deleted")?;
        if second.body() != Some("second") {
            bail!("received {:?} instead of \"second\"", second.body());
        }
        Ok("the group waited for its message in flight, then went on in order".into())
    })
    .await
}

/// The payments API's own creation, raced by several writers per key over a table with a
/// stream: one `Created` per key, every other writer finds that payment, each key holds one
/// payment row and one outbox entry; and a transaction whose second put is refused leaves no
/// trace of its first.
async fn transact_write_all_or_nothing(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String> {
    use payment_core::api::{Creation, PaymentsStore, StoredPayment};
    use payment_core::outbox::OutboxEntry;
    use payment_core::payments_table::DynamoPayments;
    let stream = StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::NewImage)
        .build()?;
    create_table_with(ddb, table, Some(stream)).await?;
    let store = Arc::new(DynamoPayments::new(ddb.clone(), table, table));
    let payment = |id: &str| StoredPayment {
        id: id.to_owned(),
        amount: 100,
        currency: "usd".into(),
        customer_id: "cus_conformance".into(),
        created: 1,
        request_hash: "h".into(),
        response_status: 202,
        response_body: format!("{{\"id\":\"{id}\"}}"),
        expires_at_s: 0,
    };
    let entry = |id: &str| OutboxEntry {
        payment_id: id.to_owned(),
        message: "{}".into(),
        created_at: 1,
        customer_id: "cus_conformance".into(),
    };
    const TX_KEYS: usize = 20;
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..TX_KEYS {
        for _ in 0..WRITERS {
            let store = store.clone();
            let id = format!("tx-{k}");
            let (p, e) = (payment(&id), entry(&id));
            tasks.spawn(async move { (id, store.create(&p, &e, 0).await) });
        }
    }
    let mut created: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (id, result) = joined?;
        match result.with_context(|| format!("creating {id}"))? {
            Creation::Created => *created.entry(id).or_default() += 1,
            Creation::Exists(p) if p.id == id => {}
            Creation::Exists(p) => bail!("creating {id} found another payment: {}", p.id),
        }
    }
    if let Some((id, n)) = created.iter().find(|(_, n)| **n != 1) {
        bail!("{n} of {WRITERS} racing creations of {id} committed");
    }
    if created.len() != TX_KEYS {
        bail!("only {} of {TX_KEYS} payments were created", created.len());
    }
    let items = ddb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await?;
    if items.items().len() != 2 * TX_KEYS {
        bail!(
            "{} items for {TX_KEYS} payments (one row and one outbox entry each)",
            items.items().len()
        );
    }
    // A stray outbox entry makes the second put fail: the first must not stay.
    ddb.put_item()
        .table_name(table)
        .set_item(Some(entry("tx-orphan").to_item(0)))
        .send()
        .await?;
    if store
        .create(&payment("tx-orphan"), &entry("tx-orphan"), 0)
        .await
        .is_ok()
    {
        bail!("a transaction whose outbox put was refused reported success");
    }
    if store.payment("tx-orphan").await?.is_some() {
        bail!("a cancelled transaction left its payment row behind");
    }
    Ok(format!(
        "{TX_KEYS} keys x {WRITERS} racing creations: one commit each; a cancelled transaction left nothing"
    ))
}

/// The outbox feed: the stream of the table [`transact_write_all_or_nothing`] wrote, read as
/// the relay's event source reads it.
async fn stream_insert_images(
    sdk: &aws_config::SdkConfig,
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String> {
    let streams = aws_sdk_dynamodbstreams::Client::new(sdk);
    let arn = ddb
        .describe_table()
        .table_name(table)
        .send()
        .await?
        .table()
        .and_then(|t| t.latest_stream_arn())
        .map(str::to_owned)
        .context("the table has no LatestStreamArn")?;
    ddb.update_item()
        .table_name(table)
        .key("pk", s("outbox#tx-0"))
        .update_expression("SET published_at = :t")
        .expression_attribute_values(":t", AttributeValue::N("1".into()))
        .send()
        .await?;
    let shards = crate::stream::shard_ids(&streams, &arn).await?;
    let (mut inserts, mut modifies, mut sequenced) = (0, 0, 0);
    for shard in &shards {
        let mut it = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard)
            .shard_iterator_type(aws_sdk_dynamodbstreams::types::ShardIteratorType::TrimHorizon)
            .send()
            .await?
            .shard_iterator()
            .map(str::to_owned);
        for _ in 0..20 {
            let Some(i) = it.take() else { break };
            let out = streams.get_records().shard_iterator(i).send().await?;
            if out.records().is_empty() {
                break;
            }
            for r in out.records() {
                use aws_sdk_dynamodbstreams::types::OperationType;
                let change = r.dynamodb();
                let has_kind = change
                    .and_then(|c| c.new_image())
                    .is_some_and(|img| img.contains_key("kind"));
                if change.and_then(|c| c.sequence_number()).is_some() {
                    sequenced += 1;
                }
                match r.event_name() {
                    Some(OperationType::Insert) if has_kind => inserts += 1,
                    Some(OperationType::Modify) => modifies += 1,
                    _ => {}
                }
            }
            it = out.next_shard_iterator().map(str::to_owned);
        }
    }
    // 20 payments x (row + entry) and the orphan entry; the update is one MODIFY.
    if inserts < 41 || modifies != 1 || sequenced < inserts + modifies {
        bail!("the stream held {inserts} INSERT records with images (41 expected), {modifies} MODIFY (1 expected), {sequenced} with sequence numbers");
    }
    Ok(format!(
        "{inserts} INSERT records with their NewImage, {modifies} MODIFY, in {} shard(s)",
        shards.len()
    ))
}
