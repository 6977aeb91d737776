//! The operator: answers the dead-letter alarm after a delay, as the runbook says: reads the
//! dead letters (`payctl dlq list`, which keeps each one's code and reason for the record) and
//! redrives what can succeed (`payctl dlq redrive`, which leaves the codes never redriven in
//! place). Both are payctl's own code, over the SDK, against the models.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::World;
use crate::sqs::url_of;

/// How long the operator takes to answer an alarm (a working day).
pub(super) const ANSWER_AFTER: Duration = Duration::from_secs(8 * 3600);

/// The dead letters the operator has read (their reasons are on record), by message id.
pub(super) type Seen = Arc<Mutex<BTreeSet<String>>>;

/// Watches the dead-letter queue until `end_ms`; from the first letter on, answers after
/// [`ANSWER_AFTER`], then again at each later letter.
pub(super) async fn answer_alarms(w: Arc<World>, seen: Seen, end_ms: i64) {
    let sqs = crate::wire::sqs_client(&w.sdk);
    // The events' dead letters too (operate.md's events runbook: redrive what has no code:
    // a message SQS moved after a crash on its last receive).
    let pairs = [
        (w.dlq.clone(), w.queue.clone()),
        (w.refunds.dlq.clone(), w.refunds.queue.clone()),
        (w.events.dlq.clone(), w.events.queue.clone()),
    ];
    while w.running(end_ms) {
        tokio::time::sleep(Duration::from_secs(600)).await;
        let waiting: usize = {
            let aws = w.wire.aws.lock().expect("aws");
            let seen = seen.lock().expect("seen");
            pairs
                .iter()
                .filter_map(|(dlq, _)| aws.sqs.queues.get(dlq))
                .map(|q| q.messages().filter(|m| !seen.contains(&m.id)).count())
                .sum()
        };
        if waiting == 0 {
            continue;
        }
        w.note(format!(
            "alarm: {waiting} new dead letters; the operator answers in {ANSWER_AFTER:?}"
        ));
        tokio::time::sleep(ANSWER_AFTER).await;
        for (dlq, queue) in &pairs {
            let (dlq, queue) = (url_of(dlq), url_of(queue));
            match payctl::dlq::list(&sqs, &dlq, 10_000).await {
                Ok(letters) => {
                    let mut s = seen.lock().expect("seen");
                    let events = dlq == url_of(&w.events.dlq);
                    for l in &letters {
                        if s.insert(l.message_id.clone()) && events {
                            let code = l
                                .error_code
                                .clone()
                                .unwrap_or_else(|| "max_receives".into());
                            *w.stats
                                .lock()
                                .expect("stats")
                                .event_dead_letters
                                .entry(code)
                                .or_default() += 1;
                        }
                    }
                    w.note(format!(
                        "operator: read {} dead letters of {dlq}",
                        letters.len()
                    ));
                }
                Err(e) => w.note(format!("operator: dlq list failed: {e:#}")),
            }
            let opts = payctl::dlq::RedriveOptions {
                dlq_url: dlq.clone(),
                queue_url: queue.clone(),
                error_code: None,
                max: None,
                force: false,
            };
            match payctl::dlq::redrive(&sqs, &opts).await {
                Ok(r) => w.note(format!(
                    "operator: redrove {} of {dlq}, kept {:?}",
                    r.moved, r.kept
                )),
                Err(e) => w.note(format!("operator: redrive failed: {e:#}")),
            }
        }
    }
}

/// Watches the relay's alarms (its iterator over a minute behind, a batch given up) until
/// `end_ms`, and answers each after [`ANSWER_AFTER`] as the runbook says: `payctl outbox
/// republish` (the payment rows older than a minute the processor has never seen, sent again
/// with the relay's own code), then purges `RelayFailuresQueue`.
pub(super) async fn answer_relay_alarms(
    w: Arc<World>,
    relay: Arc<super::intake::relay::Mapping>,
    end_ms: i64,
) {
    let ddb = crate::wire::dynamodb_client(&w.sdk);
    let sqs = crate::wire::sqs_client(&w.sdk);
    let republisher = match super::intake::relay::build_for_operator(&w.sdk, &relay) {
        Ok(r) => r,
        Err(e) => {
            w.violated("relay_operator", format!("{e:#}"));
            return;
        }
    };
    while w.running(end_ms) {
        tokio::time::sleep(Duration::from_secs(600)).await;
        if !std::mem::take(&mut w.stats.lock().expect("stats").relay_alarm) {
            continue;
        }
        w.note(format!(
            "alarm: the relay; the operator answers in {ANSWER_AFTER:?}"
        ));
        tokio::time::sleep(ANSWER_AFTER).await;
        let before = w.clock.now_ms() - 60_000;
        let unseen = payctl::republish::unseen(
            &ddb,
            &relay.source.table,
            &w.config.idempotency_table,
            before,
        )
        .await;
        match unseen {
            Ok(entries) => {
                let report = payctl::republish::republish(&republisher, &entries).await;
                w.stats.lock().expect("stats").republished += report.sent as u64;
                w.note(format!(
                    "operator: outbox republish: {} of {} unseen rows sent{}",
                    report.sent,
                    entries.len(),
                    if report.first_failed.is_some() {
                        "; the rest next time"
                    } else {
                        ""
                    }
                ));
                if report.first_failed.is_some() {
                    w.stats.lock().expect("stats").relay_alarm = true;
                    continue;
                }
            }
            Err(e) => {
                w.note(format!("operator: outbox pending failed: {e:#}"));
                w.stats.lock().expect("stats").relay_alarm = true;
                continue;
            }
        }
        if let Some(url) = &relay.source.on_failure_queue_url {
            if let Err(e) = sqs.purge_queue().queue_url(url).send().await {
                w.note(format!("operator: purging RelayFailuresQueue failed: {e}"));
            }
        }
    }
}
