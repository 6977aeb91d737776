//! Refunds: the refund processor as its function's environment builds it (the real
//! `RefundWork`, its DynamoDB ledger on the payment's record, the provider's refunds), and a
//! merchant refunding some charged payments days later: in full, a third of it, in two parts
//! that add up to the charge (a minute or days apart), twice under one refund id, and once more than is left; and some
//! sent once more when their record expires (a sweep's `late_refund_share`).

use std::sync::Arc;
use std::time::Duration;

use payment_core::refunds::ledger::DynamoRefundLedger;
use payment_core::refunds::work::{RefundProcessor, RefundWork};
use serde_json::json;
use sqs_once::SqsQueues;

use super::World;
use crate::dynamo::value::Value;
use crate::provider::client::Client;
use crate::sqs::url_of;

/// A refund the merchant sent.
#[derive(Debug, Clone)]
pub(super) struct RefundSent {
    /// The payment refunded.
    pub payment_id: String,
    /// Minor units asked (`None`: what is left).
    pub amount: Option<i64>,
}

/// A fresh refund processor instance (a cold start): the function's init, on the run's clients.
pub(super) fn instance(w: &World) -> Arc<RefundProcessor> {
    let cfg = &w.refunds.config;
    let pace = payment_core::edges::bootstrap::pace_of(cfg);
    let client = Client {
        provider: w.provider.clone(),
        pace: pace.clone(),
    };
    let dynamodb = crate::wire::dynamodb_client(&w.sdk);
    let ledger = DynamoRefundLedger::new(dynamodb.clone(), &cfg.idempotency_table)
        .with_payments_table(cfg.payments_table.clone());
    let work = RefundWork::new(
        Arc::new(client),
        Arc::new(ledger),
        cfg.provider_key_retention,
    )
    .with_refund_window(cfg.refund_window)
    .with_payment_record_ttl(cfg.settings.record_ttl)
    .with_clock(Arc::clone(&w.clock));
    let store = payment_core::refund_store(dynamodb, &cfg.idempotency_table)
        .with_clock(Arc::clone(&w.clock));
    let queues = SqsQueues::new(
        crate::wire::sqs_client(&w.sdk),
        cfg.dead_letter_queue_url.clone(),
    );
    let mut runner = RefundProcessor::new(
        Arc::new(work),
        Arc::new(store),
        Arc::new(queues),
        cfg.settings.clone(),
    )
    .with_clock(Arc::clone(&w.clock));
    if let Some(p) = pace {
        runner = runner.with_pace(p);
    }
    Arc::new(runner)
}

/// Maybe refunds a card payment just sent: some hours to ten days later (in the nightly batch
/// after that, when the merchant sends its refunds so).
pub(super) fn maybe_refund(w: &Arc<World>, n: usize, payment_id: &str, amount: i64) {
    if w.draw() >= w.opts.refund_share {
        return;
    }
    let mut after = Duration::from_secs_f64(7_200.0 + w.draw() * 10.0 * 86_400.0);
    if w.opts.nightly_refunds {
        // The nightly batch after the moment it would have been sent: 02:00 the next night.
        let at = w.clock.now_ms() + after.as_millis() as i64 - super::EPOCH_MS;
        let night = (at.div_euclid(86_400_000) + 1) * 86_400_000 + 2 * 3_600_000;
        after = Duration::from_millis((night - (w.clock.now_ms() - super::EPOCH_MS)) as u64);
    }
    // The last two days are quiet: every refund sent has ended by the run's end.
    let quiet_from = super::EPOCH_MS + ((w.opts.days - 2.0) * 86_400_000.0) as i64;
    if w.clock.now_ms() + after.as_millis() as i64 + 5 * 86_400_000 > quiet_from {
        return;
    }
    let kind = w.draw();
    let plan: Vec<(String, Option<i64>, u32)> = if kind < 0.4 {
        vec![(format!("r-{n:07}-a"), None, 1)]
    } else if kind < 0.5 {
        // A third of the charge: a refund made twice would have room to be.
        vec![(format!("r-{n:07}-a"), Some((amount / 3).max(1)), 1)]
    } else if kind < 0.75 {
        let half = amount / 2;
        vec![
            (format!("r-{n:07}-a"), Some(half), 1),
            (format!("r-{n:07}-b"), Some(amount - half), 1),
        ]
    } else if kind < 0.9 {
        // Sent twice: refunded once.
        vec![(format!("r-{n:07}-a"), Some(amount), 2)]
    } else {
        // The whole charge, then one more unit than is left: `refund_exceeds_charge`.
        vec![
            (format!("r-{n:07}-a"), Some(amount), 1),
            (format!("r-{n:07}-b"), Some(1), 1),
        ]
    };
    // Sent once more when the first refund's record expires ([`send_again`]).
    let late = w.opts.late_refund_share > 0.0 && w.draw() < w.opts.late_refund_share;
    let (w2, pid) = (Arc::clone(w), payment_id.to_owned());
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        // The merchant refunds what it saw charged or settling: until then it looks again daily
        // (a few times), and gives up on a payment that never was.
        let mut looks = 0;
        while !w2
            .provider
            .books
            .lock()
            .expect("books")
            .intents_of(&pid)
            .iter()
            .any(|i| matches!(i.status.as_str(), "succeeded" | "processing"))
        {
            looks += 1;
            if looks > 5 {
                return;
            }
            tokio::time::sleep(Duration::from_secs(86_400)).await;
        }
        let sqs = crate::wire::sqs_client(&w2.sdk);
        let url = url_of(&w2.refunds.queue);
        let mut resent = false;
        for (refund_id, amount, copies) in plan {
            w2.refunds_sent.lock().expect("refunds").insert(
                refund_id.clone(),
                RefundSent {
                    payment_id: pid.clone(),
                    amount,
                },
            );
            let mut body = json!({"refund_id": refund_id, "payment_id": pid});
            if let Some(a) = amount {
                body["amount"] = json!(a);
            }
            for _ in 0..copies {
                super::intake::sender::send(&w2, &sqs, &url, &body.to_string()).await;
            }
            if late && !resent {
                resent = true;
                w2.refunds_late
                    .lock()
                    .expect("late")
                    .insert(refund_id.clone(), body.to_string());
            }
            // The next part a minute later; in half the two-part plans, one to four days later
            // (the payment's record, extended by it, outlives the first part's).
            let next = if (0.625..0.75).contains(&kind) {
                86_400.0 * (1.0 + 3.0 * (kind - 0.625) / 0.125)
            } else {
                60.0
            };
            tokio::time::sleep(Duration::from_secs_f64(next)).await;
        }
    });
}

