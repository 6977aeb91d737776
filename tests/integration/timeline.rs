//! The provider's timeline, compressed: a year of late events in one run. The processes' clock
//! is moved through the project's clock seam (`sqs_once::clock::ShiftedClock`, given to the
//! refund and event processors and to reconcile), each message's send time moves with it (as
//! a queue in that future would stamp it), and DynamoDB's TTL is applied as it would be by then
//! (every item whose `expires_at` has passed is deleted) at days 1, 3, 15, 25, 60, 100, 200 and
//! 400. Day 0: a card charge, a bank debit, two slow debits (one to settle on day 15, one to
//! fail then), an off-session payment that needs its customer, a charge whose refund fails
//! later, a charge that will be disputed, a charge whose answer is lost and a charge refunded
//! months later. Day 1: refunds of the slow debits, held while they settle (past the 14 days a
//! dead-letter queue would have kept them); the failed one's refund stays held until its
//! customer pays after all, on day 25. Then the provider's late events on their days. At every step
//! each payment's status, refunded and disputed amounts equal the provider's books (a held
//! refund's reservation apart), no event
//! that names our payment is acknowledged as foreign, and nothing is dead-lettered.
//!
//! `make timeline` runs this test alone and prints its calendar.
//!
//! Why ~630 lines: the calendar reads as one story from day 0 to day 400, and its harness (the
//! clock, the TTL sweep, the drains on the calendar's clock, the check against the books) is
//! used by that story only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use payctl::template::{EventSource, EVENT_PROCESSOR, REFUND_PROCESSOR};
use payment_core::events::inbox::ProviderObjects;
use payment_core::provider::event::ProviderEvent;
use payment_core::provider::RefundProvider;
use payment_core::refunds::ledger::{DynamoRefundLedger, RefundLedger};
use proving::check::drain_dlq;
use sqs_once::clock::{Clock, ShiftedClock};
use sqs_once::IdempotencyStore;
use sqs_once::{BatchRunner, BatchSummary, Work};

use crate::events::{events, kinds, refund_body, Events};
use crate::helpers::*;

const DAY: Duration = Duration::from_secs(86_400);

/// One payment of the calendar and the last day something changed it (its record lives the
/// refund window from then).
struct Payment {
    pid: String,
    last_change_day: i64,
}

struct Calendar {
    t: TestStack,
    e: Events,
    clock: Arc<ShiftedClock>,
    refunds: Arc<payment_core::refunds::work::RefundProcessor>,
    inbox: Arc<payment_core::events::inbox::EventProcessor>,
    ddb: aws_sdk_dynamodb::Client,
    day: i64,
    payments: BTreeMap<&'static str, Payment>,
    /// Events delivered, by id (so each is delivered on its day, once).
    delivered: std::collections::HashSet<String>,
    /// Payments the provider has already moved on (at once, in the simulator) whose event the
    /// calendar holds back until its day: compared with the books from that day on.
    lagging: BTreeMap<&'static str, i64>,
    /// The idempotency table and the payments API's table.
    tables: [String; 2],
    /// The refunds' records.
    refund_records: sqs_once::DynamoStore,
}

impl Calendar {
    fn pid(&self, name: &str) -> String {
        self.payments[name].pid.clone()
    }

    fn changed(&mut self, name: &str) {
        let day = self.day;
        if let Some(p) = self.payments.get_mut(name) {
            p.last_change_day = day;
        }
    }

    /// Moves the clock to `day` and deletes what DynamoDB's TTL would have deleted by then.
    async fn go_to(&mut self, day: i64) {
        self.clock.advance(DAY * (day - self.day) as u32);
        self.day = day;
        let now_s = self.clock.now_ms() / 1000;
        let mut swept = 0;
        for table in self.tables.clone() {
            let mut start = None;
            loop {
                let out = self
                    .ddb
                    .scan()
                    .table_name(&table)
                    .projection_expression("pk, expires_at")
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .unwrap();
                for item in out.items() {
                    let expired = item
                        .get("expires_at")
                        .and_then(|v| v.as_n().ok())
                        .and_then(|v| v.parse::<i64>().ok())
                        .is_some_and(|t| t < now_s);
                    if expired {
                        self.ddb
                            .delete_item()
                            .table_name(&table)
                            .key("pk", item["pk"].clone())
                            .send()
                            .await
                            .unwrap();
                        swept += 1;
                    }
                }
                match out.last_evaluated_key() {
                    Some(k) if !k.is_empty() => start = Some(k.clone()),
                    _ => break,
                }
            }
        }
        println!("day {day:>3}: TTL deleted {swept} items");
    }

