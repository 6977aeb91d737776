//! Stripe's events through Amazon EventBridge, on the local stack: the partner event source
//! created as Stripe creates it, the stack provisioned from `template.yaml` with
//! `ProviderEventsDelivery` `eventbridge` (or `both`), its partner bus, rule, target and DLQ, and
//! Stripe's event objects published on the bus ([`proving::partner`]: only a partner may publish
//! `aws.partner` sources, so the local source is `local.partner/stripe.com/...`). The same
//! scenarios as the webhook's (`events::`), with the same assertions; an event that comes both
//! ways is applied once; the rule's pattern takes Stripe's envelopes and nothing else.

use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use payctl::template::EVENT_PROCESSOR;
use serde_json::{json, Value};

use crate::events::{
    async_payments_settle, events, events_through_eventbridge, failed_refund_gives_back, kinds,
};
use crate::helpers::*;

async fn eventbridge() -> aws_sdk_eventbridge::Client {
    aws_sdk_eventbridge::Client::new(&payment_core::edges::bootstrap::sdk_config().await)
}

/// Bank debits settle through events published on the partner bus, each applied once although
/// published five times, newest first; the stack has no public route to take them otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_payment_settles_through_eventbridge_once_in_any_order() {
    let t = TestStack::through_eventbridge("eb-async", "eventbridge").await;
    assert!(
        !t.stack.function_envs.contains_key("ProviderEventsFunction"),
        "the eventbridge shape has no webhook function: {:?}",
        t.stack.function_envs.keys()
    );
    let e = events_through_eventbridge(&t).await;
    async_payments_settle(&t, &e).await;
}

/// A refund that fails after `pending`, told through EventBridge, gives its amount back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_failing_after_pending_through_eventbridge_gives_its_amount_back_once() {
    let t = TestStack::through_eventbridge("eb-refund", "eventbridge").await;
    let e = events_through_eventbridge(&t).await;
    failed_refund_gives_back(&t, &e).await;
}

/// During a move from the webhook to EventBridge both deliver every event: each is applied
/// once, the other copy counted as a duplicate, whichever comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_comes_both_ways_is_applied_once() {
    let t = TestStack::through_eventbridge("eb-both", "both").await;
    let webhook = events(&t).await;
    let bus = events_through_eventbridge(&t).await;
    let (ok, closed) = (t.pid("ach-ok"), t.pid("ach-closed"));
    t.send(&payment(&ok, 1500, "pm_usBankAccount_success"))
        .await;
    t.send(&payment(&closed, 1500, "pm_usBankAccount_accountClosed"))
        .await;
    t.drain(1).await;
    let listed = bus
        .listed(&[ok.clone(), closed.clone()], |l| {
            let k = kinds(l);
            k.contains(&"payment_intent.succeeded") && k.contains(&"payment_intent.payment_failed")
        })
        .await;
    // The webhook's copies of the first half are queued before EventBridge's, those of the
    // second half after.
    let half = listed.len() / 2;
    webhook.deliver_all(&listed[..half], 1).await;
    bus.deliver_all(&listed, 1).await;
    webhook.deliver_all(&listed[half..], 1).await;
    let stats = bus.drain(&t).await;
    let applied_or_not: u32 = stats.summary.done.values().sum();
    assert_eq!(
        applied_or_not as usize,
        listed.len(),
        "each event once: {:?}",
        stats.summary
    );
    assert_eq!(
        stats.summary.duplicates as usize,
        listed.len(),
        "the other copy of each a duplicate: {:?}",
        stats.summary
    );
    assert_eq!(stats.summary.done("applied"), 2, "{:?}", stats.summary);
    let p = bus.payment(&ok).await;
    assert_eq!(
        (p.status.as_deref(), p.events.len()),
        (Some("succeeded"), 1),
        "{:?}",
        p.events
    );
    let r = t.record(&closed).await.unwrap().outcome.unwrap();
    assert_eq!(r.status, "declined");
    assert_eq!(bus.dead_letters(&t).await, 0);
}

