//! The provider's events (Stripe's `event` objects) as the inbox reads them, and the rules that
//! decide what an event changes: pure functions of the state stored and the state the event
//! carries, so that every duplicate, every late event and every order of delivery ends in the
//! same state.
//!
//! An event only says which object to look at. Its payload is whatever reached the queue: a
//! snapshot rendered in the API version of the event's day (the account's default then, which
//! the catch-up's listing keeps), an older copy delivered late, or a body an insider forged.
//! So no state is ever taken from it: an event that may change the state stored (`*_may_move`)
//! has its object read from the provider by id, at the pinned API version, and the state read
//! is applied, only forward (`*_current`, [`dispute_fetched`]). Nothing is read only when the
//! stored state is final; not even "nothing changed" is taken from a payload (a body under a
//! genuine event's id with a stale state would make the genuine event a duplicate).
//!
//! Why ~500 lines: the three rule tables and the events' reading are one vocabulary, and half
//! the file is their unit tests.

use serde::Deserialize;
use serde_json::Value;
use sqs_once::Rejection;

/// A verified event, as it sits in the provider-events queue.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderEvent {
    /// `evt_...`: the inbox's idempotency key.
    pub id: String,
    /// `payment_intent.succeeded`, `refund.failed`, ...
    pub kind: String,
    /// Unix seconds.
    pub created: i64,
    /// `data.object`: the object as it was when the event happened.
    pub object: Value,
}

#[derive(Deserialize)]
struct Wire {
    id: String,
    object: String,
    #[serde(rename = "type")]
    kind: String,
    created: i64,
    data: WireData,
}

#[derive(Deserialize)]
struct WireData {
    object: Value,
}

/// What Amazon EventBridge puts on the queue for Stripe's EventBridge event destination: its
/// envelope (`version`, `id`, `source`, `account`, `time`, `region`, `resources`), the event's
/// type in `detail-type` and Stripe's event object in `detail`.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "detail-type")]
    detail_type: String,
    detail: Value,
}

fn not_an_event(e: serde_json::Error) -> Rejection {
    Rejection::new("invalid_event", format!("not a provider event: {e}"))
}

impl ProviderEvent {
    /// Reads an event body; anything that is not a Stripe `event` object is refused.
    pub fn parse(body: &str) -> Result<Self, Rejection> {
        Self::from_wire(serde_json::from_str(body).map_err(not_an_event)?)
    }

    /// Reads a message of the provider-events queue: a Stripe event as the webhook route and
    /// the catch-up queue it, or EventBridge's envelope of one (Stripe's EventBridge
    /// destination, through the stack's rule). The event is the same either way (its id is
    /// the inbox's key, so an event that comes both ways is applied once); an envelope whose
    /// `detail-type` is not the event's `type` is refused.
    pub fn parse_queued(body: &str) -> Result<Self, Rejection> {
        let value: Value = serde_json::from_str(body).map_err(not_an_event)?;
        if value.get("detail").is_none() || value.get("detail-type").is_none() {
            // From the text again, not from `value`: a body with a key twice stays refused, as
            // the route refuses it (a `Value` keeps the last one).
            return Self::parse(body);
        }
        let envelope: Envelope = serde_json::from_value(value).map_err(|e| {
            Rejection::new("invalid_event", format!("not an EventBridge event: {e}"))
        })?;
        let w: Wire = serde_json::from_value(envelope.detail).map_err(|e| {
            Rejection::new(
                "invalid_event",
                format!("EventBridge's detail is not a provider event: {e}"),
            )
        })?;
        let event = Self::from_wire(w)?;
        if event.kind != envelope.detail_type {
            return Err(Rejection::new(
                "invalid_event",
                format!(
                    "EventBridge's detail-type {:?} is not the event's type {:?} ({})",
                    envelope.detail_type, event.kind, event.id
                ),
            ));
        }
        Ok(event)
    }

