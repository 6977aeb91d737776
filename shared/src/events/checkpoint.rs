//! The scheduled catch-up's place: the last event it queued, whether that run reached the
//! newest, and a version that every write is conditional on, in one item of the idempotency
//! table. Moved by [`crate::events::catch_up`] after every page, shown and set by
//! `payctl events checkpoint`.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use sqs_once::dynamo::{get_n, get_s, n, s};

use crate::provider::event::ProviderEvent;

/// How far before its last event a run that had caught up starts again: events created near
/// the end of the last run may have been listed after it ran.
pub const OVERLAP_S: i64 = 900;

/// An event's place in the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Place {
    /// `evt_...`.
    pub id: String,
    /// When the provider created it, unix seconds.
    pub created: i64,
}

impl Place {
    /// The place of `e`.
    pub fn of(e: &ProviderEvent) -> Self {
        Self {
            id: e.id.clone(),
            created: e.created,
        }
    }
}

/// The scheduled catch-up's place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Position {
    /// The last event queued.
    pub last: Option<Place>,
    /// The run that queued it reached the newest event.
    pub caught_up: bool,
    /// Moved by one at every write: each write is conditional on the version read.
    pub version: i64,
    /// Without a last event: where the next run's window starts, unix seconds (set by hand,
    /// or read from a checkpoint of versions before the cursor: its `through_s` less
    /// [`OVERLAP_S`]).
    pub from_s: Option<i64>,
    /// Every event created up to this time (unix seconds) has been listed: the time of the
    /// last run that reached the newest event, else the last event a run walked to. What the
    /// catch-up's lag is measured from (listing only the undelivered events, the last event
    /// queued may be days old while the runs keep up). `None`: no run wrote it yet.
    pub checked_through_s: Option<i64>,
    /// Asked to list only the undelivered events, the runs list every event, for this reason
    /// (the webhook was not verified to be sent every type), until one reaches the newest.
    pub listing_all: Option<String>,
}

impl Position {
    /// How far behind the provider's list the catch-up is at `now_s`, seconds: the time
    /// since [`Position::checked_through_s`] (`None`: no run wrote it yet).
    pub fn lag_s(&self, now_s: i64) -> Option<i64> {
        self.checked_through_s.map(|t| (now_s - t).max(0))
    }
}

/// Where the scheduled catch-up keeps its [`Position`].
pub struct Checkpoint {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

/// The checkpoint item's key.
pub const CHECKPOINT_KEY: &str = "checkpoint#provider-events";

fn dynamo_error<E: std::error::Error + 'static, R: std::fmt::Debug>(e: SdkError<E, R>) -> String {
    aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string()
}

impl Checkpoint {
    /// The checkpoint in the idempotency table `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str) -> Self {
        Self {
            client,
            table: table.to_owned(),
        }
    }

    /// The position stored (the default when no run ever wrote one).
    pub async fn read(&self) -> Result<Position, String> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(CHECKPOINT_KEY))
            .consistent_read(true)
            .send()
            .await
            .map_err(dynamo_error)?;
        let Some(item) = out.item() else {
            return Ok(Position::default());
        };
        let last = match (get_s(item, "last_event"), get_n(item, "last_created")) {
            (Some(id), Some(created)) => Some(Place { id, created }),
            _ => None,
        };
        Ok(Position {
            last,
            caught_up: item
                .get("caught_up")
                .and_then(|v| v.as_bool().ok())
                .copied()
                .unwrap_or(false),
            version: get_n(item, "version").unwrap_or(0),
            from_s: get_n(item, "start_s")
                .or_else(|| get_n(item, "through_s").map(|t| t - OVERLAP_S)),
            checked_through_s: get_n(item, "checked_through"),
            listing_all: get_s(item, "listing_all"),
        })
    }

    /// Moves the position from `from` (as read) to `to`; `false` when another run moved it.
    pub async fn advance(&self, from: &Position, to: &Position) -> Result<bool, String> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(CHECKPOINT_KEY))
            .expression_attribute_values(":v", n(to.version))
            .expression_attribute_values(":caught", AttributeValue::Bool(to.caught_up));
        let mut checked = match to.checked_through_s {
            Some(t) => {
                req = req.expression_attribute_values(":ct", n(t));
                ", checked_through = :ct".to_owned()
            }
            None => String::new(),
        };
        let removed = match &to.listing_all {
            Some(why) => {
                req = req.expression_attribute_values(":la", s(why));
                checked.push_str(", listing_all = :la");
                ""
            }
            None => ", listing_all",
        };
        req = match (&to.last, to.from_s) {
            (Some(p), _) => req
                .update_expression(format!(
                    "SET version = :v, caught_up = :caught, last_event = :id, last_created = :c{checked} \
                     REMOVE through_s, start_s{removed}"
                ))
                .expression_attribute_values(":id", s(&p.id))
                .expression_attribute_values(":c", n(p.created)),
            (None, Some(from)) => req
                .update_expression(format!(
                    "SET version = :v, caught_up = :caught, start_s = :from_s{checked} \
                     REMOVE last_event, last_created, through_s{removed}"
                ))
                .expression_attribute_values(":from_s", n(from)),
            (None, None) => req.update_expression(format!(
                "SET version = :v, caught_up = :caught{checked} REMOVE last_event, last_created, through_s, start_s{removed}"
            )),
        };
        req = if from.version == 0 {
            req.condition_expression("attribute_not_exists(version)")
        } else {
            req.condition_expression("version = :from")
                .expression_attribute_values(":from", n(from.version))
        };
        match req.send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se))
                if matches!(
                    se.err(),
                    UpdateItemError::ConditionalCheckFailedException(_)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(dynamo_error(e)),
        }
    }
}
