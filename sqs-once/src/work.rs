//! What a user of this crate writes: a [`Work`], the one thing to do exactly once per
//! idempotency key, and the answers it gives the runner.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::record::Outcome;

/// Why a message body is refused before anything is claimed: it goes to the dead-letter queue
/// with this code and message, and is never retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The dead letter's `error_code` (`invalid_json`, `invalid_order`, ...).
    pub code: String,
    /// The dead letter's `error_message`: what is wrong, for the person who sent it.
    pub message: String,
}

impl Rejection {
    /// A rejection with this code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// A copy of a body that must not be kept as it is (it holds personal or card data), for a
/// dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redaction {
    /// The body to keep instead.
    pub body: String,
    /// A `String` message attribute set to `true` on the dead letter, so an operator knows
    /// the body was changed (`card_data_masked`, ...).
    pub attribute: String,
}

/// What a stored outcome means for the message that produced it, and for every duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Acknowledge, and count it under this label (the batch summary and its metrics).
    Done(String),
    /// The downstream refused the request as sent: dead-letter with this code and reason.
    /// Duplicates are dead-lettered too, since the first copy's dead-lettering may not have
    /// happened.
    DeadLetter {
        /// The dead letter's `error_code`.
        code: String,
        /// The dead letter's `error_message`.
        reason: String,
    },
}

/// A call that ended without a definitive answer. Every one is retried with the same key,
/// within this delivery when [`CallError::retry_now`] says so, else on a later delivery.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    /// What went wrong; logged and stored as the record's `last_error` (never a secret).
    pub message: String,
    /// The answer does not prove that the call had no effect (a timeout, a dropped
    /// connection, a `5xx`): the record is marked as having an unknown outcome, and no claim
    /// is allowed until the call can no longer land ([`crate::Settings::processing_allowance`]).
    pub ambiguous: bool,
    /// Retrying within this delivery may help (`false` for a misconfiguration, or when the
    /// downstream said not to).
    pub retry_now: bool,
    /// The downstream asked to wait this long (`Retry-After`).
    pub retry_after: Option<Duration>,
    /// The downstream replays a stored error for this key: retrying will never change it,
    /// only a [`Work::lookup`] can tell what happened.
    pub replayed: bool,
    /// The call was refused because of this process's configuration (a wrong credential or
    /// URL): logged at error level.
    pub misconfigured: bool,
}

impl CallError {
    /// A failure that proves the call had no effect (a refused connection, a `429`).
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            ambiguous: false,
            retry_now: true,
            retry_after: None,
            replayed: false,
            misconfigured: false,
        }
    }

    /// A failure that may hide an effect (a timeout, a `5xx`).
    pub fn ambiguous(message: impl Into<String>) -> Self {
        Self {
            ambiguous: true,
            ..Self::transient(message)
        }
    }
}

/// What the runner tells [`Work::execute`] about the attempt it runs in.
#[derive(Debug)]
pub struct AttemptContext {
    /// The fencing token of this attempt's claim.
    pub owner: String,
    /// The key's first claim, epoch ms: the downstream remembers the key at least until this
    /// plus [`Work::key_retention`].
    pub first_attempt_at_ms: i64,
    /// An earlier attempt's call may have taken effect (the record was marked, or an expired
    /// lease was taken over).
    pub inherited_unknown: bool,
    /// Where the lease ends now, epoch ms (the heartbeat moves it).
    pub(crate) lease_end_ms: AtomicI64,
    /// The invocation's deadline, epoch ms.
    pub deadline_ms: i64,
    /// This attempt's [`Work::lookup`] found nothing ([`AttemptContext::looked_up_nothing`]).
    pub(crate) looked_up_nothing: std::sync::atomic::AtomicBool,
}