    fn from_wire(w: Wire) -> Result<Self, Rejection> {
        if w.object != "event" || !w.id.starts_with("evt_") || w.id.len() > 255 {
            return Err(Rejection::new(
                "invalid_event",
                format!("not a provider event: object {:?}, id {:?}", w.object, w.id),
            ));
        }
        Ok(Self {
            id: w.id,
            kind: w.kind,
            created: w.created,
            object: w.data.object,
        })
    }

    fn text(&self, field: &str) -> Option<String> {
        self.object.get(field)?.as_str().map(str::to_owned)
    }

    fn metadata(&self, field: &str) -> Option<String> {
        self.object
            .get("metadata")?
            .get(field)?
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    /// What the event is about.
    pub fn subject(&self) -> Subject {
        let object = self.object.get("object").and_then(Value::as_str);
        let amount = self.object.get("amount").and_then(Value::as_i64);
        match (self.kind.split('.').next(), object) {
            (Some("payment_intent"), Some("payment_intent")) => {
                // Only the events that say where the payment went: a `created` (or
                // `amount_capturable_updated`, ...) snapshot may show a state the confirmation
                // has already left. A fetched object (`*.retrieved`) is the state now.
                const SETTLING: [&str; 6] = [
                    "payment_intent.succeeded",
                    "payment_intent.processing",
                    "payment_intent.payment_failed",
                    "payment_intent.requires_action",
                    "payment_intent.canceled",
                    "payment_intent.retrieved",
                ];
                if !SETTLING.contains(&self.kind.as_str()) {
                    return Subject::Unhandled;
                }
                let Some(intent_id) = self.text("id") else {
                    return Subject::Unhandled;
                };
                let decline = decline_code(&self.object);
                let read_back = self.kind == "payment_intent.retrieved";
                let status = match self.text("status").as_deref() {
                    // Read back, it is where the payment waits now (its customer has not
                    // confirmed yet): a settling state like `requires_action`, never retried
                    // as unreadable. An event's snapshot of it says nothing settled.
                    Some("requires_confirmation") if read_back => {
                        Some("requires_confirmation".to_owned())
                    }
                    s => payment_status(s),
                };
                let Some(mut status) = status else {
                    return Subject::Unhandled;
                };
                // An off-session confirmation that needed the customer: the processor records
                // it `requires_action` (nothing charged, the merchant brings the customer back),
                // and its `payment_failed` says the same, not a decline.
                if status == "declined" && decline.as_deref() == Some("authentication_required") {
                    status = "requires_action".to_owned();
                }
                Subject::Payment(PaymentChange {
                    intent_id,
                    payment_id: self.metadata("payment_id"),
                    status,
                    decline_code: decline,
                })
            }
            (_, Some("refund")) => match (self.text("id"), self.text("status")) {
                (Some(provider_refund_id), Some(status)) => Subject::Refund(RefundChange {
                    provider_refund_id,
                    intent_id: self.text("payment_intent"),
                    refund_id: self.metadata("refund_id"),
                    payment_id: self.metadata("payment_id"),
                    status,
                    amount: amount.unwrap_or(0),
                }),
                _ => Subject::Unhandled,
            },
            (_, Some("dispute")) => match (self.text("id"), self.text("status")) {
                (Some(dispute_id), Some(status)) => Subject::Dispute(DisputeChange {
                    dispute_id,
                    intent_id: self.text("payment_intent"),
                    charge: self.text("charge"),
                    status,
                    amount: amount.unwrap_or(0),
                }),
                _ => Subject::Unhandled,
            },
            _ => Subject::Unhandled,
        }
    }
}

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A PaymentIntent's state.
    Payment(PaymentChange),
    /// A refund's state (`refund.*`, `charge.refund.updated`).
    Refund(RefundChange),
    /// A dispute's state (`charge.dispute.*`).
    Dispute(DisputeChange),
    /// Any other type (`charge.refunded` included: each refund has its own `refund.*` events):
    /// acknowledged and counted.
    Unhandled,
}