/// The rule takes Stripe's envelopes of the types the inbox applies, from the partner source
/// alone: EventBridge's own matcher says so of the rule as provisioned (and of the same pattern
/// on a real `aws.partner/stripe.com/...` source); a type the inbox does not apply, published
/// on the bus, never reaches the queue; and nobody but the partner may publish as
/// `aws.partner/stripe.com`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_takes_stripe_s_events_and_nothing_else() {
    let t = TestStack::through_eventbridge("eb-rule", "eventbridge").await;
    let route = t.stack.event_bridge.clone().unwrap();
    let client = eventbridge().await;
    let rule = client
        .describe_rule()
        .name(&route.rule)
        .event_bus_name(&route.bus)
        .send()
        .await
        .expect("the rule");
    let pattern = rule.event_pattern().expect("the rule's pattern").to_owned();
    let real = "aws.partner/stripe.com/ed_test_61Tgbw4tAWzZeirTG16TVtIa1oSQktdZeofdAxL32Ni4";
    let envelope = |source: &str, kind: &str| {
        json!({"version": "0", "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718", "detail-type": kind,
               "source": source, "account": "111111111111", "time": "2026-12-03T10:00:00Z",
               "region": "us-east-1", "resources": [],
               "detail": {"id": "evt_1", "object": "event", "type": kind, "created": 1,
                          "data": {"object": {"id": "pi_1", "object": "payment_intent"}}}})
        .to_string()
    };
    let matches = |pattern: String, event: String| {
        let client = client.clone();
        async move {
            client
                .test_event_pattern()
                .event_pattern(pattern)
                .event(event)
                .send()
                .await
                .expect("TestEventPattern")
                .result()
        }
    };
    for kind in payment_core::events::catch_up::EVENT_TYPES {
        assert!(
            matches(pattern.clone(), envelope(&route.source, kind)).await,
            "{kind}"
        );
    }
    assert!(!matches(pattern.clone(), envelope(&route.source, "customer.created")).await);
    assert!(
        !matches(
            pattern.clone(),
            envelope("my.app", "payment_intent.succeeded")
        )
        .await
    );
    let on_real = pattern.replace(&route.source, real);
    assert_ne!(on_real, pattern, "the pattern names its source");
    assert!(matches(on_real.clone(), envelope(real, "refund.failed")).await);
    assert!(!matches(on_real, envelope(&route.source, "refund.failed")).await);

    // Published on the bus: the applied type reaches the queue, the other does not.
    let publish = |source: &str, kind: &str, id: &str| {
        let detail = json!({"id": id, "object": "event", "type": kind, "created": 1,
                            "data": {"object": {"id": "cus_1", "object": "customer"}}});
        PutEventsRequestEntry::builder()
            .event_bus_name(&route.bus)
            .source(source)
            .detail_type(kind)
            .detail(detail.to_string())
            .build()
    };
    let out = client
        .put_events()
        .entries(publish(
            &route.source,
            "customer.created",
            "evt_not_applied",
        ))
        .entries(publish(&route.source, "refund.updated", "evt_applied_type"))
        .send()
        .await
        .expect("PutEvents");
    assert_eq!(out.failed_entry_count(), 0);
    let got = t
        .receive_records_from(&t.stack.event_sources[EVENT_PROCESSOR], 2)
        .await
        .into_iter()
        .map(|m| serde_json::from_str::<Value>(&m.body.unwrap_or_default()).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(got.len(), 1, "only the applied type: {got:?}");
    assert_eq!(got[0]["detail-type"], "refund.updated");
    assert_eq!(got[0]["detail"]["id"], "evt_applied_type");

    // Only the partner may publish as the partner.
    let forged = client
        .put_events()
        .entries(publish(real, "payment_intent.succeeded", "evt_forged"))
        .send()
        .await
        .expect("PutEvents answers");
    assert_eq!(forged.failed_entry_count(), 1, "{forged:?}");
    assert_eq!(
        forged.entries()[0].error_code(),
        Some("NotAuthorizedForSourceException")
    );
}
