//! The provider's events on the real SDK and the local stack: the receiver of `template.yaml`'s
//! provider-events function (verify, queue), the event processor (the inbox), the payments' and
//! refunds' records, and the simulator's events and books as the ground truth. Each test
//! lists its own events from the simulator (`GET /v1/events`, the catch-up's own client) and
//! delivers them itself, signed, as often and in whatever order it needs.
//!
//! Why one file over 500 lines: the five scenarios share the `Events` harness (receiver,
//! inbox, listing, delivery) and read as one story of what the provider finishes later.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use payctl::template::{EVENT_PROCESSOR, REFUND_PROCESSOR};
use payment_core::events::catch_up::EventLister;
use payment_core::events::inbox::EventProcessor;
use payment_core::events::queue::SqsEventQueue;
use payment_core::events::settlement::{DynamoSettlements, PaymentState, Settlements};
use payment_core::provider::event::ProviderEvent;
use payment_core::stripe::receiver::{EventReceiver, FixedSecrets, EVENTS_PATH};
use payment_core::stripe::StripeClient;
use proving::check::drain_dlq;
use secrecy::SecretString;
use sqs_once::runner::now_ms;

use crate::helpers::*;

const SECRET: &str = "whsec_integration";

/// The event side of a test stack.
pub(crate) struct Events {
    pub(crate) processor: Arc<EventProcessor>,
    pub(crate) receiver: EventReceiver,
    pub(crate) queue: SqsEventQueue,
    pub(crate) dlq_url: String,
    pub(crate) provider: StripeClient,
    pub(crate) settlements: DynamoSettlements,
    pub(crate) since_s: i64,
    /// Set when the stack takes the events through EventBridge: deliveries are published on
    /// its partner bus, as Stripe's destination does, instead of posted to the receiver.
    pub(crate) partner: Option<proving::partner::PartnerBus>,
}

pub(crate) async fn events(t: &TestStack) -> Events {
    let config = proving::demo::event_config_for(&t.stack, &fast_settings())
        .expect("the event function's configuration");
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let queue_url = config.provider_events_queue_url.clone().unwrap();
    let queue = || SqsEventQueue::new(t.sqs.clone(), queue_url.clone());
    Events {
        processor: payment_core::edges::bootstrap::build_event_processor(&config, &sdk)
            .await
            .expect("building the event processor"),
        receiver: EventReceiver::new(
            Arc::new(FixedSecrets(vec![SecretString::from(SECRET.to_owned())])),
            Arc::new(queue()),
            300,
        ),
        queue: queue(),
        dlq_url: config.dead_letter_queue_url.clone(),
        provider: payment_core::edges::bootstrap::provider_from(&config, &sdk)
            .await
            .expect("the provider client"),
        settlements: DynamoSettlements::new(
            aws_sdk_dynamodb::Client::new(&sdk),
            &config.idempotency_table,
        ),
        since_s: now_ms() / 1000 - 5,
        partner: None,
    }
}

/// The event side of a stack provisioned [`TestStack::through_eventbridge`]: what the tests
/// deliver goes through its partner bus and rule.
pub(crate) async fn events_through_eventbridge(t: &TestStack) -> Events {
    let route = t
        .stack
        .event_bridge
        .clone()
        .expect("the stack takes its events through EventBridge");
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    Events {
        partner: Some(proving::partner::PartnerBus::new(
            &sdk,
            &route.bus,
            &route.source,
        )),
        ..events(t).await
    }
}

