//! The invariants, and the services' own time that can break them: debits settling, time to
//! live deleting, retention dropping.
//!
//! Why ~550 lines: each invariant is checked where the time that can break it passes (an
//! expiry, a drop at retention, the end), and its own oracle (the records' words for the
//! provider's statuses, the dead letters a crash or a duplicate left to SQS) sits beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::World;
use crate::dynamo::value::Value;
use crate::fnv;
use crate::provider::methods;

/// How long before the end the provider stops settling: longer than the webhook's latest copy
/// (three hours) and an event's retries.
const QUIET_MS: i64 = 6 * 3_600_000;

/// More copies of one message than this waiting in a source queue at once: something sends
/// it again faster than its copies end (a retry, a requeue or a resume each adds one; a
/// duplicate delivery, a webhook's retry, a merchant's second send a few).
const MAX_COPIES: usize = 20;

/// Hourly: no source queue holds more than [`MAX_COPIES`] copies of one message. A message
/// that multiplies is found here, before its copies have grown past what a run can simulate;
/// the world then stops (what it would do next only grows).
fn check_copies(w: &World) {
    let sources = [&w.queue, &w.refunds.queue, &w.events.queue];
    let found: Vec<(String, String, usize)> = {
        let aws = w.wire.aws.lock().expect("aws");
        aws.sqs
            .queues
            .iter()
            .filter(|(name, _)| sources.contains(name))
            .filter_map(|(name, q)| {
                let mut copies: BTreeMap<&str, usize> = BTreeMap::new();
                for m in q.messages() {
                    // A body no one can read (the producer's broken ones) is no one message.
                    if serde_json::from_str::<serde_json::Value>(&m.body).is_ok() {
                        *copies.entry(m.body.as_str()).or_default() += 1;
                    }
                }
                copies
                    .into_iter()
                    .max_by_key(|(_, n)| *n)
                    .filter(|(_, n)| *n > MAX_COPIES)
                    .map(|(body, n)| (name.clone(), body.to_owned(), n))
            })
            .collect()
    };
    for (queue, body, n) in found {
        w.violated(
            "no message multiplies",
            format!("{n} copies of one message wait in {queue}: {body}"),
        );
        w.halt();
    }
}

/// The provider's and AWS's own time, every ten minutes: debits settle, retention drops,
/// and (hourly, as lazily as DynamoDB's own sweep) time to live deletes.
pub(super) async fn housekeep(w: Arc<World>, end_ms: i64) {
    let seed = w.opts.seed;
    let mut tick: u64 = 0;
    while w.running(end_ms) {
        tokio::time::sleep(Duration::from_secs(600)).await;
        tick += 1;
        let now = w.clock.now_ms();
        // The provider's own changes stop a quiet period before the end, so that the end's
        // checks compare the books with a system that had the time to apply them.
        if now < end_ms - QUIET_MS {
            w.provider
                .books
                .lock()
                .expect("books")
                .settle(now, |i| is_failing(&w, &i.payment_id));
        }
        let (expired, dropped) = {
            let mut aws = w.wire.aws.lock().expect("aws");
            let expired = if tick.is_multiple_of(6) {
                aws.dynamo.expire(now.div_euclid(1000), &|table, key, at| {
                    // Up to 48 hours after `expires_at`, drawn per item from the seed.
                    (fnv(format!("{seed}/{table}/{key}/{at}").as_bytes()) % (48 * 3600)) as i64
                })
            } else {
                Vec::new()
            };
            (expired, aws.sqs.expire(now))
        };
        if tick.is_multiple_of(6) {
            check_copies(&w);
        }
        w.stats.lock().expect("stats").expired_records += expired.len();
        for (_, item) in expired {
            check_expiry(&w, &item);
        }
        for (queue, m) in dropped {
            // A dead letter the operator read, of a code the runbook never redrives, ends at
            // its retention: its reason is on record and the producer's fix is elsewhere.
            let read = w
                .seen
                .lock()
                .expect("seen")
                .as_ref()
                .is_some_and(|s| s.lock().expect("seen").contains(&m.id));
            let code = m.string_attribute("error_code");
            if (queue == w.dlq || queue == w.refunds.dlq || queue == w.events.dlq)
                && read
                && code.is_some_and(|c| payctl::dead_letter_codes::never_redriven(c).is_some())
            {
                continue;
            }
            w.violated(
                "no message lost at a queue's retention",
                format!(
                    "{} ({}, {}) dropped from {queue} after {} receives: {}",
                    m.id,
                    code.unwrap_or("no error_code"),
                    if read {
                        "read by the operator"
                    } else {
                        "never read"
                    },
                    m.receives,
                    m.body
                ),
            );
        }
        check_now(&w);
    }
}

