//! What an event's payload may decide: nothing. On the real SDK, the local stack and the
//! provider simulator: a body an insider puts on the events queue (where no signature is asked)
//! makes the inbox read the object it names, never write what the provider does not hold; and
//! events rendered in another API version than the pinned one (the account's default on their
//! day, which the catch-up's listing keeps: the provider simulator renders them so) apply as
//! the provider holds their objects now.

use payment_core::events::inbox::ProviderObjects;
use payment_core::events::queue::EventQueue;
use payment_core::provider::event::ProviderEvent;
use serde_json::{json, Value};

use crate::events::{events, kinds, Events};
use crate::helpers::*;

/// `body` as an insider would write it: a new id, `kind`, its object's `status` set, and
/// `edit` applied to the object; sent straight to the events queue.
async fn forge(
    e: &Events,
    body: &str,
    id: &str,
    kind: &str,
    status: &str,
    edit: impl Fn(&mut Value),
) {
    let mut v: Value = serde_json::from_str(body).unwrap();
    v["id"] = json!(id);
    v["type"] = json!(kind);
    v["data"]["object"]["status"] = json!(status);
    edit(&mut v["data"]["object"]);
    let body = v.to_string();
    let event = ProviderEvent::parse(&body).unwrap();
    e.queue.enqueue(&event, &body).await.unwrap();
}

fn first<'a>(listed: &'a [(ProviderEvent, String)], kind: &str) -> &'a str {
    &listed.iter().find(|(e, _)| e.kind == kind).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insider_s_event_on_the_queue_settles_nothing_the_provider_does_not_hold() {
    let t = TestStack::new("ev-forged").await;
    let e = events(&t).await;
    let (debit, a, b) = (t.pid("debit"), t.pid("disputed-a"), t.pid("disputed-b"));
    t.send(&payment(&debit, 1500, "pm_usBankAccount_success"))
        .await;
    t.send(&payment(&a, 700, "pm_card_createDispute")).await;
    t.send(&payment(&b, 800, "pm_card_createDispute")).await;
    t.drain(1).await;
    let intent = |pid: &str| {
        let t = &t;
        let pid = pid.to_owned();
        async move { t.ledger(&pid).await.charges[&pid][0].id.clone() }
    };
    let (pi_debit, pi_a, pi_b) = (intent(&debit).await, intent(&a).await, intent(&b).await);
    let listed = e
        .listed(&[debit.clone(), pi_a.clone(), pi_b.clone()], |l| {
            kinds(l)
                .iter()
                .filter(|k| **k == "charge.dispute.created")
                .count()
                == 2
                && kinds(l).contains(&"payment_intent.processing")
        })
        .await;

    // A bank debit still `processing` at the provider: a forged `canceled` (final, so the
    // genuine `succeeded` would have been ignored) reads the PaymentIntent and applies what it
    // holds.
    forge(
        &e,
        first(&listed, "payment_intent.processing"),
        &format!("evt_forged_cancel_{}", t.name),
        "payment_intent.canceled",
        "canceled",
        |_| {},
    )
    .await;
    // Both disputes opened, genuinely.
    let opened: Vec<_> = listed
        .iter()
        .filter(|(ev, _)| ev.kind == "charge.dispute.created")
        .cloned()
        .collect();
    e.deliver_all(&opened, 1).await;
    e.drain(&t).await;
    let held = e.payment(&a).await;
    assert_eq!(held.disputed, 700, "{:?}", held.disputes);
    let provider_holds = e.provider.payment_intent(&pi_debit).await.unwrap().status;
    let recorded = e.payment(&debit).await.status.unwrap();
    assert_ne!(recorded, "canceled");
    assert_eq!(
        recorded, provider_holds,
        "the record is the provider's state"
    );

    // A's dispute `won` (it is not), and B's dispute presented as A's.
    let body_of = |pi: &str| {
        opened
            .iter()
            .find(|(ev, _)| ev.object["payment_intent"] == json!(pi))
            .unwrap()
            .1
            .clone()
    };
    forge(
        &e,
        &body_of(&pi_a),
        &format!("evt_forged_won_{}", t.name),
        "charge.dispute.closed",
        "won",
        |_| {},
    )
    .await;
    let pi = pi_a.clone();
    forge(
        &e,
        &body_of(&pi_b),
        &format!("evt_forged_other_{}", t.name),
        "charge.dispute.updated",
        "needs_response",
        move |o| o["payment_intent"] = json!(pi),
    )
    .await;
    let stats = e.drain(&t).await;
    assert_eq!(stats.summary.done("applied"), 0, "{:?}", stats.summary);
    assert_eq!(stats.summary.done("foreign"), 1, "{:?}", stats.summary);
    let after = e.payment(&a).await;
    assert_eq!(after.disputed, 700, "{:?}", after.disputes);
    assert_eq!(after.disputes.len(), 1, "{:?}", after.disputes);
    assert_eq!(after.disputes.values().next().unwrap().0, "needs_response");

    // The genuine events still settle the debit.
    let settled = e
        .listed(std::slice::from_ref(&debit), |l| {
            kinds(l).contains(&"payment_intent.succeeded")
        })
        .await;
    e.deliver_all(&settled, 1).await;
    e.drain(&t).await;
    assert_eq!(e.payment(&debit).await.status.as_deref(), Some("succeeded"));
    assert_eq!(e.dead_letters(&t).await, 0);
}

