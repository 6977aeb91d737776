//! `POST /v1/provider-events`: where the provider delivers its events. Nothing is applied
//! here: the receiver verifies `Stripe-Signature` over the raw body ([`crate::stripe::webhook`])
//! and answers `2xx` only once the event is durably in the provider-events queue, so that any
//! failure before that makes the provider deliver again (Stripe retries for up to three days).
//! The inbox ([`crate::events::inbox`]) applies what the queue holds, once per event id.
//!
//! Answers: `200` queued; `400` a missing, malformed, wrong or stale signature, or a body that
//! is not an event (nothing stored); `413` a body over [`MAX_EVENT_BYTES`]; `503` the queue or
//! the signing secret could not be reached (the provider retries); `404`/`405` other routes.
//!
//! Why ~550 lines: about 270 are unit tests (queued only when verified, the secret re-read, the
//! MACs and reads a forgery costs, the refusals' log); the route's answers are one sequence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use crate::provider::event::ProviderEvent;
use crate::stripe::webhook::{SignatureCheck, SignatureError, SignedHeader};

/// The route.
pub const EVENTS_PATH: &str = "/v1/provider-events";

/// The largest body read: SQS's largest message, which the event is sent as (a verified
/// event is also refused when, with its type attribute, it is larger than a queue message).
pub const MAX_EVENT_BYTES: usize = crate::events::queue::MAX_MESSAGE_BYTES;

/// The endpoint's signing secrets.
#[async_trait]
pub trait SigningSecrets: Send + Sync {
    /// The secrets (one, or two while one is rolled); `fresh` asks for them read again
    /// rather than from a cache (after a signature matched none of them).
    async fn secrets(&self, fresh: bool) -> Result<Vec<SecretString>, String>;
}

/// Secrets given at start (`WEBHOOK_SECRET`, local use).
pub struct FixedSecrets(pub Vec<SecretString>);

#[async_trait]
impl SigningSecrets for FixedSecrets {
    async fn secrets(&self, _fresh: bool) -> Result<Vec<SecretString>, String> {
        Ok(self.0.clone())
    }
}

/// The secrets in Secrets Manager (`WEBHOOK_SECRET_ARN`): the secret's string holds one
/// `whsec_...` per line or comma-separated (two while one is rolled). Cached for `ttl`; read
/// again after a signature matched none of them, at most once per `refresh_gap` (so that a
/// flood of forged deliveries cannot drive the secret's reads).
pub struct SecretsManagerSecrets {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
    ttl: Duration,
    refresh_gap: Duration,
    cache: Mutex<Option<(Instant, Vec<SecretString>)>>,
}

impl SecretsManagerSecrets {
    /// The secret `arn`, cached five minutes, read again at most every 30 s on a mismatch.
    pub fn new(client: aws_sdk_secretsmanager::Client, arn: String) -> Self {
        Self {
            client,
            arn,
            ttl: Duration::from_secs(300),
            refresh_gap: Duration::from_secs(30),
            cache: Mutex::new(None),
        }
    }
}

#[async_trait]
impl SigningSecrets for SecretsManagerSecrets {
    async fn secrets(&self, fresh: bool) -> Result<Vec<SecretString>, String> {
        if let Ok(cache) = self.cache.lock() {
            if let Some((at, secrets)) = cache.as_ref() {
                let age = at.elapsed();
                if age < self.ttl && (!fresh || age < self.refresh_gap) {
                    return Ok(secrets.clone());
                }
            }
        }
        let out = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .send()
            .await
            .map_err(|e| aws_sdk_secretsmanager::error::DisplayErrorContext(&e).to_string())?;
        let secrets = SignatureCheck::parse_secrets(out.secret_string().unwrap_or_default());
        if secrets.is_empty() {
            return Err(format!("the secret {} holds no signing secret", self.arn));
        }
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Some((Instant::now(), secrets.clone()));
        }
        Ok(secrets)
    }
}

use crate::events::queue::{message_bytes, sqs_text, EventQueue, MAX_MESSAGE_BYTES};

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The JSON body.
    pub body: String,
}

fn answer(status: u16, body: serde_json::Value) -> Answer {
    Answer {
        status,
        body: body.to_string(),
    }
}

fn refused(status: u16, code: &str, message: impl Into<String>) -> Answer {
    answer(
        status,
        serde_json::json!({"error": {"code": code, "message": message.into()}}),
    )
}