fn is_failing(w: &World, payment_id: &str) -> bool {
    w.sent
        .lock()
        .expect("sent")
        .get(payment_id)
        .is_some_and(|s| s.method == methods::BANK_DEBIT_FAILS)
}

/// How long after a charge a cardholder disputes it: about 120 days (Stripe's "How disputes
/// work"), or the run's own dispute window when it is shorter (a sweep that shortens the refund
/// window shortens the provider's timeline with it). Refunds come later still, within the
/// merchant's refund window, which the record's lifetime follows.
pub(super) const DISPUTE_WINDOW_MS: i64 = 120 * 86_400_000;

/// A record deleted by time to live while the provider may still change what it records is
/// lost history: a late settlement, refund or dispute would find nothing. Still changeable: a
/// payment whose debit is `processing`, whose refund or dispute has a step to come at the
/// provider, or whose PaymentIntent is within the dispute window of its creation (a decline or
/// a customer's authentication can still be confirmed on-session, a charge disputed); a
/// refund whose status changes later. A refund's record that goes completed is an end of that
/// refund (its record is how the end-of-run check knows it ended).
fn check_expiry(w: &Arc<World>, item: &crate::dynamo::value::Item) {
    let Some(Value::S(pk)) = item.get("pk") else {
        return;
    };
    let now = w.clock.now_ms();
    let books = w.provider.books.lock().expect("books");
    if let Some(refund_id) = pk.strip_prefix("refund#") {
        if let Some(why) = books.pending_for_refund(refund_id) {
            w.violated(
                "no record deleted while the provider can still change it",
                format!("{pk} expired while {why}"),
            );
        }
        drop(books);
        if item.get("status") == Some(&Value::S("COMPLETED".into())) {
            w.refunds_ended
                .lock()
                .expect("ended")
                .insert(refund_id.to_owned());
        }
        super::refunds::send_again(w, refund_id);
        return;
    }
    let Some(pid) = pk.strip_prefix("payment#") else {
        return;
    };
    let window = DISPUTE_WINDOW_MS.min((w.opts.disputes.1 .1 * 86_400_000.0) as i64);
    let open = books.pending_for_payment(pid).or_else(|| {
        books
            .intents_of(pid)
            .into_iter()
            .find(|i| now < i.created_ms + window)
            .map(|i| {
                format!(
                    "{} is {} and {} days old, within the dispute window",
                    i.id,
                    i.status,
                    (now - i.created_ms) / 86_400_000
                )
            })
    });
    if let Some(why) = open {
        w.violated(
            "no record deleted while the provider can still change it",
            format!("{pk} expired while {why}"),
        );
    }
    // Quiet for its whole lifetime: its ledger is what the provider refunded (the end-of-run
    // check cannot see a record gone by then).
    let ledger = match item.get("refunded_amount") {
        Some(Value::N(n)) => n.parse::<i64>().unwrap_or(-1),
        _ => 0,
    } - super::refunds::held_apart(&books, pid, item);
    let refunded: i64 = books
        .intents_of(pid)
        .iter()
        .map(|i| books.refunded(&i.id))
        .sum();
    if ledger != refunded {
        w.violated(
            "every ledger equals the provider's books",
            format!("{pk} expired saying {ledger} refunded, the provider {refunded}"),
        );
    }
}

