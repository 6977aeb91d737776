//! The operations: control plane (tables, time to live) and data plane (items, transactions,
//! batches, queries), each reading DynamoDB's JSON request and writing its JSON answer.
//!
//! Why ~620 lines: one dispatch over DynamoDB's operations, each a short function of the same
//! request reading and answer writing; its tests (an index's projection, a page's megabyte)
//! read the operations' answers as the SDK would.

use serde_json::{json, Value as Json};

use super::expr::{self, Names};
use super::request::{invalid, item_field, text, Placeholders};
use super::table::Table;
use super::value::{item_from_json, item_to_json, Item};
use super::{ApiError, Dynamo};

/// A write, parsed: the key it touches and how the item changes, with its condition.
struct Write {
    table: String,
    key: String,
    kind: WriteKind,
    condition: Option<expr::Cond>,
    /// `ReturnValuesOnConditionCheckFailure=ALL_OLD`.
    old_on_failure: bool,
}

enum WriteKind {
    Put(Item),
    Update(expr::Update),
    Delete,
    Check,
}

fn parse_write(db: &Dynamo, body: &Json, kind: &str) -> Result<Write, ApiError> {
    let table_name = text(body, "TableName")?.to_owned();
    let table = db.table(&table_name)?;
    let p = Placeholders::of(body)?;
    let mut names = Names::new(&p.names, &p.values);
    let condition = match body.get("ConditionExpression").and_then(Json::as_str) {
        Some(c) => Some(expr::condition(c, &mut names).map_err(invalid)?),
        None => None,
    };
    let (key, kind) = match kind {
        "Put" => {
            let item = item_field(body, "Item")?;
            (
                table.check_item(&item).map_err(ApiError::validation)?,
                WriteKind::Put(item),
            )
        }
        _ => {
            let key = table
                .key_text(&item_field(body, "Key")?)
                .map_err(ApiError::validation)?;
            let kind = match kind {
                "Update" => {
                    let u = expr::update(text(body, "UpdateExpression")?, &mut names)
                        .map_err(invalid)?;
                    for attr in expr::top_level_written(&u) {
                        if table.keys.names().contains(&attr.as_str()) {
                            return Err(ApiError::validation(format!(
                                "One or more parameter values were invalid: Cannot update attribute {attr}. This attribute is part of the key"
                            )));
                        }
                    }
                    WriteKind::Update(u)
                }
                "Delete" => WriteKind::Delete,
                _ => {
                    if condition.is_none() {
                        return Err(ApiError::validation(
                            "ConditionCheck needs a ConditionExpression",
                        ));
                    }
                    WriteKind::Check
                }
            };
            (key, kind)
        }
    };
    names.check_all_used().map_err(invalid)?;
    let old_on_failure = body
        .get("ReturnValuesOnConditionCheckFailure")
        .and_then(Json::as_str)
        == Some("ALL_OLD");
    Ok(Write {
        table: table_name,
        key,
        kind,
        condition,
        old_on_failure,
    })
}

/// What a write would make of the item, or `Err(old item)` when its condition fails.
fn decide(
    db: &Dynamo,
    w: &Write,
    req_key: Option<&Item>,
) -> Result<Result<Option<Item>, Option<Item>>, ApiError> {
    let table = db.table(&w.table)?;
    let before = table.items.get(&w.key).cloned();
    let seen = before.clone().unwrap_or_default();
    if let Some(c) = &w.condition {
        if !expr::holds(c, &seen) {
            return Ok(Err(before));
        }
    }
    Ok(Ok(match &w.kind {
        WriteKind::Put(item) => Some(item.clone()),
        WriteKind::Delete => None,
        WriteKind::Check => before,
        WriteKind::Update(u) => {
            let mut base = seen;
            if before.is_none() {
                base.extend(req_key.cloned().unwrap_or_default());
            }
            let after = expr::apply(u, &base).map_err(invalid)?;
            table.check_item(&after).map_err(ApiError::validation)?;
            Some(after)
        }
    }))
}

fn condition_failed(old: Option<Item>, wanted: bool) -> ApiError {
    let mut e = ApiError::new(
        "ConditionalCheckFailedException",
        "The conditional request failed",
    );
    if let (true, Some(item)) = (wanted, old) {
        e.extra.insert("Item".into(), item_to_json(&item));
    }
    e
}

