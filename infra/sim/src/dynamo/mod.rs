//! DynamoDB, modelled: the operations the project's code sends (through the official SDK, whose
//! requests arrive here as DynamoDB's JSON protocol) answered as DynamoDB answers them.
//!
//! Each request is applied whole, at one instant of the simulated clock, so every conditional
//! write and transaction is atomic, as DynamoDB's are; the latency around it (and a caller that
//! dies while the answer is on its way back) is the transport's (`crate::wire`). Reads are
//! strongly consistent whether asked or not, and a secondary index is updated with its table:
//! the model is stricter than DynamoDB there (see `docs/design.md`, "The simulator").

mod control;
pub mod expr;
mod ops;
mod request;
mod reserved;
mod streams;
pub mod table;
pub mod value;

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

pub use table::{Change, Table};

/// A DynamoDB error as the wire carries it.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status (400 for the client's, 500 for the service's).
    pub status: u16,
    /// The shape's name (`ConditionalCheckFailedException`).
    pub code: &'static str,
    /// Its message.
    pub message: String,
    /// Members the error carries beside its message (`Item`, `CancellationReasons`).
    pub extra: serde_json::Map<String, Json>,
}

impl ApiError {
    /// A `ValidationException`.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new("ValidationException", message)
    }

    /// A client error of the given shape.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            code,
            message: message.into(),
            extra: Default::default(),
        }
    }

    /// The wire body.
    pub fn body(&self) -> Json {
        let mut out = self.extra.clone();
        out.insert(
            "__type".into(),
            json!(format!("com.amazonaws.dynamodb.v20120810#{}", self.code)),
        );
        out.insert("message".into(), json!(self.message));
        Json::Object(out)
    }
}

/// The account's tables.
#[derive(Debug, Default)]
pub struct Dynamo {
    /// Tables by name.
    pub tables: BTreeMap<String, Table>,
}

impl Dynamo {
    /// An account without tables.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers one request (`X-Amz-Target: DynamoDB_20120810.<operation>`) at `now_s`.
    pub fn handle(&mut self, operation: &str, body: &Json, now_s: i64) -> Result<Json, ApiError> {
        ops::handle(self, operation, body, now_s)
    }

    /// A table, or DynamoDB's error for a missing one.
    pub fn table(&self, name: &str) -> Result<&Table, ApiError> {
        self.tables.get(name).ok_or_else(|| {
            ApiError::new(
                "ResourceNotFoundException",
                format!("Requested resource not found: Table: {name} not found"),
            )
        })
    }

    /// The table, writable.
    pub fn table_mut(&mut self, name: &str) -> Result<&mut Table, ApiError> {
        self.table(name)?;
        Ok(self.tables.get_mut(name).expect("checked"))
    }

    /// Deletes what time to live has made due by `now_s` in every table; returns what it
    /// deleted, by table.
    pub fn expire(
        &mut self,
        now_s: i64,
        delay_of: &dyn Fn(&str, &str, i64) -> i64,
    ) -> Vec<(String, value::Item)> {
        let mut gone = Vec::new();
        for (name, table) in self.tables.iter_mut() {
            for key in table.expired(now_s, |k, at| delay_of(name, k, at)) {
                if let Some(item) = table.items.get(&key).cloned() {
                    table.write(&key, None, now_s, true);
                    gone.push((name.clone(), item));
                }
            }
        }
        gone
    }
}
