//! What every operation reads from its JSON request: fields, items, placeholders.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use super::expr;
use super::value::{item_from_json, Item, Value};
use super::ApiError;

pub(super) fn text<'a>(body: &'a Json, field: &str) -> Result<&'a str, ApiError> {
    body.get(field)
        .and_then(Json::as_str)
        .ok_or_else(|| ApiError::validation(format!("1 validation error detected: Value null at '{field}' failed to satisfy constraint: Member must not be null")))
}

pub(super) fn item_field(body: &Json, field: &str) -> Result<Item, ApiError> {
    item_from_json(body.get(field).unwrap_or(&Json::Null)).map_err(|e| ApiError::validation(e.0))
}

/// The request's placeholders.
pub(super) struct Placeholders {
    pub(super) names: BTreeMap<String, String>,
    pub(super) values: BTreeMap<String, Value>,
}

impl Placeholders {
    pub(super) fn of(body: &Json) -> Result<Self, ApiError> {
        let names = match body.get("ExpressionAttributeNames") {
            Some(Json::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    Ok((
                        k.clone(),
                        v.as_str()
                            .ok_or_else(|| ApiError::validation("a name must be a string"))?
                            .to_owned(),
                    ))
                })
                .collect::<Result<_, ApiError>>()?,
            _ => BTreeMap::new(),
        };
        let values = match body.get("ExpressionAttributeValues") {
            Some(v @ Json::Object(_)) => {
                item_from_json(v).map_err(|e| ApiError::validation(e.0))?
            }
            _ => BTreeMap::new(),
        };
        Ok(Self { names, values })
    }
}

pub(super) fn invalid(e: expr::Invalid) -> ApiError {
    ApiError::validation(e.0)
}