    /// Drains a queue with a processor on the calendar's clock: each message stamped as sent
    /// now, in the calendar's time.
    async fn drain<W: Work>(
        &self,
        processor: &Arc<BatchRunner<W>>,
        source: &EventSource,
    ) -> BatchSummary {
        let mut total = BatchSummary::default();
        let mut empty = 0;
        while empty < 2 {
            let out = self
                .t
                .sqs
                .receive_message()
                .queue_url(&source.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap();
            if out.messages().is_empty() {
                empty += 1;
                continue;
            }
            empty = 0;
            let offset = self.clock.offset_ms();
            let records: Vec<SqsMessage> = out
                .messages()
                .iter()
                .map(|m| {
                    let mut r = lambda_local::esm::to_record(m, &source.queue_arn, "us-east-1");
                    for k in ["SentTimestamp", "ApproximateFirstReceiveTimestamp"] {
                        if let Some(v) = r.attributes.get_mut(k) {
                            *v = (v.parse::<i64>().unwrap() + offset).to_string();
                        }
                    }
                    r
                })
                .collect();
            let (response, s) = processor
                .handle_batch(records, self.clock.now_ms() + 60_000)
                .await;
            // As the event-source mapping does: what did not fail is deleted.
            let failed: Vec<&str> = response
                .batch_item_failures
                .iter()
                .map(|f| f.item_identifier.as_str())
                .collect();
            for m in out.messages() {
                if !failed.contains(&m.message_id().unwrap_or_default()) {
                    self.t
                        .sqs
                        .delete_message()
                        .queue_url(&source.queue_url)
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .send()
                        .await
                        .unwrap();
                }
            }
            for (k, v) in s.done {
                *total.done.entry(k).or_default() += v;
            }
            for (k, v) in s.dead_lettered {
                *total.dead_lettered.entry(k).or_default() += v;
            }
            total.duplicates += s.duplicates;
            total.retried += s.retried;
        }
        total
    }

    /// Delivers, signed, the events about `ids` that `until` waits for and that were not
    /// delivered before, then applies them: none is foreign, none comes back.
    async fn deliver(
        &mut self,
        ids: &[String],
        until: impl Fn(&[(ProviderEvent, String)]) -> bool,
    ) {
        let listed = self.e.listed(ids, until).await;
        let fresh: Vec<_> = listed
            .into_iter()
            .filter(|(e, _)| self.delivered.insert(e.id.clone()))
            .collect();
        self.e.deliver_all(&fresh, 1).await;
        let s = self
            .drain(&self.inbox, &self.t.stack.event_sources[EVENT_PROCESSOR])
            .await;
        println!(
            "day {:>3}: {} events delivered: {:?}",
            self.day,
            fresh.len(),
            s.done
        );
        assert_eq!(
            s.done("foreign"),
            0,
            "day {}: an event of ours was foreign: {s:?}",
            self.day
        );
        assert_eq!(
            s.retried, 0,
            "day {}: an event was handed back: {s:?}",
            self.day
        );
        assert!(s.dead_lettered.is_empty(), "day {}: {s:?}", self.day);
    }

    async fn refund(&mut self, name: &str, rid: &str, amount: Option<i64>) -> BatchSummary {
        let pid = self.pid(name);
        let source = &self.t.stack.event_sources[REFUND_PROCESSOR];
        proving::load::send_all(
            &self.t.sqs,
            &source.queue_url,
            &[refund_body(rid, &pid, amount)],
        )
        .await
        .unwrap();
        let s = self.drain(&self.refunds, source).await;
        println!("day {:>3}: refund {rid} of {name}: {:?}", self.day, s.done);
        self.changed(name);
        s
    }

    /// The customer of payment `name` confirms its PaymentIntent again with a card
    /// (`POST /v1/payment_intents/{id}/confirm`, on-session).
    async fn pays_again(&self, name: &str) {
        let pid = self.pid(name);
        let intent = self.t.record(&pid).await.unwrap().outcome.unwrap();
        let intent = intent.text("provider_payment_id").unwrap().to_owned();
        let confirmed = reqwest::Client::new()
            .post(format!(
                "{}/v1/payment_intents/{intent}/confirm",
                self.t.config.payment_api_url
            ))
            .bearer_auth(required_env("PAYMENT_API_KEY"))
            .header("Stripe-Version", &self.t.config.stripe_api_version)
            .header("Idempotency-Key", format!("confirm-{pid}"))
            .form(&[("payment_method", "pm_card_visa")])
            .send()
            .await
            .unwrap();
        assert!(
            confirmed.status().is_success(),
            "{:?}",
            confirmed.text().await
        );
    }

    /// Every payment whose record must still be there (its last change within the refund
    /// window) has one, and it equals the provider's books; the others are gone.
    async fn check(&self) {
        let books = self.t.sim.ledger().await.unwrap();
        let ledger = DynamoRefundLedger::new(self.ddb.clone(), &self.t.config.idempotency_table);
        for (name, p) in &self.payments {
            let record = ledger.payment(&p.pid).await.unwrap();
            let kept = self.day < p.last_change_day + 365;
            let Some(record) = record else {
                assert!(
                    !kept,
                    "day {}: {name}'s record is gone within its lifetime",
                    self.day
                );
                continue;
            };
            assert!(
                kept,
                "day {}: {name}'s record outlived its refund window",
                self.day
            );
            if let Some(day) = self.lagging.get(name).filter(|d| self.day < **d) {
                println!(
                    "day {:>3}: {name:<10} its event comes on day {day}",
                    self.day
                );
                continue;
            }
            let outcome = record.outcome.as_ref().expect("an outcome");
            let intent = outcome
                .provider_payment_id
                .clone()
                .expect("a PaymentIntent");
            let at_provider = self.e.provider.payment_intent(&intent).await.unwrap();
            assert_eq!(
                outcome.status, at_provider.status,
                "day {}: {name}'s status against the provider's",
                self.day
            );
            let refunded: i64 = self
                .e
                .provider
                .find_refunds(&intent)
                .await
                .unwrap()
                .iter()
                .filter(|r| !matches!(r.status.as_str(), "failed" | "canceled"))
                .map(|r| r.amount)
                .sum();
            // What held refunds reserve is not refunded yet: counted apart.
            let mut held = 0;
            for rid in record.held.keys() {
                let r = self.refund_records.get(rid).await.unwrap();
                if r.and_then(|r| r.outcome)
                    .is_some_and(|o| o.status == "held")
                {
                    held += record.refunds.get(rid).copied().unwrap_or(0);
                }
            }
            assert_eq!(
                record.refunded - held,
                refunded,
                "day {}: {name}'s refunds ({held} held)",
                self.day
            );
            let disputed: i64 = books
                .disputes
                .get(&intent)
                .filter(|d| {
                    payment_core::provider::event::dispute_holds_amount(
                        d["status"].as_str().unwrap_or(""),
                    )
                })
                .map_or(0, |d| d["amount"].as_i64().unwrap_or(0));
            assert_eq!(
                record.disputed, disputed,
                "day {}: {name}'s disputes",
                self.day
            );
            println!(
                "day {:>3}: {name:<10} {:<15} refunded {refunded:>5} disputed {disputed:>5} refundable {:>5}",
                self.day,
                outcome.status,
                if outcome.status == "succeeded" { record.left(outcome.amount) } else { 0 }
            );
        }
        for url in [
            self.t.config.dead_letter_queue_url.clone(),
            self.t
                .stack
                .var_of(REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")
                .unwrap()
                .to_owned(),
            self.e.dlq_url.clone(),
        ] {
            let dead = drain_dlq(&self.t.sqs, &url).await.unwrap();
            assert!(dead.is_empty(), "day {}: dead letters {dead:?}", self.day);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_year_of_the_provider_s_late_events_keeps_every_ledger_true() {
    // One attempt per delivery: the charge whose answer is lost stays unknown for reconcile.
    let t = TestStack::with_env("timeline", env(&[("PROVIDER_MAX_ATTEMPTS", "1")])).await;
    let e = events(&t).await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let clock = Arc::new(ShiftedClock::new());
    let refund_config = proving::demo::refund_config_for(&t.stack, &fast_settings()).unwrap();
    let event_config = proving::demo::event_config_for(&t.stack, &fast_settings()).unwrap();
    let refunds = payment_core::edges::bootstrap::build_refund_processor_on(
        &refund_config,
        &sdk,
        clock.clone(),
    )
    .await
    .unwrap();
    let inbox = payment_core::edges::bootstrap::build_event_processor_on(
        &event_config,
        &sdk,
        clock.clone(),
    )
    .await
    .unwrap();
    let methods = [
        ("card", 1000, "pm_card_visa"),
        ("debit", 2000, "pm_usBankAccount_success"),
        ("auth", 3000, "pm_card_authenticationRequired"),
        ("refundfail", 4000, "pm_card_refundFail"),
        ("dispute", 5000, "pm_card_createDispute"),
        ("late", 7000, "pm_card_visa"),
        ("sepa", 2500, "pm_usBankAccount_success"),
        ("sepafail", 1800, "pm_usBankAccount_accountClosed"),
    ];
    let mut payments = BTreeMap::new();
    for (name, _, _) in methods
        .iter()
        .chain([("lost", 6000, "pm_card_visa")].iter())
    {
        payments.insert(
            *name,
            Payment {
                pid: t.pid(name),
                last_change_day: 0,
            },
        );
    }
    let t_payments_table = t.stack.payments_table().unwrap().to_owned();
    let mut c = Calendar {
        ddb: aws_sdk_dynamodb::Client::new(&sdk),
        t,
        e,
        clock,
        refunds,
        inbox,
        day: 0,
        payments,
        delivered: Default::default(),
        lagging: BTreeMap::from([
            ("debit", 3),
            ("sepa", 15),
            ("sepafail", 15),
            ("refundfail", 25),
            ("dispute", 60),
        ]),
        tables: [refund_config.idempotency_table.clone(), t_payments_table],
        refund_records: payment_core::refunds::refund_store(
            aws_sdk_dynamodb::Client::new(&sdk),
            &refund_config.idempotency_table,
        ),
    };

    // Day 0.
    for (name, amount, method) in methods {
        c.t.send(&payment(&c.pid(name), amount, method)).await;
    }
    c.t.drain(1).await;
    let lost = c.pid("lost");
    c.t.fault(&lost, "drop_after_commit", Some(1), 0).await;
    c.t.send(&payment(&lost, 6000, "pm_card_visa")).await;
    c.t.invoke(c.t.receive_records(1).await).await;
    assert!(
        c.t.record(&lost).await.unwrap().unknown_outcome,
        "the answer was lost"
    );
    let rf = format!("{}-r1", c.pid("refundfail"));
    assert_eq!(c.refund("refundfail", &rf, None).await.done("refunded"), 1);
    // The lost charge is not completed yet: checked once reconcile settled it.
    let lost_entry = c.payments.remove("lost").unwrap();
    c.check().await;
    c.payments.insert("lost", lost_entry);

    // Day 1: reconcile settles the lost answer from the provider.
    c.go_to(1).await;
    let provider = payment_core::edges::bootstrap::provider_from(&c.t.config, &sdk)
        .await
        .unwrap();
    let settings = payctl::reconcile::ReconcileSettings {
        key_retention: Duration::from_secs(86_400),
        search_lag: Duration::from_secs(1),
        refund_window: Duration::from_secs(365 * 86_400),
    };
    let action = payctl::reconcile::reconcile_one_at(
        &c.t.store,
        &provider,
        &lost,
        settings,
        c.clock.now_ms(),
    )
    .await
    .unwrap();
    assert!(
        matches!(action, payctl::reconcile::Action::Settled(_)),
        "{action:?}"
    );
    c.changed("lost");
    // A refund of each slow debit, still processing here: held, acknowledged, nothing sent.
    let (sepa_r, sepafail_r) = (
        format!("{}-r1", c.pid("sepa")),
        format!("{}-r1", c.pid("sepafail")),
    );
    assert_eq!(c.refund("sepa", &sepa_r, Some(1000)).await.done("held"), 1);
    assert_eq!(
        c.refund("sepafail", &sepafail_r, None).await.done("held"),
        1
    );
    c.check().await;

    // Day 3: the bank debit's events, whose webhook was retried until today.
    c.go_to(3).await;
    let debit = c.pid("debit");
    c.deliver(&[debit], |l| kinds(l).contains(&"payment_intent.succeeded"))
        .await;
    c.changed("debit");
    c.check().await;

    // Day 15: the slow debits settle, one paid and one failed, after every dead-letter queue
    // would have dropped a refund waiting in it: the held refund is made once; the other stays
    // held, its amount reserved (the failed debit's customer may still pay).
    c.go_to(15).await;
    let (sepa, sepafail) = (c.pid("sepa"), c.pid("sepafail"));
    c.deliver(&[sepa, sepafail.clone()], |l| {
        kinds(l).contains(&"payment_intent.succeeded")
            && kinds(l).contains(&"payment_intent.payment_failed")
    })
    .await;
    let s = c
        .drain(&c.refunds, &c.t.stack.event_sources[REFUND_PROCESSOR])
        .await;
    println!("day  15: held refunds: {:?}", s.done);
    assert_eq!((s.done("refunded"), s.done("canceled")), (1, 0), "{s:?}");
    assert_eq!(c.t.ledger(&sepa_r).await.refunds[&sepa_r].len(), 1);
    assert!(!c
        .t
        .ledger(&sepafail_r)
        .await
        .refunds
        .contains_key(&sepafail_r));
    c.changed("sepa");
    c.changed("sepafail");
    c.check().await;

    // Day 25: the refund fails at the provider; the customers of the off-session payment and of
    // the failed debit come back and pay; the off-session payment is then refunded in part.
    c.go_to(25).await;
    c.deliver(std::slice::from_ref(&rf), |l| {
        kinds(l).contains(&"refund.failed")
    })
    .await;
    c.changed("refundfail");
    let auth = c.pid("auth");
    c.pays_again("auth").await;
    c.deliver(std::slice::from_ref(&auth), |l| {
        kinds(l).contains(&"payment_intent.succeeded")
    })
    .await;
    c.changed("auth");
    // The failed debit's customer pays it after all, by card: its refund, held since day 1, is
    // made.
    c.pays_again("sepafail").await;
    c.deliver(std::slice::from_ref(&sepafail), |l| {
        kinds(l).contains(&"payment_intent.succeeded")
    })
    .await;
    let s = c
        .drain(&c.refunds, &c.t.stack.event_sources[REFUND_PROCESSOR])
        .await;
    println!("day  25: held refunds: {:?}", s.done);
    assert_eq!(s.done("refunded"), 1, "{s:?}");
    assert_eq!(c.t.ledger(&sepafail_r).await.refunds[&sepafail_r].len(), 1);
    c.changed("sepafail");
    assert_eq!(
        c.refund("auth", &format!("{auth}-r1"), Some(1000))
            .await
            .done("refunded"),
        1
    );
    c.check().await;

    // Day 60: the dispute opens and its funds are withdrawn.
    c.go_to(60).await;
    let disputed = c.pid("dispute");
    let dispute_intent = c.t.ledger(&disputed).await.charges[&disputed][0].id.clone();
    c.deliver(std::slice::from_ref(&dispute_intent), |l| {
        kinds(l).contains(&"charge.dispute.created")
            && kinds(l).contains(&"charge.dispute.funds_withdrawn")
    })
    .await;
    c.changed("dispute");
    c.check().await;

    // Day 100: the merchant wins it.
    c.go_to(100).await;
    let books = c.t.sim.ledger().await.unwrap();
    let dispute_id = books.disputes[&dispute_intent]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    c.t.sim.close_dispute(&dispute_id, true).await.unwrap();
    c.deliver(&[dispute_intent], |l| {
        kinds(l).contains(&"charge.dispute.closed")
    })
    .await;
    c.changed("dispute");
    c.check().await;

    // Day 200: a refund long after the charge.
    c.go_to(200).await;
    let late = c.pid("late");
    assert_eq!(
        c.refund("late", &format!("{late}-r1"), Some(2000))
            .await
            .done("refunded"),
        1
    );
    c.check().await;

    // Day 400: what was last changed more than the refund window ago is gone; the rest holds.
    c.go_to(400).await;
    c.check().await;
    let ledger = DynamoRefundLedger::new(c.ddb.clone(), &c.t.config.idempotency_table);
    let mut alive = Vec::new();
    for (name, p) in &c.payments {
        if ledger.payment(&p.pid).await.unwrap().is_some() {
            alive.push(*name);
        }
    }
    assert_eq!(
        alive,
        ["dispute", "late"],
        "the ledgers changed within the last year"
    );
}
