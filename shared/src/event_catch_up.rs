//! The catch-up: events the endpoint missed (down longer than the provider retries, three days
//! at Stripe; a secret rolled wrong; a route removed) are listed from `GET /v1/events` and fed
//! into the same provider-events queue, where the inbox applies each once by its id, so a
//! window listed twice changes nothing.
//!
//! `payctl events catch-up --since ...` lists a window given by hand. The scheduled run (the
//! event function invoked with `{"catch_up": true}` by the template's schedule) starts where the
//! last run ended, less an overlap for events listed late, from a checkpoint item in the
//! idempotency table (`pk = checkpoint#provider-events`), which it advances only after every
//! event of its window is queued: a run that fails is run again over the same window.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use serde::Serialize;
use sqs_once::dynamo::{get_n, n, s};

use crate::event_receiver::EventQueue;
use crate::provider::{FailureKind, ProviderError};
use crate::provider_event::ProviderEvent;
use crate::stripe::{listing, StripeClient};

/// The event types the inbox applies: what the catch-up lists (Stripe's `types[]` takes up to
/// 20), and what to select when registering the endpoint.
pub const EVENT_TYPES: &[&str] = &[
    "payment_intent.succeeded",
    "payment_intent.processing",
    "payment_intent.payment_failed",
    "payment_intent.requires_action",
    "payment_intent.canceled",
    "refund.created",
    "refund.updated",
    "refund.failed",
    "charge.refund.updated",
    "charge.dispute.created",
    "charge.dispute.updated",
    "charge.dispute.closed",
    "charge.dispute.funds_withdrawn",
    "charge.dispute.funds_reinstated",
];

/// How long the provider keeps events (Stripe: 30 days): a window reaching further back is
/// cut there.
pub const EVENT_RETENTION_S: i64 = 30 * 86_400;

/// The first scheduled run's window: as long as the provider retries a failing endpoint.
pub const FIRST_WINDOW_S: i64 = 3 * 86_400;

/// How far before the checkpoint each scheduled run starts again: events created near the
/// end of the last window may have been listed after it ran.
pub const OVERLAP_S: i64 = 900;

/// The most events one run lists (100 per page).
const MAX_PAGES: usize = 500;

/// The provider's event list.
#[async_trait]
pub trait EventLister: Send + Sync {
    /// Every event of the inbox's types created in `[since_s, until_s]`, each with its JSON.
    async fn events(
        &self,
        since_s: i64,
        until_s: i64,
    ) -> Result<Vec<(ProviderEvent, String)>, ProviderError>;
}

#[derive(serde::Deserialize)]
struct EventPage {
    data: Vec<serde_json::Value>,
    #[serde(default)]
    has_more: bool,
}

#[async_trait]
impl EventLister for StripeClient {
    async fn events(
        &self,
        since_s: i64,
        until_s: i64,
    ) -> Result<Vec<(ProviderEvent, String)>, ProviderError> {
        let (since, until) = (since_s.to_string(), until_s.to_string());
        let type_keys: Vec<String> = (0..EVENT_TYPES.len())
            .map(|i| format!("types[{i}]"))
            .collect();
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query: Vec<(&str, &str)> = vec![
                ("limit", "100"),
                ("created[gte]", &since),
                ("created[lte]", &until),
            ];
            for (k, t) in type_keys.iter().zip(EVENT_TYPES) {
                query.push((k, t));
            }
            if let Some(a) = &after {
                query.push(("starting_after", a));
            }
            let (status, headers, body) = self.get("/v1/events", &query).await?;
            let page: EventPage = listing(status, &headers, &body, |_: &EventPage| false)?;
            for value in page.data {
                let text = value.to_string();
                match ProviderEvent::parse(&text) {
                    Ok(e) => {
                        after = Some(e.id.clone());
                        found.push((e, text));
                    }
                    Err(r) => {
                        return Err(ProviderError::new(
                            FailureKind::Network,
                            format!("the event list holds an unreadable event: {}", r.message),
                        ))
                    }
                }
            }
            if !page.has_more || after.is_none() {
                return Ok(found);
            }
        }
        Err(ProviderError::new(
            FailureKind::Network,
            format!(
                "more than {} events since {since_s}: list a shorter window",
                MAX_PAGES * 100
            ),
        ))
    }
}

