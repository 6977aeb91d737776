//! Sending a planned load through the payments API instead of straight into the queue (the
//! default of `make demo` and `make e2e-sam`), and checking what the API answered.
//!
//! Every valid payment is POSTed with `Idempotency-Key = payment_id` by several concurrent
//! clients at once; malformed bodies and reused keys must be refused with `400` and store
//! nothing. The answers are checked as a client sees them: one `202` creation per key, every
//! other answer for the key a replay of the same bytes. After processing, [`final_statuses`]
//! checks each payment's `GET` status against what the provider did.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use anyhow::Result;
use futures::future::join_all;

use crate::check::{Sent, OUTBOX_SENT};
use crate::load::{Expect, Planned};
use payctl::client::{Answer, ApiClient};

/// What the API did with a load.
#[derive(Debug, Default)]
pub struct ApiRun {
    /// One entry per accepted payment, for [`crate::check::verify`] (its message id is
    /// [`OUTBOX_SENT`] and the payment id: the relay, not the client, sends the messages).
    pub sent: Vec<Sent>,
    /// Requests made.
    pub requests: usize,
    /// Answers that were replays (`Idempotent-Replayed: true`).
    pub replays: usize,
    /// Requests refused with `400` as planned (malformed bodies, reused keys).
    pub refused: usize,
    /// Request latencies, ms.
    pub latencies_ms: Vec<f64>,
    /// Answers that break the API's contract.
    pub violations: Vec<String>,
}

/// The body of a raw queue message without its `payment_id` (the API takes it from the key).
fn api_body(body: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.remove("payment_id");
            serde_json::Value::Object(m).to_string()
        }
        _ => body.to_owned(),
    }
}

async fn timed(client: &ApiClient, key: &str, body: &str) -> (Result<Answer>, f64) {
    let t = Instant::now();
    let a = client.create(key, body).await;
    (a, t.elapsed().as_secs_f64() * 1e3)
}

/// POSTs `load` (`copies` concurrent requests per valid payment), checks every answer, and
/// remembers the first answer of each key across calls in `first_answers`.
pub async fn post_load(
    client: &ApiClient,
    load: &[Planned],
    copies: usize,
    first_answers: &mut HashMap<String, String>,
) -> Result<ApiRun> {
    let mut run = ApiRun::default();
    for (i, planned) in load.iter().enumerate() {
        let body = api_body(&planned.body);
        match (&planned.expect, &planned.payment_id) {
            (Expect::Invalid(code), _) => {
                // The body's own payment_id, if it has one, is the key (a bad one is a bad key).
                let key = serde_json::from_str::<serde_json::Value>(&planned.body)
                    .ok()
                    .and_then(|b| b["payment_id"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("invalid-{}-{i}", uuid::Uuid::new_v4().simple()));
                let (answer, ms) = timed(client, &key, &body).await;
                run.requests += 1;
                run.latencies_ms.push(ms);
                let answer = answer?;
                // 413: a body over 64 KiB, refused before parsing.
                if matches!(answer.status, 400 | 413) {
                    run.refused += 1;
                } else {
                    run.violations.push(format!(
                        "a {code} body was answered {}: {}",
                        answer.status, answer.body
                    ));
                }
            }
            (Expect::KeyReused, Some(id)) => {
                let (answer, ms) = timed(client, id, &body).await;
                run.requests += 1;
                run.latencies_ms.push(ms);
                let answer = answer?;
                let kind = answer
                    .json()
                    .ok()
                    .and_then(|j| j["error"]["type"].as_str().map(str::to_owned));
                if answer.status == 400 && kind.as_deref() == Some("idempotency_error") {
                    run.refused += 1;
                } else {
                    run.violations.push(format!(
                        "key {id} reused with another body was answered {}: {}",
                        answer.status, answer.body
                    ));
                }
            }
            (_, Some(id)) => {
                let answers = join_all((0..copies.max(1)).map(|_| timed(client, id, &body))).await;
                let mut created = 0;
                for (answer, ms) in answers {
                    run.requests += 1;
                    run.latencies_ms.push(ms);
                    let answer = answer?;
                    if answer.status != 202 {
                        run.violations.push(format!(
                            "payment {id} was answered {}: {}",
                            answer.status, answer.body
                        ));
                        continue;
                    }
                    if answer.replayed {
                        run.replays += 1;
                    } else {
                        created += 1;
                    }
                    let first = first_answers
                        .entry(id.clone())
                        .or_insert_with(|| answer.body.clone());
                    if *first != answer.body {
                        run.violations.push(format!(
                            "payment {id}: an answer differs from the first: {} vs {first}",
                            answer.body
                        ));
                    }
                }
                let earlier = run
                    .sent
                    .iter()
                    .any(|s| s.planned.payment_id.as_deref() == Some(id));
                if !earlier && planned.kind != "duplicate" {
                    if created != 1 {
                        run.violations.push(format!("payment {id}: {created} requests created it (one must, the rest replay)"));
                    }
                    run.sent.push(Sent {
                        planned: planned.clone(),
                        message_id: format!("{OUTBOX_SENT}{id}"),
                    });
                } else if created != 0 {
                    run.violations
                        .push(format!("payment {id} was created again by a retry"));
                }
            }
            (_, None) => run
                .violations
                .push("a valid planned payment without an id".into()),
        }
    }
    Ok(run)
}

impl ApiRun {
    /// Adds another run's counts.
    pub fn merge(&mut self, other: ApiRun) {
        self.sent.extend(other.sent);
        self.requests += other.requests;
        self.replays += other.replays;
        self.refused += other.refused;
        self.latencies_ms.extend(other.latencies_ms);
        self.violations.extend(other.violations);
    }
}

/// The `GET` status each accepted payment must end in.
fn expected_status(expect: &Expect) -> Option<&'static str> {
    match expect {
        Expect::Charged(s) => Some(s),
        Expect::RequiresAction => Some("requires_action"),
        Expect::Declined => Some("declined"),
        Expect::ProviderRejected => Some("failed"),
        _ => None,
    }
}

