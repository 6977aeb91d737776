//! `GET /v1/events` as Stripe lists it: the events of the last 30 days, newest first, filtered
//! by `created`, `types[]` and `delivery_success` (an event is undelivered while the webhook has
//! not answered one of its deliveries `2xx`: its retries pending, or every one failed), paged
//! with `starting_after` (older) and `ending_before` (the page just newer than a cursor, still
//! newest first). The webhook endpoint is this stack's, enabled and sent every type the inbox
//! applies. Served to the catch-up through its port ([`EventLister`]), paced as the wire client.

use async_trait::async_trait;
use payment_core::events::catch_up::{EventLister, EventPage, Listed, EVENT_TYPES, PAGE_SIZE};
use payment_core::provider::event::ProviderEvent;
use payment_core::provider::{FailureKind, ProviderError};

use super::client::Client;
use super::{Books, Provider};

/// How long the provider lists an event: 30 days.
pub const RETENTION_S: i64 = 30 * 86_400;

/// The stack's webhook endpoint at the provider: registered at `registered_ms`, and deleted
/// and registered again (a new `we_...`, its `created` then) over each of `gaps` (epoch ms,
/// from and until). Stripe sends an event to the endpoints there when it is made: one made while
/// the endpoint is away is never sent, so never fails, so `delivery_success=false` never
/// lists it.
#[derive(Debug, Clone, Default)]
pub struct Endpoint {
    /// When it was first registered, epoch ms.
    pub registered_ms: i64,
    /// When it was away, epoch ms, in order.
    pub gaps: Vec<(i64, i64)>,
    /// When it was disabled (by an operator, or by Stripe after days of failures) and then
    /// enabled again, epoch ms: the same endpoint, its `created` unchanged; Stripe sends an
    /// event made meanwhile to no endpoint of the stack's, so `delivery_success=false` never
    /// lists it.
    pub disabled: Vec<(i64, i64)>,
}

impl Endpoint {
    /// The endpoint registered at `now_ms` (Stripe's object), or `None` while it is away.
    pub fn at(&self, now_ms: i64) -> Option<payment_core::stripe::endpoints::WebhookEndpoint> {
        if self.gaps.iter().any(|(a, b)| (*a..*b).contains(&now_ms)) {
            return None;
        }
        let again = self.gaps.iter().filter(|(_, b)| *b <= now_ms).count();
        let created_ms = self
            .gaps
            .iter()
            .filter(|(_, b)| *b <= now_ms)
            .map(|(_, b)| *b)
            .max()
            .unwrap_or(self.registered_ms);
        let disabled = self
            .disabled
            .iter()
            .any(|(a, b)| (*a..*b).contains(&now_ms));
        Some(payment_core::stripe::endpoints::WebhookEndpoint {
            id: format!("we_sim{again:04}"),
            url: format!(
                "https://sim.execute-api.us-east-1.amazonaws.com/prod{}",
                payment_core::stripe::receiver::EVENTS_PATH
            ),
            status: if disabled { "disabled" } else { "enabled" }.into(),
            enabled_events: vec!["*".into()],
            api_version: None,
            metadata: Default::default(),
            created: created_ms / 1000,
        })
    }
}

/// How long after its `created` the list shows event `id` (drawn from its id): within 5 s for
/// most, 5 s to a minute for one in ten, one to ten minutes for one in a hundred. An event a
/// run's cursor has passed before it showed is found only by the next run's overlap
/// (`payment_core::events::checkpoint::OVERLAP_S`, 15 minutes).
pub fn list_lag_s(id: &str) -> i64 {
    let draw = crate::fnv(format!("list-lag/{id}").as_bytes());
    let (tier, within) = (draw % 100, (draw / 100) as i64);
    match tier {
        0 => 60 + within % 541,
        1..=10 => 5 + within % 56,
        _ => within % 6,
    }
}

/// One event as the list holds it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// `evt_...`: ids grow with creation, so their order is the list's.
    pub id: String,
    /// `created`, epoch s.
    pub created_s: i64,
    /// When the list shows it, epoch s: some seconds after `created` (Stripe's list is
    /// eventually consistent), now and then minutes ([`list_lag_s`]).
    pub listable_s: i64,
    /// Its type.
    pub kind: String,
    /// Its JSON (one copy, shared with the delivery's).
    pub body: std::sync::Arc<str>,
    /// No delivery of it was answered `2xx` yet (`delivery_success=false` lists it); never
    /// set for an event made while the webhook endpoint was away (never sent).
    pub pending: bool,
}

impl Books {
    /// Keeps an event in the list (and drops those past the retention).
    pub(super) fn logged(
        &mut self,
        id: &str,
        kind: &str,
        created_s: i64,
        body: std::sync::Arc<str>,
        sent: bool,
    ) {
        while self
            .log
            .front()
            .is_some_and(|e| e.created_s < created_s - RETENTION_S)
        {
            self.log.pop_front();
        }
        self.log.push_back(Logged {
            id: id.to_owned(),
            created_s,
            listable_s: created_s + list_lag_s(id),
            kind: kind.to_owned(),
            body,
            pending: sent,
        });
    }