/// The receiver.
pub struct EventReceiver {
    secrets: Arc<dyn SigningSecrets>,
    queue: Arc<dyn EventQueue>,
    tolerance_s: u64,
    now_ms: Box<dyn Fn() -> i64 + Send + Sync>,
    macs: AtomicU64,
    refusals: RefusalLog,
}

fn system_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The `SignatureFailures` metric (CloudWatch EMF) of `count` refused deliveries.
fn signature_failure_metric(count: u64, reason: &str) -> String {
    crate::telemetry::with_dimensions(
        serde_json::json!({
            "_aws": {
                "Timestamp": system_now_ms(),
                "CloudWatchMetrics": [{
                    "Namespace": "ProviderEvents",
                    "Dimensions": [["Service"]],
                    "Metrics": [{"Name": "SignatureFailures", "Unit": "Count"}]
                }]
            },
            "Service": "provider-events",
            "SignatureFailures": count,
            "reason": reason,
        }),
        crate::telemetry::dimensions(),
    )
    .to_string()
}

/// Refused deliveries, written one line each up to [`crate::telemetry::LineBudget::LINES`] a
/// second; those past it counted into the next second's first line. A misconfigured secret's
/// refusals are each written at once (the alarm counts them); a flood of forged requests costs
/// at most that many metric and log lines a second per instance, not two per request.
struct RefusalLog(crate::telemetry::LineBudget);

impl RefusalLog {
    fn new() -> Self {
        Self(crate::telemetry::LineBudget::new())
    }

    fn tally(&self, now: Instant) -> Option<u64> {
        self.0.tally(now)
    }

    fn refused(&self, reason: &SignatureError, bytes: usize) {
        if let Some(count) = self.tally(Instant::now()) {
            println!("{}", signature_failure_metric(count, &reason.to_string()));
            tracing::warn!(%reason, bytes, refused = count, "provider events refused: bad signature");
        }
    }
}

impl EventReceiver {
    /// Verifies with `secrets` and a tolerance of `tolerance_s` seconds, sends to `queue`.
    pub fn new(
        secrets: Arc<dyn SigningSecrets>,
        queue: Arc<dyn EventQueue>,
        tolerance_s: u64,
    ) -> Self {
        Self {
            secrets,
            queue,
            tolerance_s,
            now_ms: Box::new(system_now_ms),
            macs: AtomicU64::new(0),
            refusals: RefusalLog::new(),
        }
    }