/// Stripe's changelog, 2019-02-11: `requires_source` is now `requires_payment_method`,
/// `requires_source_action` is now `requires_action`. An event made while the account's default
/// was older carries the older words.
fn as_of_2019_01_14(body: &str) -> String {
    let mut v: Value = serde_json::from_str(body).unwrap();
    v["api_version"] = json!("2019-01-14");
    let o = &mut v["data"]["object"];
    if o["object"] == json!("payment_intent") {
        let older = match o["status"].as_str() {
            Some("requires_payment_method") => Some("requires_source"),
            Some("requires_action") => Some("requires_source_action"),
            _ => None,
        };
        if let Some(s) = older {
            o["status"] = json!(s);
        }
        if let Some(next) = o.as_object_mut().and_then(|m| m.remove("next_action")) {
            o["next_source_action"] = next;
        }
    }
    v.to_string()
}

/// A version newer than the pin may name states the pinned code does not know.
fn as_of_a_later_version(body: &str) -> String {
    let mut v: Value = serde_json::from_str(body).unwrap();
    v["api_version"] = json!("2027-09-30.future");
    v["data"]["object"]["status"] = json!("a_state_named_later");
    v.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_rendered_in_an_older_or_newer_version_apply_as_the_provider_holds_them() {
    let t = TestStack::new("ev-versions").await;
    let e = events(&t).await;
    let (ok, closed, disputed) = (t.pid("ok"), t.pid("closed"), t.pid("disputed"));
    t.send(&payment(&ok, 1500, "pm_usBankAccount_success"))
        .await;
    t.send(&payment(&closed, 1500, "pm_usBankAccount_accountClosed"))
        .await;
    t.send(&payment(&disputed, 900, "pm_card_createDispute"))
        .await;
    t.drain(1).await;
    let pi = t.ledger(&disputed).await.charges[&disputed][0].id.clone();
    let listed = e
        .listed(&[ok.clone(), closed.clone(), pi.clone()], |l| {
            let k = kinds(l);
            k.contains(&"payment_intent.succeeded")
                && k.contains(&"payment_intent.payment_failed")
                && k.contains(&"charge.dispute.created")
        })
        .await;
    let older: Vec<(ProviderEvent, String)> = listed
        .iter()
        .filter(|(ev, _)| ev.kind.starts_with("payment_intent."))
        .map(|(_, body)| {
            let b = as_of_2019_01_14(body);
            (ProviderEvent::parse(&b).unwrap(), b)
        })
        .collect();
    assert!(
        older.iter().any(|(_, b)| b.contains("requires_source")),
        "the decline is rendered in the older words"
    );
    let newer: Vec<(ProviderEvent, String)> = listed
        .iter()
        .filter(|(ev, _)| ev.kind == "charge.dispute.created")
        .map(|(_, body)| {
            let b = as_of_a_later_version(body);
            (ProviderEvent::parse(&b).unwrap(), b)
        })
        .collect();
    e.deliver_all(&older, 1).await;
    e.deliver_all(&newer, 1).await;
    e.drain(&t).await;
    assert_eq!(e.payment(&ok).await.status.as_deref(), Some("succeeded"));
    let r = t.record(&closed).await.unwrap().outcome.unwrap();
    assert_eq!(
        (r.status.as_str(), r.text("decline_code")),
        ("declined", Some("account_closed"))
    );
    let d = e.payment(&disputed).await;
    assert_eq!(d.disputed, 900, "{:?}", d.disputes);
    assert_eq!(
        d.disputes.values().next().map(|(s, _)| s.as_str()),
        Some("needs_response")
    );
    assert_eq!(e.dead_letters(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catch_up_applies_the_events_of_an_account_whose_default_version_is_older_or_newer() {
    let t = TestStack::new("ev-account-version").await;
    let e = events(&t).await;
    // Events made while the account's default was older than 2019-02-11 name a declined
    // PaymentIntent `requires_source` and one waiting for its customer `requires_source_action`;
    // the listing keeps them so. Those made under a newer default are listed in it.
    let mut ids = Vec::new();
    for (version, tag) in [("2019-01-14", "old"), ("2027-09-30.future", "new")] {
        t.sim.set_account_version(version).await.unwrap();
        let (ok, closed, auth) = (
            t.pid(&format!("{tag}-ok")),
            t.pid(&format!("{tag}-closed")),
            t.pid(&format!("{tag}-auth")),
        );
        t.send(&payment(&ok, 1500, "pm_usBankAccount_success"))
            .await;
        t.send(&payment(&closed, 1500, "pm_usBankAccount_accountClosed"))
            .await;
        t.send(&payment(&auth, 1500, "pm_card_authenticationRequired"))
            .await;
        t.drain(1).await;
        let these = [ok.clone(), closed.clone(), auth.clone()];
        let listed = e
            .listed(&these, |l| {
                let k = kinds(l);
                k.contains(&"payment_intent.succeeded")
                    && k.iter()
                        .filter(|k| **k == "payment_intent.payment_failed")
                        .count()
                        == 2
            })
            .await;
        t.sim
            .set_account_version(payment_core::stripe::DEFAULT_API_VERSION)
            .await
            .unwrap();
        if tag == "old" {
            assert!(
                listed
                    .iter()
                    .any(|(_, b)| b.contains("\"requires_source\"")),
                "the older version's words are listed"
            );
        }
        ids.push((ok, closed, auth));
    }
    let until = sqs_once::runner::now_ms() / 1000 + 1;
    payment_core::events::catch_up::catch_up(&e.provider, &e.queue, e.since_s, until)
        .await
        .unwrap();
    e.drain(&t).await;
    for (ok, closed, auth) in &ids {
        assert_eq!(
            e.payment(ok).await.status.as_deref(),
            Some("succeeded"),
            "{ok}"
        );
        let r = t.record(closed).await.unwrap().outcome.unwrap();
        assert_eq!(
            (r.status.as_str(), r.text("decline_code")),
            ("declined", Some("account_closed")),
            "{closed}"
        );
        assert_eq!(
            e.payment(auth).await.status.as_deref(),
            Some("requires_action"),
            "{auth}"
        );
    }
    assert_eq!(e.dead_letters(&t).await, 0);
}