    /// The webhook answered a delivery of `id` `2xx`.
    pub fn delivered(&mut self, id: &str) {
        if let Ok(i) = self.log.binary_search_by(|e| e.id.as_str().cmp(id)) {
            self.log[i].pending = false;
        }
    }

    /// Events listed undelivered now (the end's check of what the webhook never delivered).
    pub fn undelivered(&self) -> usize {
        self.log.iter().filter(|e| e.pending).count()
    }

    fn listed(e: &Logged, listed: Listed, oldest_s: i64, now_s: i64) -> bool {
        e.created_s >= oldest_s
            && e.listable_s <= now_s
            && EVENT_TYPES.contains(&e.kind.as_str())
            && (listed == Listed::All || e.pending)
    }

    /// Where `cursor` is in the list, or Stripe's `400` for an id it does not list.
    fn place(&self, cursor: &str, oldest_s: i64) -> Result<usize, ProviderError> {
        match self.log.binary_search_by(|e| e.id.as_str().cmp(cursor)) {
            Ok(i) if self.log[i].created_s >= oldest_s => Ok(i),
            _ => Err(ProviderError::new(
                FailureKind::Misconfigured,
                format!("400: No such event: '{cursor}'"),
            )),
        }
    }
}

fn page(events: Vec<&Logged>, has_more: bool) -> Result<EventPage, ProviderError> {
    let events = events
        .into_iter()
        .map(|e| {
            ProviderEvent::parse(&e.body)
                .map(|p| (p, e.body.to_string()))
                .map_err(|r| {
                    ProviderError::new(
                        FailureKind::Network,
                        format!("unreadable event {}: {}", e.id, r.message),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EventPage { events, has_more })
}

impl Provider {
    /// `GET /v1/events?created[gte]&created[lte]&starting_after`: newest first.
    pub async fn list_back(
        &self,
        listed: Listed,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.reachable().await?;
        let now_s = self.clock.now_ms() / 1000;
        let oldest = now_s - RETENTION_S;
        let books = self.books.lock().expect("books");
        let end = match starting_after {
            Some(c) => books.place(c, oldest)?,
            None => books.log.len(),
        };
        let mut found: Vec<&Logged> = books
            .log
            .range(..end)
            .rev()
            .filter(|e| Books::listed(e, listed, oldest, now_s))
            .filter(|e| (since_s..=until_s).contains(&e.created_s))
            .take(PAGE_SIZE + 1)
            .collect();
        let more = found.len() > PAGE_SIZE;
        found.truncate(PAGE_SIZE);
        page(found, more)
    }

    /// `GET /v1/events?ending_before=cursor`: the page of events just after it, newest first.
    pub async fn list_after(
        &self,
        listed: Listed,
        cursor: &str,
    ) -> Result<EventPage, ProviderError> {
        self.reachable().await?;
        let now_s = self.clock.now_ms() / 1000;
        let oldest = now_s - RETENTION_S;
        let books = self.books.lock().expect("books");
        let from = books.place(cursor, oldest)? + 1;
        let mut found: Vec<&Logged> = books
            .log
            .range(from..)
            .filter(|e| Books::listed(e, listed, oldest, now_s))
            .take(PAGE_SIZE + 1)
            .collect();
        let more = found.len() > PAGE_SIZE;
        found.truncate(PAGE_SIZE);
        found.reverse();
        page(found, more)
    }
}

#[async_trait]
impl EventLister for Client {
    async fn page_back(
        &self,
        listed: Listed,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.slot(false).await?;
        let answer = self
            .provider
            .list_back(listed, since_s, until_s, starting_after)
            .await;
        self.told(&answer);
        answer
    }

    async fn page_after(&self, listed: Listed, cursor: &str) -> Result<EventPage, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.list_after(listed, cursor).await;
        self.told(&answer);
        answer
    }

    /// `GET /v1/webhook_endpoints`: the endpoint as registered now, judged by the code's own
    /// rule ([`payment_core::stripe::objects::webhook_unfit`]).
    async fn webhook_unfit(&self, since_s: Option<i64>) -> Result<Option<String>, ProviderError> {
        self.slot(false).await?;
        let answer = self.provider.reachable().await.map(|()| {
            let now_ms = self.provider.clock.now_ms();
            let endpoints: Vec<_> = self
                .provider
                .books
                .lock()
                .expect("books")
                .endpoint
                .at(now_ms)
                .into_iter()
                .collect();
            payment_core::stripe::objects::webhook_unfit(&endpoints, None, since_s)
        });
        self.told(&answer);
        answer
    }
}