/// The invariants that hold at every step: what the provider's books found as it happened.
pub(super) fn check_now(w: &World) {
    let found: Vec<String> =
        std::mem::take(&mut w.provider.books.lock().expect("books").double_charges);
    for detail in found {
        w.violated("no payment charged twice", detail);
    }
    let again = {
        let mut aws = w.wire.aws.lock().expect("aws");
        aws.dynamo
            .tables
            .get_mut(&w.config.idempotency_table)
            .map(|t| std::mem::take(&mut t.findings))
            .unwrap_or_default()
    };
    for detail in again {
        w.violated("each record completed once per claim", detail);
    }
    super::refunds::check_dead_letters(w);
}

/// The model's S4, on every write to the idempotency table: a record is completed once for
/// each claim that completes it, so a write that completes a record already completed (a new
/// `completed_at`; every completion the code writes requires a record not completed) is a
/// second completion: a second charge counted, and a stale outcome written over one that an
/// event may have moved on since.
pub(super) fn completed_again(
    key: &str,
    before: Option<&crate::dynamo::value::Item>,
    after: Option<&crate::dynamo::value::Item>,
) -> Option<String> {
    // Every write to the table passes here: nothing is cloned unless it is a finding.
    let completed = |i: Option<&crate::dynamo::value::Item>| matches!(i.and_then(|i| i.get("status")), Some(Value::S(s)) if s == "COMPLETED");
    let (at_before, at_after) = (
        before.and_then(|i| i.get("completed_at")),
        after.and_then(|i| i.get("completed_at")),
    );
    (completed(before) && completed(after) && at_before != at_after).then(|| {
        format!(
            "{key} completed again at {:?} (completed at {:?})",
            at_after, at_before
        )
    })
}