/// What a catch-up did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CatchUpReport {
    /// The window listed, unix seconds.
    pub since_s: i64,
    /// Its end.
    pub until_s: i64,
    /// Events listed (and queued: the inbox drops those it applied before).
    pub queued: usize,
}

/// Lists `[since_s, until_s]` (cut at the provider's retention) and queues every event,
/// oldest first.
pub async fn catch_up(
    lister: &dyn EventLister,
    queue: &dyn EventQueue,
    since_s: i64,
    until_s: i64,
) -> Result<CatchUpReport, String> {
    let since_s = since_s.max(until_s - EVENT_RETENTION_S);
    let mut events = lister
        .events(since_s, until_s)
        .await
        .map_err(|e| format!("listing the provider's events: {e}"))?;
    events.sort_by_key(|(e, _)| e.created);
    for (event, text) in &events {
        queue
            .enqueue(event, text)
            .await
            .map_err(|e| format!("queueing event {}: {e}", event.id))?;
    }
    Ok(CatchUpReport {
        since_s,
        until_s,
        queued: events.len(),
    })
}

/// Where the scheduled catch-up keeps how far it got.
pub struct Checkpoint {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

/// The checkpoint item's key.
pub const CHECKPOINT_KEY: &str = "checkpoint#provider-events";

impl Checkpoint {
    /// The checkpoint in the idempotency table `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str) -> Self {
        Self {
            client,
            table: table.to_owned(),
        }
    }

    /// Through when every event was queued, if a run ended.
    pub async fn read(&self) -> Result<Option<i64>, String> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(CHECKPOINT_KEY))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string())?;
        Ok(out.item().and_then(|i| get_n(i, "through_s")))
    }

    /// Moves the checkpoint from `from` (as read) to `to`; `false` when another run moved it.
    pub async fn advance(&self, from: Option<i64>, to: i64) -> Result<bool, String> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(CHECKPOINT_KEY))
            .update_expression("SET through_s = :to")
            .expression_attribute_values(":to", n(to));
        req = match from {
            None => req.condition_expression("attribute_not_exists(through_s)"),
            Some(f) => req
                .condition_expression("through_s = :from")
                .expression_attribute_values(":from", n(f)),
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
            Err(e) => Err(aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string()),
        }
    }
}

/// The scheduled catch-up: from the checkpoint less [`OVERLAP_S`] (the last
/// [`FIRST_WINDOW_S`] on the first run) to `now_s`, then the checkpoint moved to `now_s`.
pub async fn scheduled(
    lister: &dyn EventLister,
    queue: &dyn EventQueue,
    checkpoint: &Checkpoint,
    now_s: i64,
) -> Result<CatchUpReport, String> {
    let through = checkpoint.read().await?;
    let since = through.map_or(now_s - FIRST_WINDOW_S, |t| t - OVERLAP_S);
    let report = catch_up(lister, queue, since, now_s).await?;
    if !checkpoint.advance(through, now_s).await? {
        tracing::warn!("another catch-up moved the checkpoint meanwhile; this run's events are queued all the same");
    }
    Ok(report)
}

/// The scheduled catch-up's parts, as the event function holds them.
pub struct ScheduledCatchUp {
    /// The provider's list.
    pub lister: Arc<dyn EventLister>,
    /// The provider-events queue.
    pub queue: Arc<dyn EventQueue>,
    /// The checkpoint.
    pub checkpoint: Checkpoint,
}

impl ScheduledCatchUp {
    /// One scheduled run at the current time.
    pub async fn run(&self) -> Result<CatchUpReport, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        scheduled(&*self.lister, &*self.queue, &self.checkpoint, now).await
    }
}
