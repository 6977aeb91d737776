//! The provider's events: each change of a PaymentIntent, a refund or a dispute is an event in Stripe's
//! shape (`evt_...`, its type, `data.object` as the object was), handed to whoever delivers
//! them (the world's webhook model), and the objects as they are now, for the inbox's fetches
//! (`ProviderObjects`), read through the inbox's own parser.

use payment_core::provider::event::{
    DisputeChange, PaymentChange, ProviderEvent, RefundChange, Subject,
};
use payment_core::provider::{FailureKind, ProviderError};
use serde_json::{json, Value as Json};

use super::refunds::refund_json;
use super::{Books, Intent, Provider};

/// One event, as `GET /v1/events` or a webhook carries it.
#[derive(Debug, Clone)]
pub struct Event {
    /// `evt_...`.
    pub id: String,
    /// Its body (Stripe's event JSON), shared with the list's copy.
    pub body: std::sync::Arc<str>,
    /// Sent to the webhook: the endpoint was registered when it was made.
    pub sent: bool,
}

/// A PaymentIntent's JSON as the API writes it (the fields the inbox reads).
pub fn intent_json(i: &Intent) -> Json {
    let error = i.failure_code.as_ref().map(|c| {
        json!({"type": "card_error", "code": if c == "authentication_required" { c.as_str() } else { "card_declined" }, "decline_code": c})
    });
    json!({
        "id": i.id, "object": "payment_intent", "amount": i.amount, "currency": i.currency,
        "status": i.status, "customer": i.customer, "created": i.created_ms / 1000,
        "metadata": {"payment_id": i.payment_id}, "last_payment_error": error,
    })
}

/// An event as Stripe sends it: its envelope at the account's API version (the one the wire
/// client pins), the object as it is now.
pub fn event_json(id: &str, kind: &str, created_s: i64, object: Json) -> Json {
    json!({
        "id": id, "object": "event", "type": kind, "created": created_s,
        "api_version": payment_core::stripe::DEFAULT_API_VERSION, "livemode": false,
        "data": {"object": object},
    })
}

impl Books {
    /// Records an event of `kind` about `object` at `now_ms`.
    pub(super) fn emit(&mut self, kind: &str, object: Json, now_ms: i64) {
        self.next_id += 1;
        let id = format!("evt_sim{:08}", self.next_id);
        let body: std::sync::Arc<str> = event_json(&id, kind, now_ms / 1000, object)
            .to_string()
            .into();
        let sent = self
            .endpoint
            .at(now_ms)
            .is_some_and(|e| e.status == "enabled");
        self.logged(&id, kind, now_ms / 1000, std::sync::Arc::clone(&body), sent);
        self.events.push(Event { id, body, sent });
    }

    /// The event a PaymentIntent's new status makes.
    pub(super) fn emit_intent(&mut self, intent_id: &str, now_ms: i64) {
        let Some(i) = self.intents.get(intent_id) else {
            return;
        };
        let kind = match i.status.as_str() {
            "succeeded" => "payment_intent.succeeded",
            "processing" => "payment_intent.processing",
            "requires_payment_method" => "payment_intent.payment_failed",
            _ => return,
        };
        let object = intent_json(i);
        self.emit(kind, object, now_ms);
    }

    /// Takes the events not handed out yet.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}

fn change(kind: &str, object: Json) -> Subject {
    ProviderEvent {
        id: "evt_read".into(),
        kind: kind.into(),
        created: 0,
        object,
    }
    .subject()
}

impl Provider {
    /// `GET /v1/payment_intents/{id}`, read as the inbox reads a fetched intent.
    pub async fn payment_intent(&self, id: &str) -> Result<PaymentChange, ProviderError> {
        self.reachable().await?;
        let object = self
            .books
            .lock()
            .expect("books")
            .intents
            .get(id)
            .map(intent_json);
        match object.map(|o| change("payment_intent.retrieved", o)) {
            Some(Subject::Payment(p)) => Ok(p),
            _ => Err(ProviderError::new(
                FailureKind::Misconfigured,
                format!("404: no such payment_intent {id}"),
            )),
        }
    }

    /// `GET /v1/refunds/{id}`.
    pub async fn refund(&self, id: &str) -> Result<RefundChange, ProviderError> {
        self.reachable().await?;
        let books = self.books.lock().expect("books");
        let object = books
            .refunds
            .get(id)
            .map(|r| refund_json(r, &books.payment_of(&r.payment_intent)));
        drop(books);
        match object.map(|o| change("refund.retrieved", o)) {
            Some(Subject::Refund(r)) => Ok(r),
            _ => Err(ProviderError::new(
                FailureKind::Misconfigured,
                format!("404: no such refund {id}"),
            )),
        }
    }

    /// `GET /v1/disputes/{id}`: an open dispute as it is now.
    pub async fn dispute(&self, id: &str) -> Result<DisputeChange, ProviderError> {
        self.reachable().await?;
        let object = self
            .books
            .lock()
            .expect("books")
            .disputes
            .get(id)
            .filter(|d| d.opened())
            .map(super::disputes::dispute_json);
        match object.map(|o| change("charge.dispute.retrieved", o)) {
            Some(Subject::Dispute(d)) => Ok(d),
            _ => Err(ProviderError::new(
                FailureKind::Misconfigured,
                format!("404: no such dispute {id}"),
            )),
        }
    }

    /// `GET /v1/charges/{id}`: the PaymentIntent of a charge.
    pub async fn charge_intent(&self, charge: &str) -> Result<Option<String>, ProviderError> {
        self.reachable().await?;
        let books = self.books.lock().expect("books");
        let intent = format!("pi_{}", charge.trim_start_matches("ch_"));
        if books.intents.contains_key(&intent) && charge.starts_with("ch_") {
            Ok(Some(intent))
        } else {
            Err(ProviderError::new(
                FailureKind::Misconfigured,
                format!("404: no such charge {charge}"),
            ))
        }
    }
}