fn returned(body: &Json, before: &Option<Item>, after: &Option<Item>) -> Json {
    let pick = match body.get("ReturnValues").and_then(Json::as_str) {
        Some("ALL_OLD") => before.as_ref(),
        Some("ALL_NEW") => after.as_ref(),
        Some("UPDATED_OLD") | Some("UPDATED_NEW") => {
            let (from, other) = if body["ReturnValues"] == "UPDATED_OLD" {
                (before, after)
            } else {
                (after, before)
            };
            let changed: Item = from
                .iter()
                .flatten()
                .filter(|(k, v)| other.as_ref().and_then(|o| o.get(*k)) != Some(*v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            return json!({ "Attributes": item_to_json(&changed) });
        }
        _ => None,
    };
    match pick {
        Some(item) => json!({ "Attributes": item_to_json(item) }),
        None => json!({}),
    }
}

fn single_write(db: &mut Dynamo, body: &Json, kind: &str, now_s: i64) -> Result<Json, ApiError> {
    let w = parse_write(db, body, kind)?;
    let key_item = body
        .get("Key")
        .map(item_from_json)
        .transpose()
        .map_err(|e| ApiError::validation(e.0))?;
    match decide(db, &w, key_item.as_ref())? {
        Err(old) => Err(condition_failed(old, w.old_on_failure)),
        Ok(after) => {
            let table = db.table_mut(&w.table)?;
            let before = table.items.get(&w.key).cloned();
            table.write(&w.key, after.clone(), now_s, false);
            Ok(returned(body, &before, &after))
        }
    }
}

fn transact(db: &mut Dynamo, body: &Json, now_s: i64) -> Result<Json, ApiError> {
    let items = body
        .get("TransactItems")
        .and_then(Json::as_array)
        .ok_or_else(|| ApiError::validation("TransactItems must not be null"))?;
    if items.is_empty() || items.len() > 100 {
        return Err(ApiError::validation(
            "Member must have length between 1 and 100",
        ));
    }
    let mut writes = Vec::new();
    for t in items {
        let (kind, inner) = ["ConditionCheck", "Put", "Update", "Delete"]
            .iter()
            .find_map(|k| t.get(*k).map(|v| (*k, v)))
            .ok_or_else(|| {
                ApiError::validation(
                    "a TransactItem needs one of ConditionCheck, Put, Update, Delete",
                )
            })?;
        let key_item = inner
            .get("Key")
            .map(item_from_json)
            .transpose()
            .map_err(|e| ApiError::validation(e.0))?;
        writes.push((parse_write(db, inner, kind)?, key_item));
    }
    for (i, (a, _)) in writes.iter().enumerate() {
        if writes[i + 1..]
            .iter()
            .any(|(b, _)| a.table == b.table && a.key == b.key)
        {
            return Err(ApiError::validation(
                "Transaction request cannot include multiple operations on one item",
            ));
        }
    }
    let mut outcomes = Vec::new();
    for (w, key_item) in &writes {
        outcomes.push(decide(db, w, key_item.as_ref())?);
    }
    if outcomes.iter().any(Result::is_err) {
        let reasons: Vec<Json> = outcomes
            .iter()
            .zip(&writes)
            .map(|(o, (w, _))| match o {
                Ok(_) => json!({"Code": "None"}),
                Err(old) => {
                    let mut r = json!({"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"});
                    if let (true, Some(item)) = (w.old_on_failure, old) {
                        r["Item"] = item_to_json(item);
                    }
                    r
                }
            })
            .collect();
        let codes: Vec<&str> = reasons
            .iter()
            .map(|r| r["Code"].as_str().unwrap_or("None"))
            .collect();
        let mut e = ApiError::new(
            "TransactionCanceledException",
            format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{}]", codes.join(", ")),
        );
        e.extra
            .insert("CancellationReasons".into(), Json::Array(reasons));
        return Err(e);
    }
    for ((w, _), after) in writes.iter().zip(outcomes) {
        if matches!(w.kind, WriteKind::Check) {
            continue;
        }
        db.table_mut(&w.table)?
            .write(&w.key, after.expect("no failure"), now_s, false);
    }
    Ok(json!({}))
}

fn projection_of(body: &Json) -> Result<Option<Vec<expr::Path>>, ApiError> {
    let Some(p) = body.get("ProjectionExpression").and_then(Json::as_str) else {
        if body.get("ExpressionAttributeNames").is_some()
            && body.get("KeyConditionExpression").is_none()
            && body.get("FilterExpression").is_none()
        {
            return Err(ApiError::validation(
                "ExpressionAttributeNames can only be specified when using expressions",
            ));
        }
        return Ok(None);
    };
    let ph = Placeholders::of(body)?;
    let mut names = Names::new(&ph.names, &ph.values);
    let paths = expr::projection(p, &mut names).map_err(invalid)?;
    Ok(Some(paths))
}

fn get_item(db: &Dynamo, body: &Json) -> Result<Json, ApiError> {
    let table = db.table(text(body, "TableName")?)?;
    let key = table
        .key_text(&item_field(body, "Key")?)
        .map_err(ApiError::validation)?;
    let projection = projection_of(body)?;
    Ok(match table.items.get(&key) {
        Some(item) => {
            let item = match &projection {
                Some(p) => expr::project(item, p),
                None => item.clone(),
            };
            json!({ "Item": item_to_json(&item) })
        }
        None => json!({}),
    })
}

fn batch_get(db: &Dynamo, body: &Json) -> Result<Json, ApiError> {
    let requests = body
        .get("RequestItems")
        .and_then(Json::as_object)
        .ok_or_else(|| ApiError::validation("RequestItems must not be null"))?;
    let total: usize = requests
        .values()
        .map(|r| r["Keys"].as_array().map_or(0, Vec::len))
        .sum();
    if total > 100 {
        return Err(ApiError::validation(
            "Too many items requested for the BatchGetItem call",
        ));
    }
    let mut responses = serde_json::Map::new();
    for (name, request) in requests {
        let table = db.table(name)?;
        let projection = projection_of(request)?;
        let mut found = Vec::new();
        for key in request["Keys"].as_array().into_iter().flatten() {
            let key = item_from_json(key).map_err(|e| ApiError::validation(e.0))?;
            let key = table.key_text(&key).map_err(ApiError::validation)?;
            if let Some(item) = table.items.get(&key) {
                found.push(item_to_json(&match &projection {
                    Some(p) => expr::project(item, p),
                    None => item.clone(),
                }));
            }
        }
        responses.insert(name.clone(), Json::Array(found));
    }
    Ok(json!({ "Responses": responses, "UnprocessedKeys": {} }))
}

/// `Query` (with its key condition) or `Scan` (without): items in key order, filtered, paged.
fn query(db: &Dynamo, body: &Json, scan: bool) -> Result<Json, ApiError> {
    let table = db.table(text(body, "TableName")?)?;
    let index = body.get("IndexName").and_then(Json::as_str);
    // An index holds what its projection declares, no more: the table's and its own keys, and
    // for `INCLUDE` the attributes it names (`ALL`: every one). A query of it sees only those,
    // in its filter as in its answer.
    let mut projected: Option<std::collections::BTreeSet<String>> = None;
    let schema = match index {
        Some(i) => {
            if body.get("ConsistentRead") == Some(&Json::Bool(true)) {
                return Err(ApiError::validation(
                    "Consistent reads are not supported on global secondary indexes",
                ));
            }
            let x = table.indexes.iter().find(|x| x.name == i).ok_or_else(|| {
                ApiError::validation(format!("The table does not have the specified index: {i}"))
            })?;
            if x.projection["ProjectionType"].as_str() != Some("ALL") {
                let mut kept: std::collections::BTreeSet<String> = table
                    .keys
                    .names()
                    .into_iter()
                    .chain(x.keys.names())
                    .map(str::to_owned)
                    .collect();
                if let Some(Json::Array(more)) = x.projection.get("NonKeyAttributes") {
                    kept.extend(more.iter().filter_map(Json::as_str).map(str::to_owned));
                }
                projected = Some(kept);
            }
            &x.keys
        }
        None => &table.keys,
    };
    let ph = Placeholders::of(body)?;
    let mut names = Names::new(&ph.names, &ph.values);
    let key_cond = match scan {
        true => None,
        false => Some(
            expr::condition(text(body, "KeyConditionExpression")?, &mut names).map_err(invalid)?,
        ),
    };
    let filter = match body.get("FilterExpression").and_then(Json::as_str) {
        Some(f) => Some(expr::condition(f, &mut names).map_err(invalid)?),
        None => None,
    };
    let projection = match body.get("ProjectionExpression").and_then(Json::as_str) {
        Some(p) => Some(expr::projection(p, &mut names).map_err(invalid)?),
        None => None,
    };
    names.check_all_used().map_err(invalid)?;
    // A query reads the partition its key condition names; a scan (or a key condition without
    // the partition key's equality, which DynamoDB would refuse) reads every item.
    let candidates: Box<dyn Iterator<Item = (&String, &Item)>> = match key_cond
        .as_ref()
        .and_then(|c| c.equality_on(&schema.hash.0))
    {
        Some(v) if !crate::cost::on("query_reads_the_table") => Box::new(table.partition(index, v)),
        _ => Box::new(table.items.iter()),
    };
    let candidates = candidates.inspect(|_| crate::cost::visit(1));
    let mut rows: Vec<(&String, &Item)> = candidates
        .filter(|(_, item)| {
            Table::key_text_of(schema, item).ok().flatten().is_some()
                && key_cond.as_ref().is_none_or(|c| expr::holds(c, item))
        })
        .collect();
    let sort = |item: &Item| {
        schema
            .range
            .as_ref()
            .and_then(|(r, _)| item.get(r).cloned())
    };
    rows.sort_by(|a, b| match (sort(a.1), sort(b.1)) {
        (Some(x), Some(y)) => x
            .compare(&y)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.0.cmp(b.0)),
        _ => a.0.cmp(b.0),
    });
    if body.get("ScanIndexForward") == Some(&Json::Bool(false)) {
        rows.reverse();
    }
    if let Some(start) = body.get("ExclusiveStartKey") {
        let start = item_from_json(start).map_err(|e| ApiError::validation(e.0))?;
        let start_key = Table::key_text_of(&table.keys, &start).map_err(ApiError::validation)?;
        if let Some(pos) = rows
            .iter()
            .position(|(k, _)| Some(*k) == start_key.as_ref())
        {
            rows.drain(..=pos);
        }
    }
    let limit = body.get("Limit").and_then(Json::as_u64).map(|l| l as usize);
    let mut out = Vec::new();
    let mut scanned = 0;
    let mut last = None;
    // A page ends at `Limit` items read, or once 1 MB of them was read (before the filter):
    // DynamoDB's own page size, which a caller's pagination must follow.
    let mut read_bytes = 0;
    let mut full = false;
    for (k, item) in &rows {
        if limit.is_some_and(|l| scanned >= l) || read_bytes >= 1_048_576 {
            full = true;
            break;
        }
        let in_index;
        let item: &Item = match &projected {
            Some(kept) => {
                in_index = item
                    .iter()
                    .filter(|(n, _)| kept.contains(n.as_str()))
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect::<Item>();
                &in_index
            }
            None => item,
        };
        scanned += 1;
        read_bytes += super::value::item_size(item);
        last = Some((*k, item.clone()));
        if filter.as_ref().is_none_or(|f| expr::holds(f, item)) {
            out.push(item_to_json(&match &projection {
                Some(p) => expr::project(item, p),
                None => item.clone(),
            }));
        }
    }
    let mut answer = json!({ "Count": out.len(), "ScannedCount": scanned });
    if body.get("Select").and_then(Json::as_str) != Some("COUNT") {
        answer["Items"] = Json::Array(out);
    }
    if let (true, Some((_, item))) = (full, last.as_ref()) {
        {
            let mut key = table.key_of(item);
            for n in schema.names() {
                if let Some(v) = item.get(n) {
                    key.insert(n.to_owned(), v.clone());
                }
            }
            answer["LastEvaluatedKey"] = item_to_json(&key);
        }
    }
    Ok(answer)
}

