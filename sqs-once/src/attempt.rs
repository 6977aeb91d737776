//! One message: parse, claim, execute, complete (or dead-letter, or come back later).
//!
//! The calls themselves, with the heartbeat that keeps the lease and the message, are in
//! `call.rs`, with the [`Attempt`] they act for (one floor down: `call.rs` never reaches back
//! here).
//!
//! Why ~540 lines: the claim's conflict decisions, the completion and the dead-lettering are
//! one sequence that reads top to bottom; their spans and outcomes for the trace are a few
//! lines each where they happen.

use std::sync::atomic::AtomicI64;
use std::sync::Mutex;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use tracing::{debug, info, warn, Instrument};

use crate::call::{Attempt, CallFailure};
use crate::queue::DeadLetter;
use crate::record::{
    decide_conflict, inherits_unknown_outcome, ClaimRequest, ClaimResult, ConflictDecision,
    DeadLetterMark, FailureNote, IdempotencyRecord, StoreError, KEY_REUSED,
};
use crate::redelivery::Redelivery;
use crate::runner::{first_sent_at_ms, ms, BatchRunner, Disposition};
use crate::settings::CLOCK_SKEW_MS;
use crate::trace::Outcome;
use crate::work::{AttemptContext, Redaction, Verdict, Work};

/// The outcome field (and dead letter attribute) naming who sent the message: its `SenderId`,
/// as SQS recorded it (the IAM user or role session, never the message's own word).
pub const SENDER_ID: &str = "sender_id";