/// Whether an event is about one of `ids` (payment ids, refund ids or PaymentIntent ids).
fn about(e: &ProviderEvent, ids: &[String]) -> bool {
    let o = &e.object;
    let field = |path: &[&str]| {
        path.iter()
            .try_fold(o, |v, k| v.get(*k))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    [
        field(&["metadata", "payment_id"]),
        field(&["metadata", "refund_id"]),
        field(&["payment_intent"]),
    ]
    .into_iter()
    .flatten()
    .any(|id| ids.contains(&id))
}

impl Events {
    /// The events about `ids` since the test began, newest first, once `until` holds of them
    /// (the simulator finishes asynchronous work after a delay).
    pub(crate) async fn listed(
        &self,
        ids: &[String],
        until: impl Fn(&[(ProviderEvent, String)]) -> bool,
    ) -> Vec<(ProviderEvent, String)> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut found: Vec<_> = self
                .provider
                .events(self.since_s, now_ms() / 1000 + 1)
                .await
                .expect("listing events")
                .into_iter()
                .filter(|(e, _)| about(e, ids))
                .collect();
            found.sort_by_key(|(e, _)| std::cmp::Reverse(e.created));
            if until(&found) {
                return found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the provider's events never got there: {:?}",
                found.iter().map(|(e, _)| &e.kind).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Delivers a body as the provider does (signed now); the receiver's status.
    async fn deliver(&self, body: &str) -> u16 {
        let header =
            payment_core::stripe::webhook::sign(&[SECRET], now_ms() / 1000, body.as_bytes());
        self.receiver
            .handle("POST", EVENTS_PATH, Some(&header), body.as_bytes())
            .await
            .status
    }

    /// Delivers each event `copies` times at once, in the order given: signed to the
    /// receiver, or published on the partner bus when the stack takes its events there.
    pub(crate) async fn deliver_all(&self, events: &[(ProviderEvent, String)], copies: usize) {
        if let Some(partner) = &self.partner {
            for event in events {
                let each = futures::future::join_all(
                    (0..copies).map(|_| partner.publish(std::slice::from_ref(event))),
                )
                .await;
                for published in each {
                    published.expect("publishing on the partner bus");
                }
            }
            return;
        }
        for (e, body) in events {
            let statuses = futures::future::join_all((0..copies).map(|_| self.deliver(body))).await;
            assert!(statuses.iter().all(|s| *s == 200), "{}: {statuses:?}", e.id);
        }
    }

    pub(crate) async fn drain(&self, t: &TestStack) -> lambda_local::esm::EsmStats {
        proving::demo::drain_source(
            self.processor.clone(),
            &t.sqs,
            &t.stack.event_sources[EVENT_PROCESSOR],
            2,
        )
        .await
        .expect("draining the events queue")
    }

    pub(crate) async fn payment(&self, pid: &str) -> PaymentState {
        self.settlements
            .payment(pid)
            .await
            .expect("reading the payment")
            .expect("the payment's record")
    }

    pub(crate) async fn dead_letters(&self, t: &TestStack) -> usize {
        drain_dlq(&t.sqs, &self.dlq_url)
            .await
            .expect("the events DLQ")
            .len()
    }
}

pub(crate) fn kinds(events: &[(ProviderEvent, String)]) -> Vec<&str> {
    events.iter().map(|(e, _)| e.kind.as_str()).collect()
}

async fn refund_processor(t: &TestStack) -> Arc<payment_core::refunds::work::RefundProcessor> {
    let config = proving::demo::refund_config_for(&t.stack, &fast_settings()).unwrap();
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    payment_core::edges::bootstrap::build_refund_processor(&config, &sdk)
        .await
        .unwrap()
}

/// Sends refunds and drains the refunds queue.
pub(crate) async fn refund(t: &TestStack, bodies: &[String]) -> lambda_local::esm::EsmStats {
    let source = &t.stack.event_sources[REFUND_PROCESSOR];
    proving::load::send_all(&t.sqs, &source.queue_url, bodies)
        .await
        .unwrap();
    proving::demo::drain_source(refund_processor(t).await, &t.sqs, source, 1)
        .await
        .unwrap()
}

pub(crate) fn refund_body(rid: &str, pid: &str, amount: Option<i64>) -> String {
    payment_core::refunds::work::RefundRequest {
        refund_id: rid.into(),
        payment_id: pid.into(),
        amount,
        reason: None,
        contract_version: None,
    }
    .to_message_body()
}

/// Bank debits answer `processing`; their events settle them: each applied once although
/// delivered five times at once, newest first (`succeeded` before `processing`), and the
/// payment that succeeded becomes refundable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_payment_settles_through_its_events_once_in_any_order() {
    let t = TestStack::new("ev-async").await;
    let e = events(&t).await;
    async_payments_settle(&t, &e).await;
}

/// The scenario of [`an_async_payment_settles_through_its_events_once_in_any_order`], on
/// whichever delivery `e` makes.
pub(crate) async fn async_payments_settle(t: &TestStack, e: &Events) {
    let (ok, closed, auth) = (t.pid("ach-ok"), t.pid("ach-closed"), t.pid("auth"));
    t.send(&payment(&ok, 1500, "pm_usBankAccount_success"))
        .await;
    t.send(&payment(&closed, 1500, "pm_usBankAccount_accountClosed"))
        .await;
    // Off-session, the card needs the customer: recorded requires_action; its payment_failed
    // event says the same and must not turn it into a decline.
    t.send(&payment(&auth, 1500, "pm_card_authenticationRequired"))
        .await;
    t.drain(1).await;
    for pid in [&ok, &closed] {
        let o = t.record(pid).await.unwrap().outcome.unwrap();
        assert_eq!(o.status, "processing", "{pid}");
    }
    let ids = [ok.clone(), closed.clone(), auth.clone()];
    let listed = e
        .listed(&ids, |l| {
            let k = kinds(l);
            k.contains(&"payment_intent.succeeded") && k.contains(&"payment_intent.payment_failed")
        })
        .await;
    e.deliver_all(&listed, 5).await;
    let stats = e.drain(t).await;
    assert_eq!(
        stats.summary.done("applied"),
        2,
        "succeeded and failed, once each: {:?}",
        stats.summary
    );
    let p = e.payment(&ok).await;
    assert_eq!(p.status.as_deref(), Some("succeeded"));
    // One event applied it, whichever came first: each reads the PaymentIntent, and the
    // provider holds it succeeded.
    assert_eq!(p.events.len(), 1, "{:?}", p.events);
    assert_eq!(p.events[0].change, "payment processing -> succeeded");
    let r = t.record(&closed).await.unwrap().outcome.unwrap();
    assert_eq!(
        (r.status.as_str(), r.text("decline_code")),
        ("declined", Some("account_closed"))
    );
    let a = e.payment(&auth).await;
    assert_eq!(
        (a.status.as_deref(), a.events.len()),
        (Some("requires_action"), 0)
    );
    assert_eq!(e.dead_letters(t).await, 0);

    // The same events again (a late `processing` included) change nothing.
    e.deliver_all(&listed, 1).await;
    let again = e.drain(t).await;
    assert_eq!(again.summary.done("applied"), 0, "{:?}", again.summary);
    assert_eq!(
        again.summary.duplicates as usize,
        listed.len(),
        "each came again and was known: {:?}",
        again.summary
    );
    assert_eq!(e.payment(&ok).await.status.as_deref(), Some("succeeded"));

    // Refundable now; the declined one is not.
    let stats = refund(
        t,
        &[
            refund_body(&format!("{ok}-r"), &ok, None),
            refund_body(&format!("{closed}-r"), &closed, None),
        ],
    )
    .await;
    assert_eq!(stats.summary.done("refunded"), 1, "{:?}", stats.summary);
    assert_eq!(t.ledger(&format!("{ok}-r")).await.refunds.len(), 1);
    assert_eq!(t.charges(&ok).await, 1);
    assert_eq!(t.charges(&closed).await, 0);
}

/// A refund that fails after `pending` gives its reservation back exactly once: a new refund of
/// the whole amount is accepted, and the ledger always equals the refunds the provider did not
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_fails_after_pending_gives_its_amount_back_once() {
    let t = TestStack::new("ev-refund").await;
    let e = events(&t).await;
    failed_refund_gives_back(&t, &e).await;
}

/// The scenario of [`a_refund_that_fails_after_pending_gives_its_amount_back_once`], on
/// whichever delivery `e` makes.
pub(crate) async fn failed_refund_gives_back(t: &TestStack, e: &Events) {
    let pid = t.pid("p");
    t.send(&payment(&pid, 1000, "pm_card_refundFail")).await;
    t.drain(1).await;
    assert_charged_once(t, &pid).await;
    let r1 = format!("{pid}-r1");
    let stats = refund(t, &[refund_body(&r1, &pid, Some(1000))]).await;
    assert_eq!(stats.summary.done("refunded"), 1);
    let refunded = |t: &TestStack| {
        let pid = pid.clone();
        let table = t.config.idempotency_table.clone();
        async move {
            let ledger = payment_core::refunds::ledger::DynamoRefundLedger::new(
                aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await),
                &table,
            );
            use payment_core::refunds::ledger::RefundLedger;
            ledger.payment(&pid).await.unwrap().unwrap().refunded
        }
    };
    assert_eq!(refunded(t).await, 1000, "reserved while pending");

    let ids = [r1.clone()];
    let listed = e
        .listed(&ids, |l| kinds(l).contains(&"refund.failed"))
        .await;
    e.deliver_all(&listed, 3).await;
    let stats = e.drain(t).await;
    assert_eq!(stats.summary.done("applied"), 1, "{:?}", stats.summary);
    assert_eq!(refunded(t).await, 0, "given back once");
    let view = payment_core::api::view::after_charge_of(
        &aws_sdk_dynamodb::Client::new(&payment_core::edges::bootstrap::sdk_config().await),
        &t.config.idempotency_table,
        &pid,
    )
    .await
    .unwrap();
    let view = view.expect("the refund and its event show");
    assert_eq!(view.refunded_amount, 0);
    assert_eq!(
        view.refunds
            .iter()
            .map(|r| (r.refund_id.as_str(), r.amount, r.state.as_str()))
            .collect::<Vec<_>>(),
        [(r1.as_str(), 1000, "failed")],
        "the failed refund still shows, given back"
    );

    // The amount can be refunded again.
    let r2 = format!("{pid}-r2");
    let stats = refund(t, &[refund_body(&r2, &pid, Some(1000))]).await;
    assert_eq!(stats.summary.done("refunded"), 1, "{:?}", stats.summary);
    assert_eq!(refunded(t).await, 1000);
    // ... and its failure gives it back too; the events of r1 delivered again change nothing.
    let ids = [r2.clone()];
    let listed2 = e
        .listed(&ids, |l| kinds(l).contains(&"refund.failed"))
        .await;
    e.deliver_all(&listed2, 2).await;
    e.deliver_all(&listed, 1).await;
    let stats = e.drain(t).await;
    assert_eq!(stats.summary.done("applied"), 1, "{:?}", stats.summary);
    assert_eq!(
        stats.summary.duplicates as usize,
        listed2.len() + listed.len(),
        "r2's second copies and r1's events again, each known: {:?}",
        stats.summary
    );
    assert_eq!(refunded(t).await, 0);
    // The provider's books: two refunds, both failed; none counted.
    let books = t.sim.ledger().await.unwrap();
    for rid in [&r1, &r2] {
        assert_eq!(books.refunds[rid].len(), 1, "{rid}");
        assert_eq!(books.refunds[rid][0].status, "failed", "{rid}");
    }
    assert_eq!(e.dead_letters(t).await, 0);
}