pub(super) fn handle(
    db: &mut Dynamo,
    operation: &str,
    body: &Json,
    now_s: i64,
) -> Result<Json, ApiError> {
    match operation {
        "CreateTable" => super::control::create_table(db, body),
        "DescribeTable" => {
            Ok(json!({ "Table": super::control::describe(db.table(text(body, "TableName")?)?) }))
        }
        "DeleteTable" => {
            let name = text(body, "TableName")?;
            let d = super::control::describe(db.table(name)?);
            db.tables.remove(name);
            Ok(json!({ "TableDescription": d }))
        }
        "ListTables" => Ok(json!({ "TableNames": db.tables.keys().collect::<Vec<_>>() })),
        "UpdateTimeToLive" => {
            let spec = body
                .get("TimeToLiveSpecification")
                .cloned()
                .unwrap_or(Json::Null);
            let table = db.table_mut(text(body, "TableName")?)?;
            table.set_ttl(
                (spec["Enabled"] == Json::Bool(true))
                    .then(|| spec["AttributeName"].as_str().map(str::to_owned))
                    .flatten(),
            );
            Ok(json!({ "TimeToLiveSpecification": spec }))
        }
        "DescribeTimeToLive" => {
            let table = db.table(text(body, "TableName")?)?;
            Ok(
                json!({ "TimeToLiveDescription": match table.ttl_attribute() {
                    Some(a) => json!({"TimeToLiveStatus": "ENABLED", "AttributeName": a}),
                    None => json!({"TimeToLiveStatus": "DISABLED"}),
                }}),
            )
        }
        "GetItem" => get_item(db, body),
        "BatchGetItem" => batch_get(db, body),
        "Query" => query(db, body, false),
        "Scan" => query(db, body, true),
        "PutItem" => single_write(db, body, "Put", now_s),
        "UpdateItem" => single_write(db, body, "Update", now_s),
        "DeleteItem" => single_write(db, body, "Delete", now_s),
        "TransactWriteItems" => transact(db, body, now_s),
        "ListStreams" | "DescribeStream" | "GetShardIterator" | "GetRecords" => {
            super::streams::streams(db, operation, body)
        }
        other => Err(ApiError::new(
            "UnknownOperationException",
            format!("the simulator does not model DynamoDB's {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Dynamo;
    use serde_json::json;

    /// A table `t` (key `pk`) with an index `open` on `gpk`, projecting `status` only.
    fn table() -> Dynamo {
        let mut db = Dynamo::new();
        db.handle(
            "CreateTable",
            &json!({
                "TableName": "t",
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
                "AttributeDefinitions": [
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "gpk", "AttributeType": "S"}
                ],
                "GlobalSecondaryIndexes": [{
                    "IndexName": "open",
                    "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["status"]}
                }]
            }),
            0,
        )
        .unwrap();
        db
    }

    fn put(db: &mut Dynamo, pk: &str, extra: serde_json::Value) {
        let mut item = json!({"pk": {"S": pk}, "gpk": {"S": "g"}, "status": {"S": "FAILED"}});
        for (k, v) in extra.as_object().unwrap() {
            item[k] = v.clone();
        }
        db.handle("PutItem", &json!({"TableName": "t", "Item": item}), 0)
            .unwrap();
    }

    #[test]
    fn an_index_query_sees_only_what_the_index_projects() {
        let mut db = table();
        put(&mut db, "a", json!({"held": {"S": "secret"}}));
        let mut q = |filter: Option<&str>| {
            let mut body = json!({
                "TableName": "t", "IndexName": "open",
                "KeyConditionExpression": "gpk = :g",
                "ExpressionAttributeValues": {":g": {"S": "g"}}
            });
            if let Some(f) = filter {
                body["FilterExpression"] = json!(f);
            }
            db.handle("Query", &body, 0).unwrap()
        };
        let all = q(None);
        let item = all["Items"][0].as_object().unwrap();
        let mut names: Vec<&str> = item.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["gpk", "pk", "status"], "{item:?}");
        // A filter on an attribute the index does not hold finds nothing of it.
        assert_eq!(q(Some("attribute_exists(held)"))["Count"], 0);
    }

    #[test]
    fn a_page_ends_after_a_megabyte_read() {
        let mut db = table();
        let big = "x".repeat(100_000);
        for n in 0..25 {
            put(&mut db, &format!("p{n:02}"), json!({"blob": {"S": big}}));
        }
        let mut start = None;
        let mut pages = Vec::new();
        loop {
            let mut body = json!({"TableName": "t"});
            if let Some(s) = start.take() {
                body["ExclusiveStartKey"] = s;
            }
            let page = db.handle("Scan", &body, 0).unwrap();
            pages.push(page["Count"].as_u64().unwrap());
            match page.get("LastEvaluatedKey") {
                Some(k) => start = Some(k.clone()),
                None => break,
            }
        }
        assert_eq!(pages, [11, 11, 3], "100 KB items, pages of a megabyte");
    }
}
