//! DynamoDB Streams' reading side (`ListStreams`, `DescribeStream`, `GetShardIterator`,
//! `GetRecords`): one shard per table, its records kept 24 hours.

use serde_json::{json, Value as Json};

use super::control::describe;
use super::request::text;
use super::value::item_to_json;
use super::{ApiError, Dynamo};

/// The table a stream ARN (`<table ARN>/stream/<label>`) belongs to.
fn table_of_stream(arn: &str) -> &str {
    arn.split("/stream/")
        .next()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or("")
}

const SHARD: &str = "shardId-00000000000000000001-00000001";

/// DynamoDB Streams: one shard per table, its records kept 24 hours; an iterator is the table
/// and the next sequence number to read.
pub(super) fn streams(db: &Dynamo, operation: &str, body: &Json) -> Result<Json, ApiError> {
    let not_found = || {
        ApiError::new(
            "ResourceNotFoundException",
            "Requested resource not found: Stream not found",
        )
    };
    match operation {
        "ListStreams" => {
            let only = body.get("TableName").and_then(Json::as_str);
            let list: Vec<Json> = db
                .tables
                .values()
                .filter(|t| t.stream_view.is_some() && only.is_none_or(|o| o == t.name))
                .map(|t| json!({"StreamArn": describe(t)["LatestStreamArn"], "TableName": t.name, "StreamLabel": "1970-01-01T00:00:00.000"}))
                .collect();
            Ok(json!({ "Streams": list }))
        }
        "DescribeStream" => {
            let arn = text(body, "StreamArn")?;
            let t = db
                .tables
                .get(table_of_stream(arn))
                .filter(|t| t.stream_view.is_some())
                .ok_or_else(not_found)?;
            let first = t.first_sequence().unwrap_or(1);
            Ok(json!({ "StreamDescription": {
                "StreamArn": arn, "StreamLabel": "1970-01-01T00:00:00.000", "StreamStatus": "ENABLED",
                "StreamViewType": t.stream_view, "TableName": t.name, "KeySchema": t.keys.to_json(),
                "Shards": [{"ShardId": SHARD, "SequenceNumberRange": {"StartingSequenceNumber": format!("{first:021}")}}],
            }}))
        }
        "GetShardIterator" => {
            let arn = text(body, "StreamArn")?;
            let t = db
                .tables
                .get(table_of_stream(arn))
                .filter(|t| t.stream_view.is_some())
                .ok_or_else(not_found)?;
            if text(body, "ShardId")? != SHARD {
                return Err(not_found());
            }
            let seq = |b: &Json| -> Result<u64, ApiError> {
                text(b, "SequenceNumber")?
                    .parse()
                    .map_err(|_| ApiError::validation("SequenceNumber is not valid"))
            };
            let next = match text(body, "ShardIteratorType")? {
                "TRIM_HORIZON" => t.first_sequence().unwrap_or(t.next_sequence()),
                "LATEST" => t.next_sequence(),
                "AT_SEQUENCE_NUMBER" => seq(body)?,
                "AFTER_SEQUENCE_NUMBER" => seq(body)? + 1,
                other => {
                    return Err(ApiError::validation(format!(
                        "unknown ShardIteratorType {other}"
                    )))
                }
            };
            Ok(json!({ "ShardIterator": format!("{}|{next}", t.name) }))
        }
        _ => {
            let it = text(body, "ShardIterator")?;
            let (name, next) = it
                .rsplit_once('|')
                .ok_or_else(|| ApiError::validation("Invalid ShardIterator"))?;
            let next: u64 = next
                .parse()
                .map_err(|_| ApiError::validation("Invalid ShardIterator"))?;
            let t = db.tables.get(name).ok_or_else(not_found)?;
            if t.first_sequence().is_some_and(|first| first > next) {
                return Err(ApiError::new(
                    "TrimmedDataAccessException",
                    "the records asked for are past the stream's 24 hours",
                ));
            }
            let limit = body.get("Limit").and_then(Json::as_u64).unwrap_or(1000) as usize;
            let records: Vec<Json> = t
                .changes_from(next)
                .take(limit)
                .map(|c| t.record_of(c))
                .collect();
            let after = records
                .last()
                .and_then(|r| r["dynamodb"]["SequenceNumber"].as_str())
                .and_then(|s| s.parse::<u64>().ok())
                .map_or(next, |s| s + 1);
            Ok(json!({ "Records": records, "NextShardIterator": format!("{name}|{after}") }))
        }
    }
}

impl super::table::Table {
    /// One change as its stream record (`GetRecords`' shape; Lambda's event-source mapping
    /// passes the same record to a function).
    pub fn record_of(&self, c: &super::table::Change) -> Json {
        let view = self.stream_view.as_deref().unwrap_or("KEYS_ONLY");
        let mut d = json!({
            "ApproximateCreationDateTime": c.at_s,
            "Keys": item_to_json(&c.keys),
            "SequenceNumber": format!("{:021}", c.sequence),
            "SizeBytes": c.size_bytes,
            "StreamViewType": view,
        });
        if matches!(view, "NEW_IMAGE" | "NEW_AND_OLD_IMAGES") {
            if let Some(n) = &c.new {
                d["NewImage"] = item_to_json(n);
            }
        }
        if matches!(view, "OLD_IMAGE" | "NEW_AND_OLD_IMAGES") {
            if let Some(o) = &c.old {
                d["OldImage"] = item_to_json(o);
            }
        }
        let mut r = json!({
            "eventID": format!("{}-{}", self.name, c.sequence), "eventName": c.event, "eventVersion": "1.1",
            "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "dynamodb": d,
        });
        if c.by_ttl {
            r["userIdentity"] = json!({"type": "Service", "principalId": "dynamodb.amazonaws.com"});
        }
        r
    }
}