/// Reads every accepted payment back with `GET` and checks its status; returns the count of
/// each status seen and the violations.
pub async fn final_statuses(
    client: &ApiClient,
    sent: &[Sent],
) -> Result<(BTreeMap<String, usize>, Vec<String>)> {
    let mut seen = BTreeMap::new();
    let mut violations = Vec::new();
    for s in sent {
        let Some(id) = &s.planned.payment_id else {
            continue;
        };
        let answer = client.get(id).await?;
        let status = answer.json()?["status"].as_str().unwrap_or("?").to_owned();
        *seen.entry(status.clone()).or_default() += 1;
        let unsettled = status == "dead_lettered"
            && answer.json()?["error_code"]
                .as_str()
                .is_some_and(|c| matches!(c, "outcome_unknown" | "retries_exhausted"));
        match expected_status(&s.planned.expect) {
            Some(want) if want == status || unsettled => {}
            Some(want) => violations.push(format!(
                "GET {id}: status {status}, expected {want}: {}",
                answer.body
            )),
            None => {}
        }
    }
    Ok((seen, violations))
}

/// Waits until no accepted payment is `pending` or `processing` any more (relayed, processed,
/// and finished or dead-lettered), or `max` has passed.
pub async fn wait_settled(
    client: &ApiClient,
    sent: &[Sent],
    started: Instant,
    max: std::time::Duration,
) -> Result<()> {
    let ids: Vec<&str> = sent
        .iter()
        .filter_map(|s| s.planned.payment_id.as_deref())
        .collect();
    let mut open: Vec<&str> = ids.clone();
    while !open.is_empty() {
        if started.elapsed() > max {
            anyhow::bail!(
                "{} accepted payments were still pending or processing after {max:?} (first: {})",
                open.len(),
                open[0]
            );
        }
        let mut still = Vec::new();
        for id in open {
            let status = client.get(id).await?.json()?["status"]
                .as_str()
                .unwrap_or("?")
                .to_owned();
            if matches!(status.as_str(), "pending" | "processing") {
                still.push(id);
            }
        }
        open = still;
        if !open.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    Ok(())
}