/// A refund the merchant sends once more: now that its record expired (the moment a second
/// copy finds no record of the first, while its payment's record, and the amount reserved on
/// it, may live on), unless the run's quiet end is near.
pub(super) fn send_again(w: &Arc<World>, refund_id: &str) {
    let Some(body) = w.refunds_late.lock().expect("late").remove(refund_id) else {
        return;
    };
    let quiet_from = super::EPOCH_MS + ((w.opts.days - 2.0) * 86_400_000.0) as i64;
    if w.clock.now_ms() + 86_400_000 >= quiet_from {
        return;
    }
    // Whether the payment's record lives on with the refund's amount reserved on it.
    let pid = w
        .refunds_sent
        .lock()
        .expect("refunds")
        .get(refund_id)
        .map(|r| r.payment_id.clone());
    let reserved = pid.is_some_and(|pid| {
        let aws = w.wire.aws.lock().expect("aws");
        aws.dynamo
            .tables
            .get(&w.refunds.config.idempotency_table)
            .and_then(|t| t.items.get(&format!("S:payment#{pid}")))
            .and_then(|i| i.get("refunds"))
            .is_some_and(|r| matches!(r, Value::M(m) if m.contains_key(refund_id)))
    });
    w.note(format!(
        "merchant: refund {refund_id} sent again, its record expired{}",
        if reserved {
            " (its payment's record holds its reservation)"
        } else {
            ""
        }
    ));
    let w2 = Arc::clone(w);
    tokio::spawn(async move {
        let sqs = crate::wire::sqs_client(&w2.sdk);
        let url = url_of(&w2.refunds.queue);
        super::intake::sender::send(&w2, &sqs, &url, &body).await;
    });
}