/// The message's `SenderId` system attribute.
fn sender_of(msg: &SqsMessage) -> Option<&str> {
    msg.attributes
        .get("SenderId")
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// Where the message stands after the claim.
enum Claimed {
    /// We hold the lease.
    Owner(Attempt),
    /// Nothing to execute: the disposition is known.
    Done(Disposition),
}

/// The end of one message's work before the batch reports it.
pub(crate) enum Step {
    /// Finished: acknowledged or dead-lettered.
    Done(Disposition),
    /// Must come back, for this reason, not before the delay [`Redelivery`] decides.
    Again(String, Redelivery),
}

impl<W: Work> BatchRunner<W> {
    /// Processes one message; one that must come back is handed back with its delay.
    pub async fn process(
        &self,
        msg: &SqsMessage,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Disposition {
        self.process_step(msg, deadline_ms, latencies).await.0
    }

    /// [`BatchRunner::process`], also saying when the downstream's pace has its next slot if
    /// the message only waited for it (its FIFO followers then wait with it).
    pub(crate) async fn process_step(
        &self,
        msg: &SqsMessage,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> (Disposition, Option<i64>) {
        match self.decide(msg, deadline_ms, latencies).await {
            Step::Done(d) => {
                // A success is a debug line: at the default level a batch logs its counts (the
                // EMF line) and one line per message that did not simply succeed (dead-lettered
                // and handed-back messages say so where it happens).
                debug!(disposition = %d, "message done");
                (d, None)
            }
            Step::Again(reason, when) => {
                let paced = match when {
                    Redelivery::Paced(at) => Some(at),
                    _ => None,
                };
                (self.give_back(msg, reason, when).await, paced)
            }
        }
    }

    async fn decide(
        &self,
        msg: &SqsMessage,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Step {
        let body = msg.body.clone().unwrap_or_default();
        let request = match self.work.parse(&body) {
            Ok(r) => r,
            Err(e) => {
                let redaction = self.work.redact(&body);
                return Step::Done(
                    self.dead_letter(msg, &body, &e.code, &e.message, None, redaction)
                        .await,
                );
            }
        };
        let key = self.work.key(&request);
        // A key this release refuses (a card number) is never claimed, logged or marked: only
        // an earlier release's record under it is taken up, and then logged masked.
        let refused_key = self.work.refused_unless_recorded(&request);
        if let Some(refusal) = &refused_key {
            match self.store.get(&key).await {
                Ok(None) => {
                    let redaction = self.work.redact_refused(&request, &body);
                    return Step::Done(
                        self.dead_letter(
                            msg,
                            &body,
                            &refusal.code,
                            &refusal.message,
                            None,
                            redaction,
                        )
                        .await,
                    );
                }
                Ok(Some(_)) => {}
                Err(e) => {
                    return Step::Again(
                        format!("reading the record of a refused key: {e}"),
                        Redelivery::Backoff,
                    )
                }
            }
        }
        let shown = match refused_key {
            Some(_) => self
                .work
                .redact(&key)
                .map_or_else(|| key.clone(), |r| r.body),
            None => key.clone(),
        };
        tracing::Span::current().record("key", shown.as_str());
        crate::trace::on_message("idempotency.key", shown.as_str());
        let now = self.clock.now_ms();
        if let Some(sent) = first_sent_at_ms(msg) {
            if now - sent > ms(self.settings.record_ttl) - CLOCK_SKEW_MS {
                let why = self.expired_reason(&key, now - sent).await;
                return Step::Done(
                    self.dead_letter(msg, &body, "request_expired", &why, Some(&request), None)
                        .await,
                );
            }
        }

        // A paced downstream: the slots of the attempt's requests are booked before anything
        // is claimed, no later than a call can still be sent in this invocation; a message
        // whose slots would come later is handed back unattempted (no claim, no receive budget
        // spent).
        let Some(pace) = self
            .pace
            .as_ref()
            .filter(|_| self.work.paces_first_call(&request))
        else {
            return self
                .claim_and_run(msg, &body, &request, &key, now, deadline_ms, latencies)
                .await;
        };
        let latest_ms = deadline_ms
            - ms(self.settings.deadline_safety)
            - self.call_window_ms()
            - ms(self.claim_times.allowance());
        if latest_ms <= now {
            // It waited for a permit past the last start a call could end from (a batch larger
            // than the invocation can finish): handed back unattempted, as the runner hands
            // back what it cannot start, not claimed to fail.
            return Step::Again(
                "not attempted: no call could start and end before this invocation's deadline"
                    .to_owned(),
                Redelivery::NotAttempted,
            );
        }
        let latest = tokio::time::Instant::now() + Duration::from_millis((latest_ms - now) as u64);
        let requests = if crate::mutation::on("an_attempt_books_only_its_first_slot") {
            1
        } else {
            self.work.requests_per_attempt(&request)
        };
        let slots = match pace.book_many(requests, latest) {
            Ok(slots) => slots,
            Err(e) => {
                // A copy of a message whose record is completed makes no request (its claim
                // finds the outcome): it ends now, instead of waiting for the pace with the
                // messages that need it (a duplicate, a requeued copy, a redrive).
                let done = matches!(
                    self.store.get(&key).await,
                    Ok(Some(r)) if r.status == crate::record::RecordStatus::Completed
                );
                if done && !crate::mutation::on("a_done_copy_waits_for_the_pace") {
                    return self
                        .claim_and_run(msg, &body, &request, &key, now, deadline_ms, latencies)
                        .await;
                }
                return Step::Again(e.to_string(), Redelivery::Paced(now + e.next_in_ms as i64));
            }
        };
        tokio::time::sleep_until(slots[0]).await;
        let now = self.clock.now_ms();
        pace.with_booked(
            slots,
            self.claim_and_run(msg, &body, &request, &key, now, deadline_ms, latencies),
        )
        .await
    }

    /// Who sent the message, as kept: its `SenderId` through the work's redaction (a role
    /// session's name is the caller's choice of text). The sender of this delivery: a copy the
    /// runner requeued, or a redrive, names who sent that.
    fn sender_shown(&self, msg: &SqsMessage) -> Option<String> {
        sender_of(msg).map(|s| self.work.redact(s).map_or_else(|| s.to_owned(), |r| r.body))
    }

    /// Claims the record, runs the calls with the heartbeat, and records what they ended in.
    #[allow(clippy::too_many_arguments)]
    async fn claim_and_run(
        &self,
        msg: &SqsMessage,
        body: &str,
        request: &W::Request,
        key: &str,
        now: i64,
        deadline_ms: i64,
        latencies: &Mutex<Vec<f64>>,
    ) -> Step {
        let attempt = match self.claim(msg, body, request, key, now, deadline_ms).await {
            Ok(Claimed::Owner(attempt)) => attempt,
            Ok(Claimed::Done(d)) => return Step::Done(d),
            Err(again) => return again,
        };
        crate::failpoint!("after_claim");

        // The calls and the heartbeat run together; a lost lease stops the calls.
        let executed = tokio::select! {
            biased; // in order, so a seed replays; a taken outcome's completion is still fenced
            r = self.execute(request, key, &attempt, deadline_ms, latencies) => r,
            lost = self.heartbeat(msg, key, &attempt, deadline_ms) => Err(lost),
        };
        let owner = &attempt.context.owner;
        match executed {
            Ok(outcome) => {
                crate::failpoint!("after_execute");
                // Kept longer than the record retention when the work asks, never shorter.
                let keep_until = self
                    .work
                    .retention_after(&outcome)
                    .map(|d| (self.clock.now_ms() + ms(d.max(self.settings.record_ttl))) / 1000);
                // The record says who sent the message it completed (PCI DSS 10.2: who did it).
                let outcome = match self.sender_shown(msg) {
                    Some(sender) if outcome.text(SENDER_ID).is_none() => {
                        outcome.with_text(SENDER_ID, sender)
                    }
                    _ => outcome,
                };
                match self
                    .store
                    .complete(key, owner, &outcome, keep_until)
                    .instrument(crate::trace::otel_span!("complete"))
                    .await
                {
                    Ok(()) => {}
                    Err(StoreError::LeaseLost) => {
                        return Step::Again(
                            "lease lost before completion; another attempt owns the key".into(),
                            Redelivery::Soon,
                        )
                    }
                    Err(e) => {
                        // The lease is still ours until it ends; the next delivery takes the
                        // record over as an unknown outcome and gets the downstream's replay.
                        return Step::Again(
                            format!("completing the record failed: {e}"),
                            Redelivery::Backoff,
                        );
                    }
                }
                crate::failpoint!("after_complete");
                Step::Done(match self.work.verdict(&outcome) {
                    Verdict::DeadLetter { code, reason } => {
                        self.dead_letter(msg, body, &code, &reason, Some(request), None)
                            .await
                    }
                    Verdict::Done(label) => Disposition::Done(label),
                })
            }
            Err(CallFailure::LeaseLost) => Step::Again(
                "lease lost while working; another attempt owns the key".into(),
                Redelivery::Soon,
            ),
            Err(CallFailure::NotSent {
                message,
                next_slot_ms,
            }) => {
                // Nothing reached the downstream: the record is released as it was (its mark
                // and `not_before` are the inherited ones) and the message comes back as never
                // attempted, when the pace has a slot.
                self.record_failure(
                    key,
                    owner,
                    &message,
                    attempt.context.inherited_unknown,
                    attempt.landing_ms,
                )
                .await;
                let when = next_slot_ms.map_or(Redelivery::NotAttempted, Redelivery::Paced);
                Step::Again(message, when)
            }
            Err(CallFailure::Transient {
                message,
                unknown,
                not_before,
                retry_at,
            }) => {
                self.record_failure(key, owner, &message, unknown, not_before)
                    .await;
                let when = match (retry_at, not_before) {
                    (Some(t), _) => Redelivery::At(t),
                    (None, Some(t)) => Redelivery::BackoffAfter(t),
                    (None, None) => Redelivery::Backoff,
                };
                Step::Again(message, when)
            }
            Err(CallFailure::OutcomeUnknown {
                message,
                not_before,
            }) => {
                self.record_failure(key, owner, &message, true, not_before)
                    .await;
                Step::Done(
                    self.dead_letter(msg, body, "outcome_unknown", &message, Some(request), None)
                        .await,
                )
            }
        }
    }

    /// The `request_expired` reason: how old the message is, and whether the key has a record
    /// (then it says what the record holds: an effect may exist).
    async fn expired_reason(&self, key: &str, age_ms: i64) -> String {
        let head = format!(
            "first sent {} s ago, longer than the record retention of {} s: this message is not processed",
            age_ms / 1000,
            self.settings.record_ttl.as_secs()
        );
        match self.store.get(key).await {
            Ok(Some(r)) => format!(
                "{head}; {key} has a record (status {}{}): look at it before sending it again",
                r.status.as_str(),
                r.outcome
                    .as_ref()
                    .map(|o| format!(", outcome {}", o.status))
                    .unwrap_or_default(),
            ),
            Ok(None) => format!(
                "{head}; no record exists for {key} (a record older than the retention has expired)"
            ),
            Err(e) => format!("{head}; whether a record exists could not be read: {e}"),
        }
    }

    async fn record_failure(
        &self,
        key: &str,
        owner: &str,
        error: &str,
        unknown: bool,
        not_before: Option<i64>,
    ) {
        let note = FailureNote {
            error: error.to_owned(),
            unknown_outcome: unknown,
            not_before_ms: not_before,
        };
        if let Err(se) = self
            .store
            .fail(key, owner, self.clock.now_ms(), &note)
            .await
        {
            warn!(error = %se, "could not record the failure; the lease will expire instead");
        }
    }

    /// Claims the record; returns the lease, the disposition the conflict decides, or when
    /// the message must come back.
    async fn claim(
        &self,
        msg: &SqsMessage,
        body: &str,
        request: &W::Request,
        key: &str,
        now: i64,
        deadline_ms: i64,
    ) -> Result<Claimed, Step> {
        let lease_end_ms = self.lease_end(now, deadline_ms);
        if lease_end_ms - now <= self.call_window_ms() {
            return Err(Step::Again(
                "too little time left in this invocation to execute".into(),
                Redelivery::NotAttempted,
            ));
        }
        let mut hash = self.work.fingerprint(request);
        let owner = crate::token::new();
        let mut claim = ClaimRequest {
            traceparent: crate::trace::current_traceparent(),
            key: key.to_owned(),
            payload_hash: hash.clone(),
            owner: owner.clone(),
            now_ms: now,
            lease_expires_at_ms: lease_end_ms,
            expires_at_s: (now + ms(self.settings.record_ttl)) / 1000,
        };
        let attempt = |unknown: bool, first: Option<i64>, landing: Option<i64>| Attempt {
            context: AttemptContext {
                owner: owner.clone(),
                first_attempt_at_ms: first.filter(|t| *t > 0).unwrap_or(now),
                inherited_unknown: unknown,
                lease_end_ms: AtomicI64::new(lease_end_ms),
                deadline_ms,
                looked_up_nothing: Default::default(),
            },
            landing_ms: landing,
        };
        let existing = loop {
            let started = tokio::time::Instant::now();
            let claimed = self
                .store
                .claim(&claim)
                .instrument(crate::trace::otel_span!("claim"))
                .await;
            self.claim_times.record(started.elapsed());
            let existing = match claimed {
                Ok(ClaimResult::Claimed { previous }) => {
                    let unknown = inherits_unknown_outcome(previous.as_ref());
                    crate::trace::outcome(match previous {
                        Some(_) => Outcome::TakenOver,
                        None => Outcome::Claimed,
                    });
                    crate::trace::on_message("idempotency.unknown_outcome", unknown);
                    if let Some(p) = &previous {
                        info!(
                            previous_status = p.status.as_str(),
                            attempts = p.attempts + 1,
                            unknown_outcome = unknown,
                            "took over the record"
                        );
                    }
                    return Ok(Claimed::Owner(attempt(
                        unknown,
                        previous.as_ref().map(|p| p.first_attempt_at_ms),
                        previous.as_ref().and_then(IdempotencyRecord::last_landing),
                    )));
                }
                Ok(ClaimResult::Conflict(existing)) => existing,
                Err(e) => {
                    return Err(Step::Again(
                        format!("claim failed: {e}"),
                        Redelivery::Backoff,
                    ))
                }
            };
            // A record written by an earlier version of the work, with the fingerprint of
            // that version: the same request, claimed again under the stored form (once).
            if existing.payload_hash != hash
                && claim.payload_hash == self.work.fingerprint(request)
                && self.work.same_request(request, &existing.payload_hash)
            {
                hash = existing.payload_hash.clone();
                claim.payload_hash = hash.clone();
                continue;
            }
            break existing;
        };
        let decision = decide_conflict(&existing, &hash, &owner, now);
        crate::trace::outcome(match &decision {
            ConflictDecision::OwnClaim => Outcome::OwnClaimRecovered,
            ConflictDecision::Duplicate(_) => Outcome::Duplicate,
            ConflictDecision::KeyReused => Outcome::KeyReused,
            ConflictDecision::Busy { .. } => Outcome::InProgressElsewhere,
            ConflictDecision::NotYet { .. } => Outcome::NotYet,
            ConflictDecision::Retry => Outcome::ClaimRaced,
        });
        match decision {
            ConflictDecision::OwnClaim => {
                // Our first write was applied and its answer lost; what it replaced is unknown,
                // so an earlier attempt may have executed: until now, calls of an expired lease
                // could still be landing.
                warn!("the claim's answer was lost and its retry refused by our own lease: claimed, outcome unknown");
                Ok(Claimed::Owner(attempt(
                    true,
                    Some(existing.first_attempt_at_ms),
                    Some(existing.not_before_ms.unwrap_or(now).max(now)),
                )))
            }
            ConflictDecision::Duplicate(outcome) => match self.work.verdict(&outcome) {
                // A duplicate of a request the downstream refused must still end in the DLQ:
                // the first copy's dead-lettering may not have happened.
                Verdict::DeadLetter { code, reason } => Ok(Claimed::Done(
                    self.dead_letter(msg, body, &code, &reason, Some(request), None)
                        .await,
                )),
                Verdict::Done(_) => Ok(Claimed::Done(Disposition::Duplicate)),
            },
            ConflictDecision::KeyReused => {
                let why = format!(
                    "{key} was already used for a different request (status {}); this one is never executed",
                    existing.status.as_str()
                );
                Ok(Claimed::Done(
                    // Marked with this request's fingerprint (so that whoever tracks this
                    // request learns it was refused), yielding to the key's own marks.
                    self.dead_letter(msg, body, KEY_REUSED, &why, Some(request), None)
                        .await,
                ))
            }
            ConflictDecision::Busy {
                lease_expires_at_ms,
            } => Err(Step::Again(
                "another attempt holds the lease".into(),
                Redelivery::Busy(lease_expires_at_ms),
            )),
            ConflictDecision::NotYet { not_before_ms } => Err(Step::Again(
                "an earlier call may still land downstream (not_before)".into(),
                Redelivery::At(not_before_ms),
            )),
            ConflictDecision::Retry => Err(Step::Again(
                "record changed during the claim".into(),
                Redelivery::Soon,
            )),
        }
    }

    /// Where a lease taken or renewed at `now` ends: never past the deadline plus the margin,
    /// so a timed-out attempt's record can be taken over by the next delivery.
    pub(crate) fn lease_end(&self, now: i64, deadline_ms: i64) -> i64 {
        (now + ms(self.settings.lease)).min(deadline_ms + ms(self.settings.deadline_margin))
    }

    /// Sends the message to the DLQ with its reason, marks the key dead-lettered with the
    /// request's fingerprint when the message is a valid request (`request`; a key-reuse mark
    /// yields to the key's own, see [`crate::record::KEY_REUSED`]), and deletes it from the
    /// source queue, in that order.
    pub(crate) async fn dead_letter(
        &self,
        msg: &SqsMessage,
        body: &str,
        code: &str,
        why: &str,
        request: Option<&W::Request>,
        redaction: Option<Redaction>,
    ) -> Disposition {
        // What is logged and kept as the reason goes through the work's redaction first: a
        // reason may quote what the sender wrote.
        let why = &self
            .work
            .redact(why)
            .map_or_else(|| why.to_owned(), |r| r.body);
        // A request the work refuses for what it holds is masked as a body it cannot parse is
        // ([`Work::redact_refused`]); any other letter keeps its body, so that a redrive is
        // the same request.
        let redaction =
            redaction.or_else(|| request.and_then(|r| self.work.redact_refused(r, body)));
        let (body, mut extra_attributes) = match redaction {
            Some(r) => (r.body, vec![(r.attribute, "true".to_owned())]),
            None => (body.to_owned(), Vec::new()),
        };
        // Who sent it (the message's `SenderId`, as SQS recorded it): the letter's own sender is
        // this function.
        if let Some(sender) = self.sender_shown(msg) {
            extra_attributes.push((SENDER_ID.to_owned(), sender));
        }
        // The dead letter keeps its trace: a redrive continues it.
        if let Some((parent, state)) = crate::trace::producer(msg) {
            extra_attributes.push((crate::trace::TRACEPARENT.to_owned(), parent.to_owned()));
            if let Some(state) = state {
                extra_attributes.push((crate::trace::TRACESTATE.to_owned(), state.to_owned()));
            }
        }
        let letter = DeadLetter {
            body,
            error_code: code.to_owned(),
            error_message: why.to_owned(),
            source_message_id: msg.message_id.clone().unwrap_or_default(),
            first_sent_at_ms: first_sent_at_ms(msg),
            // Through the work's redaction too: a producer may group by an id it chose.
            message_group_id: msg
                .attributes
                .get("MessageGroupId")
                .map(|g| self.work.redact(g).map_or_else(|| g.clone(), |r| r.body)),
            extra_attributes,
        };
        let sent = self
            .queues
            .dead_letter(&letter)
            .instrument(crate::trace::otel_span!("dead_letter", error_code = code))
            .await;
        if let Err(e) = sent {
            // Nothing is lost: the message stays on the source queue and comes back.
            let reason = format!("dead-lettering failed: {e}");
            let budget = self.budget_of(msg).await;
            let back_at_ms = self.hide(msg, &reason, Redelivery::Backoff, &budget).await;
            return Disposition::Retry { reason, back_at_ms };
        }
        warn!(error_code = code, reason = why, "message dead-lettered");
        crate::trace::on_message("error.type", code);
        // No mark is keyed by what this release refuses as a key (a card number).
        if let Some(request) = request.filter(|r| self.work.refused_unless_recorded(r).is_none()) {
            let now = self.clock.now_ms();
            let mark = DeadLetterMark {
                key: self.work.key(request),
                payload_hash: self.work.fingerprint(request),
                error_code: code.to_owned(),
                error_message: why.chars().take(1_000).collect(),
                at_ms: now,
                expires_at_s: (now + ms(self.settings.record_ttl)) / 1000,
            };
            if let Err(e) = self.store.mark_dead_lettered(&mark).await {
                // The dead letter holds everything; only the key's status says less.
                warn!(error = %e, "could not mark the key dead-lettered");
            }
        }
        if let (Some(arn), Some(rh)) = (&msg.event_source_arn, &msg.receipt_handle) {
            if let Err(e) = self.queues.delete(arn, rh).await {
                // Reported as a success, so the event source mapping deletes it instead.
                warn!(error = %e, "could not delete the dead-lettered message");
            }
        }
        Disposition::DeadLettered(code.to_owned())
    }
}
