//! The provider model's objects are Stripe's: every field it sets is one that Stripe's own
//! example of the object (`shared/tests/fixtures/stripe/fixtures3.json.gz`, Stripe's published
//! fixtures) has, with the same JSON type, and every status it gives is one of Stripe's.

use serde_json::Value as Json;
use simulator::provider::events::{event_json, intent_json};
use simulator::provider::refunds::{refund_json, Refund};
use simulator::provider::Intent;

fn fixture(name: &str) -> Json {
    use std::io::Read;
    let gz: &[u8] = include_bytes!("../../../shared/tests/fixtures/stripe/fixtures3.json.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_string(&mut text)
        .unwrap();
    let all: Json = serde_json::from_str(&text).unwrap();
    let object = all["resources"][name].clone();
    assert!(object.is_object(), "Stripe's fixtures have no {name}");
    object
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// Every field of `ours` is in `stripe`'s, of the same type (either may be `null`: an optional
/// field), and so on into objects both have.
fn same_shape(what: &str, ours: &Json, stripe: &Json) {
    let (Json::Object(ours), Json::Object(stripe)) = (ours, stripe) else {
        return;
    };
    for (field, value) in ours {
        let Some(theirs) = stripe.get(field) else {
            panic!("{what}.{field}: Stripe's {what} has no such field");
        };
        if !value.is_null() && !theirs.is_null() {
            assert_eq!(
                kind(value),
                kind(theirs),
                "{what}.{field}: {value} against Stripe's {theirs}"
            );
        }
        // Not compared inside: the merchant's own map (metadata: its keys are ours), an error
        // (Stripe's example holds only its type), an event's object (Stripe's example event
        // carries a plan; each object is compared with its own example).
        let path = format!("{what}.{field}");
        if !path.ends_with(".metadata")
            && !path.ends_with(".last_payment_error")
            && path != "event.data.object"
        {
            same_shape(&path, value, theirs);
        }
    }
}

fn intent(status: &str, failure: Option<&str>) -> Intent {
    Intent {
        id: "pi_sim00000001".into(),
        payment_id: "p-1".into(),
        amount: 1999,
        currency: "usd".into(),
        customer: "cus_1".into(),
        status: status.into(),
        created_ms: 1_767_225_600_000,
        settles_ms: None,
        failure_code: failure.map(str::to_owned),
    }
}

#[test]
fn a_payment_intent_is_stripes_shape_and_status() {
    let stripe = fixture("payment_intent");
    // PaymentIntent.status as the stripe package (16.x) types it (`_payment_intent.py`).
    let statuses = [
        "requires_payment_method",
        "requires_confirmation",
        "requires_action",
        "processing",
        "requires_capture",
        "canceled",
        "succeeded",
    ];
    for (status, failure) in [
        ("succeeded", None),
        ("processing", None),
        ("requires_action", Some("authentication_required")),
        ("requires_payment_method", Some("insufficient_funds")),
    ] {
        let ours = intent_json(&intent(status, failure));
        same_shape("payment_intent", &ours, &stripe);
        assert!(statuses.contains(&ours["status"].as_str().unwrap()));
        if let Some(error) = ours["last_payment_error"].as_object() {
            // Stripe's error object: its type is one of the API's error types.
            assert!(["card_error", "invalid_request_error", "api_error"]
                .contains(&error["type"].as_str().unwrap()));
        }
    }
}

#[test]
fn a_refund_is_stripes_shape_and_status() {
    let stripe = fixture("refund");
    // Refund.status as the stripe package (16.x) documents it (`_refund.py`).
    let statuses = [
        "pending",
        "requires_action",
        "succeeded",
        "failed",
        "canceled",
    ];
    for status in ["pending", "succeeded", "failed"] {
        let r = Refund {
            id: "re_sim00000002".into(),
            refund_id: "r-1".into(),
            payment_intent: "pi_sim00000001".into(),
            amount: 500,
            status: status.into(),
            changes: None,
        };
        let ours = refund_json(&r, "p-1");
        same_shape("refund", &ours, &stripe);
        assert!(statuses.contains(&ours["status"].as_str().unwrap()));
    }
}

#[test]
fn an_event_is_stripes_envelope_at_the_pinned_api_version() {
    let stripe = fixture("event");
    let ours = event_json(
        "evt_sim00000003",
        "payment_intent.succeeded",
        1_767_225_600,
        intent_json(&intent("succeeded", None)),
    );
    same_shape("event", &ours, &stripe);
    let version = ours["api_version"].as_str().unwrap();
    assert_eq!(version, payment_core::stripe::DEFAULT_API_VERSION);
    assert!(payment_core::stripe::is_api_version(version));
    // What the inbox reads from a queued event is what it reads from Stripe's.
    let parsed = payment_core::provider::event::ProviderEvent::parse(&ours.to_string()).unwrap();
    assert_eq!(parsed.kind, "payment_intent.succeeded");
}

#[test]
fn a_dispute_is_stripes_shape_and_status() {
    use simulator::provider::disputes::{dispute_json, Dispute};
    let stripe = fixture("dispute");
    // Dispute.status as the stripe package (16.x) types it (`_dispute.py`), the appeal's
    // two among them (API version 2026-10-28).
    let statuses = [
        "appeal_needs_response",
        "appeal_under_review",
        "lost",
        "needs_response",
        "prevented",
        "under_review",
        "warning_closed",
        "warning_needs_response",
        "warning_under_review",
        "won",
    ];
    for (status, names_intent) in [
        ("needs_response", true),
        ("warning_needs_response", false),
        ("lost", false),
        ("appeal_under_review", true),
        ("won", true),
    ] {
        let d = Dispute {
            id: "dp_sim00000004".into(),
            payment_intent: "pi_sim00000001".into(),
            charge: "ch_sim00000001".into(),
            names_intent,
            amount: 1999,
            currency: "usd".into(),
            status: status.into(),
            opens_ms: 1_767_225_600_000,
            steps: Default::default(),
            appealed: false,
        };
        let ours = dispute_json(&d);
        same_shape("dispute", &ours, &stripe);
        assert!(statuses.contains(&ours["status"].as_str().unwrap()));
        // What the inbox reads of it: the dispute, its charge, and its intent when named.
        let event = event_json(
            "evt_sim00000005",
            "charge.dispute.updated",
            1_767_225_600,
            ours,
        );
        let parsed =
            payment_core::provider::event::ProviderEvent::parse(&event.to_string()).unwrap();
        let payment_core::provider::event::Subject::Dispute(c) = parsed.subject() else {
            panic!("not read as a dispute: {parsed:?}");
        };
        assert_eq!((c.status.as_str(), c.amount), (status, 1999));
        assert_eq!(c.intent_id.is_some(), names_intent);
        assert_eq!(c.charge.as_deref(), Some("ch_sim00000001"));
    }
}