/// No refund is dead-lettered only for waiting: a refund's new dead letter that gave up
/// (`retries_exhausted`, or SQS's redrive) while its payment was still settling at the
/// provider (a debit `processing`, a customer yet to authenticate) pages an operator for a
/// normal business event, and its letter may outlive neither the debit nor the DLQ's retention;
/// one that gave up although the provider failed no request about its payment spent its
/// budget waiting (for the pace, for a record), not on failures. And no refund the provider made
/// is dead-lettered (whatever the code): the letter would have a person refund it by hand.
pub(super) fn check_dead_letters(w: &World) {
    // Each new letter: its id, the id of the message it was (itself when SQS moved it), its
    // code and body.
    let letters: Vec<(String, String, Option<String>, String)> = {
        let aws = w.wire.aws.lock().expect("aws");
        let Some(q) = aws.sqs.queues.get(&w.refunds.dlq) else {
            return;
        };
        let judged = w.refund_letters.lock().expect("letters");
        q.messages()
            .filter(|m| !judged.contains(&m.id))
            .map(|m| {
                let code = m.string_attribute("error_code").map(str::to_owned);
                let source = m.string_attribute("source_message_id").unwrap_or(&m.id);
                (m.id.clone(), source.to_owned(), code, m.body.clone())
            })
            .collect()
    };
    for (id, source, code, body) in letters {
        w.refund_letters.lock().expect("letters").insert(id);
        // A receive spent by a killed invocation: with a small maxReceiveCount a crash on a
        // message's last receive leaves it to SQS, which moves it without a reason; the
        // processor could not have done otherwise (and its redrive finds its record).
        // So is a twin SQS delivered of a message on its last receive: the redrive policy moves
        // it at its own next receive, and the processor never sees it.
        // (A letter the processor wrote is judged whatever befell the message before: on its
        // last receive it must have found a made refund by its record or its lookup.)
        let spent = code.is_none()
            && (w
                .wire
                .aws
                .lock()
                .expect("aws")
                .sqs
                .twinned
                .contains(&source)
                || w.crashed_on.lock().expect("crashed").contains(&source));
        if spent {
            continue;
        }
        // A refund the provider made (or is making) needs no person: a letter for it misleads
        // one into refunding by hand, twice.
        let rid = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["refund_id"].as_str().map(str::to_owned));
        if let Some(rid) = rid {
            let made = w
                .provider
                .books
                .lock()
                .expect("books")
                .refund_made_for(&rid);
            if let Some(made) = made {
                w.violated(
                    "no refund made and dead-lettered",
                    format!(
                        "{rid} dead-lettered {} although the provider's {made}",
                        code.as_deref().unwrap_or("max receives")
                    ),
                );
            }
        }
        if !matches!(code.as_deref(), None | Some("retries_exhausted")) {
            continue;
        }
        let Some(pid) = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["payment_id"].as_str().map(str::to_owned))
        else {
            continue;
        };
        let (settling, troubled): (Vec<String>, bool) = {
            let books = w.provider.books.lock().expect("books");
            let intents = books.intents_of(&pid);
            (
                intents
                    .iter()
                    .filter(|i| {
                        matches!(
                            i.status.as_str(),
                            "processing" | "requires_action" | "requires_confirmation"
                        )
                    })
                    .map(|i| format!("{} {}", i.id, i.status))
                    .collect(),
                intents.iter().any(|i| books.refund_trouble.contains(&i.id)),
            )
        };
        // DynamoDB or SQS down for hours spends a refund's budget on failures too (within the
        // retry horizon after the outage's end, with a day to spare).
        let now = w.clock.now_ms();
        let aws_down = [w.opts.dynamo_outage, w.opts.sqs_outage]
            .into_iter()
            .flatten()
            .map(super::outage_window)
            .any(|r| r.start <= now && now < r.end + 2 * 86_400_000);
        let crashed = w.crashed_on.lock().expect("crashed").contains(&source);
        if settling.is_empty() && !troubled && !aws_down && !crashed {
            // Its budget is spent by failures: a request about its payment the provider
            // failed, an outage of AWS, or (all but never, at the sweep's rates) crashes and
            // the tables' faults.
            w.violated(
                "no message dead-lettered only for waiting",
                format!(
                    "a refund of {pid} dead-lettered ({}) although the provider failed no request about its payment: {body}",
                    code.as_deref().unwrap_or("max receives"),
                ),
            );
        } else if !settling.is_empty() {
            w.violated(
                "no message dead-lettered only for waiting",
                format!(
                    "a refund of {pid} dead-lettered ({}) while its payment is {}: {body}",
                    code.as_deref().unwrap_or("max receives"),
                    settling.join(", ")
                ),
            );
        }
    }
}

/// A PaymentIntent's statuses (Stripe's, read here without the system's own parsers) from
/// which it may still be charged: settling, waiting for its customer, or failed and open to be
/// confirmed again (`requires_payment_method` is not final until it is `canceled`).
fn may_still_charge(status: &str) -> bool {
    matches!(
        status,
        "processing" | "requires_action" | "requires_confirmation" | "requires_payment_method"
    )
}

/// What a payment's record (`item`) reserves for refunds it holds while the provider may still
/// charge the payment (none made at the provider yet): not refunded, so not in the provider's
/// books. Read from the record's `held_refunds` and `refunds` maps; nothing held apart once the
/// payment cannot be charged any more (a held refund must have been resumed then).
pub(super) fn held_apart(
    books: &crate::provider::Books,
    payment_id: &str,
    item: &crate::dynamo::value::Item,
) -> i64 {
    if !books
        .intents_of(payment_id)
        .iter()
        .any(|i| may_still_charge(&i.status))
    {
        return 0;
    }
    let (Some(Value::M(held)), Some(Value::M(reserved))) =
        (item.get("held_refunds"), item.get("refunds"))
    else {
        return 0;
    };
    held.keys()
        .filter(|rid| !books.has_refund_for(rid))
        .filter_map(|rid| match reserved.get(rid) {
            Some(Value::N(n)) => n.parse::<i64>().ok(),
            _ => None,
        })
        .sum()
}

