//! The calls of one attempt, and the heartbeat that keeps its lease and its message while
//! they run.
//!
//! A call is sent only while the lease outlasts the call timeout plus the processing
//! allowance, so no call of an attempt can land after its lease ended. An outcome left unknown
//! is settled by a [`Work::lookup`] before any call that could land after the downstream forgot
//! the key (a paced call may wait for its slot until the lease allows: it is looked up first
//! whenever the lease ends after the key may be forgotten), and whenever the downstream
//! replays an error for it. An attempt that sent nothing because the pace had no slot in time
//! ends [`CallFailure::NotSent`]: waiting is not an attempt.

use std::sync::Mutex;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use backon::{BackoffBuilder, ExponentialBuilder};
use tracing::{error, info, warn, Instrument};

use crate::record::{Outcome, StoreError};
use crate::runner::{ms, visibility_extension, BatchRunner};
use crate::work::{AttemptContext, CallError, Work};

/// One attempt's hold on the record.
#[derive(Debug)]
pub(crate) struct Attempt {
    /// What the work sees of it (fencing token, lease end, first claim).
    pub(crate) context: AttemptContext,
    /// The latest time a call of an earlier attempt may still land downstream (its
    /// `not_before`, or the end of the expired lease taken over).
    pub(crate) landing_ms: Option<i64>,
}

impl<W: Work> BatchRunner<W> {
    /// The time a call needs inside the lease: the call timeout plus the downstream's
    /// processing allowance, so that no call can land after the lease ended.
    pub(crate) fn call_window_ms(&self) -> i64 {
        ms(self.work.call_timeout() + self.settings.processing_allowance)
    }

