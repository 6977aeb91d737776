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
//!
//! Why ~610 lines: the walk, the scheduled run's use of the checkpoint and the run's sweep of
//! held refunds are one run, read from its start to its report.

use std::sync::Arc;

pub use crate::events::checkpoint::{Checkpoint, Place, Position, CHECKPOINT_KEY, OVERLAP_S};
use crate::events::listing::{paced, start_at, Start};
pub use crate::events::listing::{
    Budget, CatchUpReport, EventLister, EventPage, Listed, EVENT_TYPES, PAGE_SIZE,
};
use crate::events::queue::{
    message_bytes, sqs_text, EventQueue, EVENT_TOO_LARGE, MAX_MESSAGE_BYTES,
};
use crate::provider::event::ProviderEvent;
use crate::provider::FailureKind;

/// How long the provider keeps events (Stripe: 30 days): a window reaching further back is
/// cut there.
pub const EVENT_RETENTION_S: i64 = 30 * 86_400;

/// The first scheduled run's window: as long as the provider retries a failing endpoint.
pub const FIRST_WINDOW_S: i64 = 3 * 86_400;

/// The mark of a listing of every event that one run which found the webhook fit has ended
/// (see [`scheduled`]): the next fit run ends it for good.
const FIT_AGAIN: &str = "fit again, one more run: ";

/// The most pages a run re-lists of the [`OVERLAP_S`] before its last event, newest first (the
/// events just before it are the likeliest to have been listed late): a busy quarter of an
/// hour never stops a run from making progress.
const OVERLAP_MAX_PAGES: usize = 10;

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
    let cursor = match start_at(
        (lister, Listed::All),
        since_s,
        until_s,
        Budget::unlimited(),
        &mut report,
    )
    .await?
    {
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
        (lister, Listed::All),
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
    /// Why the run lists every event where only the undelivered were asked for, kept in the
    /// checkpoint while it walks (the next run goes on likewise); and what is kept once the
    /// walk reaches the newest event (`None` when this run found the webhook sent every type
    /// at its start).
    listing_all: (Option<String>, Option<String>),
}