/// A dispute holds its amount from refunds until it is won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispute_holds_its_amount_from_refunds_until_won() {
    let t = TestStack::new("ev-dispute").await;
    let e = events(&t).await;
    let pid = t.pid("p");
    t.send(&payment(&pid, 700, "pm_card_createDispute")).await;
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    let intent = t.ledger(&pid).await.charges[&pid][0].id.clone();
    let ids = [intent.clone()];
    let opened = e
        .listed(&ids, |l| kinds(l).contains(&"charge.dispute.created"))
        .await;
    e.deliver_all(&opened, 2).await;
    let stats = e.drain(&t).await;
    assert!(stats.summary.done("applied") >= 1, "{:?}", stats.summary);
    let p = e.payment(&pid).await;
    assert_eq!(p.disputed, 700);
    let (dispute_id, (status, _)) = p.disputes.iter().next().unwrap();
    assert_eq!(status, "needs_response");

    let stats = refund(&t, &[refund_body(&format!("{pid}-r1"), &pid, Some(100))]).await;
    assert_eq!(stats.summary.done("refunded"), 0);
    let codes: Vec<String> = drain_dlq(
        &t.sqs,
        t.stack
            .var_of(REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")
            .unwrap(),
    )
    .await
    .unwrap()
    .into_iter()
    .map(|d| d.error_code)
    .collect();
    assert_eq!(codes, ["refund_exceeds_charge"]);

    t.sim.close_dispute(dispute_id, true).await.unwrap();
    let closed = e
        .listed(&ids, |l| kinds(l).contains(&"charge.dispute.closed"))
        .await;
    e.deliver_all(&closed, 2).await;
    e.drain(&t).await;
    let p = e.payment(&pid).await;
    assert_eq!((p.disputed, p.disputes[dispute_id].0.as_str()), (0, "won"));
    let stats = refund(&t, &[refund_body(&format!("{pid}-r2"), &pid, Some(100))]).await;
    assert_eq!(stats.summary.done("refunded"), 1, "{:?}", stats.summary);
    assert_eq!(e.dead_letters(&t).await, 0);

    // GET, payctl status and payctl history show the dispute and the events applied.
    let (_server, client) = crate::api::served(&t).await;
    let got = client.get(&pid).await.unwrap().json().unwrap();
    assert_eq!(got["status"], "succeeded", "{got}");
    assert_eq!(
        (&got["disputed_amount"], &got["disputes"][0]["status"]),
        (&serde_json::json!(0), &serde_json::json!("won")),
        "{got}"
    );
    // Whichever of each pair (created / funds_withdrawn, closed / funds_reinstated) came
    // first applied; the other changed nothing.
    let changes: Vec<&str> = got["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes.len(), 2, "{got}");
    assert!(
        changes[0].ends_with("needs_response (700 held: 700)"),
        "{got}"
    );
    assert!(
        changes[1].ends_with("needs_response -> won (700 held: 0)"),
        "{got}"
    );
    let payctl = |args: &[&str]| {
        let out = std::process::Command::new(bin("payctl"))
            .args(args)
            .args(["--table", &t.config.idempotency_table])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status = payctl(&["status", &pid]);
    assert!(
        status.contains(&format!("{dispute_id}  700  won")),
        "{status}"
    );
    let history = payctl(&["history", &pid]);
    let created = history.find("needs_response (700 held: 700)");
    let closed = history.find("-> won (700 held: 0)");
    assert!(
        created.is_some() && closed.is_some() && created < closed,
        "the events in order: {history}"
    );
}

/// Events missed while the endpoint was down are listed and applied once; the same window
/// listed again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catch_up_applies_every_missed_event_once() {
    let t = TestStack::new("ev-catch-up").await;
    let e = events(&t).await;
    let pids: Vec<String> = (0..3).map(|i| t.pid(&format!("ach{i}"))).collect();
    for pid in &pids {
        t.send(&payment(pid, 900, "pm_usBankAccount_success")).await;
    }
    t.drain(1).await;
    e.listed(&pids, |l| {
        kinds(l)
            .iter()
            .filter(|k| **k == "payment_intent.succeeded")
            .count()
            == 3
    })
    .await;
    // Nothing was delivered: the endpoint was down.
    let until = now_ms() / 1000 + 1;
    let report = payment_core::events::catch_up::catch_up(&e.provider, &e.queue, e.since_s, until)
        .await
        .unwrap();
    // Each bank debit's `processing` and `succeeded` (a creation is not a type the inbox takes).
    assert!(report.queued >= 6, "{report:?}");
    let first = e.drain(&t).await;
    assert_eq!(first.summary.done("applied"), 3, "{:?}", first.summary);
    for pid in &pids {
        assert_eq!(e.payment(pid).await.status.as_deref(), Some("succeeded"));
    }
    payment_core::events::catch_up::catch_up(&e.provider, &e.queue, e.since_s, until)
        .await
        .unwrap();
    let second = e.drain(&t).await;
    assert_eq!(second.summary.done("applied"), 0, "{:?}", second.summary);
    assert!(second.summary.duplicates as usize >= report.queued);
    for pid in &pids {
        assert_eq!(e.payment(pid).await.events.len(), 1);
    }
    assert_eq!(e.dead_letters(&t).await, 0);
}

/// The scheduled catch-up as the event function runs it at the template's defaults (its pace:
/// the function's share, 20 × 20 % = 4 requests a second; its budget: the function's 60 s less
/// 15 s; what it lists: the webhook shape's undelivered events), on an account whose last two
/// days hold 20,000 events delivered to the endpoint and a few of ours that an outage made the
/// provider give up on: within two runs ours are queued, and the inbox applies them. (Listing
/// every event at one instance's rate, 0.4 a second, a run walked 18 of the 200 pages.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_catch_up_finds_what_an_outage_missed_among_20_000_delivered_events() {
    use payment_core::events::catch_up::Budget;
    let t = TestStack::new("ev-shipped-catch-up").await;
    let e = events(&t).await;
    let pids: Vec<String> = (0..3).map(|i| t.pid(&format!("ach{i}"))).collect();
    for pid in &pids {
        t.send(&payment(pid, 900, "pm_usBankAccount_success")).await;
    }
    t.drain(1).await;
    let ours = e
        .listed(&pids, |l| {
            kinds(l)
                .iter()
                .filter(|k| **k == "payment_intent.succeeded")
                .count()
                == 3
        })
        .await;
    let ids: Vec<String> = ours.iter().map(|(e, _)| e.id.clone()).collect();
    // The outage: the provider gave up on ours. The account's other traffic: delivered.
    t.sim.undelivered(&ids).await.unwrap();
    let now = now_ms() / 1000;
    t.sim
        .event_history(
            20_000,
            now - 2 * 86_400,
            now - 3_600,
            "payment_intent.succeeded",
        )
        .await
        .unwrap();

    let mut config = proving::functions::event_config_for(&t.stack, &fast_settings()).unwrap();
    assert_eq!(
        config.catch_up_lists,
        payment_core::events::catch_up::Listed::Undelivered,
        "the template's default shape is the webhook's"
    );
    let pace = &t.stack.deployed_pace[EVENT_PROCESSOR];
    let var = |k: &str| pace[k].parse::<f64>().unwrap();
    config.catch_up_pace =
        Some(var("PROVIDER_REQUESTS_PER_SECOND") * var("PROVIDER_SHARE_PERCENT") / 100.0);
    assert_eq!(config.catch_up_pace, Some(4.0), "the template's defaults");
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let catch_up = payment_core::edges::bootstrap::build_catch_up(&config, &sdk)
        .await
        .unwrap()
        .expect("the event function's catch-up");
    // The account's webhook endpoint, registered as the docs say (every type): the run
    // checks it before it trusts the undelivered filter.
    t.sim
        .webhook(serde_json::json!({"endpoints": [{
            "id": "we_shipped",
            "url": "https://shipped.example/v1/provider-events",
            "enabled_events": ["*"],
        }]}))
        .await
        .unwrap();
    let mut queued = 0;
    for run in 1..=2 {
        let budget = Budget::before_deadline(now_ms() + 60_000, Duration::from_secs(15));
        let report = catch_up.run(budget).await.into_result();
        println!("catch-up run {run}: {report:?}");
        let report = report.unwrap();
        assert_eq!(report.listed_all, None, "it lists the undelivered");
        queued += report.queued;
        if report.finished {
            break;
        }
        assert!(
            run < 2,
            "two runs did not reach the newest event: {report:?}"
        );
    }
    t.sim
        .webhook(serde_json::json!({"endpoints": []}))
        .await
        .unwrap();
    assert!(queued >= ids.len(), "queued {queued} of our {}", ids.len());
    let applied = e.drain(&t).await;
    assert_eq!(applied.summary.done("applied"), 3, "{:?}", applied.summary);
    for pid in &pids {
        assert_eq!(e.payment(pid).await.status.as_deref(), Some("succeeded"));
    }
    assert_eq!(e.dead_letters(&t).await, 0);
}

