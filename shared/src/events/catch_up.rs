//! The catch-up: events the endpoint missed (down longer than the provider retries, three days
//! at Stripe; a secret rolled wrong; a route removed) are listed from `GET /v1/events` and fed
//! into the same provider-events queue, where the inbox applies each once by its id, so a
//! window listed twice changes nothing.
//!
//! It walks the list page by page, oldest first, as Stripe documents for undelivered events
//! (`ending_before` an event id: the page of events created just after it), queues each page
//! with `SendMessageBatch` and only then moves on, so no run holds more than one page, and a
//! run that stops (its budget spent, its function timed out) has lost nothing: the next one
//! continues from where it got.
//!
//! `payctl events catch-up --since ...` lists a window given by hand. The scheduled run (the
//! event function invoked with `{"catch_up": true}` by the template's schedule) keeps its place
//! in a checkpoint item of the idempotency table (`pk = checkpoint#provider-events`): the last
//! event it queued, moved after every page with a write conditional on the version read (two
//! runs never move it back), and whether the last run reached the newest event. Every run goes
//! on from that event; one after a run that reached the newest first lists again the
//! [`OVERLAP_S`] before it, newest first (events listed late). The first run starts
//! [`FIRST_WINDOW_S`] back; a checkpoint older than the provider keeps events starts from the
//! oldest it still lists. Every run stops within its [`Budget`], below the function's timeout.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

pub use crate::events::checkpoint::{Checkpoint, Place, Position, CHECKPOINT_KEY, OVERLAP_S};
use crate::events::queue::{
    message_bytes, sqs_text, EventQueue, EVENT_TOO_LARGE, MAX_MESSAGE_BYTES,
};
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

/// How long the provider keeps events (Stripe: 30 days): a window reaching further back is
/// cut there.
pub const EVENT_RETENTION_S: i64 = 30 * 86_400;

/// The first scheduled run's window: as long as the provider retries a failing endpoint.
pub const FIRST_WINDOW_S: i64 = 3 * 86_400;

/// Events per page (Stripe's largest).
pub const PAGE_SIZE: usize = 100;

/// The most pages a run re-lists of the [`OVERLAP_S`] before its last event, newest first (the
/// events just before it are the likeliest to have been listed late): a busy quarter of an
/// hour never stops a run from making progress.
const OVERLAP_MAX_PAGES: usize = 10;

/// The most pages walked back to find a window's oldest event when nothing of the inbox's
/// types precedes the window (a new account).
const OLDEST_MAX_PAGES: usize = 500;

/// One page of the provider's event list, newest first as the provider lists it.
#[derive(Debug, Clone, Default)]
pub struct EventPage {
    /// The events with their JSON, newest first.
    pub events: Vec<(ProviderEvent, String)>,
    /// More events lie beyond this page in the direction listed.
    pub has_more: bool,
}