/// The invariants of a quiet system, at the end.
pub(super) fn check_end(w: &World) {
    let aws = w.wire.aws.lock().expect("aws");
    let table = &w.config.idempotency_table;
    let Some(t) = aws.dynamo.tables.get(table) else {
        drop(aws);
        w.violated("the stack exists", format!("no table {table}"));
        return;
    };
    let mut dead: BTreeMap<String, usize> = BTreeMap::new();
    let mut dead_ids: BTreeSet<String> = BTreeSet::new();
    // Each letter of a payment: (payment id, code, amount asked, whether SQS moved it after
    // a crash or a duplicate delivery spent its receives: nothing the processor could help).
    let mut letters: Vec<(String, String, Option<i64>, bool)> = Vec::new();
    if let Some(q) = aws.sqs.queues.get(&w.dlq) {
        for m in q.messages() {
            let code = m
                .string_attribute("error_code")
                .unwrap_or("max_receives")
                .to_owned();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&m.body) {
                if let Some(id) = v["payment_id"].as_str() {
                    dead_ids.insert(id.to_owned());
                    let source = m.string_attribute("source_message_id").unwrap_or(&m.id);
                    let spent = m.string_attribute("error_code").is_none()
                        && (aws.sqs.twinned.contains(source)
                            || w.crashed_on.lock().expect("crashed").contains(source));
                    letters.push((id.to_owned(), code.clone(), v["amount"].as_i64(), spent));
                }
            }
            *dead.entry(code).or_default() += 1;
        }
    }
    let in_queue = aws.sqs.queues.get(&w.queue).map_or(0, |q| q.len());
    let records: BTreeMap<String, crate::dynamo::value::Item> = t
        .items
        .values()
        .filter_map(|i| match i.get("pk") {
            Some(Value::S(pk)) => pk
                .strip_prefix("payment#")
                .map(|p| (p.to_owned(), i.clone())),
            _ => None,
        })
        .collect();
    // The dead-letter marks, by payment: their code.
    let marks: BTreeMap<String, String> = t
        .items
        .values()
        .filter_map(|i| match (i.get("pk"), i.get("error_code")) {
            (Some(Value::S(pk)), Some(Value::S(code))) => pk
                .strip_prefix("dead_letter#")
                .map(|p| (p.to_owned(), code.clone())),
            _ => None,
        })
        .collect();
    drop(aws);
    for code in dead.keys() {
        if !payctl::dead_letter_codes::KNOWN_CODES.contains(&code.as_str()) {
            w.violated(
                "every dead letter has a code the runbook explains",
                format!("code {code}"),
            );
        }
    }
    if in_queue > 0 {
        w.violated(
            "every accepted payment ends",
            format!("{in_queue} messages still in the source queue at the end"),
        );
    }
    let sent = w.sent.lock().expect("sent").clone();
    let books = w.provider.books.lock().expect("books");
    for (pid, s) in &sent {
        let intents = books.intents_of(pid);
        let charged = intents
            .iter()
            .any(|i| matches!(i.status.as_str(), "succeeded" | "processing"));
        let record = records.get(pid);
        let status = record.and_then(|r| match r.get("status") {
            Some(Value::S(s)) => Some(s.as_str()),
            _ => None,
        });
        let ended = status == Some("COMPLETED")
            || dead_ids.contains(pid)
            || (record.is_none() && !intents.is_empty());
        if !ended {
            w.violated(
                "every accepted payment ends",
                format!(
                    "{pid} ({}) has record {status:?}, {} intents, no dead letter",
                    s.method,
                    intents.len()
                ),
            );
        }
        if status == Some("COMPLETED") {
            let outcome = record.and_then(|r| match r.get("outcome") {
                Some(Value::M(m)) => m.get("provider_payment_id").cloned(),
                _ => None,
            });
            if let Some(Value::S(pi)) = outcome {
                match intents.iter().find(|i| i.id == pi) {
                    None => w.violated(
                        "every ledger equals the provider's books",
                        format!("{pid}'s record names {pi}, which the provider does not hold"),
                    ),
                    Some(i) => {
                        let recorded = record.and_then(|r| match r.get("outcome") {
                            Some(Value::M(m)) => match m.get("status") {
                                Some(Value::S(s)) => Some(s.clone()),
                                _ => None,
                            },
                            _ => None,
                        });
                        if let Some(expected) = in_the_records_words(i) {
                            if recorded.as_deref() != Some(expected) {
                                w.violated(
                                    "every ledger equals the provider's books",
                                    format!("{pid}'s record says {recorded:?}, the provider's {pi} is {} ({expected} in the record's words)", i.status),
                                );
                            }
                        }
                        if let Some(r) = record {
                            check_disputes(w, pid, r, &books, &pi);
                        }
                    }
                }
            } else if charged {
                w.violated(
                    "every ledger equals the provider's books",
                    format!("{pid} is charged at the provider and its record names no intent"),
                );
            }
        }
    }
    // A dead letter says a payment needs a person; one the provider charged needs none, and a
    // person who acts on it (charges it by hand, tells the customer it failed) is misled. Only a
    // body that reused a charged payment's id with another amount is dead-lettered beside its
    // charge (`idempotency_key_reused`: that body is never charged).
    for (pid, code, amount, spent) in &letters {
        if *spent {
            continue;
        }
        let charged = books
            .intents_of(pid)
            .into_iter()
            .find(|i| matches!(i.status.as_str(), "succeeded" | "processing"));
        if let Some(i) = charged {
            if code == "idempotency_key_reused" && *amount != Some(i.amount) {
                continue;
            }
            w.violated(
                "no charged payment dead-lettered",
                format!(
                    "{pid} dead-lettered {code} although the provider's {} is {} ({} {})",
                    i.id, i.status, i.amount, i.currency
                ),
            );
        }
    }
    // A payment answered 202 whose message the queue cannot carry is set aside by the relay
    // (its mark reads `failed` at GET), never left pending for the row's life.
    let refused = w.refused.lock().expect("refused").clone();
    for pid in &refused.accepted {
        if records.contains_key(pid) {
            continue;
        }
        match marks.get(pid) {
            Some(code) if code == payment_core::payments::outbox::MESSAGE_REFUSED => {
                w.stats.lock().expect("stats").relay_set_aside += 1;
            }
            _ => w.violated(
                "a 202 is never followed by silence",
                format!("{pid} was accepted, never relayed, and nothing says so"),
            ),
        }
    }
    // Text no door may take (a card number, a character SQS refuses) is never charged, and a
    // payment sent with it straight to the queue is dead-lettered, not left in the queue.
    for (pid, why) in &refused.text {
        if !books.intents_of(pid).is_empty() {
            w.violated(
                "text no door may take is never sent to the provider",
                format!("{pid} with {why} in its text reached the provider"),
            );
        }
        // Its record, if it has one, holds the refusal (`rejected`), never a charge.
        let outcome = records.get(pid).and_then(|r| match r.get("outcome") {
            Some(Value::M(m)) => match m.get("status") {
                Some(Value::S(s)) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        });
        if outcome.as_deref().is_some_and(|s| s != "rejected") {
            w.violated(
                "text no door may take is never sent to the provider",
                format!("{pid} with {why} in its text has a record of {outcome:?}"),
            );
        }
    }
    drop(books);
    w.stats.lock().expect("stats").dead_letters = dead;
}