/// Events about objects this system did not create, and types the inbox does not apply, are
/// acknowledged and counted, never dead-lettered; a body without a valid signature is refused
/// and queues nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_unknown_events_are_counted_and_forged_ones_refused() {
    let t = TestStack::new("ev-foreign").await;
    let e = events(&t).await;
    let event = |id: &str, kind: &str, object: serde_json::Value| {
        serde_json::json!({"id": id, "object": "event", "type": kind, "created": 1,
                           "data": {"object": object}})
        .to_string()
    };
    let suffix = &t.name;
    let bodies = [
        event(
            &format!("evt_other_{suffix}"),
            "payment_intent.succeeded",
            serde_json::json!({"id": "pi_other", "object": "payment_intent", "status": "succeeded",
                               "metadata": {"payment_id": "another-system-1"}}),
        ),
        event(
            &format!("evt_nometa_{suffix}"),
            "refund.updated",
            serde_json::json!({"id": "re_other", "object": "refund", "status": "failed", "metadata": {}}),
        ),
        event(
            &format!("evt_plan_{suffix}"),
            "plan.created",
            serde_json::json!({"id": "price_1", "object": "plan"}),
        ),
    ];
    for b in &bodies {
        assert_eq!(e.deliver(b).await, 200);
    }
    let forged = event(
        &format!("evt_forged_{suffix}"),
        "payment_intent.succeeded",
        serde_json::json!({"id": "pi_x", "object": "payment_intent", "status": "succeeded"}),
    );
    let wrong =
        payment_core::stripe::webhook::sign(&["whsec_wrong"], now_ms() / 1000, forged.as_bytes());
    let answer = e
        .receiver
        .handle("POST", EVENTS_PATH, Some(&wrong), forged.as_bytes())
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let stats = e.drain(&t).await;
    let counts: BTreeMap<&str, u32> = ["foreign", "unhandled", "applied"]
        .into_iter()
        .map(|l| (l, stats.summary.done(l)))
        .collect();
    assert_eq!(
        counts,
        BTreeMap::from([("applied", 0), ("foreign", 2), ("unhandled", 1)]),
        "{:?}",
        stats.summary
    );
    assert_eq!(stats.received, 3, "the forged body was never queued");
    assert_eq!(e.dead_letters(&t).await, 0);
}