/// The refunds' invariants, once the system is quiet: the provider never refunded more than a
/// charge nor one refund id twice (as found at each write); every refund ended (its record
/// completed, or dead-lettered with a reason; `held` only while its payment may still be
/// charged); none canceled of a payment the provider charged; each payment's ledger (`refunded_amount`, less what it holds for refunds while the payment may still be charged, [`held_apart`]) equals
/// what the provider refunded of it.
pub(super) fn check_end(w: &World) {
    let breaches = std::mem::take(&mut w.provider.books.lock().expect("books").refund_breaches);
    for b in breaches {
        w.violated("each refund made at most once", b);
    }
    // Read what is needed and let the account go: reporting a violation writes the trace,
    // which folds into the account's digest.
    let aws = w.wire.aws.lock().expect("aws");
    let Some(items) = aws
        .dynamo
        .tables
        .get(&w.refunds.config.idempotency_table)
        .map(|t| t.items.clone())
    else {
        return;
    };
    let dead: std::collections::BTreeSet<String> = aws
        .sqs
        .queues
        .get(&w.refunds.dlq)
        .map(|q| {
            q.messages()
                .filter_map(|m| serde_json::from_str::<serde_json::Value>(&m.body).ok())
                .filter_map(|v| v["refund_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    drop(aws);
    // Items are kept by their key's canonical text (`S:<pk>` for the table's string key).
    let get = |pk: String| items.get(&format!("S:{pk}")).cloned();
    let sent = w.refunds_sent.lock().expect("refunds").clone();
    let books = w.provider.books.lock().expect("books");
    let mut payments = std::collections::BTreeSet::new();
    for (refund_id, r) in &sent {
        payments.insert(r.payment_id.clone());
        let record = get(format!("refund#{refund_id}"));
        let mut completed =
            record.as_ref().and_then(|i| i.get("status")) == Some(&Value::S("COMPLETED".into()));
        // `held` is an end only while its payment still settles at the provider (a customer
        // who never authenticates): one settled since must have been resumed, made or canceled.
        let outcome = record.as_ref().and_then(|i| match i.get("outcome") {
            Some(Value::M(m)) => m.get("status").cloned(),
            _ => None,
        });
        let held = outcome == Some(Value::S(payment_core::refunds::work::HELD.into()));
        let intents = books.intents_of(&r.payment_id);
        if completed && held && !intents.iter().any(|i| may_still_charge(&i.status)) {
            completed = false;
        }
        // Given up because its payment failed: only a payment the provider never charged.
        if outcome == Some(Value::S(payment_core::refunds::work::CANCELED.into())) {
            if let Some(i) = intents.iter().find(|i| i.status == "succeeded") {
                w.violated(
                    "no refund canceled of a payment charged",
                    format!(
                        "{refund_id} of {} ({:?}) was canceled as its payment failed, and {} is succeeded at the provider",
                        r.payment_id, r.amount, i.id
                    ),
                );
            }
        }
        // Dead-lettered: in the DLQ, or its mark kept (the letter may have passed its retention
        // after the operator read it).
        let marked = get(format!("refund_dead_letter#{refund_id}")).is_some();
        let expired = w.refunds_ended.lock().expect("ended").contains(refund_id);
        if !completed && !dead.contains(refund_id) && !marked && !expired {
            w.violated(
                "every refund ends",
                format!(
                    "{refund_id} of {} ({:?}) is neither completed nor dead-lettered{}",
                    r.payment_id,
                    r.amount,
                    if held {
                        " (held, and its payment settled)"
                    } else {
                        ""
                    }
                ),
            );
        }
    }
    for pid in payments {
        let Some(record) = get(format!("payment#{pid}")) else {
            continue;
        };
        let ledger = match record.get("refunded_amount") {
            Some(Value::N(n)) => n.parse::<i64>().unwrap_or(-1),
            _ => 0,
        };
        let ledger = ledger - held_apart(&books, &pid, &record);
        let intents = books.intents_of(&pid);
        let refunded: i64 = intents.iter().map(|i| books.refunded(&i.id)).sum();
        let charged: i64 = intents
            .iter()
            .filter(|i| i.status == "succeeded")
            .map(|i| i.amount)
            .sum();
        if ledger != refunded {
            w.violated(
                "every ledger equals the provider's books",
                format!("{pid}: the ledger says {ledger} refunded, the provider {refunded}"),
            );
        }
        if ledger > charged {
            w.violated(
                "no refund beyond its charge",
                format!("{pid}: {ledger} refunded of {charged}"),
            );
        }
    }
}