/// A PaymentIntent's state as an event or a fetch carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentChange {
    /// `pi_...`.
    pub intent_id: String,
    /// `metadata[payment_id]`: set on every PaymentIntent this system creates.
    pub payment_id: Option<String>,
    /// In the record's words: `succeeded`, `processing`, `requires_action`, `canceled`, or
    /// `declined` (the PaymentIntent is back at `requires_payment_method`: its payment failed).
    pub status: String,
    /// `last_payment_error`'s decline code (else its code), when it failed.
    pub decline_code: Option<String>,
}

/// A refund's state as an event or a fetch carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundChange {
    /// `re_...`.
    pub provider_refund_id: String,
    /// `metadata[refund_id]`: set on every refund this system creates.
    pub refund_id: Option<String>,
    /// `metadata[payment_id]`.
    pub payment_id: Option<String>,
    /// The refunded PaymentIntent (`payment_intent`), when the object names it.
    pub intent_id: Option<String>,
    /// `pending`, `requires_action`, `succeeded`, `failed`, `canceled`.
    pub status: String,
    /// Minor units.
    pub amount: i64,
}

/// A dispute's state as an event or a fetch carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisputeChange {
    /// `dp_...`.
    pub dispute_id: String,
    /// The disputed PaymentIntent, when the object names it.
    pub intent_id: Option<String>,
    /// The disputed charge (`ch_...`).
    pub charge: Option<String>,
    /// `warning_needs_response`, `warning_under_review`, `warning_closed`, `needs_response`,
    /// `under_review`, `won`, `lost`, `prevented`.
    pub status: String,
    /// Minor units.
    pub amount: i64,
}

/// A PaymentIntent's status in the record's words; `None` for one that says nothing settled
/// (`requires_confirmation`, `requires_capture` is kept as it is).
pub fn payment_status(status: Option<&str>) -> Option<String> {
    Some(match status? {
        "requires_payment_method" => "declined".to_owned(),
        "requires_confirmation" => return None,
        s => s.to_owned(),
    })
}

