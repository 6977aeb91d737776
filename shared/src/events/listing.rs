//! The provider's event list as the catch-up reads it: the port its adapter implements
//! ([`EventLister`]: pages of every event, or of the undelivered ones, and whether the latter
//! can be trusted), where a window's walk starts in it, a run's [`Budget`] and what it did
//! ([`CatchUpReport`]).

use async_trait::async_trait;
use serde::Serialize;

use crate::events::checkpoint::Place;
use crate::provider::event::ProviderEvent;
use crate::provider::{FailureKind, ProviderError};

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

/// Events per page (Stripe's largest).
pub const PAGE_SIZE: usize = 100;

/// The most pages walked back to find a window's oldest event when nothing of the inbox's
/// types precedes the window (a new account).
pub(crate) const OLDEST_MAX_PAGES: usize = 500;

/// Which of the provider's events a listing holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Listed {
    /// Every event of the inbox's types.
    All,
    /// Only those not delivered to every webhook endpoint (`delivery_success=false`: still
    /// pending, or failed all their attempts), as Stripe's guide to undelivered events lists
    /// them: the delivered ones were queued by the receiver when they arrived.
    Undelivered,
}

/// One page of the provider's event list, newest first as the provider lists it.
#[derive(Debug, Clone, Default)]
pub struct EventPage {
    /// The events with their JSON, newest first.
    pub events: Vec<(ProviderEvent, String)>,
    /// More events lie beyond this page in the direction listed.
    pub has_more: bool,
}