impl AttemptContext {
    /// The context of an attempt made outside the runner: a [`Work`]'s own tests call its
    /// `execute` with one, with the lease ending at `lease_end_ms` (the runner's heartbeat moves
    /// it; nothing does here).
    pub fn new(
        owner: impl Into<String>,
        first_attempt_at_ms: i64,
        inherited_unknown: bool,
        lease_end_ms: i64,
        deadline_ms: i64,
    ) -> Self {
        Self {
            owner: owner.into(),
            first_attempt_at_ms,
            inherited_unknown,
            lease_end_ms: AtomicI64::new(lease_end_ms),
            deadline_ms,
            looked_up_nothing: Default::default(),
        }
    }

    /// True once the runner's [`Work::lookup`] in this attempt, made before any call of it,
    /// found nothing for the request: a work that would look the same up before its own call
    /// need not ask again (its own calls are the attempt's, under its key).
    pub fn looked_up_nothing(&self) -> bool {
        self.looked_up_nothing.load(Ordering::SeqCst)
    }

    /// Where the lease ends now, epoch ms. A call must end before it: the runner sends a call
    /// only while the lease outlasts [`Work::call_timeout`] plus the processing allowance.
    pub fn lease_end_ms(&self) -> i64 {
        self.lease_end_ms.load(Ordering::SeqCst)
    }

    pub(crate) fn set_lease_end(&self, ms: i64) {
        self.lease_end_ms.store(ms, Ordering::SeqCst);
    }
}

