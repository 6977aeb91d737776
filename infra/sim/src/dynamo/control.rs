//! The control plane: tables created, described and deleted, as the provisioning asks.

use serde_json::{json, Value as Json};

use super::request::text;
use super::table::{Index, KeySchema, Table};
use super::{ApiError, Dynamo};

fn key_schema(v: &Json, definitions: &Json) -> Result<KeySchema, ApiError> {
    let ty = |name: &str| -> Result<String, ApiError> {
        definitions
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["AttributeName"] == name)
            .and_then(|d| d["AttributeType"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::validation(format!("No attribute definition for key attribute {name}"))
            })
    };
    let mut hash = None;
    let mut range = None;
    for k in v.as_array().into_iter().flatten() {
        let name = k["AttributeName"].as_str().unwrap_or_default();
        match k["KeyType"].as_str() {
            Some("HASH") => hash = Some((name.to_owned(), ty(name)?)),
            Some("RANGE") => range = Some((name.to_owned(), ty(name)?)),
            _ => return Err(ApiError::validation("KeyType must be HASH or RANGE")),
        }
    }
    Ok(KeySchema {
        hash: hash.ok_or_else(|| ApiError::validation("a key schema needs a HASH key"))?,
        range,
    })
}

pub(super) fn describe(t: &Table) -> Json {
    let mut d = json!({
        "TableName": t.name,
        "TableStatus": "ACTIVE",
        "TableArn": format!("arn:aws:dynamodb:us-east-1:000000000000:table/{}", t.name),
        "KeySchema": t.keys.to_json(),
        "AttributeDefinitions": t.definitions,
        "ItemCount": t.items.len(),
        "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"},
    });
    if !t.indexes.is_empty() {
        d["GlobalSecondaryIndexes"] = Json::Array(
            t.indexes
                .iter()
                .map(|i| json!({"IndexName": i.name, "KeySchema": i.keys.to_json(), "Projection": i.projection, "IndexStatus": "ACTIVE"}))
                .collect(),
        );
    }
    if let Some(view) = &t.stream_view {
        d["StreamSpecification"] = json!({"StreamEnabled": true, "StreamViewType": view});
        d["LatestStreamArn"] = json!(format!(
            "arn:aws:dynamodb:us-east-1:000000000000:table/{}/stream/1970-01-01T00:00:00.000",
            t.name
        ));
        d["LatestStreamLabel"] = json!("1970-01-01T00:00:00.000");
    }
    d
}

pub(super) fn create_table(db: &mut Dynamo, body: &Json) -> Result<Json, ApiError> {
    let name = text(body, "TableName")?.to_owned();
    if db.tables.contains_key(&name) {
        return Err(ApiError::new(
            "ResourceInUseException",
            format!("Table already exists: {name}"),
        ));
    }
    let definitions = body
        .get("AttributeDefinitions")
        .cloned()
        .unwrap_or(Json::Null);
    let keys = key_schema(&body["KeySchema"], &definitions)?;
    let mut indexes = Vec::new();
    for g in body
        .get("GlobalSecondaryIndexes")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        indexes.push(Index {
            name: g["IndexName"].as_str().unwrap_or_default().to_owned(),
            keys: key_schema(&g["KeySchema"], &definitions)?,
            projection: g
                .get("Projection")
                .cloned()
                .unwrap_or(json!({"ProjectionType": "ALL"})),
        });
    }
    let stream = body
        .get("StreamSpecification")
        .filter(|s| s["StreamEnabled"] == Json::Bool(true))
        .and_then(|s| s["StreamViewType"].as_str())
        .map(str::to_owned);
    let table = Table::new(name.clone(), keys, definitions, indexes, stream);
    let d = describe(&table);
    db.tables.insert(name, table);
    Ok(json!({ "TableDescription": d }))
}
