//! What `payctl run` needs around the processor to be an operator's tool: progress lines while
//! it works, and a summary that it prints however it stops, with an exit status that says
//! whether anything succeeded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_local::esm::EsmStats;
use serde::Serialize;
use tokio::sync::Mutex;

/// What a `payctl run` did, as printed and as `--json` writes it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Batches handed to the processor.
    pub invocations: u64,
    /// Deliveries received (a message that came back counts again).
    pub received: u64,
    /// Payments charged.
    pub charged: u32,
    /// Payments declined (recorded, final).
    pub declined: u32,
    /// Payments whose card needs the customer (`requires_action`): recorded, nothing charged.
    pub requires_action: u32,
    /// Payments the provider is still settling (`processing`): recorded, settled by its event.
    pub processing: u32,
    /// Refunds made (a refund run).
    pub refunded: u32,
    /// The provider's events that changed a payment, a refund or a dispute (an events run).
    pub events_applied: u32,
    /// Events that changed nothing (the state stored, or older), or that the inbox does not
    /// apply (another system's objects, other types).
    pub events_unchanged: u32,
    /// Copies of finished payments acknowledged without a charge.
    pub duplicates: u32,
    /// Deliveries handed back to come again later.
    pub retried: u32,
    /// Messages dead-lettered, by `error_code`.
    pub dead_lettered: BTreeMap<String, u32>,
    /// Messages finished under another label (`payment_unknown`, a refund released, ...).
    pub other_done: BTreeMap<String, u32>,
    /// Invocations that hit the function timeout.
    pub timeouts: u64,
    /// Invocations that failed as a whole.
    pub function_errors: u64,
    /// The messages of those invocations: they all come back.
    pub in_failed_batches: u64,
    /// Stopped by Ctrl-C or SIGTERM before the queue drained.
    pub interrupted: bool,
    /// Messages a run stopped at once (a second signal) left with the function: they come back
    /// after the queue's visibility timeout.
    pub left_in_flight: u64,
    /// Passing AWS failures (throttled, `5xx`, timeouts, lost answers) the pollers rode out.
    pub aws_failures: u64,
    /// Processed messages whose delete kept failing: they come back after the visibility
    /// timeout and are absorbed as duplicates.
    pub unacknowledged: u64,
}

/// The labels the summary counts under a name of their own; any other lands in `other_done`.
const NAMED_LABELS: [&str; 9] = [
    payment_core::payments::charge::labels::CHARGED,
    payment_core::payments::charge::labels::DECLINED,
    payment_core::payments::charge::labels::REQUIRES_ACTION,
    payment_core::payments::charge::labels::PROCESSING,
    payment_core::refunds::work::REFUNDED,
    payment_core::events::inbox::labels::APPLIED,
    payment_core::events::inbox::labels::UNCHANGED,
    payment_core::events::inbox::labels::FOREIGN,
    payment_core::events::inbox::labels::UNHANDLED,
];

impl RunSummary {
    /// The deliveries the buckets account for: every one received falls in exactly one, so
    /// this equals `received`.
    pub fn accounted(&self) -> u64 {
        let done = self.charged
            + self.declined
            + self.requires_action
            + self.processing
            + self.refunded
            + self.events_applied
            + self.events_unchanged
            + self.other_done.values().sum::<u32>()
            + self.duplicates
            + self.retried
            + self.dead_lettered.values().sum::<u32>();
        done as u64 + self.in_failed_batches
    }

    /// The summary of what the mapping counted.
    pub fn of(stats: &EsmStats, interrupted: bool) -> Self {
        Self {
            invocations: stats.invocations,
            received: stats.received,
            charged: stats
                .summary
                .done(payment_core::payments::charge::labels::CHARGED),
            declined: stats
                .summary
                .done(payment_core::payments::charge::labels::DECLINED),
            requires_action: stats
                .summary
                .done(payment_core::payments::charge::labels::REQUIRES_ACTION),
            processing: stats
                .summary
                .done(payment_core::payments::charge::labels::PROCESSING),
            other_done: stats
                .summary
                .done
                .iter()
                .filter(|(label, _)| !NAMED_LABELS.contains(&label.as_str()))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            refunded: stats.summary.done(payment_core::refunds::work::REFUNDED),
            events_applied: stats
                .summary
                .done(payment_core::events::inbox::labels::APPLIED),
            events_unchanged: {
                use payment_core::events::inbox::labels::{FOREIGN, UNCHANGED, UNHANDLED};
                [UNCHANGED, FOREIGN, UNHANDLED]
                    .iter()
                    .map(|l| stats.summary.done(l))
                    .sum()
            },
            duplicates: stats.summary.duplicates,
            retried: stats.summary.retried,
            dead_lettered: stats
                .summary
                .dead_lettered
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            timeouts: stats.timeouts,
            function_errors: stats.function_errors,
            in_failed_batches: stats.in_failed_batches,
            interrupted,
            left_in_flight: stats.in_flight,
            aws_failures: stats.aws_failures,
            unacknowledged: stats.unacknowledged,
        }
    }

