//! The template's `AWS::DynamoDB::Table`s: keys, billing, stream and TTL as the template says.

use anyhow::{anyhow, bail, Context, Result};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, CreateGlobalSecondaryIndexAction, GlobalSecondaryIndex,
    GlobalSecondaryIndexUpdate, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TimeToLiveSpecification,
};
use serde_yaml_ng::{Mapping, Value};

use super::resolve::{get, Resolver};
use super::{local_name, missing, ProvisionOptions, Stack};

/// Creates (or finds) every table of the template.
pub(super) async fn create(
    ddb: &aws_sdk_dynamodb::Client,
    sdk: &aws_config::SdkConfig,
    opts: &ProvisionOptions,
    r: &mut Resolver<'_>,
    stack: &mut Stack,
    resources: &Mapping,
) -> Result<()> {
    for (logical, res) in resources {
        let (Some(logical), Some("AWS::DynamoDB::Table")) =
            (logical.as_str(), get(res, "Type").and_then(|t| t.as_str()))
        else {
            continue;
        };
        let props = get(res, "Properties").cloned().unwrap_or(Value::Null);
        let name = local_name(&opts.stack_name, logical, false);
        let stream_view = get(&props, "StreamSpecification")
            .and_then(|v| get(v, "StreamViewType"))
            .and_then(|v| v.as_str());
        let existing = match ddb.describe_table().table_name(&name).send().await {
            Ok(d) => d.table().cloned(),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                None
            }
            Err(e) => {
                return Err(anyhow!(crate::aws::explain(
                    &e,
                    &format!("table {name}"),
                    &crate::aws::endpoint(sdk)
                )))
            }
        };
        let mut req = ddb
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest);
        let indexes = global_indexes(&props)?;
        for gsi in &indexes {
            req = req.global_secondary_indexes(gsi.clone());
        }
        let mut definitions = Vec::new();
        for ad in get(&props, "AttributeDefinitions")
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
        {
            let n = get(ad, "AttributeName")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            let t = get(ad, "AttributeType")
                .and_then(|v| v.as_str())
                .unwrap_or("S");
            let definition = AttributeDefinition::builder()
                .attribute_name(n)
                .attribute_type(ScalarAttributeType::from(t))
                .build()?;
            definitions.push(definition.clone());
            req = req.attribute_definitions(definition);
        }
        for ks in get(&props, "KeySchema")
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
        {
            let n = get(ks, "AttributeName")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            let t = get(ks, "KeyType")
                .and_then(|v| v.as_str())
                .unwrap_or("HASH");
            req = req.key_schema(
                KeySchemaElement::builder()
                    .attribute_name(n)
                    .key_type(KeyType::from(t))
                    .build()?,
            );
        }
        if let Some(view) = stream_view {
            req = req.stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::from(view))
                    .build()?,
            );
        }
        let table = match existing {
            Some(t) if opts.read_only => {
                stack.report.push((format!("table {name}"), "exists"));
                t
            }
            None if opts.read_only => bail!(missing(&opts.stack_name, &format!("table {name}"))),
            Some(t)
                if indexes.iter().any(|gsi| {
                    !t.global_secondary_indexes()
                        .iter()
                        .any(|have| have.index_name() == Some(gsi.index_name()))
                }) =>
            {
                // An existing table without an index the template adds: created on it (a
                // table of a version before the index; DynamoDB backfills it).
                let mut update = ddb
                    .update_table()
                    .table_name(&name)
                    .set_attribute_definitions(Some(definitions.clone()));
                for gsi in indexes.iter().filter(|gsi| {
                    !t.global_secondary_indexes()
                        .iter()
                        .any(|have| have.index_name() == Some(gsi.index_name()))
                }) {
                    update = update.global_secondary_index_updates(
                        GlobalSecondaryIndexUpdate::builder()
                            .create(
                                CreateGlobalSecondaryIndexAction::builder()
                                    .index_name(gsi.index_name())
                                    .set_key_schema(Some(gsi.key_schema().to_vec()))
                                    .set_projection(gsi.projection().cloned())
                                    .build()?,
                            )
                            .build(),
                    );
                }
                let updated = update
                    .send()
                    .await
                    .with_context(|| format!("adding the template's indexes to table {name}"))?;
                stack.report.push((format!("table {name}"), "updated"));
                updated.table_description().cloned().unwrap_or(t)
            }
            Some(t) => {
                // An existing table: its stream is switched on if the template wants one.
                let has_stream = t.stream_specification().is_some_and(|s| s.stream_enabled());
                match (stream_view, has_stream) {
                    (Some(view), false) => {
                        let updated = ddb
                            .update_table()
                            .table_name(&name)
                            .stream_specification(
                                StreamSpecification::builder()
                                    .stream_enabled(true)
                                    .stream_view_type(StreamViewType::from(view))
                                    .build()?,
                            )
                            .send()
                            .await
                            .with_context(|| format!("enabling the stream of table {name}"))?;
                        stack.report.push((format!("table {name}"), "updated"));
                        updated.table_description().cloned().unwrap_or(t)
                    }
                    _ => {
                        stack.report.push((format!("table {name}"), "exists"));
                        t
                    }
                }
            }
            None => {
                let created = req
                    .send()
                    .await
                    .with_context(|| format!("creating table {name}"))?;
                stack.report.push((format!("table {name}"), "created"));
                created
                    .table_description()
                    .cloned()
                    .ok_or_else(|| anyhow!("no description of the new table {name}"))?
            }
        };
        if let Some(arn) = table.latest_stream_arn() {
            r.attrs
                .insert(format!("{logical}.StreamArn"), arn.to_owned());
        }
        let table_arn = table.table_arn().map(str::to_owned);
        let ttl_on = ddb
            .describe_time_to_live()
            .table_name(&name)
            .send()
            .await
            .ok()
            .and_then(|d| {
                d.time_to_live_description()
                    .and_then(|t| t.time_to_live_status().cloned())
            })
            .is_some_and(|s| s.as_str() == "ENABLED" || s.as_str() == "ENABLING");
        if let (Some(ttl), false, false) = (
            get(&props, "TimeToLiveSpecification"),
            ttl_on,
            opts.read_only,
        ) {
            let attr = get(ttl, "AttributeName")
                .and_then(|v| v.as_str())
                .unwrap_or("expires_at");
            ddb.update_time_to_live()
                .table_name(&name)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name(attr)
                        .enabled(true)
                        .build()?,
                )
                .send()
                .await
                .with_context(|| format!("enabling TTL on {name}"))?;
        }
        r.refs.insert(logical.to_owned(), name.clone());
        r.attrs.insert(
            format!("{logical}.Arn"),
            table_arn.unwrap_or_else(|| {
                format!(
                    "arn:aws:dynamodb:{}:{}:table/{name}",
                    r.region,
                    r.account.clone().unwrap_or_default()
                )
            }),
        );
        stack.tables.insert(logical.to_owned(), name);
    }
    Ok(())
}