fn decline_code(object: &Value) -> Option<String> {
    let error = object.get("last_payment_error")?;
    error
        .get("decline_code")
        .or_else(|| error.get("code"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// What the provider's copy of an object does to the state stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Move the stored state to this one.
    Apply(String),
    /// Nothing: the copy is the state stored, or the stored state is final.
    Unchanged,
}

/// A payment's statuses that the provider settles later: a debit still `processing`, an
/// intent waiting for its customer (`requires_action`, `requires_confirmation`).
pub fn payment_settling(s: &str) -> bool {
    matches!(
        s,
        "processing" | "requires_action" | "requires_confirmation"
    )
}

/// A payment's statuses from which the provider may still charge it: settling, or declined (a
/// PaymentIntent back at `requires_payment_method` after a failed confirmation is confirmed
/// again whenever its customer comes back; only `canceled` ends it). A refund held while its
/// payment is in one of these stays held ([`crate::refunds::held`]).
pub fn payment_may_still_charge(s: &str) -> bool {
    payment_settling(s)
        || (s == "declined" && !sqs_once::mutation::on("held_refund_canceled_on_decline"))
}

/// A payment's statuses that never change again.
fn payment_final(s: &str) -> bool {
    matches!(
        s,
        "succeeded" | "canceled" | "requires_capture" | "rejected"
    )
}

/// Whether an event about a payment stored `stored` may change it: then the PaymentIntent is
/// read from the provider by its id, at the pinned API version, and its state now applied
/// ([`payment_current`]). Only a final state stored says no: the payload says nothing either
/// way (a body under a genuine event's id with a stale state would otherwise make the genuine
/// event a duplicate that read nothing).
pub fn payment_may_move(stored: &str) -> bool {
    !payment_final(stored)
}

/// What the provider's current state of a payment does to a payment stored `stored`.
pub fn payment_current(stored: &str, current: &str) -> Step {
    if stored == current || payment_final(stored) {
        Step::Unchanged
    } else {
        Step::Apply(current.to_owned())
    }
}

/// Whether an event about a refund stored `stored` may change it: then the refund is read
/// from the provider ([`refund_current`]). `failed` and `canceled` never change; a refund
/// `succeeded` may still fail (Stripe can fail a refund it reported succeeded), so it is read.
pub fn refund_may_move(stored: &str) -> bool {
    !matches!(stored, "failed" | "canceled" | "rejected")
}

/// What the provider's current state of a refund does to a refund stored `stored`.
pub fn refund_current(stored: &str, current: &str) -> Step {
    if stored == current || matches!(stored, "failed" | "canceled" | "rejected") {
        Step::Unchanged
    } else {
        Step::Apply(current.to_owned())
    }
}

/// True when a refund in this state moved no money: its reservation is given back.
pub fn refund_returns_nothing(status: &str) -> bool {
    matches!(status, "failed" | "canceled")
}

/// A dispute status's place in its life: inquiries, then disputes, then decided, then an
/// appeal of a lost one (API version 2026-10-28: `appeal_needs_response`,
/// `appeal_under_review`), which is decided again: `won` or `lost` once more.
fn dispute_rank(status: &str) -> u8 {
    match status {
        "warning_needs_response" => 1,
        "warning_under_review" => 2,
        "needs_response" => 3,
        "under_review" => 4,
        "warning_closed" | "won" | "lost" | "prevented" => 5,
        "appeal_needs_response" => 6,
        "appeal_under_review" => 7,
        _ => 0,
    }
}

/// A decision no later event changes: won, an inquiry closed, a dispute prevented. A loss may
/// still be appealed (API version 2026-10-28).
fn dispute_final(status: &str) -> bool {
    matches!(status, "won" | "warning_closed" | "prevented")
}

/// Whether an event about a dispute stored `stored` (`None`: not recorded yet) may change it:
/// then the dispute is read from the provider ([`dispute_fetched`]), after the record, and
/// written under the version read. Only a final decision (won, an inquiry closed, a dispute
/// prevented) says no; a loss may still be appealed.
pub fn dispute_may_move(stored: Option<&str>) -> bool {
    stored.is_none_or(|s| !dispute_final(s))
}

/// True once a dispute was decided (a loss or an appeal of it among them): past that the
/// record's status alone does not say which stage it is at (`lost` comes twice in a dispute
/// appealed), so a copy read that changes nothing is written all the same, raising the
/// dispute's version (a copy another event read before it then reads again).
pub fn dispute_decided(stored: &str) -> bool {
    dispute_rank(stored) >= 5
}

/// What the provider's copy of a dispute (`current`, read when [`dispute_may_move`]) does to the
/// state stored: it applies, as the dispute is now, unless the stored state is final or past
/// it (a copy older than the record), where a decision is past an appeal.
pub fn dispute_fetched(stored: &str, current: &str) -> Option<String> {
    let (s, c) = (dispute_rank(stored), dispute_rank(current));
    let newer = c >= s || (c == 5 && s >= 6);
    (current != stored && c != 0 && !dispute_final(stored) && newer).then(|| current.to_owned())
}

/// True when a dispute in this state holds its amount: a dispute (not an inquiry) the
/// merchant has not won, an appeal of a lost one among them. Stripe withdraws a dispute's
/// amount when it opens and returns it when the merchant wins, on appeal too; an inquiry
/// withdraws nothing.
pub fn dispute_holds_amount(status: &str) -> bool {
    matches!(
        status,
        "needs_response"
            | "under_review"
            | "lost"
            | "appeal_needs_response"
            | "appeal_under_review"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, object: Value) -> ProviderEvent {
        ProviderEvent::parse(
            &json!({"id": "evt_1", "object": "event", "type": kind, "created": 1, "data": {"object": object}})
                .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn events_name_their_subject() {
        let e = event(
            "payment_intent.payment_failed",
            json!({"id": "pi_1", "object": "payment_intent", "status": "requires_payment_method",
                   "metadata": {"payment_id": "p1"},
                   "last_payment_error": {"code": "card_declined", "decline_code": "insufficient_funds"}}),
        );
        assert_eq!(
            e.subject(),
            Subject::Payment(PaymentChange {
                intent_id: "pi_1".into(),
                payment_id: Some("p1".into()),
                status: "declined".into(),
                decline_code: Some("insufficient_funds".into()),
            })
        );
        let r = event(
            "refund.failed",
            json!({"id": "re_1", "object": "refund", "status": "failed", "amount": 300,
                   "metadata": {"refund_id": "r1", "payment_id": "p1"}}),
        );
        assert!(
            matches!(r.subject(), Subject::Refund(c) if c.refund_id.as_deref() == Some("r1") && c.amount == 300)
        );
        let d = event(
            "charge.dispute.created",
            json!({"id": "dp_1", "object": "dispute", "status": "needs_response", "amount": 500,
                   "payment_intent": "pi_1", "charge": "ch_1"}),
        );
        assert!(
            matches!(d.subject(), Subject::Dispute(c) if c.intent_id.as_deref() == Some("pi_1"))
        );
        // An off-session confirmation that needed the customer is `requires_action`, as the
        // processor recorded it, not a decline.
        let auth = event(
            "payment_intent.payment_failed",
            json!({"id": "pi_2", "object": "payment_intent", "status": "requires_payment_method",
                   "metadata": {"payment_id": "p2"},
                   "last_payment_error": {"code": "authentication_required",
                                          "decline_code": "authentication_required"}}),
        );
        assert!(
            matches!(auth.subject(), Subject::Payment(c) if c.status == "requires_action"),
            "{:?}",
            auth.subject()
        );
        assert!(payment_may_move("requires_action"));
        // Read back, a PaymentIntent waiting for its confirmation is a waiting state (it was
        // refused as unreadable, and its event retried until dead-lettered).
        let waiting = event(
            "payment_intent.retrieved",
            json!({"id": "pi_3", "object": "payment_intent", "status": "requires_confirmation",
                   "metadata": {"payment_id": "p3"}}),
        );
        assert!(
            matches!(waiting.subject(), Subject::Payment(c) if c.status == "requires_confirmation"),
            "{:?}",
            waiting.subject()
        );
        assert_eq!(
            payment_current("processing", "requires_confirmation"),
            Step::Apply("requires_confirmation".into())
        );
        assert!(payment_may_move("requires_confirmation"));
        // A creation's snapshot says nothing settled.
        let created = event(
            "payment_intent.created",
            json!({"id": "pi_1", "object": "payment_intent", "status": "requires_payment_method",
                   "metadata": {"payment_id": "p1"}}),
        );
        assert_eq!(created.subject(), Subject::Unhandled);
        let other = event("charge.refunded", json!({"id": "ch_1", "object": "charge"}));
        assert_eq!(other.subject(), Subject::Unhandled);
        let plan = event("plan.created", json!({"id": "price_1", "object": "plan"}));
        assert_eq!(plan.subject(), Subject::Unhandled);
    }

    #[test]
    fn what_is_not_an_event_is_refused() {
        for body in [
            "nope",
            r#"{"id":"evt_1","object":"charge","type":"x","created":1,"data":{"object":{}}}"#,
            r#"{"id":"ch_1","object":"event","type":"x","created":1,"data":{"object":{}}}"#,
            r#"{"id":"evt_1","object":"event","type":"x","created":1}"#,
        ] {
            assert_eq!(
                ProviderEvent::parse(body).unwrap_err().code,
                "invalid_event",
                "{body}"
            );
        }
    }

    #[test]
    fn an_eventbridge_envelope_carries_the_same_event() {
        let stripe = json!({"id": "evt_9", "object": "event", "type": "refund.failed", "created": 7,
                            "api_version": "2026-10-28.endive",
                            "data": {"object": {"id": "re_1", "object": "refund", "status": "failed"}}});
        let envelope = |detail_type: &str, detail: Value| {
            json!({"version": "0", "id": "0c7b1c34-5f0e-4a4f-9c3e-6b0d1f2a3b4c",
                   "detail-type": detail_type, "source": "aws.partner/stripe.com/ed_test_1",
                   "account": "111111111111", "time": "2026-12-03T10:00:00Z", "region": "us-east-1",
                   "resources": [], "detail": detail})
            .to_string()
        };
        let raw = ProviderEvent::parse_queued(&stripe.to_string()).unwrap();
        let through =
            ProviderEvent::parse_queued(&envelope("refund.failed", stripe.clone())).unwrap();
        assert_eq!(raw, through);
        assert_eq!(raw, ProviderEvent::parse(&stripe.to_string()).unwrap());
        for (body, why) in [
            (
                envelope("refund.created", stripe.clone()),
                "is not the event's type",
            ),
            (
                envelope("refund.failed", json!({"id": "re_1", "object": "refund"})),
                "detail is not a provider event",
            ),
            (
                envelope(
                    "refund.failed",
                    json!({"id": "ch_1", "object": "event", "type": "refund.failed",
                                             "created": 1, "data": {"object": {}}}),
                ),
                "not a provider event",
            ),
            (
                json!({"detail-type": 3, "detail": stripe.clone()}).to_string(),
                "not an EventBridge event",
            ),
        ] {
            let refused = ProviderEvent::parse_queued(&body).unwrap_err();
            assert_eq!(refused.code, "invalid_event", "{body}");
            assert!(refused.message.contains(why), "{}: {body}", refused.message);
        }
        // The webhook route takes Stripe's own events only: an envelope posted there is refused.
        assert_eq!(
            ProviderEvent::parse(&envelope("refund.failed", stripe))
                .unwrap_err()
                .code,
            "invalid_event"
        );
    }

    #[test]
    fn a_payment_only_moves_forward_as_the_provider_holds_it() {
        // Whatever the payload says (a forged `canceled`, a stale `processing` under a genuine
        // event's id), a payment not final is read, and the provider's state is what applies.
        for stored in [
            "processing",
            "requires_action",
            "requires_confirmation",
            "declined",
        ] {
            assert!(payment_may_move(stored), "{stored}");
        }
        for stored in ["succeeded", "canceled", "requires_capture", "rejected"] {
            assert!(!payment_may_move(stored), "{stored}");
        }
        assert_eq!(
            payment_current("processing", "declined"),
            Step::Apply("declined".into())
        );
        assert_eq!(payment_current("processing", "processing"), Step::Unchanged);
        assert_eq!(
            payment_current("declined", "succeeded"),
            Step::Apply("succeeded".into())
        );
        assert_eq!(payment_current("declined", "declined"), Step::Unchanged);
        assert_eq!(payment_current("succeeded", "declined"), Step::Unchanged);
        assert_eq!(payment_current("canceled", "succeeded"), Step::Unchanged);
    }

    #[test]
    fn a_refund_only_moves_forward_as_the_provider_holds_it() {
        for stored in ["pending", "requires_action", "succeeded"] {
            assert!(refund_may_move(stored), "{stored}");
        }
        for stored in ["failed", "canceled", "rejected"] {
            assert!(!refund_may_move(stored), "{stored}");
        }
        assert_eq!(
            refund_current("succeeded", "failed"),
            Step::Apply("failed".into())
        );
        assert_eq!(refund_current("succeeded", "succeeded"), Step::Unchanged);
        assert_eq!(refund_current("failed", "succeeded"), Step::Unchanged);
        assert!(refund_returns_nothing("failed") && refund_returns_nothing("canceled"));
        assert!(!refund_returns_nothing("succeeded"));
    }

    #[test]
    fn a_dispute_only_moves_forward_and_holds_its_amount_until_won() {
        assert!(dispute_may_move(None));
        for stored in [
            "warning_needs_response",
            "needs_response",
            "under_review",
            "lost",
        ] {
            assert!(dispute_may_move(Some(stored)), "{stored}");
        }
        for stored in ["won", "warning_closed", "prevented"] {
            assert!(!dispute_may_move(Some(stored)), "{stored}");
        }
        // Read, a copy older than the record changes nothing; a newer one applies.
        assert_eq!(
            dispute_fetched("", "needs_response"),
            Some("needs_response".into())
        );
        assert_eq!(dispute_fetched("under_review", "lost"), Some("lost".into()));
        assert_eq!(dispute_fetched("under_review", "needs_response"), None);
        assert_eq!(dispute_fetched("needs_response", "needs_response"), None);
        assert!(!dispute_decided("under_review") && dispute_decided("lost"));
        assert!(dispute_holds_amount("needs_response") && dispute_holds_amount("lost"));
        assert!(!dispute_holds_amount("won") && !dispute_holds_amount("warning_needs_response"));
    }

    /// API version 2026-10-28: a lost dispute is appealed and decided again. Found by the
    /// simulator (its appeals, `infra/sim`): a lost dispute was final, so an appeal won left
    /// the amount recorded as held.
    #[test]
    fn a_lost_dispute_appealed_and_won_is_won() {
        // Past a loss, every event is read: the provider's copy applies.
        assert!(dispute_may_move(Some("lost")));
        assert_eq!(
            dispute_fetched("lost", "appeal_needs_response"),
            Some("appeal_needs_response".into())
        );
        assert!(dispute_may_move(Some("appeal_needs_response")));
        // The appeal's decision, or the first decision's event late: read.
        assert!(dispute_may_move(Some("appeal_under_review")));
        assert_eq!(
            dispute_fetched("appeal_under_review", "won"),
            Some("won".into())
        );
        assert_eq!(
            dispute_fetched("appeal_under_review", "appeal_needs_response"),
            None
        );
        assert_eq!(dispute_fetched("lost", "won"), Some("won".into()));
        assert_eq!(dispute_fetched("under_review", "needs_response"), None);
        // Earlier events of the first round change nothing under appeal: the copy read is
        // the appeal's, or past it.
        assert_eq!(dispute_fetched("appeal_under_review", "under_review"), None);
        // An appeal's event arriving after the appeal was won (a standard queue keeps no
        // order), or the first round's loss after it: a won dispute stays won, unread.
        assert!(!dispute_may_move(Some("won")));
        assert_eq!(dispute_fetched("won", "lost"), None);
        // The second loss's event finds the first loss recorded: read, not taken as known
        // (the record's status alone does not say which loss it is), and written all the same.
        assert!(dispute_may_move(Some("lost")) && dispute_decided("lost"));
        assert!(dispute_decided("appeal_under_review") && !dispute_decided("under_review"));
        // Two racing events of the appeal: whichever reads first applies the provider's
        // decision; a stale copy behind the record is not applied.
        assert_eq!(
            dispute_fetched("appeal_needs_response", "won"),
            Some("won".into())
        );
        assert_eq!(
            dispute_fetched("appeal_under_review", "appeal_needs_response"),
            None
        );
        // Before any decision, the copy read orders it.
        assert!(dispute_may_move(Some("under_review")));
        assert_eq!(
            dispute_fetched("under_review", "appeal_under_review"),
            Some("appeal_under_review".into())
        );
        assert!(
            dispute_holds_amount("appeal_needs_response")
                && dispute_holds_amount("appeal_under_review")
        );
    }
}