    /// Extends the message's visibility and the record's lease together, on one schedule,
    /// until the work ends (this future is dropped) or the lease is lost (it returns). Stops
    /// extending before the deadline and within SQS's 12-hour cap; work shorter than the first
    /// interval makes no call.
    pub(crate) async fn heartbeat(
        &self,
        msg: &SqsMessage,
        key: &str,
        attempt: &Attempt,
        deadline_ms: i64,
    ) -> CallFailure {
        let interval = self.settings.heartbeat_interval();
        let started = self.clock.now_ms();
        loop {
            tokio::time::sleep(interval).await;
            crate::failpoint!("in_heartbeat");
            let now = self.clock.now_ms();
            let visibility = visibility_extension(
                self.settings.visibility_timeout,
                Duration::from_millis((now - started).max(0) as u64),
            );
            if now + ms(interval) >= deadline_ms || visibility.is_zero() {
                // No more extensions: the lease runs out at the deadline (plus the margin)
                // and the message comes back when its visibility ends.
                return std::future::pending().await;
            }
            let lease_end = self.lease_end(now, deadline_ms);
            match self
                .store
                .renew_lease(key, &attempt.context.owner, lease_end)
                .await
            {
                Ok(()) => attempt.context.set_lease_end(lease_end),
                Err(StoreError::LeaseLost) => {
                    warn!("lease renewal refused: another attempt owns the record; stopping");
                    return CallFailure::LeaseLost;
                }
                Err(e) => {
                    warn!(error = %e, "lease renewal failed; will try again at the next beat");
                    continue;
                }
            }
            if let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) {
                let secs = visibility.as_secs() as i32;
                match self.queues.change_visibility(arn, rh, secs).await {
                    Ok(()) => crate::trace::event(
                        "visibility extended",
                        &[("messaging.aws_sqs.visibility_timeout_s", i64::from(secs))],
                    ),
                    Err(e) => warn!(error = %e, "could not extend the message's visibility"),
                }
            }
        }
    }

    /// Calls [`Work::execute`] with retries, each call only while the lease outlasts the call
    /// timeout plus the processing allowance, so no call of this attempt can land after its
    /// lease ended. An unknown outcome is settled by a lookup before any call that could land
    /// after the downstream forgot the key, and whenever the downstream replays an error.
    /// Nothing sent because the pace had no slot in time: [`CallFailure::NotSent`].
    pub(crate) async fn execute(
        &self,
        request: &W::Request,
        key: &str,
        attempt: &Attempt,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Result<Outcome, CallFailure> {
        let timed = |started: tokio::time::Instant| {
            if let Ok(mut l) = latencies.lock() {
                l.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        };
        let window = self.call_window_ms();
        // A call must also end before the invocation's answer is due: a call cut off at the
        // deadline would leave the outcome unknown for nothing.
        let cutoff_ms = deadline_ms - ms(self.settings.deadline_safety);
        let limit = || attempt.context.lease_end_ms().min(cutoff_ms);
        let forget_at = match self.work.key_retention() {
            Some(retention) => {
                attempt.context.first_attempt_at_ms + ms(retention)
                    - ms(self.settings.key_retention_margin)
            }
            None => i64::MAX,
        };
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.settings.call_retry_delay)
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build();
        // `mark`: what the record will say (sticky: only a completion clears it).
        // `must_look`: a blind call could act twice once the key may be forgotten; a
        // lookup that proves no effect lifts it until the next ambiguous answer.
        // `landing`: the latest time a call whose answer was not definitive may still land.
        let mut mark =
            attempt.context.inherited_unknown && !crate::mutation::on("unknown_mark_not_sticky");
        let mut must_look = attempt.context.inherited_unknown;
        let mut landing = attempt.landing_ms;
        let mut last: Option<CallError> = None;
        // Whether any call of this attempt reached the downstream, and the pace's last refusal.
        let mut sent_any = false;
        let mut refused: Option<i64> = None;
        let transient =
            |message: String, mark: bool, landing: Option<i64>, retry_at| CallFailure::Transient {
                message,
                unknown: mark,
                not_before: landing,
                retry_at,
            };
        for n in 0..self.settings.call_attempts.max(1) {
            if n > 0 {
                let Some(prev) = &last else { break };
                if !prev.retry_now || prev.replayed {
                    break;
                }
                let pause = delays
                    .next()
                    .unwrap_or_default()
                    .max(prev.retry_after.unwrap_or_default());
                if self.clock.now_ms() + ms(pause) + window >= limit() {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            // The latest this call may land: it starts by `bound - window` (after waiting for
            // its slot, when paced), and ends within its window.
            let bound = limit();
            if must_look && bound >= forget_at {
                // The downstream may have forgotten the key by the time this call lands: a
                // blind call could act a second time. Look first. (`bound`, not the time now:
                // a paced call may wait for its slot until its latest start.)
                match self.settle(request, &attempt.context, landing).await {
                    Lookup::Found(found) => return Ok(found),
                    Lookup::Nothing => {
                        info!("lookup proved no effect for the unknown outcome; calling");
                        must_look = false;
                        if !sent_any {
                            attempt
                                .context
                                .looked_up_nothing
                                .store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    Lookup::TooSoon(at) => return Err(transient(
                        "the downstream's lookup may not show a recent call yet; looking again later"
                            .into(),
                        true,
                        landing,
                        Some(at),
                    )),
                    Lookup::NotSent(at) if !sent_any => {
                        return Err(CallFailure::NotSent {
                            message: "not sent: the lookup of the unknown outcome had no request slot in time".into(),
                            next_slot_ms: Some(at),
                        })
                    }
                    Lookup::NotSent(_) => return Err(transient(
                        "the lookup of the unknown outcome had no request slot in time".into(),
                        true,
                        landing,
                        None,
                    )),
                    Lookup::Failed(e) => return Err(transient(e, true, landing, None)),
                }
            }
            let sent = self.clock.now_ms();
            let bound = bound.min(limit());
            if bound - sent <= window {
                break;
            }
            let call_started = tokio::time::Instant::now();
            // A paced request waits for its slot only while the call can still end in time.
            let latest_start =
                call_started + Duration::from_millis((bound - sent - window).max(0) as u64);
            // The work's spans (its downstream requests) are children of this attempt's.
            let span = crate::trace::otel_span!("execute", attempt = n + 1);
            let (answer, requests) = crate::pace::within(
                latest_start,
                crate::trace::in_attempt(
                    n as i64 + 1,
                    self.work.execute(request, &attempt.context),
                ),
            )
            .instrument(span.clone())
            .await;
            // Only reads reached the downstream before the pace refused a request (a work
            // that reads and then writes, or one whose every request reads): nothing changed.
            let reads_refused = (requests.refused.is_some() && self.work.reads_only(request))
                || (requests.only_read()
                    && !crate::mutation::on("a_read_before_a_refused_write_spends_the_attempt"));
            if answer.is_err() && (requests.none_sent() || reads_refused) {
                // Nothing reached the downstream (or only reads did): the pace had no slot
                // before the latest start.
                refused = requests
                    .refused
                    .map(|r| self.clock.now_ms() + r.next_in_ms as i64);
            } else {
                sent_any = true;
            }
            // A paced request may have waited for its slot: it was sent that much later, and
            // may land that much later.
            let waited = requests
                .last_start
                .map_or(Duration::ZERO, |at| at - call_started);
            let sent = sent + ms(waited);
            timed(call_started + waited);
            match answer {
                Ok(r) => return Ok(r),
                Err(e) => {
                    if e.ambiguous {
                        mark = true;
                        if !e.replayed {
                            // This call may have been executed, or still be, until then.
                            must_look = true;
                            landing = Some(landing.unwrap_or(0).max(sent + window));
                        }
                    }
                    if e.misconfigured {
                        error!(error = %e, "the downstream refused this process's credentials or URL: fix the configuration");
                    } else {
                        warn!(error = %e, attempt = n + 1, "call failed");
                    }
                    if e.replayed {
                        // Retrying the key replays the same error: only a lookup can tell.
                        return match self.settle(request, &attempt.context, landing).await {
                            Lookup::Found(found) => Ok(found),
                            Lookup::Nothing => Err(CallFailure::OutcomeUnknown {
                                message: format!(
                                    "the downstream replays an error for {key} ({e}) and its lookup, made {} after the last call could land, shows nothing for it; nothing is executed automatically: {}",
                                    if self.work.lookup_is_consistent() {
                                        "at once (a consistent listing)".to_owned()
                                    } else {
                                        format!("{} s or more", self.settings.search_lag.as_secs())
                                    },
                                    self.work.settle_hint(key)
                                ),
                                not_before: landing,
                            }),
                            Lookup::TooSoon(at) => Err(transient(
                                format!("the downstream replays an error ({e}); its lookup may not show a recent call yet, looking again later"),
                                true,
                                landing,
                                Some(at),
                            )),
                            Lookup::NotSent(at) => Err(transient(
                                format!("the downstream replays an error ({e}); its lookup had no request slot in time"),
                                true,
                                landing,
                                Some(at),
                            )),
                            Lookup::Failed(msg) => Err(transient(msg, true, landing, None)),
                        };
                    }
                    last = Some(e);
                }
            }
        }
        if !sent_any {
            // Only waited (for a slot, or for a claim slower than its allowance): not an attempt.
            return Err(CallFailure::NotSent {
                message: last.map(|e| e.to_string()).unwrap_or_else(|| {
                    "not sent: too little of the lease was left to call the downstream".into()
                }),
                next_slot_ms: refused,
            });
        }
        Err(transient(
            last.map(|e| e.to_string())
                .unwrap_or_else(|| "lease too short to call the downstream".into()),
            mark,
            landing,
            None,
        ))
    }

    /// Looks the key up downstream. What it finds settles the outcome; finding nothing proves
    /// no effect only once the lookup has had [`crate::Settings::search_lag`] to catch up with
    /// the last call that could have landed (`landing`).
    async fn settle(
        &self,
        request: &W::Request,
        context: &AttemptContext,
        landing: Option<i64>,
    ) -> Lookup {
        // Its requests wait for a slot only while the lease outlasts a call.
        let left = context.lease_end_ms() - self.clock.now_ms() - self.call_window_ms();
        let latest = tokio::time::Instant::now() + Duration::from_millis(left.max(0) as u64);
        let span = crate::trace::otel_span!("lookup");
        let (answer, requests) = crate::pace::within(latest, self.work.lookup(request, context))
            .instrument(span.clone())
            .await;
        let found = match answer {
            Err(_) if requests.none_sent() => Lookup::NotSent(
                self.clock.now_ms()
                    + requests
                        .refused
                        .map_or(0, |r| r.next_in_ms.min(i64::MAX as u64) as i64),
            ),
            Err(e) => Lookup::Failed(format!("lookup of an unknown outcome failed: {e}")),
            Ok(Some(found)) => {
                info!(status = %found.status, "lookup settled the unknown outcome");
                Lookup::Found(found)
            }
            Ok(None) => {
                let lag = if self.work.lookup_is_consistent() {
                    0
                } else {
                    ms(self.settings.search_lag)
                };
                let proof_at = landing.map_or(i64::MIN, |t| t + lag);
                if self.clock.now_ms() < proof_at {
                    info!(
                        look_again_in_s = (proof_at - self.clock.now_ms()) / 1000,
                        "lookup found nothing, but a recent call may not be visible to it yet"
                    );
                    Lookup::TooSoon(proof_at)
                } else {
                    Lookup::Nothing
                }
            }
        };
        let label = match &found {
            Lookup::Found(_) => "found",
            Lookup::Nothing => "nothing",
            Lookup::TooSoon(_) => "too_soon",
            Lookup::NotSent(_) => "not_sent",
            Lookup::Failed(_) => "failed",
        };
        crate::trace::set_attribute(&span, "idempotency.lookup", label);
        found
    }
}

/// What a lookup downstream established.
enum Lookup {
    /// The downstream holds this for the key: the record takes it as the outcome.
    Found(Outcome),
    /// Nothing, and the lookup has caught up with every call that could have landed: no effect.
    Nothing,
    /// Nothing yet, but the lookup may lag behind a recent call: look again at this epoch ms.
    TooSoon(i64),
    /// Not sent: the pace had no slot for it in time; the next one is at this epoch ms.
    NotSent(i64),
    /// The lookup failed (transient).
    Failed(String),
}

/// Why an attempt ended without a definitive answer.
#[derive(Debug)]
pub(crate) enum CallFailure {
    /// Retry on a later delivery; `unknown` when a call may have taken effect.
    Transient {
        /// The last error.
        message: String,
        /// The record's unknown-outcome mark (sticky: set by any ambiguous answer or inherited).
        unknown: bool,
        /// The record's `not_before`: the latest time a call may still land downstream.
        not_before: Option<i64>,
        /// The next delivery comes no earlier than this (a lookup that must wait for the
        /// downstream's lookup to catch up); `None`: the transient backoff.
        retry_at: Option<i64>,
    },
    /// No lookup can settle it: an operator does (dead-lettered as
    /// `outcome_unknown`).
    OutcomeUnknown {
        /// Why, for the dead letter.
        message: String,
        /// The record's `not_before`.
        not_before: Option<i64>,
    },
    /// Nothing reached the downstream in this attempt: the pace had no slot before the latest
    /// start a call allowed (or too little of the lease was left after the claim). The record
    /// is released as it was, and the message handed back as never attempted.
    NotSent {
        /// Why, for the log and the record's `last_error`.
        message: String,
        /// When the pace has its next slot, epoch ms (`None`: not a pace refusal).
        next_slot_ms: Option<i64>,
    },
    /// Another attempt took the record over: stop, complete nothing.
    LeaseLost,
}