/// The table's `GlobalSecondaryIndexes` as the template gives them (on-demand: no throughput).
fn global_indexes(props: &Value) -> Result<Vec<GlobalSecondaryIndex>> {
    let mut out = Vec::new();
    for gsi in get(props, "GlobalSecondaryIndexes")
        .and_then(|v| v.as_sequence())
        .into_iter()
        .flatten()
    {
        let name = get(gsi, "IndexName")
            .and_then(|v| v.as_str())
            .context("an index without an IndexName")?;
        let mut keys = Vec::new();
        for ks in get(gsi, "KeySchema")
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
        {
            keys.push(
                KeySchemaElement::builder()
                    .attribute_name(
                        get(ks, "AttributeName")
                            .and_then(|v| v.as_str())
                            .unwrap_or_default(),
                    )
                    .key_type(KeyType::from(
                        get(ks, "KeyType")
                            .and_then(|v| v.as_str())
                            .unwrap_or("HASH"),
                    ))
                    .build()?,
            );
        }
        let projection = get(gsi, "Projection");
        let mut p = Projection::builder().projection_type(ProjectionType::from(
            projection
                .and_then(|p| get(p, "ProjectionType"))
                .and_then(|v| v.as_str())
                .unwrap_or("ALL"),
        ));
        for a in projection
            .and_then(|p| get(p, "NonKeyAttributes"))
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
        {
            p = p.non_key_attributes(a);
        }
        out.push(
            GlobalSecondaryIndex::builder()
                .index_name(name)
                .set_key_schema(Some(keys))
                .projection(p.build())
                .build()?,
        );
    }
    Ok(out)
}