/// What a payment's record must say of its PaymentIntent, by docs/api.md's statuses, read
/// here without the system's own parsers (`provider::event`): `declined` for one back at
/// `requires_payment_method` (unless it failed for want of the customer's authentication:
/// `requires_action`, as the processor records an off-session charge that needed them); Stripe's
/// own word otherwise; nothing for one only created (`requires_confirmation` says nothing
/// settled).
fn in_the_records_words(i: &crate::provider::Intent) -> Option<&'static str> {
    Some(match i.status.as_str() {
        "requires_payment_method"
            if i.failure_code.as_deref() == Some("authentication_required") =>
        {
            "requires_action"
        }
        "requires_payment_method" => "declined",
        "requires_action" => "requires_action",
        "processing" => "processing",
        "succeeded" => "succeeded",
        "canceled" => "canceled",
        "requires_capture" => "requires_capture",
        _ => return None,
    })
}

/// A payment's record holds each dispute of its charge as the provider holds it (status and
/// amount), no other, and as disputed what the chargebacks among them hold.
fn check_disputes(
    w: &World,
    pid: &str,
    record: &crate::dynamo::value::Item,
    books: &crate::provider::Books,
    pi: &str,
) {
    use crate::provider::disputes::holds;
    use payment_core::events::settlement::DISPUTE_PREFIX;
    let number = |v: Option<&Value>| match v {
        Some(Value::N(n)) => n.parse::<i64>().unwrap_or(i64::MIN),
        _ => 0,
    };
    let recorded: BTreeMap<&str, (String, i64)> = record
        .iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix(DISPUTE_PREFIX)?;
            let Value::M(m) = v else {
                return Some((id, (format!("{v:?}"), 0)));
            };
            let status = match m.get("status") {
                Some(Value::S(s)) => s.clone(),
                _ => String::new(),
            };
            Some((id, (status, number(m.get("amount")))))
        })
        .collect();
    let theirs: BTreeMap<&str, (String, i64)> = books
        .disputes
        .values()
        .filter(|d| d.payment_intent == pi && d.opened())
        .map(|d| (d.id.as_str(), (d.status.clone(), d.amount)))
        .collect();
    if recorded != theirs {
        w.violated(
            "every ledger equals the provider's books",
            format!("{pid}'s record holds the disputes {recorded:?}, the provider {theirs:?}"),
        );
    }
    let held: i64 = theirs
        .values()
        .filter(|(s, _)| holds(s))
        .map(|(_, a)| a)
        .sum();
    let disputed = number(record.get("disputed_amount"));
    if disputed != held {
        w.violated(
            "every ledger equals the provider's books",
            format!(
                "{pid}'s record holds {disputed} as disputed, the provider's chargebacks {held}"
            ),
        );
    }
}