/// The provider's event list, restricted to [`EVENT_TYPES`], every event or only the
/// undelivered ones ([`Listed`]).
#[async_trait]
pub trait EventLister: Send + Sync {
    /// One page of the events created in `[since_s, until_s]`, newest first, after
    /// `starting_after` (`None`: from the newest).
    async fn page_back(
        &self,
        listed: Listed,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError>;

    /// The page of events created just after the event `cursor` (Stripe's `ending_before`),
    /// newest first; `has_more` when newer ones follow.
    async fn page_after(&self, listed: Listed, cursor: &str) -> Result<EventPage, ProviderError>;

    /// Whether listing only the undelivered events ([`Listed::Undelivered`]) holds every event
    /// of [`EVENT_TYPES`] the webhook did not apply: `None` when this stack's endpoint is
    /// enabled and sent every one of them; else why not (not registered, disabled, or not sent
    /// some of the types; or registered after `since_s`, where the list was last checked
    /// through: deleted and registered again between two runs, it was sent nothing made
    /// meanwhile). An event the provider never tried to send never failed a delivery either:
    /// only a listing of every event holds it.
    async fn webhook_unfit(&self, since_s: Option<i64>) -> Result<Option<String>, ProviderError>;

    /// Every event created in `[since_s, until_s]`, newest first, in memory: for short windows
    /// (tests, the demo's checks). Refused past 500 pages.
    async fn events(
        &self,
        since_s: i64,
        until_s: i64,
    ) -> Result<Vec<(ProviderEvent, String)>, ProviderError> {
        let mut found: Vec<(ProviderEvent, String)> = Vec::new();
        for _ in 0..OLDEST_MAX_PAGES {
            let after = found.last().map(|(e, _)| e.id.clone());
            let page = self
                .page_back(Listed::All, since_s, until_s, after.as_deref())
                .await?;
            let more = page.has_more && !page.events.is_empty();
            found.extend(page.events);
            if !more {
                return Ok(found);
            }
        }
        Err(ProviderError::new(
            FailureKind::Network,
            format!(
                "more than {} events since {since_s}: list a shorter window",
                OLDEST_MAX_PAGES * PAGE_SIZE
            ),
        ))
    }
}

/// A list call whose request may wait for the pace's slot until the run's budget ends (a run
/// is alone in its instance: waiting is all it would do meanwhile, and a `429`'s `Retry-After`
/// pauses the pace). `Ok(None)`: the pace had no slot before then; the run stops there, as at
/// its budget's end, and the next one goes on.
pub(crate) async fn paced<T, F>(budget: &Budget, call: F) -> Result<Option<T>, ProviderError>
where
    F: std::future::Future<Output = Result<T, ProviderError>>,
{
    let (answer, requests) = sqs_once::pace::within(budget.until, call).await;
    match answer {
        Err(_) if requests.none_sent() => Ok(None),
        other => other.map(Some),
    }
}

/// Where a window's oldest-first walk starts.
pub(crate) enum Start {
    /// Not known in this run: the pace had no slot for its list call before the budget's end.
    Later,
    /// After this event (not queued again).
    After(Place),
    /// With this event (the window's oldest, nothing of the types before it), then after it.
    With(ProviderEvent, String),
    /// No event at all from the window's start.
    Nothing,
}

/// Where the walk of events created from `since_s` starts: the newest event `listed` before it,
/// else (nothing before: a new account) the oldest since, found by walking back.
pub(crate) async fn start_at(
    (lister, listed): (&dyn EventLister, Listed),
    since_s: i64,
    now_s: i64,
    budget: Budget,
    report: &mut CatchUpReport,
) -> Result<Start, String> {
    let listing = |e: ProviderError| format!("listing the provider's events: {e}");
    let Some(before) = paced(&budget, lister.page_back(listed, 0, since_s - 1, None))
        .await
        .map_err(listing)?
    else {
        return Ok(Start::Later);
    };
    report.pages += 1;
    if let Some((e, _)) = before.events.first() {
        return Ok(Start::After(Place::of(e)));
    }
    let mut oldest: Option<(ProviderEvent, String)> = None;
    for pages in 0..OLDEST_MAX_PAGES {
        if budget.spent(pages) {
            return Err(format!(
                "the events since {since_s} have none before them to start from, and their oldest was not reached within this run ({pages} pages): set where to start with `payctl events checkpoint --set evt_...` or `--since`"
            ));
        }
        let after = oldest.as_ref().map(|(e, _)| e.id.clone());
        let Some(page) = paced(
            &budget,
            lister.page_back(listed, since_s, now_s, after.as_deref()),
        )
        .await
        .map_err(listing)?
        else {
            return Ok(Start::Later);
        };
        report.pages += 1;
        let more = page.has_more;
        if let Some(last) = page.events.into_iter().last() {
            oldest = Some(last);
        }
        if !more {
            return Ok(oldest.map_or(Start::Nothing, |(e, t)| Start::With(e, t)));
        }
    }
    Err(format!(
        "more than {} events since {since_s} and none before it to start from: set where to start with `payctl events checkpoint --set evt_...`",
        OLDEST_MAX_PAGES * PAGE_SIZE
    ))
}

/// How much one run may do.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// No page is started after this instant.
    pub until: tokio::time::Instant,
    /// No more pages than this.
    pub max_pages: usize,
}

impl Budget {
    /// No limit (a catch-up by hand).
    pub fn unlimited() -> Self {
        Self {
            until: tokio::time::Instant::now() + std::time::Duration::from_secs(100 * 365 * 86_400),
            max_pages: usize::MAX,
        }
    }

    /// Pages until `deadline_ms` (epoch ms, the function's) less `margin`: the time one page
    /// may take (a list call and ten batches, each within its own timeout).
    pub fn before_deadline(deadline_ms: i64, margin: std::time::Duration) -> Self {
        let now = sqs_once::runner::now_ms();
        let left = (deadline_ms - now - margin.as_millis() as i64).max(0) as u64;
        Self {
            until: tokio::time::Instant::now() + std::time::Duration::from_millis(left),
            max_pages: usize::MAX,
        }
    }

    pub(crate) fn spent(&self, pages: usize) -> bool {
        pages >= self.max_pages || tokio::time::Instant::now() >= self.until
    }
}