    /// Nothing was handled and something failed: the run's exit status is then non-zero.
    /// Handled: charged, declined, waiting for the customer or the provider (recorded), a
    /// duplicate, or dead-lettered for what the message itself is (bad input, a reused key,
    /// the provider's refusal, too old). Failed: handed back to
    /// come again, given up on (`retries_exhausted`), left unknown (`outcome_unknown`), timed
    /// out, or a whole batch failed (a wrong table or queue, provider down, a bad key).
    pub fn all_failed(&self) -> bool {
        let for_content = |code: &str| crate::dlq::never_redriven(code).is_some();
        let handled = (self.charged
            + self.declined
            + self.requires_action
            + self.processing
            + self.other_done.values().sum::<u32>()
            + self.refunded
            + self.events_applied
            + self.events_unchanged
            + self.duplicates) as u64
            + self
                .dead_lettered
                .iter()
                .filter(|(code, _)| for_content(code))
                .map(|(_, n)| *n as u64)
                .sum::<u64>();
        let failed = self.retried as u64
            + self
                .dead_lettered
                .iter()
                .filter(|(code, _)| !for_content(code))
                .map(|(_, n)| *n as u64)
                .sum::<u64>()
            + self.timeouts
            + self.function_errors;
        handled == 0 && failed > 0
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let dead: u32 = self.dead_lettered.values().sum();
        let codes = if self.dead_lettered.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                self.dead_lettered
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!(
            "{}{} deliveries in {} batches: {}{} charged, {} declined, {} requires_action, {} processing, {}{} duplicates, {} retried later, {} dead-lettered{codes}; {} timeouts, {} failed batches ({} messages, all coming back)",
            if self.interrupted { "interrupted: " } else { "" },
            self.received,
            self.invocations,
            match (self.refunded, self.events_applied + self.events_unchanged) {
                (0, 0) => String::new(),
                (r, 0) => format!("{r} refunded, "),
                (_, _) => format!(
                    "{} events applied, {} unchanged, ",
                    self.events_applied, self.events_unchanged
                ),
            },
            self.charged,
            self.declined,
            self.requires_action,
            self.processing,
            self.other_done
                .iter()
                .map(|(k, v)| format!("{v} {k}, "))
                .collect::<String>(),
            self.duplicates,
            self.retried,
            dead,
            self.timeouts,
            self.function_errors,
            self.in_failed_batches
        ) + &if self.left_in_flight > 0 {
            format!(
                "; {} left in flight, back after the queue's visibility timeout",
                self.left_in_flight
            )
        } else {
            String::new()
        } + &if self.aws_failures > 0 {
            format!(
                "; rode out {} AWS failures ({} processed messages not deleted: they come back as duplicates)",
                self.aws_failures, self.unacknowledged
            )
        } else {
            String::new()
        }
    }
}

/// When messages received now come back if nobody answers them: the visibility timeout given
/// to the receives, else the queue's, from now (an extension the function made was earlier).
pub async fn back_after_visibility(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    given: Option<i32>,
) -> String {
    let seconds = match given {
        Some(s) => Some(s as i64),
        None => sqs
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
            .send()
            .await
            .ok()
            .and_then(|a| {
                a.attributes()
                    .and_then(|m| m.get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout))
                    .and_then(|v| v.parse().ok())
            }),
    };
    match seconds {
        Some(s) => format!(
            "within the visibility timeout ({s} s): by {}",
            crate::time::utc(sqs_once::runner::now_ms() + s * 1000)
        ),
        None => "after the queue's visibility timeout".to_owned(),
    }
}

/// Prints a progress line to stderr every `every`, with the queue's own counts, until dropped.
pub fn progress(
    stats: Arc<Mutex<EsmStats>>,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let (s, next) = {
                let stats = stats.lock().await;
                (
                    RunSummary::of(&stats, false),
                    next_back(&stats, sqs_once::runner::now_ms()),
                )
            };
            let counts = queue_counts(&sqs, &queue_url, next).await;
            crate::say!("{} | queue: {counts}", s.line());
        }
    })
}

async fn queue_counts(sqs: &aws_sdk_sqs::Client, queue_url: &str, next: Option<i64>) -> String {
    match lambda_local::esm::queue_counts(sqs, queue_url).await {
        Ok([waiting, in_flight, delayed]) => {
            let waits = match (waiting, in_flight, next) {
                (0, 1.., Some(at)) => format!("; {}", back_at(at, sqs_once::runner::now_ms())),
                _ => String::new(),
            };
            format!("{waiting} waiting, {in_flight} in flight, {delayed} delayed{waits}")
        }
        Err(_) => "counts unavailable".into(),
    }
}

/// The earliest time after `now_ms` at which a message this run handed back comes back.
pub fn next_back(stats: &EsmStats, now_ms: i64) -> Option<i64> {
    stats
        .summary
        .returns_at_ms
        .iter()
        .copied()
        .filter(|t| *t > now_ms)
        .min()
}

/// "the next handed-back message comes back at 16:54:11Z (in 312 s)".
pub fn back_at(at_ms: i64, now_ms: i64) -> String {
    format!(
        "the next handed-back message comes back at {} (in {} s)",
        crate::time::utc(at_ms),
        ((at_ms - now_ms).max(0) as u64).div_ceil(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_return_is_the_earliest_still_ahead() {
        let mut stats = EsmStats::default();
        stats.summary.returns_at_ms = vec![5_000, 20_000, 12_000];
        assert_eq!(next_back(&stats, 6_000), Some(12_000));
        assert_eq!(next_back(&stats, 20_000), None);
        assert_eq!(
            back_at(12_000, 6_500),
            "the next handed-back message comes back at 1970-01-01T00:00:12.000Z (in 6 s)"
        );
    }
}
