//! The scheduled catch-up over a long backlog: its checkpoint on the emulator's table, the
//! provider's list held in memory with Stripe's paging (`starting_after` back, `ending_before`
//! forward, newest first within a page), so that tens of thousands of events cost no provider.
//! What is measured: every missed event is queued, runs that each stop within their budget
//! get through the backlog, none starts over, and the steady state resumes ([`backlog`]);
//! listing only the undelivered events is trusted only while the webhook is sent every type
//! ([`webhook`]).

mod backlog;
mod start;
mod webhook;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use payment_core::events::catch_up::{Budget, EventLister, EventPage, Listed, PAGE_SIZE};
use payment_core::events::queue::EventQueue;
use payment_core::provider::event::ProviderEvent;
use payment_core::provider::ProviderError;

/// The provider's event list in memory, oldest first, listed as Stripe lists it: every event,
/// or only those a delivery to the webhook failed (`delivery_success=false`); and whether the
/// webhook endpoint is sent every type.
#[derive(Default)]
struct Provider {
    events: Mutex<Vec<(ProviderEvent, String)>>,
    calls: AtomicUsize,
    /// The backward list calls among them (what finding a window's start takes).
    backs: AtomicUsize,
    /// The events whose delivery failed: what `delivery_success=false` lists.
    undelivered: Mutex<HashSet<String>>,
    /// Why the endpoint is not sent every type (`None`: it is).
    unfit: Mutex<Option<String>>,
    /// How many of the next forward pages fail (a provider's `5xx`).
    failing_pages: AtomicUsize,
}

impl Provider {
    /// Adds `n` events (of a type the inbox applies) created evenly over `[from_s, to_s]`.
    fn add(&self, n: usize, from_s: i64, to_s: i64) {
        let mut events = self.events.lock().unwrap();
        let base = events.len();
        for i in 0..n {
            let created = from_s + ((to_s - from_s) as i128 * i as i128 / n.max(1) as i128) as i64;
            let body = serde_json::json!({
                "id": format!("evt_{:07}", base + i), "object": "event",
                "type": "payment_intent.succeeded", "created": created,
                "data": {"object": {"id": format!("pi_{i}"), "object": "payment_intent",
                                    "status": "succeeded", "metadata": {}}}})
            .to_string();
            events.push((ProviderEvent::parse(&body).unwrap(), body));
        }
    }
}

#[async_trait::async_trait]
impl EventLister for Provider {
    async fn page_back(
        &self,
        listed: Listed,
        since_s: i64,
        until_s: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.backs.fetch_add(1, Ordering::SeqCst);
        let events = self.events.lock().unwrap();
        let newest_first: Vec<_> = events
            .iter()
            .rev()
            .filter(|(e, _)| (since_s..=until_s).contains(&e.created) && self.lists(listed, e))
            .collect();
        let start = match starting_after {
            Some(id) => newest_first.iter().position(|(e, _)| e.id == id).unwrap() + 1,
            None => 0,
        };
        let rest = &newest_first[start..];
        Ok(EventPage {
            events: rest.iter().take(PAGE_SIZE).map(|x| (*x).clone()).collect(),
            has_more: rest.len() > PAGE_SIZE,
        })
    }

    async fn page_after(&self, listed: Listed, cursor: &str) -> Result<EventPage, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self
            .failing_pages
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ProviderError::new(
                payment_core::provider::FailureKind::ServerError,
                "HTTP 500",
            ));
        }
        let events = self.events.lock().unwrap();
        // The cursor is a place in the whole list, listed or not (Stripe's guide walks from a
        // delivered event).
        let at = events.iter().position(|(e, _)| e.id == cursor).unwrap();
        let newer: Vec<_> = events[at + 1..]
            .iter()
            .filter(|(e, _)| self.lists(listed, e))
            .collect();
        Ok(EventPage {
            events: newer
                .iter()
                .take(PAGE_SIZE)
                .rev()
                .map(|x| (*x).clone())
                .collect(),
            has_more: newer.len() > PAGE_SIZE,
        })
    }

    async fn webhook_unfit(&self, _since_s: Option<i64>) -> Result<Option<String>, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(self.unfit.lock().unwrap().clone())
    }
}

impl Provider {
    fn lists(&self, listed: Listed, e: &ProviderEvent) -> bool {
        listed == Listed::All || self.undelivered.lock().unwrap().contains(&e.id)
    }
}

/// A queue that counts what it holds, by event id, and the batches sent; what it sets aside
/// (event id, code).
#[derive(Default)]
struct Counted {
    copies: Mutex<HashMap<String, usize>>,
    batches: AtomicUsize,
    set_aside: Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl EventQueue for Counted {
    async fn enqueue(&self, event: &ProviderEvent, _: &str) -> Result<(), String> {
        *self
            .copies
            .lock()
            .unwrap()
            .entry(event.id.clone())
            .or_default() += 1;
        Ok(())
    }

    async fn enqueue_batch(&self, events: &[(ProviderEvent, String)]) -> Result<(), String> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        for (e, body) in events {
            assert!(
                payment_core::events::queue::message_bytes(&e.kind, body)
                    <= payment_core::events::queue::MAX_MESSAGE_BYTES,
                "{} was sent although SQS would refuse it",
                e.id
            );
            self.enqueue(e, body).await?;
        }
        Ok(())
    }

    async fn set_aside(
        &self,
        event: &ProviderEvent,
        _: &str,
        code: &str,
        _: &str,
    ) -> Result<(), String> {
        self.set_aside
            .lock()
            .unwrap()
            .push((event.id.clone(), code.to_owned()));
        Ok(())
    }
}

fn budget(pages: usize) -> Budget {
    Budget {
        until: tokio::time::Instant::now() + Duration::from_secs(3600),
        max_pages: pages,
    }
}