    /// The same receiver on another clock, unix milliseconds (tests).
    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Box::new(now_ms);
        self
    }

    /// The MACs computed over bodies since the receiver was built: what verification has
    /// cost (at most one per secret per request).
    pub fn macs_computed(&self) -> u64 {
        self.macs.load(Ordering::Relaxed)
    }

    /// Hashes `body` under `secrets` on the blocking pool, off the runtime's workers: the one
    /// CPU-bound step, so that nothing else the process serves waits on it.
    async fn signed_by_any(
        &self,
        signed: &Arc<SignedHeader>,
        secrets: Vec<SecretString>,
        body: &Arc<[u8]>,
    ) -> Result<bool, Answer> {
        if secrets.is_empty() {
            return Ok(false);
        }
        let (signed, body) = (Arc::clone(signed), Arc::clone(body));
        let outcome = tokio::task::spawn_blocking(move || signed.signed_by_any(&secrets, &body))
            .await
            .map_err(|e| {
                // The runtime shutting down: not the delivery's fault; the provider sends it
                // again.
                tracing::error!(error = %e, "the signature check did not run");
                refused(
                    503,
                    "verification_unavailable",
                    "the signature could not be checked; deliver again",
                )
            })?;
        self.macs.fetch_add(outcome.macs as u64, Ordering::Relaxed);
        Ok(outcome.matched)
    }

    async fn verify(&self, signature: Option<&str>, body: &[u8]) -> Result<(), Answer> {
        let refuse = |e: SignatureError| {
            self.refusals.refused(&e, body.len());
            refused(400, "signature_invalid", e.to_string())
        };
        // Everything that costs nothing to refuse is refused before the secret is read or the
        // body hashed: the header's size, form and age.
        let signed = SignedHeader::read(signature, body, self.tolerance_s, (self.now_ms)())
            .map_err(refuse)?;
        let unavailable = |e: String| {
            tracing::error!(error = %e, "the webhook signing secret could not be read");
            refused(
                503,
                "secret_unavailable",
                "the signing secret could not be read; deliver again",
            )
        };
        let (signed, body) = (Arc::new(signed), Arc::<[u8]>::from(body));
        let cached = self.secrets.secrets(false).await.map_err(unavailable)?;
        if self.signed_by_any(&signed, cached.clone(), &body).await? {
            return Ok(());
        }
        // The secret may have been rolled since it was cached: only secrets not tried yet are
        // hashed with (reads are rate-limited by the source, so a flood reads nothing more).
        let fresh = self.secrets.secrets(true).await.map_err(unavailable)?;
        let untried: Vec<SecretString> = fresh
            .into_iter()
            .filter(|f| {
                !cached
                    .iter()
                    .any(|c| c.expose_secret() == f.expose_secret())
            })
            .collect();
        if self.signed_by_any(&signed, untried, &body).await? {
            return Ok(());
        }
        Err(refuse(SignatureError::NoMatch))
    }

    /// Answers one request.
    pub async fn handle(
        &self,
        method: &str,
        path: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Answer {
        // The delivery's span (kind server); the event's message continues its trace, and the
        // event's work links it to the payment's.
        let span = crate::telemetry::traces::request_span(method, EVENTS_PATH);
        let answer = tracing::Instrument::instrument(
            self.receive(method, path, signature, body),
            span.clone(),
        )
        .await;
        crate::telemetry::traces::answered(&span, answer.status);
        answer
    }

    async fn receive(
        &self,
        method: &str,
        path: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Answer {
        if path.trim_end_matches('/') != EVENTS_PATH {
            return refused(404, "not_found", format!("no route {path}"));
        }
        if method != "POST" {
            return refused(
                405,
                "method_not_allowed",
                format!("{EVENTS_PATH} takes POST"),
            );
        }
        if body.len() > MAX_EVENT_BYTES {
            return refused(
                413,
                "body_too_large",
                format!(
                    "the body is {} bytes; at most {MAX_EVENT_BYTES} are accepted",
                    body.len()
                ),
            );
        }
        if let Err(refusal) = self.verify(signature, body).await {
            return refusal;
        }
        let Ok(text) = std::str::from_utf8(body) else {
            return refused(400, "invalid_event", "the body is not UTF-8");
        };
        let event = match ProviderEvent::parse(text) {
            Ok(e) => e,
            Err(r) => return refused(400, &r.code, r.message),
        };
        // What SQS counts: the body as it is sent and the event's type attribute. Refused
        // here, the provider retries for days and then lists it as undelivered: the catch-up
        // sets it aside to the dead-letter queue with its reason.
        let bytes = message_bytes(&event.kind, &sqs_text(text));
        if bytes > MAX_MESSAGE_BYTES {
            return refused(
                413,
                "body_too_large",
                format!(
                    "event {} is {bytes} bytes as a queue message (with its type attribute); at most {MAX_MESSAGE_BYTES} are queued",
                    event.id
                ),
            );
        }
        match self.queue.enqueue(&event, text).await {
            Ok(()) => {
                tracing::debug!(event_id = %event.id, event_type = %event.kind, "provider event queued");
                answer(200, serde_json::json!({"received": true, "id": event.id}))
            }
            Err(e) => {
                tracing::error!(event_id = %event.id, error = %e, "provider event not queued");
                refused(
                    503,
                    "queue_unavailable",
                    "the event could not be queued; deliver again",
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stripe::webhook::sign;

    const NOW: i64 = 1_800_000_000;

    #[derive(Default)]
    struct Queue {
        sent: Mutex<Vec<String>>,
        down: bool,
    }

    #[async_trait]
    impl EventQueue for Queue {
        async fn enqueue(&self, _event: &ProviderEvent, body: &str) -> Result<(), String> {
            if self.down {
                return Err("down".into());
            }
            self.sent.lock().unwrap().push(body.to_owned());
            Ok(())
        }
    }

    /// Secrets that change when read fresh (a roll since the cache was filled).
    struct Rolled;

    #[async_trait]
    impl SigningSecrets for Rolled {
        async fn secrets(&self, fresh: bool) -> Result<Vec<SecretString>, String> {
            let s = if fresh { "whsec_new" } else { "whsec_old" };
            Ok(vec![SecretString::from(s.to_owned())])
        }
    }

    fn receiver(queue: Arc<Queue>) -> EventReceiver {
        EventReceiver::new(
            Arc::new(FixedSecrets(vec![SecretString::from("whsec_a".to_owned())])),
            queue,
            300,
        )
        .with_clock(|| NOW * 1000)
    }

    const BODY: &str = r#"{"id":"evt_1","object":"event","type":"payment_intent.succeeded","created":1,"data":{"object":{"id":"pi_1","object":"payment_intent","status":"succeeded"}}}"#;

    #[tokio::test]
    async fn a_verified_event_is_queued_as_it_came_and_nothing_else_is() {
        let queue = Arc::new(Queue::default());
        let r = receiver(queue.clone());
        let good = sign(&["whsec_a"], NOW, BODY.as_bytes());
        let a = r
            .handle("POST", EVENTS_PATH, Some(&good), BODY.as_bytes())
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(queue.sent.lock().unwrap().as_slice(), [BODY.to_owned()]);

        let tampered = BODY.replace("succeeded", "canceled");
        let stale = sign(&["whsec_a"], NOW - 301, BODY.as_bytes());
        let wrong = sign(&["whsec_b"], NOW, BODY.as_bytes());
        for (header, body) in [
            (Some(good.as_str()), tampered.as_str()),
            (Some(stale.as_str()), BODY),
            (Some(wrong.as_str()), BODY),
            (None, BODY),
        ] {
            let a = r.handle("POST", EVENTS_PATH, header, body.as_bytes()).await;
            assert_eq!(a.status, 400, "{header:?}: {}", a.body);
            assert!(a.body.contains("signature_invalid"), "{}", a.body);
        }
        assert_eq!(
            queue.sent.lock().unwrap().len(),
            1,
            "refused deliveries store nothing"
        );
    }

    #[tokio::test]
    async fn an_event_that_fits_the_body_cap_but_not_a_queue_message_with_its_attribute_is_refused()
    {
        let queue = Arc::new(Queue::default());
        let r = receiver(queue.clone());
        // A body of exactly the body cap, one that with its attribute (`event_type`, `String`,
        // and the type: 40 bytes) is one byte short of a queue message, and one 10 bytes
        // shorter still.
        let event = |bytes: usize| {
            let head = r#"{"id":"evt_1","object":"event","type":"payment_intent.succeeded","created":1,"data":{"object":{"id":"pi_1","object":"payment_intent","status":"succeeded","description":""#;
            let tail = r#""}}}"#;
            format!(
                "{head}{}{tail}",
                "x".repeat(bytes - head.len() - tail.len())
            )
        };
        let attribute = "event_type".len() + "String".len() + "payment_intent.succeeded".len();
        let full = event(MAX_EVENT_BYTES);
        let a = r
            .handle(
                "POST",
                EVENTS_PATH,
                Some(&sign(&["whsec_a"], NOW, full.as_bytes())),
                full.as_bytes(),
            )
            .await;
        assert_eq!(a.status, 413, "{}", a.body);
        assert!(a.body.contains("evt_1"), "{}", a.body);
        let over = event(MAX_MESSAGE_BYTES - attribute + 1);
        let a = r
            .handle(
                "POST",
                EVENTS_PATH,
                Some(&sign(&["whsec_a"], NOW, over.as_bytes())),
                over.as_bytes(),
            )
            .await;
        assert_eq!(a.status, 413, "{}", a.body);
        assert!(queue.sent.lock().unwrap().is_empty());
        let fits = event(MAX_MESSAGE_BYTES - attribute);
        let a = r
            .handle(
                "POST",
                EVENTS_PATH,
                Some(&sign(&["whsec_a"], NOW, fits.as_bytes())),
                fits.as_bytes(),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(queue.sent.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn what_cannot_be_queued_is_not_acknowledged() {
        let r = receiver(Arc::new(Queue {
            down: true,
            ..Queue::default()
        }));
        let good = sign(&["whsec_a"], NOW, BODY.as_bytes());
        let a = r
            .handle("POST", EVENTS_PATH, Some(&good), BODY.as_bytes())
            .await;
        assert_eq!(a.status, 503, "{}", a.body);
    }

    #[tokio::test]
    async fn oversized_bodies_other_routes_and_non_events_are_refused() {
        let queue = Arc::new(Queue::default());
        let r = receiver(queue.clone());
        let big = vec![b' '; MAX_EVENT_BYTES + 1];
        assert_eq!(r.handle("POST", EVENTS_PATH, None, &big).await.status, 413);
        assert_eq!(r.handle("GET", EVENTS_PATH, None, b"").await.status, 405);
        assert_eq!(r.handle("POST", "/v1/other", None, b"").await.status, 404);
        let not_event = br#"{"id":"ch_1","object":"charge"}"#;
        let signed = sign(&["whsec_a"], NOW, not_event);
        let a = r
            .handle("POST", EVENTS_PATH, Some(&signed), not_event)
            .await;
        assert_eq!(a.status, 400, "{}", a.body);
        assert!(queue.sent.lock().unwrap().is_empty());
    }

    /// The same secrets cached and fresh, counting reads.
    struct Counted(Vec<SecretString>, std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl SigningSecrets for Counted {
        async fn secrets(&self, _fresh: bool) -> Result<Vec<SecretString>, String> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Ok(self.0.clone())
        }
    }

    #[tokio::test]
    async fn a_forged_delivery_is_hashed_once_per_secret_and_a_malformed_one_not_at_all() {
        let held = vec![
            SecretString::from("whsec_old".to_owned()),
            SecretString::from("whsec_new".to_owned()),
        ];
        let secrets = Arc::new(Counted(held, Default::default()));
        let queue = Arc::new(Queue::default());
        let r = EventReceiver::new(secrets.clone(), queue.clone(), 300).with_clock(|| NOW * 1000);
        let body = vec![b'x'; MAX_EVENT_BYTES];
        let forged = format!("t={NOW}{}", format!(",v1={}", "ab".repeat(32)).repeat(63));
        let a = r.handle("POST", EVENTS_PATH, Some(&forged), &body).await;
        assert_eq!(a.status, 400, "{}", a.body);
        // Two secrets, read cached and then fresh (unchanged): two MACs, not 2 x 63 x 2.
        assert_eq!(r.macs_computed(), 2);
        assert_eq!(secrets.1.load(Ordering::Relaxed), 2);
        // Stale, oversized or unreadable: refused before the secret is read or anything hashed.
        for header in [
            forged.replace(&format!("t={NOW}"), &format!("t={}", NOW - 301)),
            format!("{forged},v1=00,v1=00"),
            format!("{forged},v1"),
        ] {
            let a = r.handle("POST", EVENTS_PATH, Some(&header), &body).await;
            assert_eq!(a.status, 400, "{}", a.body);
        }
        assert_eq!(r.macs_computed(), 2);
        assert_eq!(secrets.1.load(Ordering::Relaxed), 2);
        assert!(queue.sent.lock().unwrap().is_empty());
        // A genuine delivery under the second secret.
        let good = sign(&["whsec_new"], NOW, BODY.as_bytes());
        let a = r
            .handle("POST", EVENTS_PATH, Some(&good), BODY.as_bytes())
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(r.macs_computed(), 4);
    }

    #[test]
    fn refusals_are_written_each_up_to_ten_a_second_and_the_rest_counted() {
        let log = RefusalLog::new();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for ms in 0..10 {
            assert_eq!(log.tally(at(ms)), Some(1), "each of the first ten at once");
        }
        for ms in 10..15 {
            assert_eq!(log.tally(at(ms)), None);
        }
        assert_eq!(
            log.tally(at(999)),
            None,
            "still the same second: counted, not written"
        );
        assert_eq!(
            log.tally(at(1000)),
            Some(7),
            "the next second's first line carries them"
        );
        assert_eq!(log.tally(at(1001)), Some(1));
        assert_eq!(log.tally(at(9000)), Some(1));
    }

    #[tokio::test]
    async fn a_secret_rolled_since_it_was_cached_is_read_again() {
        let queue = Arc::new(Queue::default());
        let r = EventReceiver::new(Arc::new(Rolled), queue.clone(), 300).with_clock(|| NOW * 1000);
        let signed = sign(&["whsec_new"], NOW, BODY.as_bytes());
        let a = r
            .handle("POST", EVENTS_PATH, Some(&signed), BODY.as_bytes())
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        // The cached secret, then the new one: each hashed once.
        assert_eq!(r.macs_computed(), 2);
    }
}