/// What a catch-up did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CatchUpReport {
    /// The window's start, unix seconds.
    pub since_s: i64,
    /// Its end (the run's time).
    pub until_s: i64,
    /// Events queued (the inbox drops those it applied before).
    pub queued: usize,
    /// The run listed every event although only the undelivered were asked for, and why:
    /// the webhook was not verified to be sent every type (see [`EventLister::webhook_unfit`]),
    /// or an earlier run's listing of every event had not reached the newest yet.
    pub listed_all: Option<String>,
    /// Events the queue cannot take, set aside to the dead-letter queue with their reason.
    pub set_aside: usize,
    /// Pages listed.
    pub pages: usize,
    /// The last event queued.
    pub last: Option<Place>,
    /// The run reached the newest event of its window; `false`: its budget ended first, and
    /// the next run continues from `last`.
    pub finished: bool,
    /// Every event created up to this time has been listed (a scheduled run's; see
    /// [`crate::events::checkpoint::Position::checked_through_s`]).
    pub checked_through_s: Option<i64>,
    /// The run found its checkpoint older than the provider keeps events and started from
    /// the oldest it still lists: what was created between the two may never have been
    /// applied (an alarm, and a runbook row: docs/operate.md, `CatchUpJumped`).
    pub jumped: bool,
    /// The sweep of the refunds payments hold until they settle, when the run made one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::refunds::held::HeldSweep>,
}

impl CatchUpReport {
    /// The scheduled run's EMF line (namespace `ProviderEvents`, dimensions `Stack`, `Service`):
    /// `CatchUpLagMinutes` (how far behind the provider's list the catch-up is after the run:
    /// 0 when it reached the newest event), `CatchUpJumped` (1 when it skipped to the
    /// oldest event the provider still lists) and `CatchUpListedAll` (1 when it listed every
    /// event where only the undelivered were asked for: see [`CatchUpReport::listed_all`]).
    /// The template alarms on the first two. The sweep of the held refunds has its own line
    /// ([`crate::refunds::held::HeldSweep::emf_line`]).
    pub fn emf_line(&self, now_ms: i64) -> String {
        let lag_min = self
            .checked_through_s
            .map_or(0, |t| (now_ms / 1000 - t).max(0) / 60);
        let line = serde_json::json!({
            "_aws": {
                "Timestamp": now_ms,
                "CloudWatchMetrics": [{
                    "Namespace": "ProviderEvents",
                    "Dimensions": [["Service"]],
                    "Metrics": [
                        {"Name": "CatchUpLagMinutes", "Unit": "None"},
                        {"Name": "CatchUpJumped", "Unit": "Count"},
                        {"Name": "CatchUpListedAll", "Unit": "Count"}
                    ]
                }]
            },
            "Service": "event-processor",
            "CatchUpLagMinutes": if self.finished { 0 } else { lag_min },
            "CatchUpJumped": u8::from(self.jumped),
            "CatchUpListedAll": u8::from(self.listed_all.is_some()),
            "queued": self.queued,
            "set_aside": self.set_aside,
            "pages": self.pages,
        });
        crate::telemetry::with_dimensions(line, crate::telemetry::dimensions()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A list call through the paced client: it waits for its slot (the real client calls
    /// `Pace::acquire` the same way).
    async fn listed(pace: &sqs_once::pace::Pace) -> Result<EventPage, ProviderError> {
        pace.acquire(Duration::from_secs(10))
            .await
            .map_err(|e| ProviderError::new(FailureKind::NotSent, e.to_string()))?;
        Ok(EventPage::default())
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_call_waits_for_its_slot_within_the_run_and_a_pause_past_it_ends_the_run_quietly(
    ) {
        // A 429 asked for a minute's pause; the run has 45 s left.
        let pace = sqs_once::pace::Pace::new(4.0);
        pace.slowed(Some(Duration::from_secs(60)));
        let t0 = tokio::time::Instant::now();
        let short = Budget {
            until: t0 + Duration::from_secs(45),
            max_pages: usize::MAX,
        };
        assert!(
            paced(&short, listed(&pace)).await.unwrap().is_none(),
            "no slot within the run: it stops, it does not fail"
        );
        // With the client's own timeout (10 s) as its only bound it was refused NotSent, an
        // error that failed the run; within a budget that reaches the slot, it waits for it.
        let long = Budget {
            until: t0 + Duration::from_secs(75),
            max_pages: usize::MAX,
        };
        assert!(paced(&long, listed(&pace)).await.unwrap().is_some());
        assert!(tokio::time::Instant::now() - t0 >= Duration::from_secs(60));
    }
}