/// One kind of work done exactly once per idempotency key: parse a message body, name its key
/// and fingerprint, and execute it against a downstream that takes an idempotency key.
///
/// The runner claims the key before [`Work::execute`] and completes the record with its
/// [`Outcome`] while it still holds the lease, so `execute` runs again only when an earlier
/// attempt ended without a stored outcome (a crash, a timeout, a [`CallError`]). It must then
/// send the same idempotency key downstream, so the downstream replays instead of acting twice.
#[async_trait]
pub trait Work: Send + Sync + 'static {
    /// A parsed, validated message.
    type Request: Send + Sync + 'static;

    /// Parses a body. A [`Rejection`] dead-letters the message before anything is claimed.
    fn parse(&self, body: &str) -> Result<Self::Request, Rejection>;

    /// The idempotency key: one record, and one downstream effect, per key.
    fn key(&self, request: &Self::Request) -> String;

    /// A fingerprint of the request's meaning (a hash of its canonical form, e.g. a
    /// [`crate::Fingerprint`]): a second message with the same key and another fingerprint is
    /// dead-lettered as `idempotency_key_reused`, never executed.
    fn fingerprint(&self, request: &Self::Request) -> String;

    /// Whether a fingerprint stored by this or an earlier version of the work is the same
    /// request as `request`. The default accepts only [`Work::fingerprint`]; a work that
    /// changed its fingerprint accepts the earlier form too, so that the messages and records
    /// in flight across the deploy stay the same request instead of "key reuse" (the claim is
    /// then made with the stored form, which the record keeps).
    fn same_request(&self, request: &Self::Request, stored: &str) -> bool {
        stored == self.fingerprint(request)
    }

    /// Does the work once: one call downstream with the idempotency key. `Ok` is definitive
    /// and stored; a [`CallError`] is retried with the same key.
    async fn execute(
        &self,
        request: &Self::Request,
        attempt: &AttemptContext,
    ) -> Result<Outcome, CallError>;

    /// Asks the downstream what it holds for this key, to settle an outcome that no answer
    /// told: `Ok(Some)` is stored as the outcome, `Ok(None)` says nothing exists (trusted only
    /// once the last call could have landed, plus [`crate::Settings::search_lag`] unless
    /// [`Work::lookup_is_consistent`]). The attempt says since when the key has been used
    /// (`first_attempt_at_ms`), which bounds what a listing must cover. The default has no
    /// lookup: an outcome stays unknown until a retry with the key answers.
    async fn lookup(
        &self,
        request: &Self::Request,
        attempt: &AttemptContext,
    ) -> Result<Option<Outcome>, CallError> {
        let _ = (request, attempt);
        Err(CallError {
            retry_now: false,
            ..CallError::transient("this work has no lookup")
        })
    }

    /// True when [`Work::lookup`] reads a consistent view (a list that shows every write as
    /// soon as it is acknowledged), so that finding nothing is proof at once; `false` (the
    /// default) for an index that may lag its writes (a search), whose "nothing" is trusted
    /// only [`crate::Settings::search_lag`] after the last call could land.
    fn lookup_is_consistent(&self) -> bool {
        false
    }

    /// What a stored outcome means for its message: acknowledged under a label, or
    /// dead-lettered. The default acknowledges every outcome under its status.
    fn verdict(&self, outcome: &Outcome) -> Verdict {
        Verdict::Done(outcome.status.clone())
    }

    /// The longest a call may take (the client's timeout).
    fn call_timeout(&self) -> Duration;

    /// Whether executing `request` calls the downstream at once, so that a paced runner
    /// ([`crate::BatchRunner::with_pace`]) books its first request's slot before claiming it.
    /// `true` by default; a work that calls the downstream only sometimes (to read back what
    /// a message does not say) answers `false`, and its calls take their slots as they come.
    fn paces_first_call(&self, request: &Self::Request) -> bool {
        let _ = request;
        true
    }

    /// How many downstream requests one attempt at `request` makes in turn when nothing
    /// fails (a lookup before its write: two). The runner books that many slots of the pace
    /// before it claims ([`crate::pace`]), so that the later ones are not queued behind every
    /// other message's first: at a low rate they would come past the lease, and the attempt
    /// could only ever wait. Slots not used are given back. One by default.
    fn requests_per_attempt(&self, request: &Self::Request) -> usize {
        let _ = request;
        1
    }

    /// Whether executing `request` only reads from the downstream (its effects are writes of
    /// its own, made after its reads, that an error return has not made). Then an execute
    /// that fails because the pace refused one of its requests did nothing, whatever it read
    /// before: it is handed back as never attempted, and waiting for the pace never counts
    /// toward the retry horizon or the receive budget. `false` by default: an attempt that
    /// sent a request is an attempt.
    fn reads_only(&self, request: &Self::Request) -> bool {
        let _ = request;
        false
    }

    /// How long a record completed with `outcome` must be kept from its completion, when that
    /// is longer than the record retention (`None`, the default: the record retention from
    /// the first claim). A payment keeps the record that holds its refund ledger for as long as
    /// refunds are accepted.
    fn retention_after(&self, _outcome: &Outcome) -> Option<Duration> {
        None
    }

    /// How long the downstream remembers an idempotency key (`None`: as long as the record
    /// lives). After it, an outcome left unknown is looked up before any new call.
    fn key_retention(&self) -> Option<Duration> {
        None
    }

    /// A redacted copy of a body refused by [`Work::parse`], when the original must not rest
    /// in the dead-letter queue. The default keeps bodies as they are.
    fn redact(&self, body: &str) -> Option<Redaction> {
        let _ = body;
        None
    }

    /// A request this release refuses for its key itself (it holds what must never rest, in a
    /// table's key, a log or a span: a card number), unless an earlier release left a record
    /// under that key, which is then taken up as before. The runner reads the record first
    /// and, without one, dead-letters the request with this rejection (its body through
    /// [`Work::redact_refused`]) before claiming, logging or marking the key. The default
    /// refuses nothing.
    fn refused_unless_recorded(&self, request: &Self::Request) -> Option<crate::Rejection> {
        let _ = request;
        None
    }

    /// A redacted copy of the body of a request that parsed but is dead-lettered for what it
    /// holds (a letter never redriven), as [`Work::redact`] does for one that did not parse.
    /// The default keeps it as it is: a dead-lettered request's redrive must be the same body.
    fn redact_refused(&self, request: &Self::Request, body: &str) -> Option<Redaction> {
        let _ = (request, body);
        None
    }

    /// What an operator should do about an outcome that no lookup can settle, appended to
    /// the `outcome_unknown` dead letter's reason.
    fn settle_hint(&self, key: &str) -> String {
        format!("settle the record of {key} by hand from the downstream's books")
    }
}
