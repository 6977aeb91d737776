//! The DynamoDB probes: atomic conditional writes under concurrency, `ALL_OLD` on a refused
//! write, consistent reads, the payments API's one conditional put, all-or-nothing
//! transactions, and the stream's images.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, StreamSpecification, StreamViewType,
};
use sqs_once::record::{ClaimRequest, ClaimResult, IdempotencyStore, StoreError};
use sqs_once::DynamoStore;

/// Concurrency of the atomicity check: writers racing per key, and keys.
const WRITERS: usize = 6;
const KEYS: usize = 60;
/// Payments created by racing writers in the payments-table check.
const PUT_KEYS: usize = 20;

pub(super) fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

pub(super) async fn create_table(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<()> {
    create_table_with(ddb, table, None).await
}

pub(super) async fn create_table_with(
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
pub(super) async fn conditional_claim(
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

pub(super) async fn atomic_conditional_update(
    sdk: &aws_config::SdkConfig,
    table: &str,
) -> Result<String> {
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
                    traceparent: None,
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

pub(super) async fn all_old_on_failure(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String> {
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

pub(super) async fn consistent_read(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Result<String> {
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

/// The payments API's write: racing creations of one payment through the API's own store are
/// one conditional `PutItem` each, and exactly one commits per key (the others are refused and
/// get the winner's row back); every committed row carries its outbox fields.
pub(super) async fn conditional_put_one_winner(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String> {
    use payment_core::api::table::DynamoPayments;
    use payment_core::api::{Creation, PaymentsStore, StoredPayment};
    use payment_core::payments::outbox::OutboxEntry;
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
        created_by: None,
    };
    let entry = |id: &str| OutboxEntry {
        payment_id: id.to_owned(),
        message: format!("{{\"payment_id\":\"{id}\"}}"),
        created_at: 1,
        customer_id: "cus_conformance".into(),
        ..Default::default()
    };
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..PUT_KEYS {
        for _ in 0..WRITERS {
            let store = store.clone();
            let id = format!("put-{k}");
            let (p, e) = (payment(&id), entry(&id));
            tasks.spawn(async move { (id, store.create(&p, &e).await) });
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
    if created.len() != PUT_KEYS {
        bail!("only {} of {PUT_KEYS} payments were created", created.len());
    }
    let items = ddb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await?;
    let with_message = items
        .items()
        .iter()
        .filter(|i| i.contains_key("message") && i.contains_key("created_at"))
        .count();
    if items.items().len() != PUT_KEYS || with_message != PUT_KEYS {
        bail!(
            "{} items ({with_message} with their outbox fields) for {PUT_KEYS} payments",
            items.items().len()
        );
    }
    Ok(format!(
        "{PUT_KEYS} keys x {WRITERS} racing creations: one commit each, the others got its row"
    ))
}

/// `TransactWriteItems` applies both puts or neither (a failed refund's release writes the
/// refund and its payment together): a transaction whose second put is refused leaves no
/// trace of its first.
pub(super) async fn transact_write_all_or_nothing(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String> {
    use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
    create_table(ddb, table).await?;
    ddb.put_item()
        .table_name(table)
        .item("pk", s("taken"))
        .send()
        .await?;
    let put = |key: &str| -> Result<TransactWriteItem> {
        Ok(TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name(table)
                    .item("pk", s(key))
                    .condition_expression("attribute_not_exists(pk)")
                    .build()?,
            )
            .build())
    };
    let refused = ddb
        .transact_write_items()
        .transact_items(put("first")?)
        .transact_items(put("taken")?)
        .send()
        .await;
    if refused.is_ok() {
        bail!("a transaction whose second put failed its condition reported success");
    }
    let first = ddb
        .get_item()
        .table_name(table)
        .key("pk", s("first"))
        .consistent_read(true)
        .send()
        .await?;
    if first.item().is_some() {
        bail!("a cancelled transaction left its first put behind");
    }
    ddb.transact_write_items()
        .transact_items(put("first")?)
        .transact_items(put("second")?)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", DisplayErrorContext(&e)))?;
    let n = ddb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await?
        .items()
        .len();
    if n != 3 {
        bail!("{n} items after a committed transaction of two puts beside one item (3 expected)");
    }
    Ok("a cancelled transaction left nothing; a committed one wrote both".into())
}

/// The outbox feed: the stream of the table [`conditional_put_one_winner`] wrote, read as the
/// relay's event source reads it: one `INSERT` with the whole new image per committed row,
/// none for the refused puts, and an update as a `MODIFY` (which the relay's filter drops).
pub(super) async fn stream_insert_images(
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
        .key(
            "pk",
            s(&format!(
                "{}put-0",
                payment_core::payments::outbox::PAYMENT_PREFIX
            )),
        )
        .update_expression("SET touched_at = :t")
        .expression_attribute_values(":t", AttributeValue::N("1".into()))
        .send()
        .await?;
    let shards = lambda_local::stream::shard_ids(&streams, &arn).await?;
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
                    .is_some_and(|img| img.contains_key("kind") && img.contains_key("message"));
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
    // One INSERT per committed row and none for the refused puts; the update is one MODIFY.
    if inserts != PUT_KEYS || modifies != 1 || sequenced < inserts + modifies {
        bail!("the stream held {inserts} INSERT records with whole images ({PUT_KEYS} expected: one per committed row, none for a refused put), {modifies} MODIFY (1 expected), {sequenced} with sequence numbers");
    }
    Ok(format!(
        "{inserts} INSERT records with their NewImage, {modifies} MODIFY, in {} shard(s)",
        shards.len()
    ))
}