/// Walks the pages after `cursor`, oldest first, queueing each (and the events up to
/// `until_s`), until the newest event, the budget's end, or another run moving the checkpoint.
async fn walk(
    (lister, listed): (&dyn EventLister, Listed),
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
        let Some(page) = paced(&budget, lister.page_after(listed, &cursor.id))
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
                listing_all: if page.has_more {
                    m.listing_all.0.clone()
                } else {
                    m.listing_all.1.clone()
                },
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

/// Mutations of the catch-up that the whole-system simulator puts back
/// (`sqs_once::mutation::put_back_from`) to show that it finds them; in a build without
/// `sqs-once`'s `sim-mutations` feature they are never on.
pub const MUTATIONS: &[(&str, &str)] = &[
    (
        "endpoint_registered_since_fit",
        "the webhook check takes an endpoint registered after the list was last checked through for fit: deleted and registered again between two runs, the events made meanwhile were sent nowhere and are never listed (issue 65, bug 4)",
    ),
    (
        "catch_up_without_overlap",
        "a run that had caught up starts from its last event, not the overlap before it: an event created before it and listed only after the run is never listed again",
    ),
];

/// How far before its last event a run that had caught up starts again ([`OVERLAP_S`]).
fn overlap_s() -> i64 {
    if sqs_once::mutation::on("catch_up_without_overlap") {
        0
    } else {
        OVERLAP_S
    }
}

/// One scheduled run at `now_s` within `budget`: from where the last run got, else from
/// [`FIRST_WINDOW_S`] back (or the time set by hand); when the last run had reached the newest
/// event, the [`OVERLAP_S`] before its last event is listed again first, newest first, at most
/// `OVERLAP_MAX_PAGES` pages. The checkpoint moves after every page, only ever forward (but for
/// the start over below, which goes back to where the list was checked through).
///
/// Asked to list only the undelivered events (`lists`), a run first asks the provider whether
/// the webhook is sent every type ([`EventLister::webhook_unfit`]); when it is not (an endpoint
/// disabled, deleted, or not subscribed to a type: the events created meanwhile were never
/// sent, so never failed), the run lists every event instead, from where the list was last
/// checked through (kept in the checkpoint before anything is listed), and the runs after it go
/// on doing so until one that found the webhook fit at its own start reaches the newest event.
pub async fn scheduled(
    (lister, lists): (&dyn EventLister, Listed),
    queue: &dyn EventQueue,
    checkpoint: &Checkpoint,
    now_s: i64,
    budget: Budget,
) -> Result<CatchUpReport, String> {
    let mut read = checkpoint.read().await?;
    let mut report = CatchUpReport {
        until_s: now_s,
        checked_through_s: read.checked_through_s,
        ..CatchUpReport::default()
    };
    // Asked for the undelivered only, every run checks that the webhook is sent every type,
    // a run going on with a listing of every event too: only one that found it so at its
    // start may end that listing (what was made before then is in its walk; what is made
    // after, the webhook is sent).
    let unfit = match lists {
        Listed::All => None,
        Listed::Undelivered => match paced(&budget, lister.webhook_unfit(read.checked_through_s)).await {
            Ok(Some(unfit)) => unfit,
            // No request slot within the run: the next run starts here again.
            Ok(None) => return Ok(report),
            Err(e) if e.kind == FailureKind::Misconfigured => Some(format!(
                "the webhook endpoints could not be read ({e}): the key must be valid and may read Webhook Endpoints"
            )),
            Err(e) => return Err(format!("reading the provider's webhook endpoints: {e}")),
        },
    };
    if let Some(why) = &unfit {
        tracing::error!(
            reason = why.as_str(),
            "the webhook is not verified to be sent every event type: the catch-up lists every event, not only the undelivered (docs/operate.md, webhook_unfit)"
        );
    }
    // What this run lists; whether it starts over from where the list was checked through (a
    // listing of every event cannot go on from the last undelivered one, which may be weeks
    // old); what the checkpoint keeps once a walk reaches the newest event.
    // A listing of every event ends two fit runs after the fix, not one: the second re-lists
    // the quarter of an hour before the first one's last event, as every run does, for what
    // the provider listed late (an event made while the endpoint was unfit, listed after the
    // first fit run passed its time, was never sent: only a listing of every event holds it).
    let (listed, restart, walking, after) = match (lists, &read.listing_all, unfit) {
        (Listed::All, _, _) => (Listed::All, false, None, None),
        (Listed::Undelivered, None, None) => (Listed::Undelivered, false, None, None),
        (Listed::Undelivered, Some(was), None) => {
            report.listed_all = Some(format!(
                "the webhook is sent every type again; the runs list every event to the newest first ({})",
                was.trim_start_matches(FIT_AGAIN)
            ));
            let after = (!was.starts_with(FIT_AGAIN)).then(|| format!("{FIT_AGAIN}{was}"));
            (Listed::All, false, Some(was.clone()), after)
        }
        (Listed::Undelivered, Some(_), Some(why)) => {
            report.listed_all = Some(why.clone());
            (Listed::All, false, Some(why.clone()), Some(why))
        }
        (Listed::Undelivered, None, Some(why)) => {
            report.listed_all = Some(why.clone());
            (Listed::All, true, Some(why.clone()), Some(why))
        }
    };
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
    let last = read
        .last
        .clone()
        .filter(|p| !restart && p.created > oldest_listable);
    let since = match (&last, read.from_s, covered) {
        (Some(p), _, _) if read.caught_up => p.created - overlap_s(),
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
    report.since_s = since;
    report.jumped = stale;
    if restart {
        // Kept at once, before any listing: a run stopped before its first page (the pace, an
        // error, its budget) leaves the next one to go on listing every event from here, even
        // if the webhook is fixed by then.
        let to = Position {
            last: None,
            caught_up: false,
            version: read.version + 1,
            from_s: Some(since),
            checked_through_s: read.checked_through_s,
            listing_all: report.listed_all.clone(),
        };
        if !checkpoint.advance(&read, &to).await? {
            // Failed, not stopped quietly: what it found must not be forgotten (the retry, or
            // the next run, checks the endpoint again from the checkpoint as it now is).
            return Err(
                "another catch-up moved the checkpoint while this run found the webhook unfit: run again".into(),
            );
        }
        read = to;
    }
    let cursor = match &last {
        Some(p) => {
            if read.caught_up {
                overlap((lister, listed), queue, p, budget, &mut report).await?;
            }
            p.clone()
        }
        None => {
            let (start, through) =
                match start_at((lister, listed), since, now_s, budget, &mut report).await? {
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
                            listing_all: after.clone(),
                            ..read.clone()
                        };
                        if !checkpoint.advance(&read, &to).await? {
                            tracing::warn!("another catch-up moved the checkpoint meanwhile");
                        }
                        return Ok(report);
                    }
                    // Every event before the window is the last runs' (or before the catch-up's
                    // time): the list is checked through its start.
                    Start::After(p) => (p, since - 1),
                    // The window's oldest event: there is none in it before this one.
                    Start::With(e, text) => {
                        queue_page(queue, &[(e.clone(), text)], &mut report).await?;
                        let p = Place::of(&e);
                        let through = p.created;
                        (p, through)
                    }
                };
            // The start is kept before the walk: a run whose request slots all went to finding
            // it (the webhook's check, the walk back to a new account's oldest event), or whose
            // first page failed, leaves the next run to go on from it, not to look for it
            // again (at a pace of a few slots a run, every run would, and none would move), nor
            // to start a window that has slid on since.
            let to = Position {
                last: Some(start.clone()),
                caught_up: false,
                version: read.version + 1,
                from_s: None,
                checked_through_s: read.checked_through_s.max(Some(through)),
                listing_all: walking.clone(),
            };
            if !checkpoint.advance(&read, &to).await? {
                tracing::warn!(
                    "another catch-up moved the checkpoint while this run found where to start: this run stops"
                );
                return Ok(report);
            }
            read = to;
            start
        }
    };
    let mut moving = Moving {
        checkpoint,
        read: read.clone(),
        now_s,
        listing_all: (walking, after.clone()),
    };
    walk(
        (lister, listed),
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
            listing_all: after,
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
    (lister, listed): (&dyn EventLister, Listed),
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
            lister.page_back(
                listed,
                last.created - overlap_s(),
                last.created,
                after.as_deref(),
            ),
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
    /// What it lists: only the undelivered events (a webhook endpoint delivers them), or
    /// every event (EventBridge alone).
    pub lists: Listed,
    /// The refunds payments hold until they settle, swept after each run, and how long a
    /// payment may settle before it is overdue.
    pub held: Option<(Arc<crate::refunds::held::HeldRefunds>, std::time::Duration)>,
    /// The run's clock (the host's; the simulator's calendar in its runs).
    pub clock: Arc<dyn sqs_once::clock::Clock>,
}

/// The time a scheduled run keeps for its sweep of the held refunds (one consistent read
/// per payment that holds refunds, a few more for one that settled: hundreds of payments).
pub const SWEEP_TIME: std::time::Duration = std::time::Duration::from_secs(10);

impl ScheduledCatchUp {
    /// One scheduled run at the current time within `budget`, then the sweep of the held
    /// refunds within the same time, whatever the listing did: the sweep needs nothing from
    /// the provider, so an outage of its list (or a key that cannot read events) does not
    /// stop held refunds from being made.
    /// The listing stops starting pages [`SWEEP_TIME`] earlier than `budget` says, so that a
    /// long listing (a backlog) leaves the sweep its time.
    pub async fn run(&self, budget: Budget) -> ScheduledRun {
        let now = self.clock.now_ms() / 1000;
        let listing_budget = match &self.held {
            Some(_) => Budget {
                until: budget
                    .until
                    .checked_sub(SWEEP_TIME)
                    .unwrap_or_else(tokio::time::Instant::now),
                ..budget
            },
            None => budget,
        };
        let listing = scheduled(
            (&*self.lister, self.lists),
            &*self.queue,
            &self.checkpoint,
            now,
            listing_budget,
        )
        .await;
        let held = match &self.held {
            Some((held, horizon)) => Some(
                held.sweep(*horizon, budget.until)
                    .await
                    .map_err(|e| format!("sweeping the held refunds: {e}")),
            ),
            None => None,
        };
        ScheduledRun { listing, held }
    }
}

/// What a scheduled run did: its listing, and its sweep of the held refunds.
#[derive(Debug)]
pub struct ScheduledRun {
    /// The listing's report, or why it failed.
    pub listing: Result<CatchUpReport, String>,
    /// The sweep (when the run has held refunds to sweep), or why the partition could not be
    /// read.
    pub held: Option<Result<crate::refunds::held::HeldSweep, String>>,
}

impl ScheduledRun {
    /// The EMF lines of what ran: the listing's when it listed, the sweep's when it swept.
    pub fn emf_lines(&self, now_ms: i64) -> Vec<String> {
        let listing = self.listing.as_ref().ok().map(|r| r.emf_line(now_ms));
        let held = match &self.held {
            Some(Ok(h)) => Some(h.emf_line(now_ms)),
            _ => None,
        };
        listing.into_iter().chain(held).collect()
    }

    /// The run's answer: the listing's report with the sweep in it; an error (the function's
    /// `Errors` alarm) when the listing failed, or the sweep could not read the partition or
    /// any payment in it.
    pub fn into_result(self) -> Result<CatchUpReport, String> {
        let held = self.held.transpose();
        let (mut report, held) = match (self.listing, held) {
            (Ok(report), Ok(held)) => (report, held),
            (Err(listing), Ok(_)) => return Err(listing),
            (Ok(_), Err(held)) => return Err(held),
            (Err(listing), Err(held)) => return Err(format!("{listing}; {held}")),
        };
        if let Some(h) = held.as_ref().filter(|h| !h.failed.is_empty()) {
            let (pid, e) = &h.failed[0];
            return Err(format!(
                "sweeping the held refunds: {} payments could not be swept (first: {pid}: {e})",
                h.failed.len()
            ));
        }
        report.held = held;
        Ok(report)
    }
}