/// The provider's event list, restricted to [`EVENT_TYPES`].
#[async_trait]
pub trait EventLister: Send + Sync {
    /// One page of the events created in `[since_s, until_s]`, newest first, after
    /// `starting_after` (`None`: from the newest).
    async fn page_back(
        &self,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError>;

    /// The page of events created just after the event `cursor` (Stripe's `ending_before`),
    /// newest first; `has_more` when newer ones follow.
    async fn page_after(&self, cursor: &str) -> Result<EventPage, ProviderError>;

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
            let page = self.page_back(since_s, until_s, after.as_deref()).await?;
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
async fn paced<F>(budget: &Budget, call: F) -> Result<Option<EventPage>, ProviderError>
where
    F: std::future::Future<Output = Result<EventPage, ProviderError>>,
{
    let (answer, requests) = sqs_once::pace::within(budget.until, call).await;
    match answer {
        Err(_) if requests.none_sent() => Ok(None),
        other => other.map(Some),
    }
}

/// Where a window's oldest-first walk starts.
enum Start {
    /// Not known in this run: the pace had no slot for its list call before the budget's end.
    Later,
    /// After this event (not queued again).
    After(Place),
    /// With this event (the window's oldest, nothing of the types before it), then after it.
    With(ProviderEvent, String),
    /// No event at all from the window's start.
    Nothing,
}

/// Where the walk of events created from `since_s` starts: the newest event before it, else
/// (nothing before: a new account) the oldest since, found by walking back.
async fn start_at(
    lister: &dyn EventLister,
    since_s: i64,
    now_s: i64,
    budget: Budget,
    report: &mut CatchUpReport,
) -> Result<Start, String> {
    let listing = |e: ProviderError| format!("listing the provider's events: {e}");
    let Some(before) = paced(&budget, lister.page_back(0, since_s - 1, None))
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
        let Some(page) = paced(&budget, lister.page_back(since_s, now_s, after.as_deref()))
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

    fn spent(&self, pages: usize) -> bool {
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
    /// [`Position::checked_through_s`]).
    pub checked_through_s: Option<i64>,
    /// The run found its checkpoint older than the provider keeps events and started from
    /// the oldest it still lists: what was created between the two may never have been
    /// applied (an alarm, and a runbook row: docs/operate.md, `CatchUpJumped`).
    pub jumped: bool,
}

impl CatchUpReport {
    /// The scheduled run's EMF line (namespace `ProviderEvents`, dimension `Service`):
    /// `CatchUpLagMinutes` (how far behind the provider's list the catch-up is after the run:
    /// 0 when it reached the newest event) and `CatchUpJumped` (1 when it skipped to the
    /// oldest event the provider still lists). The template alarms on both.
    pub fn emf_line(&self, now_ms: i64) -> String {
        let lag_min = self
            .checked_through_s
            .map_or(0, |t| (now_ms / 1000 - t).max(0) / 60);
        serde_json::json!({
            "_aws": {
                "Timestamp": now_ms,
                "CloudWatchMetrics": [{
                    "Namespace": "ProviderEvents",
                    "Dimensions": [["Service"]],
                    "Metrics": [
                        {"Name": "CatchUpLagMinutes", "Unit": "None"},
                        {"Name": "CatchUpJumped", "Unit": "Count"}
                    ]
                }]
            },
            "Service": "event-processor",
            "CatchUpLagMinutes": if self.finished { 0 } else { lag_min },
            "CatchUpJumped": u8::from(self.jumped),
            "queued": self.queued,
            "set_aside": self.set_aside,
            "pages": self.pages,
        })
        .to_string()
    }
}

/// Lists `[since_s, until_s]` (cut at the provider's retention) page by page, oldest first,
/// and queues every event (by hand: no budget, no checkpoint).
pub async fn catch_up(
    lister: &dyn EventLister,
    queue: &dyn EventQueue,
    since_s: i64,
    until_s: i64,
) -> Result<CatchUpReport, String> {
    let since_s = since_s.max(until_s - EVENT_RETENTION_S);
    let mut report = CatchUpReport {
        since_s,
        until_s,
        ..CatchUpReport::default()
    };
    let cursor = match start_at(lister, since_s, until_s, Budget::unlimited(), &mut report).await? {
        Start::Nothing => {
            report.finished = true;
            return Ok(report);
        }
        Start::Later => {
            return Err(
                "the provider's pace had no request slot for the catch-up: run it again".into(),
            )
        }
        Start::After(p) => p,
        Start::With(e, text) => {
            if e.created > until_s {
                report.finished = true;
                return Ok(report);
            }
            queue_page(queue, &[(e.clone(), text)], &mut report).await?;
            Place::of(&e)
        }
    };
    walk(
        lister,
        queue,
        cursor,
        Some(until_s),
        Budget::unlimited(),
        &mut report,
        None,
    )
    .await?;
    Ok(report)
}

/// Queues a page's events; one larger than a queue message is set aside with its reason
/// ([`EventQueue::set_aside`]), so the walk goes on after it (as one the queue refuses is, and
/// one the parser cannot read is queued for the inbox to dead-letter with the parser's reason).
async fn queue_page(
    queue: &dyn EventQueue,
    events: &[(ProviderEvent, String)],
    report: &mut CatchUpReport,
) -> Result<(), String> {
    let mut fits = Vec::with_capacity(events.len());
    for (e, body) in events {
        let bytes = message_bytes(&e.kind, &sqs_text(body));
        if bytes > MAX_MESSAGE_BYTES {
            let why = format!(
                "{bytes} bytes with its attribute, more than a queue message takes ({MAX_MESSAGE_BYTES})"
            );
            queue
                .set_aside(e, body, EVENT_TOO_LARGE, &why)
                .await
                .map_err(|err| format!("setting event {} aside: {err}", e.id))?;
            report.set_aside += 1;
        } else {
            fits.push((e.clone(), body.clone()));
        }
    }
    if fits.is_empty() {
        return Ok(());
    }
    queue
        .enqueue_batch(&fits)
        .await
        .map_err(|e| format!("queueing {} events: {e}", fits.len()))?;
    report.queued += fits.len();
    Ok(())
}

/// The checkpoint's part in a walk: moved after each page.
struct Moving<'a> {
    checkpoint: &'a Checkpoint,
    read: Position,
    /// The run's time: what the list is walked through once the newest event is reached.
    now_s: i64,
}

/// Walks the pages after `cursor`, oldest first, queueing each (and the events up to
/// `until_s`), until the newest event, the budget's end, or another run moving the checkpoint.
async fn walk(
    lister: &dyn EventLister,
    queue: &dyn EventQueue,
    mut cursor: Place,
    until_s: Option<i64>,
    budget: Budget,
    report: &mut CatchUpReport,
    mut moving: Option<&mut Moving<'_>>,
) -> Result<(), String> {
    // Every run walks at least one page forward, whatever the overlap or the start spent of
    // the budget: no run can repeat the last one's work without progress.
    let first = report.pages;
    loop {
        if report.pages > first && budget.spent(report.pages) {
            return Ok(());
        }
        let Some(page) = paced(&budget, lister.page_after(&cursor.id))
            .await
            .map_err(|e| format!("listing the provider's events after {}: {e}", cursor.id))?
        else {
            return Ok(());
        };
        report.pages += 1;
        let mut oldest_first: Vec<_> = page.events.into_iter().rev().collect();
        let past_end = until_s.is_some_and(|u| oldest_first.iter().any(|(e, _)| e.created > u));
        if let Some(u) = until_s {
            oldest_first.retain(|(e, _)| e.created <= u);
        }
        let Some((newest, _)) = oldest_first.last() else {
            report.finished = true;
            return Ok(());
        };
        let newest = Place::of(newest);
        queue_page(queue, &oldest_first, report).await?;
        report.last = Some(newest.clone());
        if let Some(m) = moving.as_deref_mut() {
            // The last page marks the checkpoint caught up in the same write: a run that dies
            // right after it still has the next one list the overlap.
            let to = Position {
                last: Some(newest.clone()),
                caught_up: !page.has_more,
                version: m.read.version + 1,
                from_s: None,
                checked_through_s: Some(if page.has_more {
                    newest.created
                } else {
                    m.now_s
                }),
            };
            if !m.checkpoint.advance(&m.read, &to).await? {
                tracing::warn!(
                    "another catch-up moved the checkpoint: this run stops, its events are queued"
                );
                return Ok(());
            }
            m.read = to;
        }
        cursor = newest;
        if !page.has_more || past_end {
            report.finished = true;
            return Ok(());
        }
    }
}

/// One scheduled run at `now_s` within `budget`: from where the last run got, else from
/// [`FIRST_WINDOW_S`] back (or the time set by hand); when the last run had reached the newest
/// event, the [`OVERLAP_S`] before its last event is listed again first, newest first, at most
/// `OVERLAP_MAX_PAGES` pages. The checkpoint moves after every page, only ever forward.
pub async fn scheduled(
    lister: &dyn EventLister,
    queue: &dyn EventQueue,
    checkpoint: &Checkpoint,
    now_s: i64,
    budget: Budget,
) -> Result<CatchUpReport, String> {
    let read = checkpoint.read().await?;
    // A place older than the provider keeps events can no longer be listed after: the run
    // starts from the oldest events it still lists.
    // (Five minutes short of it: the run's calls all land before the provider drops it.)
    let oldest_listable = now_s - EVENT_RETENTION_S + 300;
    // Listed through when: the last run's time, else its last event. Listing only the
    // undelivered events, the last one queued may be older than the provider keeps events
    // while the runs keep up: then the run starts from where the list was checked through.
    let covered = read
        .checked_through_s
        .or(read.last.as_ref().map(|p| p.created));
    let stale = covered.is_some_and(|t| t <= oldest_listable);
    let last = read.last.clone().filter(|p| p.created > oldest_listable);
    let since = match (&last, read.from_s, covered) {
        (Some(p), _, _) if read.caught_up => p.created - OVERLAP_S,
        (Some(p), _, _) => p.created,
        (None, Some(from), _) => from.max(oldest_listable),
        (None, None, Some(t)) => (t - OVERLAP_S).max(oldest_listable),
        (None, None, None) => (now_s - FIRST_WINDOW_S).max(oldest_listable),
    };
    if stale {
        tracing::error!(
            "the catch-up's last event is older than the provider keeps events: this run starts from the oldest it still lists, and what was created between them may never have been applied (docs/operate.md, CatchUpJumped)"
        );
    }
    let mut report = CatchUpReport {
        since_s: since,
        until_s: now_s,
        jumped: stale,
        ..CatchUpReport::default()
    };
    let cursor = match &last {
        Some(p) => {
            if read.caught_up {
                overlap(lister, queue, p, budget, &mut report).await?;
            }
            p.clone()
        }
        None => match start_at(lister, since, now_s, budget, &mut report).await? {
            // The pace kept it waiting to its budget's end (a `429`'s pause): the next run
            // starts here again; nothing moved.
            Start::Later => return Ok(report),
            Start::Nothing => {
                // Nothing listed since: checked through now all the same.
                report.finished = true;
                report.checked_through_s = Some(now_s);
                let to = Position {
                    caught_up: true,
                    version: read.version + 1,
                    from_s: None,
                    checked_through_s: Some(now_s),
                    ..read.clone()
                };
                if !checkpoint.advance(&read, &to).await? {
                    tracing::warn!("another catch-up moved the checkpoint meanwhile");
                }
                return Ok(report);
            }
            Start::After(p) => p,
            Start::With(e, text) => {
                queue_page(queue, &[(e.clone(), text)], &mut report).await?;
                Place::of(&e)
            }
        },
    };
    let mut moving = Moving {
        checkpoint,
        read: read.clone(),
        now_s,
    };
    walk(
        lister,
        queue,
        cursor.clone(),
        None,
        budget,
        &mut report,
        Some(&mut moving),
    )
    .await?;
    // A run that reached the newest event says so, and through when it listed, even when it
    // found nothing new (listing only the undelivered events, most runs find nothing): one
    // write a run, from which the lag is measured.
    if report.finished && moving.read.checked_through_s != Some(now_s) {
        let to = Position {
            last: report.last.clone().or(Some(cursor)),
            caught_up: true,
            version: moving.read.version + 1,
            from_s: None,
            checked_through_s: Some(now_s),
        };
        if !checkpoint.advance(&moving.read, &to).await? {
            tracing::warn!("another catch-up moved the checkpoint meanwhile");
        }
    }
    report.checked_through_s = if report.finished {
        Some(now_s)
    } else {
        report
            .last
            .as_ref()
            .map(|p| p.created)
            .or(moving.read.checked_through_s)
    };
    Ok(report)
}

/// Lists again the events created in the [`OVERLAP_S`] before `last` (and `last` itself),
/// newest first, and queues them: what the last run may have missed because the provider
/// listed it late. At most [`OVERLAP_MAX_PAGES`] pages; the checkpoint does not move.
async fn overlap(
    lister: &dyn EventLister,
    queue: &dyn EventQueue,
    last: &Place,
    budget: Budget,
    report: &mut CatchUpReport,
) -> Result<(), String> {
    let mut after: Option<String> = None;
    for _ in 0..OVERLAP_MAX_PAGES {
        if budget.spent(report.pages) {
            return Ok(());
        }
        let Some(page) = paced(
            &budget,
            lister.page_back(last.created - OVERLAP_S, last.created, after.as_deref()),
        )
        .await
        .map_err(|e| format!("listing the provider's events before {}: {e}", last.id))?
        else {
            return Ok(());
        };
        report.pages += 1;
        let Some((oldest, _)) = page.events.last() else {
            return Ok(());
        };
        after = Some(oldest.id.clone());
        queue_page(queue, &page.events, report).await?;
        if !page.has_more {
            return Ok(());
        }
    }
    Ok(())
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
    /// One scheduled run at the current time within `budget`.
    pub async fn run(&self, budget: Budget) -> Result<CatchUpReport, String> {
        let now = sqs_once::runner::now_ms() / 1000;
        scheduled(&*self.lister, &*self.queue, &self.checkpoint, now, budget).await
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