/// The scheduled catch-up against the provider's own list and the real queue: from the place
/// set by hand it walks forward page by page, queues each page in batches, moves its checkpoint
/// to the last event it queued and marks it caught up; the inbox applies what it queued once,
/// and the next run (from a quarter of an hour before its last event) applies nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduled_catch_up_runs_from_its_checkpoint() {
    use payment_core::events::catch_up::{scheduled, Budget, Checkpoint, Listed, Position};
    let t = TestStack::new("ev-scheduled").await;
    let e = events(&t).await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let checkpoint = Checkpoint::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &t.config.idempotency_table,
    );
    assert_eq!(checkpoint.read().await.unwrap(), Position::default());
    // Where an operator would put it (payctl events checkpoint --since): this test's start.
    let set = Position {
        from_s: Some(e.since_s),
        version: 1,
        ..Position::default()
    };
    assert!(checkpoint
        .advance(&Position::default(), &set)
        .await
        .unwrap());
    let pid = t.pid("ach");
    t.send(&payment(&pid, 900, "pm_usBankAccount_success"))
        .await;
    t.drain(1).await;
    let ids = [pid.clone()];
    let listed = e
        .listed(&ids, |l| kinds(l).contains(&"payment_intent.succeeded"))
        .await;
    let newest_of_ours = listed.iter().map(|(e, _)| e.created).max().unwrap();

    let now = now_ms() / 1000 + 1;
    let first = scheduled(
        (&e.provider, Listed::All),
        &e.queue,
        &checkpoint,
        now,
        Budget::unlimited(),
    )
    .await
    .unwrap();
    assert!(first.finished, "{first:?}");
    assert!(first.queued >= listed.len(), "{first:?}");
    let place = checkpoint.read().await.unwrap();
    assert!(place.caught_up, "{place:?}");
    assert!(
        place
            .last
            .as_ref()
            .is_some_and(|l| l.created >= newest_of_ours),
        "the checkpoint is at the last event queued: {place:?}"
    );
    let applied = e.drain(&t).await;
    assert_eq!(applied.summary.done("applied"), 1, "{:?}", applied.summary);
    assert_eq!(e.payment(&pid).await.status.as_deref(), Some("succeeded"));

    let again = scheduled(
        (&e.provider, Listed::All),
        &e.queue,
        &checkpoint,
        now + 600,
        Budget::unlimited(),
    )
    .await
    .unwrap();
    assert!(again.finished, "{again:?}");
    let drained = e.drain(&t).await;
    assert_eq!(drained.summary.done("applied"), 0, "{:?}", drained.summary);
    assert_eq!(e.payment(&pid).await.events.len(), 1);
    // A run that read the checkpoint before another moved it does not move it back.
    assert!(!checkpoint
        .advance(&set, &Position::default())
        .await
        .unwrap());
    assert!(checkpoint.read().await.unwrap().caught_up);
    assert_eq!(e.dead_letters(&t).await, 0);
}
