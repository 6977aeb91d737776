//! The payments API: `POST /v1/payments` and `GET /v1/payments/{id}`, with Stripe's
//! idempotency semantics (design.md, "Accepting payments").
//!
//! - The `Idempotency-Key` header is the payment's id end to end (API, queue, provider).
//! - A payment is stored with one conditional write of its row, which carries the queue's
//!   message and is itself the outbox entry ([`PaymentsStore::create`]);
//!   the stored answer (status and body) comes back byte for byte for a retry with the same key
//!   and the same parameters, with `Idempotent-Replayed: true`. The same key with other
//!   parameters is an `idempotency_error`, for as long as the row or any processor record of
//!   the key lives (the record is read before the write). A request that fails validation
//!   stores nothing.
//! - `GET` reads the payment row and the processor's record (and dead-letter mark) with one
//!   consistent read each, and says where the payment stands.
//!
//! HTTP-agnostic: [`PaymentsApi::handle`] takes a method, a path, headers and a body, so the
//! Lambda (`lambda_http`) and the local server call the same code.
//!
//! Why one file of ~1,100 lines: the API's answers (creation, replay, errors, status) are one
//! contract read in one place; ~490 lines are its tests, which need the private builders.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tracing::{info, warn, Instrument};

use crate::api::view::AfterCharge;
use crate::domain::{PaymentId, PaymentRequest, MAX_BODY_BYTES};
use crate::payments::charge::{rejection_code, PaymentOutcome};
use crate::payments::outbox::OutboxEntry;
use crate::telemetry::traces;
use sqs_once::clock::Clock;
use sqs_once::record::{DeadLetterMark, IdempotencyRecord, RecordStatus};

/// A payment as the payments table stores it, with the answer to the request that created it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPayment {
    /// The payment's id (its idempotency key).
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// Lowercase ISO 4217.
    pub currency: String,
    /// The provider's customer id.
    pub customer_id: String,
    /// Epoch s of the creation (`created`).
    pub created: i64,
    /// Hash of the canonical request: a retry with other parameters is refused.
    pub request_hash: String,
    /// The stored answer's status code.
    pub response_status: u16,
    /// The stored answer's body, byte for byte.
    pub response_body: String,
    /// DynamoDB TTL, epoch s.
    pub expires_at_s: i64,
    /// Who created it: the IAM principal API Gateway authenticated (`requestContext.authorizer.iam.userArn`),
    /// when the request came through it.
    pub created_by: Option<String>,
}

/// What [`PaymentsStore::create`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Creation {
    /// The payment's row (with its outbox fields) was written.
    Created,
    /// The key is taken: this is the payment that holds it.
    Exists(StoredPayment),
}

/// The payments table could not answer (retryable: nothing was written, or the write is found
/// by the retry and replayed).
#[derive(Debug, thiserror::Error)]
#[error("payments table unavailable: {0}")]
pub struct Unavailable(pub String);

/// The port over the payments table (and the processor's records, read-only).
#[async_trait]
pub trait PaymentsStore: Send + Sync {
    /// Writes the payment's row with the entry's outbox fields in one write, on condition that
    /// its key is free; when the key is taken, returns the payment that holds it.
    async fn create(
        &self,
        payment: &StoredPayment,
        entry: &OutboxEntry,
    ) -> Result<Creation, Unavailable>;
    /// Reads a payment row (consistent).
    async fn payment(&self, id: &str) -> Result<Option<StoredPayment>, Unavailable>;
    /// Reads the processor's record and dead-letter mark of a payment (consistent).
    async fn progress(
        &self,
        id: &str,
    ) -> Result<(Option<IdempotencyRecord>, Option<DeadLetterMark>), Unavailable>;
    /// Reads what happened to a payment after its charge (consistent): refunds, disputes,
    /// the provider's events; `None` when nothing did.
    async fn after_charge(&self, id: &str) -> Result<Option<AfterCharge>, Unavailable>;
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiResponse {
    /// Status code.
    pub status: u16,
    /// Headers beyond `Content-Type: application/json`.
    pub headers: Vec<(&'static str, String)>,
    /// JSON body.
    pub body: String,
}

impl ApiResponse {
    fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }
}

/// Largest request body read; a larger one is refused before parsing (`413`).
pub const MAX_REQUEST_BYTES: usize = MAX_BODY_BYTES;

/// The header carrying the idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How long a payment row (and its stored answer) lives, from the API's write: as long as any
/// processor record of its key can. The record's TTL runs from its first claim, which comes at
/// most the record retention after the first send (an older message is refused
/// `request_expired`, less the 5 minutes of clock skew allowed), and the first send follows the
/// row's write; a day of margin covers the skew and the relay's delay. So a record that a
/// retry's message could still claim never outlives the row. A charged payment's record lives
/// longer (the refund window from its last change): for that time the API reads the record
/// before it writes ([`PaymentsApi::create`]), so the key stays refused with other parameters
/// (`400 idempotency_error`) and replayed with the same ones for as long as any record lives.
pub fn row_lifetime(record_retention: Duration) -> Duration {
    record_retention * 2 + Duration::from_secs(86_400)
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// The API over its store.
pub struct PaymentsApi {
    store: Arc<dyn PaymentsStore>,
    clock: Arc<dyn Clock>,
    /// Payment rows (and their stored answers) live this long: the idempotency records' TTL.
    retention: Duration,
    /// The message contract's version the API writes ([`crate::domain::contract`]).
    contract: u64,
}

fn error(status: u16, kind: &str, code: &str, param: Option<&str>, message: &str) -> ApiResponse {
    let mut e = json!({"type": kind, "code": code, "message": message});
    if let Some(p) = param {
        e["param"] = json!(p);
    }
    ApiResponse::json(status, &json!({ "error": e }))
}

/// The same key with other parameters.
fn key_in_use(key: &str) -> ApiResponse {
    error(
        400,
        "idempotency_error",
        "idempotency_key_in_use",
        Some("Idempotency-Key"),
        &format!(
            "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to create a different payment."
        ),
    )
}

fn invalid(code: &str, param: Option<&str>, message: &str) -> ApiResponse {
    error(400, "invalid_request_error", code, param, message)
}

/// A store call failed or its answer was lost: the 5xx says only what is known. A creation's
/// write may have committed (a lost answer of a transaction that succeeded), so it never says
/// that nothing was stored or charged; a read says nothing of the payment at all.
fn unavailable(e: &Unavailable, creating: bool) -> ApiResponse {
    warn!(error = %e, "payments table unavailable");
    let message = if creating {
        "The payment's outcome is not known yet: it may or may not have been stored. Retry with \
         the same Idempotency-Key and the same parameters: the retry answers with the stored \
         payment if there is one, and creates it once if there is none."
    } else {
        "The payment could not be read right now; this says nothing about its status. Retry the \
         request."
    };
    error(500, "api_error", "storage_unavailable", None, message)
}

impl PaymentsApi {
    /// The API over a store, with the record retention (`IDEMPOTENCY_TTL_*`).
    pub fn new(store: Arc<dyn PaymentsStore>, clock: Arc<dyn Clock>, retention: Duration) -> Self {
        Self {
            store,
            clock,
            retention,
            contract: 1,
        }
    }

    /// Writes messages of contract `version` (`MESSAGE_CONTRACT_VERSION`: 2 once every
    /// processor deployed reads it); 1 by default.
    pub fn with_contract(mut self, version: u64) -> Self {
        self.contract = version;
        self
    }

    /// Routes one request. `header` looks a header up by its lowercase name.
    pub async fn handle(
        &self,
        method: &str,
        path: &str,
        header: impl Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> ApiResponse {
        self.handle_as(None, method, path, header, body).await
    }

    /// [`PaymentsApi::handle`] for a request whose IAM principal API Gateway authenticated
    /// (`caller`, never read from the request's own headers): a payment it creates keeps it as
    /// `created_by`, and `GET` shows it.
    pub async fn handle_as(
        &self,
        caller: Option<&str>,
        method: &str,
        path: &str,
        header: impl Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> ApiResponse {
        let path = path.trim_end_matches('/');
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        // The request's span (kind server) continues the caller's trace when it sends a
        // `traceparent`; the payment's message and every later span of it follow from here.
        let route = match segments.as_slice() {
            ["v1", "payments"] => "/v1/payments",
            ["v1", "payments", _] => "/v1/payments/{id}",
            _ => "unknown",
        };
        let span = traces::request_span(method, route);
        if let Some(parent) = header("traceparent") {
            sqs_once::trace::continue_trace(&span, &parent, header("tracestate").as_deref());
        }
        let answer = self
            .route(caller, method, path, &segments, header, body)
            .instrument(span.clone())
            .await;
        traces::answered(&span, answer.status);
        if method == "POST" && route == "/v1/payments" {
            let replayed = answer
                .headers
                .iter()
                .any(|(h, _)| *h == "idempotent-replayed");
            let outcome = match answer.status {
                _ if replayed => Some("replayed"),
                202 => Some("created"),
                400 if answer.body.contains("\"idempotency_key_in_use\"") => Some("key_reused"),
                _ => None,
            };
            if let Some(outcome) = outcome {
                span.record("idempotency.outcome", outcome);
            }
        }
        answer
    }

    async fn route(
        &self,
        caller: Option<&str>,
        method: &str,
        path: &str,
        segments: &[&str],
        header: impl Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> ApiResponse {
        match (method, segments) {
            ("POST", ["v1", "payments"]) => {
                self.create_as(caller, header(IDEMPOTENCY_KEY), body).await
            }
            ("GET", ["v1", "payments", id]) => {
                let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
                self.retrieve(&id).await
            }
            (_, ["v1", "payments"] | ["v1", "payments", _]) => error(
                405,
                "invalid_request_error",
                "method_not_allowed",
                None,
                "Use POST /v1/payments or GET /v1/payments/{id}.",
            ),
            _ => error(
                404,
                "invalid_request_error",
                "resource_missing",
                None,
                // The path is the caller's text: a card number in it is masked.
                &format!(
                    "Unrecognized request URL ({method} {}).",
                    crate::domain::mask_card_numbers(path).unwrap_or_else(|| path.to_owned())
                ),
            ),
        }
    }

    /// `POST /v1/payments`.
    pub async fn create(&self, key: Option<String>, body: &[u8]) -> ApiResponse {
        self.create_as(None, key, body).await
    }

    /// `POST /v1/payments` by `caller` (the IAM principal API Gateway authenticated).
    pub async fn create_as(
        &self,
        caller: Option<&str>,
        key: Option<String>,
        body: &[u8],
    ) -> ApiResponse {
        if body.len() > MAX_REQUEST_BYTES {
            return error(
                413,
                "invalid_request_error",
                "request_too_large",
                None,
                &format!(
                    "The body is {} bytes; at most {MAX_REQUEST_BYTES} are accepted.",
                    body.len()
                ),
            );
        }
        let Some(key) = key.map(|k| k.trim().to_owned()) else {
            return invalid(
                "parameter_missing",
                Some("Idempotency-Key"),
                "An Idempotency-Key header is required: it becomes the payment's id, and a retry with the same key never creates a second payment.",
            );
        };
        if let Err(e) = PaymentId::parse(&key) {
            return invalid(
                "idempotency_key_invalid",
                Some("Idempotency-Key"),
                &e.to_string().replacen("payment_id", "Idempotency-Key", 1),
            );
        }
        let mut value: Value = match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return invalid("body_invalid", None, "The body must be a JSON object.");
            }
            Err(e) => {
                return invalid(
                    "body_invalid_json",
                    None,
                    &format!("The body is not valid JSON: {e}."),
                )
            }
        };
        if value.get("payment_id").is_some() {
            return invalid(
                "parameter_unknown",
                Some("payment_id"),
                "payment_id is not a body parameter: the Idempotency-Key header is the payment's id.",
            );
        }
        if value.get(crate::domain::contract::FIELD).is_some() {
            return invalid(
                "parameter_unknown",
                Some(crate::domain::contract::FIELD),
                "contract_version is not a body parameter: the API writes the version it is deployed with (MessageContractVersion).",
            );
        }
        // A field of a later contract than the one written: only a retry of a payment accepted
        // while that contract was written is answered (a replay); a new one is refused.
        let ahead = self.contract < 2 && value.get("statement_descriptor_suffix").is_some();
        value["payment_id"] = Value::String(key.clone());
        if self.contract >= 2 || ahead {
            value[crate::domain::contract::FIELD] = json!(self.contract.max(2));
        }
        let request = match PaymentRequest::from_value_as_before(value) {
            Ok(r) => match &r.refused_now {
                None => r,
                // Refused by a rule earlier releases did not have: answered only as the retry
                // of a payment one of them accepted under this key (its stored answer), never
                // accepted anew.
                Some(e) => match self.store.payment(&key).await {
                    Ok(Some(row)) if r.has_payload_hash(&row.request_hash) => r,
                    Ok(_) => return invalid("parameter_invalid", e.field(), &e.to_string()),
                    Err(u) => return unavailable(&u, true),
                },
            },
            Err(e) => return invalid("parameter_invalid", e.field(), &e.to_string()),
        };
        let now = self.clock.now_ms();
        let created = now / 1000;
        let object = payment_object(
            &key,
            request.money.amount,
            &request.money.currency,
            "pending",
            created,
        );
        let payment = StoredPayment {
            id: key.clone(),
            amount: request.money.amount,
            currency: request.money.currency.clone(),
            customer_id: request.customer_id.clone(),
            created,
            request_hash: request.payload_hash(),
            response_status: 202,
            response_body: object.to_string(),
            expires_at_s: (now + ms(row_lifetime(self.retention))) / 1000,
            // A role session's name is the caller's text: a card number in it is masked.
            created_by: caller.map(|c| crate::domain::mask_card_numbers(c).unwrap_or(c.to_owned())),
        };
        sqs_once::trace::set_attribute(&tracing::Span::current(), "idempotency.key", key.as_str());
        let entry = OutboxEntry {
            payment_id: key.clone(),
            message: request.to_message_body(),
            created_at: now,
            customer_id: request.customer_id.clone(),
            traceparent: sqs_once::trace::current_traceparent(),
            request_hash: Some(payment.request_hash.clone()),
            expires_at_s: Some(payment.expires_at_s),
        };
        // A charged payment's record outlives its row (the record lives the refund window from
        // its last change, the row `row_lifetime` from its write): once the row is gone, the
        // record still holds the key. So the record is read first: while any record of the key
        // lives, other parameters are refused and the same ones replayed, and nothing is
        // written (no second message) for a key that is taken.
        match self.earlier_use(&key, &request).await {
            Ok(None) => {}
            Ok(Some(answer)) => return answer,
            Err(e) => return unavailable(&e, true),
        }
        if ahead {
            return match self.store.payment(&key).await {
                Ok(Some(row)) if request.has_payload_hash(&row.request_hash) => ApiResponse {
                    status: row.response_status,
                    headers: vec![("idempotent-replayed", "true".to_owned())],
                    body: row.response_body,
                },
                Ok(Some(_)) => key_in_use(&key),
                Ok(None) => invalid(
                    "parameter_unknown",
                    Some("statement_descriptor_suffix"),
                    "statement_descriptor_suffix is taken once the stack writes message contract 2 (MessageContractVersion=2, after every processor deployed reads it).",
                ),
                Err(e) => unavailable(&e, true),
            };
        }
        match self.store.create(&payment, &entry).await {
            Ok(Creation::Created) => {
                info!(payment_id = %key, amount = payment.amount, currency = %payment.currency, "payment accepted");
                crate::failpoint_async!("api_after_write");
                ApiResponse {
                    status: payment.response_status,
                    headers: Vec::new(),
                    body: payment.response_body,
                }
            }
            Ok(Creation::Exists(existing)) if request.has_payload_hash(&existing.request_hash) => {
                info!(payment_id = %key, "idempotent replay");
                ApiResponse {
                    status: existing.response_status,
                    headers: vec![("idempotent-replayed", "true".to_owned())],
                    body: existing.response_body,
                }
            }
            Ok(Creation::Exists(_)) => key_in_use(&key),
            Err(e) => unavailable(&e, true),
        }
    }

    /// What a creation must answer when the processor already holds a record of its key,
    /// before anything is written (`None`: write the row, as for a new key):
    /// - a record of other parameters: an `idempotency_error`, unless the key's row holds this
    ///   very request (a raw message claimed the key first; the row's answer is replayed);
    /// - a record of these parameters and no row (its lifetime ended, or the payment came
    ///   through the queue): a replay of the creation rebuilt from the request and the record
    ///   (`created` is its first claim), with nothing written or sent again. Whatever the
    ///   record's state: an unfinished one has its own message, in the queue or dead-lettered
    ///   (`retries_exhausted`, which alarms and is redriven), and a second message would carry
    ///   a fresh `first_sent_at`, so it could outlive the record's TTL and claim the key anew
    ///   without the record's unknown-outcome mark: a second charge.
    async fn earlier_use(
        &self,
        key: &str,
        request: &PaymentRequest,
    ) -> Result<Option<ApiResponse>, Unavailable> {
        let (Some(record), _) = self.store.progress(key).await? else {
            return Ok(None);
        };
        let row = self.store.payment(key).await?;
        if !request.has_payload_hash(&record.payload_hash) {
            if row.is_some_and(|row| request.has_payload_hash(&row.request_hash)) {
                return Ok(None);
            }
            info!(payment_id = %key, "key held by a record with other parameters");
            return Ok(Some(key_in_use(key)));
        }
        if row.is_some() {
            return Ok(None);
        }
        info!(payment_id = %key, "idempotent replay from the record");
        let object = payment_object(
            key,
            request.money.amount,
            &request.money.currency,
            "pending",
            record.first_attempt_at_ms / 1000,
        );
        Ok(Some(ApiResponse {
            status: 202,
            headers: vec![("idempotent-replayed", "true".to_owned())],
            body: object.to_string(),
        }))
    }

    /// `GET /v1/payments/{id}`.
    pub async fn retrieve(&self, id: &str) -> ApiResponse {
        let missing = || {
            error(
                404,
                "invalid_request_error",
                "resource_missing",
                Some("id"),
                // The id is the caller's text: a card number in it is masked.
                &format!(
                    "No such payment: '{}'.",
                    crate::domain::mask_card_numbers(id).unwrap_or_else(|| id.to_owned())
                ),
            )
        };
        if PaymentId::parse(id).is_err() {
            // Not an id this API could have made: not shown (it may be any text, a card number).
            return error(
                404,
                "invalid_request_error",
                "resource_missing",
                Some("id"),
                "No such payment: the id is not one this API makes (1 to 255 of A-Z a-z 0-9 _ - : .).",
            );
        }
        let payment = match self.store.payment(id).await {
            Ok(p) => p,
            Err(e) => return unavailable(&e, false),
        };
        let (record, mark) = match self.store.progress(id).await {
            Ok(p) => p,
            Err(e) => return unavailable(&e, false),
        };
        let after = match self.store.after_charge(id).await {
            Ok(r) => r,
            Err(e) => return unavailable(&e, false),
        };
        let Some(payment) = payment else {
            // Not created through the API: a payment sent to the queue itself is known by
            // the processor's record (or its dead letter) alone.
            if record.is_none() && mark.is_none() {
                return missing();
            }
            let mut object = queue_payment(id, record.as_ref(), mark.as_ref());
            add_after_charge(&mut object, after);
            return ApiResponse::json(200, &object);
        };
        let view = status_of(&payment, record.as_ref(), mark.as_ref());
        let mut object = payment_object(
            &payment.id,
            payment.amount,
            &payment.currency,
            &view.status,
            payment.created,
        );
        add_view(&mut object, view);
        add_after_charge(&mut object, after);
        if let Some(by) = &payment.created_by {
            object["created_by"] = json!(by);
        }
        ApiResponse::json(200, &object)
    }
}

/// A payment that came through the queue, not the API: its status from the processor's
/// record and dead-letter mark as [`status_of`] reads them, its amount and currency from the
/// outcome when the provider answered (else `null`), `created` from its first claim (or its
/// dead-lettering), `"source": "queue"`, and `sent_by` (the message's `SenderId`) when its
/// record says.
fn queue_payment(
    id: &str,
    record: Option<&IdempotencyRecord>,
    mark: Option<&DeadLetterMark>,
) -> Value {
    let view = status_from(record, mark);
    let outcome = record
        .and_then(|r| r.outcome.as_ref())
        .map(PaymentOutcome::from_outcome)
        .filter(|o| !o.currency.is_empty());
    let created_ms = record
        .map(|r| r.first_attempt_at_ms)
        .or(mark.map(|m| m.at_ms))
        .unwrap_or_default();
    let mut object = json!({
        "id": id,
        "object": "payment",
        "amount": outcome.as_ref().map(|o| o.amount),
        "currency": outcome.as_ref().map(|o| o.currency.clone()),
        "status": view.status.clone(),
        "created": created_ms / 1000,
        "source": "queue",
    });
    // Who sent the message its record completed (SQS's `SenderId`), when it says.
    if let Some(by) = record
        .and_then(|r| r.outcome.as_ref())
        .and_then(|o| o.text(sqs_once::SENDER_ID))
    {
        object["sent_by"] = json!(by);
    }
    add_view(&mut object, view);
    object
}

/// What happened after the charge, on the payment's object: `refunded_amount` and `refunds`
/// (each one's id, amount, state and provider id) when it has refunds, `disputed_amount` and
/// `disputes` when it has disputes, and `events` (the provider's events applied, oldest
/// first) when any was, with `events_not_listed` (those past the first 100, counted) when
/// there are more.
fn add_after_charge(object: &mut Value, after: Option<AfterCharge>) {
    let Some(a) = after else {
        return;
    };
    if !a.refunds.is_empty() {
        object["refunded_amount"] = json!(a.refunded_amount);
        object["refunds"] = json!(a.refunds);
    }
    if !a.disputes.is_empty() {
        object["disputed_amount"] = json!(a.disputed_amount);
        object["disputes"] = json!(a.disputes);
    }
    if !a.events.is_empty() {
        object["events"] = json!(a.events);
    }
    if a.events_not_listed > 0 {
        object["events_not_listed"] = json!(a.events_not_listed);
    }
}

/// The fields a status view adds to a payment object, where it has them.
fn add_view(object: &mut Value, view: StatusView) {
    let extra = [
        ("provider_payment_id", view.provider_payment_id),
        ("decline_code", view.decline_code),
        ("error_code", view.error_code),
        ("error_message", view.error_message),
        ("next_action", view.next_action),
    ];
    for (k, v) in extra {
        if let Some(v) = v {
            object[k] = json!(v);
        }
    }
}

fn payment_object(id: &str, amount: i64, currency: &str, status: &str, created: i64) -> Value {
    json!({
        "id": id,
        "object": "payment",
        "amount": amount,
        "currency": currency,
        "status": status,
        "created": created,
    })
}

/// Where a payment stands, for `GET`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusView {
    /// `pending`, `processing`, `succeeded`, `declined`, `requires_action`, `failed` (the
    /// provider refused it), `dead_lettered`, or another PaymentIntent status the provider
    /// answered with.
    pub status: String,
    /// The provider's PaymentIntent id, once known.
    pub provider_payment_id: Option<String>,
    /// The card's decline code.
    pub decline_code: Option<String>,
    /// The dead letter's `error_code`.
    pub error_code: Option<String>,
    /// The dead letter's reason.
    pub error_message: Option<String>,
    /// What the merchant must do (for `requires_action`: bring the customer on-session).
    pub next_action: Option<String>,
}

/// Whether a processor record's digest and a payment row's are of one request. Equal digests
/// are; a digest stored before versioned digests (no `version:` prefix) beside a versioned
/// one cannot be compared without the request, so they are taken as one: only payments in
/// flight across that upgrade have such a pair, and without it their GET would read
/// `pending` forever.
fn same_digest(a: &str, b: &str) -> bool {
    let unversioned = |h: &str| h.len() == 64 && h.bytes().all(|c| c.is_ascii_hexdigit());
    a == b || (unversioned(a) && b.contains(':')) || (unversioned(b) && a.contains(':'))
}

/// The status of a payment from its processor record and dead-letter mark. A terminal outcome
/// wins (a provider's refusal is `failed`, with the code its dead letter carries); a live claim
/// is `processing` (a redriven message is being worked on); a mark for this payment's
/// parameters is `dead_lettered`; a record between attempts is `processing`; no record yet is
/// `pending`.
pub fn status_of(
    payment: &StoredPayment,
    record: Option<&IdempotencyRecord>,
    mark: Option<&DeadLetterMark>,
) -> StatusView {
    let ours = |h: &str| same_digest(h, &payment.request_hash);
    let record = record.filter(|r| ours(&r.payload_hash));
    let mark = mark.filter(|m| ours(&m.payload_hash));
    status_from(record, mark)
}

/// The status of the request a record and a mark are of (already matched to it).
fn status_from(record: Option<&IdempotencyRecord>, mark: Option<&DeadLetterMark>) -> StatusView {
    let view = |status: &str| StatusView {
        status: status.to_owned(),
        ..StatusView::default()
    };
    let with_error = |status: &str, code: String, message: String| StatusView {
        error_code: Some(code),
        error_message: Some(message),
        ..view(status)
    };
    match (record, mark) {
        (Some(r), _) if r.status == RecordStatus::Completed => {
            let Some(o) = r.outcome.as_ref().map(PaymentOutcome::from_outcome) else {
                return view("processing");
            };
            if o.is_rejected() {
                let (code, why) = rejection_code(&o);
                return with_error("failed", code.to_owned(), why);
            }
            StatusView {
                provider_payment_id: o.provider_payment_id.clone(),
                decline_code: o.decline_code.clone(),
                next_action: (o.label() == Some(crate::payments::charge::labels::REQUIRES_ACTION))
                    .then(|| {
                        crate::payments::charge::requires_action_hint(
                            o.provider_payment_id.as_deref(),
                        )
                    }),
                ..view(&o.status)
            }
        }
        (Some(r), _) if r.status == RecordStatus::InProgress => view("processing"),
        // The processor refused this request (its key names another one), or the relay set it
        // aside (the queue refused its message for its content). Never charged.
        (_, Some(m))
            if m.error_code == sqs_once::record::KEY_REUSED
                || m.error_code == crate::payments::outbox::MESSAGE_REFUSED =>
        {
            with_error("failed", m.error_code.clone(), m.error_message.clone())
        }
        (_, Some(m)) => with_error(
            "dead_lettered",
            m.error_code.clone(),
            m.error_message.clone(),
        ),
        (Some(_), None) => view("processing"),
        (None, None) => view("pending"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use super::*;
    use sqs_once::clock::SystemClock;
    use sqs_once::Outcome;

    #[test]
    fn a_payment_the_relay_set_aside_reads_failed_with_its_reason() {
        let row = StoredPayment {
            id: "p1".into(),
            amount: 100,
            currency: "usd".into(),
            customer_id: "cus_1".into(),
            created: 1,
            request_hash: "payment/v1:aa".into(),
            response_status: 202,
            response_body: "{}".into(),
            expires_at_s: 1,
            created_by: None,
        };
        let mark = DeadLetterMark {
            key: "p1".into(),
            payload_hash: "payment/v1:aa".into(),
            error_code: crate::payments::outbox::MESSAGE_REFUSED.into(),
            error_message: "the payments queue refused the payment's message".into(),
            at_ms: 1,
            expires_at_s: 1,
        };
        let v = status_of(&row, None, Some(&mark));
        assert_eq!(v.status, "failed");
        assert_eq!(v.error_code.as_deref(), Some("message_refused"));
        // Another request's mark under the key says nothing of this row.
        let other = DeadLetterMark {
            payload_hash: "payment/v1:bb".into(),
            ..mark
        };
        assert_eq!(status_of(&row, None, Some(&other)).status, "pending");
    }

    /// Payment rows in a map; `outbox` holds each row's outbox fields, written with it.
    #[derive(Default)]
    struct Tables {
        payments: Mutex<HashMap<String, StoredPayment>>,
        outbox: Mutex<HashMap<String, OutboxEntry>>,
        records: Mutex<HashMap<String, IdempotencyRecord>>,
        marks: Mutex<HashMap<String, DeadLetterMark>>,
        refunds: Mutex<HashMap<String, AfterCharge>>,
        down: AtomicBool,
    }

    #[async_trait]
    impl PaymentsStore for Tables {
        async fn create(
            &self,
            payment: &StoredPayment,
            entry: &OutboxEntry,
        ) -> Result<Creation, Unavailable> {
            if self.down.load(Ordering::SeqCst) {
                return Err(Unavailable("table down".into()));
            }
            let mut rows = self.payments.lock().unwrap();
            if let Some(existing) = rows.get(&payment.id) {
                return Ok(Creation::Exists(existing.clone()));
            }
            rows.insert(payment.id.clone(), payment.clone());
            self.outbox
                .lock()
                .unwrap()
                .insert(entry.payment_id.clone(), entry.clone());
            Ok(Creation::Created)
        }

        async fn payment(&self, id: &str) -> Result<Option<StoredPayment>, Unavailable> {
            Ok(self.payments.lock().unwrap().get(id).cloned())
        }

        async fn progress(
            &self,
            id: &str,
        ) -> Result<(Option<IdempotencyRecord>, Option<DeadLetterMark>), Unavailable> {
            if self.down.load(Ordering::SeqCst) {
                return Err(Unavailable("table down".into()));
            }
            Ok((
                self.records.lock().unwrap().get(id).cloned(),
                self.marks.lock().unwrap().get(id).cloned(),
            ))
        }

        async fn after_charge(&self, id: &str) -> Result<Option<AfterCharge>, Unavailable> {
            Ok(self.refunds.lock().unwrap().get(id).cloned())
        }
    }

    fn api() -> (PaymentsApi, Arc<Tables>) {
        let tables = Arc::new(Tables::default());
        let api = PaymentsApi::new(
            tables.clone(),
            Arc::new(SystemClock),
            Duration::from_secs(86_400),
        );
        (api, tables)
    }

    const BODY: &str = r#"{"amount":1999,"currency":"usd","customer_id":"cus_42","payment_method":"pm_card_visa","metadata":{"order":"1234"}}"#;

    async fn post(api: &PaymentsApi, key: Option<&str>, body: &str) -> ApiResponse {
        let key = key.map(str::to_owned);
        api.handle(
            "POST",
            "/v1/payments",
            move |h| {
                if h == IDEMPOTENCY_KEY {
                    key.clone()
                } else {
                    None
                }
            },
            body.as_bytes(),
        )
        .await
    }

    async fn get(api: &PaymentsApi, id: &str) -> ApiResponse {
        api.handle("GET", &format!("/v1/payments/{id}"), |_| None, b"")
            .await
    }

    fn json_of(r: &ApiResponse) -> Value {
        serde_json::from_str(&r.body).unwrap()
    }

    #[tokio::test]
    async fn a_retry_gets_the_first_answer_byte_for_byte_and_one_outbox_entry() {
        let (api, tables) = api();
        let first = post(&api, Some("order-1234"), BODY).await;
        assert_eq!(first.status, 202, "{}", first.body);
        let object = json_of(&first);
        assert_eq!(object["id"], "order-1234");
        assert_eq!(object["object"], "payment");
        assert_eq!(object["status"], "pending");
        assert_eq!(object["amount"], 1999);
        assert!(first.headers.is_empty());
        // Same parameters in another key order and currency case: the same request.
        let reordered = r#"{"metadata":{"order":"1234"},"payment_method":"pm_card_visa","customer_id":"cus_42","currency":"USD","amount":1999}"#;
        for body in [BODY, reordered] {
            let again = post(&api, Some("order-1234"), body).await;
            assert_eq!(again.status, 202);
            assert_eq!(again.body, first.body, "byte for byte");
            assert_eq!(
                again.headers,
                vec![("idempotent-replayed", "true".to_owned())]
            );
        }
        let outbox = tables.outbox.lock().unwrap();
        assert_eq!(outbox.len(), 1);
        let message = PaymentRequest::parse(&outbox["order-1234"].message).unwrap();
        assert_eq!(message.payment_id.as_str(), "order-1234");
        assert_eq!(message.metadata["order"], "1234");
    }

    #[tokio::test]
    async fn the_payment_keeps_who_created_it_and_get_says_so_never_from_a_header() {
        let (api, tables) = api();
        let by = "arn:aws:sts::111122223333:assumed-role/order-service/i-0abc";
        let headers = |h: &str| match h {
            IDEMPOTENCY_KEY => Some("order-by".to_owned()),
            // A caller cannot name itself: this header is nobody's word.
            "x-created-by" => Some("arn:aws:iam::111122223333:role/someone-else".to_owned()),
            _ => None,
        };
        let created = api
            .handle_as(Some(by), "POST", "/v1/payments", headers, BODY.as_bytes())
            .await;
        assert_eq!(created.status, 202, "{}", created.body);
        assert_eq!(
            tables.payments.lock().unwrap()["order-by"]
                .created_by
                .as_deref(),
            Some(by)
        );
        assert_eq!(json_of(&get(&api, "order-by").await)["created_by"], by);
        // Without an authenticated principal (payctl api serve), nothing is claimed.
        assert_eq!(post(&api, Some("order-anon"), BODY).await.status, 202);
        assert!(json_of(&get(&api, "order-anon").await)
            .get("created_by")
            .is_none());
    }

    #[tokio::test]
    async fn the_api_writes_the_contract_it_is_configured_with_and_a_retry_across_a_change_replays()
    {
        let (api, tables) = api();
        let suffixed = r#"{"amount":1999,"currency":"usd","customer_id":"cus_42","payment_method":"pm_card_visa","statement_descriptor_suffix":"ORDER 1234"}"#;
        // Contract 1 (the default): the new field is not taken yet, the version never a body
        // parameter, and the message carries no version.
        let early = post(&api, Some("k-early"), suffixed).await;
        assert_eq!(early.status, 400, "{}", early.body);
        assert_eq!(
            json_of(&early)["error"]["param"],
            "statement_descriptor_suffix"
        );
        let versioned = BODY.replacen('{', r#"{"contract_version":2,"#, 1);
        assert_eq!(post(&api, Some("k-v"), &versioned).await.status, 400);
        assert_eq!(post(&api, Some("k-1"), BODY).await.status, 202);
        assert!(!tables.outbox.lock().unwrap()["k-1"]
            .message
            .contains("contract_version"));
        // Contract 2: the field is taken and the message says its version; a retry of a key
        // first written under contract 1 is the same request.
        let api = PaymentsApi::new(
            tables.clone(),
            Arc::new(SystemClock),
            Duration::from_secs(86_400),
        )
        .with_contract(2);
        let again = post(&api, Some("k-1"), BODY).await;
        assert_eq!(
            (again.status, again.headers.len()),
            (202, 1),
            "{}",
            again.body
        );
        assert_eq!(post(&api, Some("k-2"), suffixed).await.status, 202);
        let message = tables.outbox.lock().unwrap()["k-2"].message.clone();
        let request = PaymentRequest::parse(&message).unwrap();
        assert_eq!(request.contract_version, 2);
        assert_eq!(
            request.statement_descriptor_suffix.as_deref(),
            Some("ORDER 1234")
        );
        // Back to contract 1: a retry of the payment accepted under 2 is replayed, nothing
        // written; a new one with the field is refused.
        let api = PaymentsApi::new(
            tables.clone(),
            Arc::new(SystemClock),
            Duration::from_secs(86_400),
        );
        let retry = post(&api, Some("k-2"), suffixed).await;
        assert_eq!(
            (retry.status, retry.headers.len()),
            (202, 1),
            "{}",
            retry.body
        );
        assert_eq!(post(&api, Some("k-3"), suffixed).await.status, 400);
        assert_eq!(tables.outbox.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn the_same_key_with_other_parameters_is_an_idempotency_error() {
        let (api, tables) = api();
        assert_eq!(post(&api, Some("k1"), BODY).await.status, 202);
        let other = post(&api, Some("k1"), &BODY.replace("1999", "2000")).await;
        assert_eq!(other.status, 400);
        assert_eq!(json_of(&other)["error"]["type"], "idempotency_error");
        assert_eq!(tables.payments.lock().unwrap()["k1"].amount, 1999);
    }

    #[tokio::test]
    async fn a_bad_body_names_the_field_stores_nothing_and_a_corrected_retry_works() {
        let (api, tables) = api();
        let cases = [
            (BODY.replace("1999", "\"1999\""), "amount"),
            (BODY.replace("1999", "0"), "amount"),
            (BODY.replace("\"usd\"", "\"xyz\""), "currency"),
            (
                BODY.replace("pm_card_visa", "4242424242424242"),
                "payment_method",
            ),
            (BODY.replace("\"amount\"", "\"ammount\""), "ammount"),
            (BODY.replace(",\"currency\":\"usd\"", ""), "currency"),
            (BODY.replace("\"1234\"}", "1234}"), "metadata"),
        ];
        for (body, field) in cases {
            let r = post(&api, Some("k2"), &body).await;
            assert_eq!(r.status, 400, "{body}");
            let e = &json_of(&r)["error"];
            assert_eq!(e["type"], "invalid_request_error");
            assert_eq!(e["param"], field, "{body}: {}", r.body);
            assert!(!r.body.contains("4242424242424242"), "card data echoed");
        }
        assert!(tables.payments.lock().unwrap().is_empty());
        assert!(tables.outbox.lock().unwrap().is_empty());
        assert_eq!(post(&api, Some("k2"), BODY).await.status, 202);
    }

    #[tokio::test]
    async fn what_stripe_would_refuse_is_parameter_invalid_naming_the_field_and_the_limit() {
        let (api, tables) = api();
        let cases = [
            (BODY.replace("1999", "30"), "amount", "0.50 usd"),
            (
                BODY.replace("1999", "49").replace("\"usd\"", "\"jpy\""),
                "amount",
                "50 jpy",
            ),
            (
                BODY.replace("1999", "1005").replace("\"usd\"", "\"kwd\""),
                "amount",
                "end in 0",
            ),
            (BODY.replace("\"1234\"}", "\"\"}"), "metadata", "unset"),
        ];
        for (body, field, limit) in cases {
            let r = post(&api, Some("k3"), &body).await;
            assert_eq!(r.status, 400, "{body}");
            let e = &json_of(&r)["error"];
            assert_eq!(
                (e["code"].as_str(), e["param"].as_str()),
                (Some("parameter_invalid"), Some(field)),
                "{}",
                r.body
            );
            assert!(
                e["message"].as_str().is_some_and(|m| m.contains(limit)),
                "{}",
                r.body
            );
        }
        assert!(tables.outbox.lock().unwrap().is_empty(), "nothing queued");
        let refund_key = post(&api, Some("refund:r1"), BODY).await;
        assert_eq!(json_of(&refund_key)["error"]["param"], "Idempotency-Key");
    }

    #[tokio::test]
    async fn key_and_envelope_errors() {
        let (api, _) = api();
        let missing = post(&api, None, BODY).await;
        assert_eq!(missing.status, 400);
        assert_eq!(json_of(&missing)["error"]["param"], "Idempotency-Key");
        let bad = post(&api, Some("has space"), BODY).await;
        assert_eq!(json_of(&bad)["error"]["code"], "idempotency_key_invalid");
        assert_eq!(post(&api, Some(&"k".repeat(256)), BODY).await.status, 400);
        assert_eq!(post(&api, Some(&"k".repeat(255)), BODY).await.status, 202);
        let id_in_body = post(
            &api,
            Some("k3"),
            &BODY.replace("{\"amount\"", "{\"payment_id\":\"x\",\"amount\""),
        )
        .await;
        assert_eq!(json_of(&id_in_body)["error"]["param"], "payment_id");
        assert_eq!(
            json_of(&post(&api, Some("k3"), "{nope").await)["error"]["code"],
            "body_invalid_json"
        );
        assert_eq!(post(&api, Some("k3"), "[1]").await.status, 400);
        let huge = format!("{{\"description\":\"{}\"}}", "d".repeat(MAX_REQUEST_BYTES));
        assert_eq!(post(&api, Some("k3"), &huge).await.status, 413);
        assert_eq!(get(&api, "nope").await.status, 404);
        assert_eq!(
            api.handle("DELETE", "/v1/payments/k3", |_| None, b"")
                .await
                .status,
            405
        );
        assert_eq!(
            api.handle("GET", "/v2/other", |_| None, b"").await.status,
            404
        );
    }

    #[tokio::test]
    async fn a_store_outage_is_a_500_and_the_retry_creates_the_payment() {
        let (api, tables) = api();
        tables.down.store(true, Ordering::SeqCst);
        let r = post(&api, Some("k4"), BODY).await;
        assert_eq!(r.status, 500);
        assert_eq!(json_of(&r)["error"]["type"], "api_error");
        // The write may have committed with its answer lost: the text says only that.
        let said = json_of(&r)["error"]["message"].as_str().unwrap().to_owned();
        assert!(said.contains("not known yet"), "{said}");
        assert!(said.contains("same Idempotency-Key"), "{said}");
        assert!(!said.contains("nothing was charged"), "{said}");
        tables.down.store(false, Ordering::SeqCst);
        assert_eq!(post(&api, Some("k4"), BODY).await.status, 202);
        // A failed read of a stored payment says nothing about its status.
        tables.down.store(true, Ordering::SeqCst);
        let r = api.handle("GET", "/v1/payments/k4", |_| None, b"").await;
        assert_eq!(r.status, 500);
        let said = json_of(&r)["error"]["message"].as_str().unwrap().to_owned();
        assert!(said.contains("says nothing about its status"), "{said}");
        assert!(!said.contains("charged"), "{said}");
    }

    fn record(status: RecordStatus, hash: &str, outcome: Option<Outcome>) -> IdempotencyRecord {
        IdempotencyRecord {
            traceparent: None,
            key: "p".into(),
            status,
            payload_hash: hash.into(),
            lease_owner: None,
            lease_expires_at_ms: 0,
            attempts: 1,
            outcome,
            expires_at_s: 0,
            first_attempt_at_ms: 0,
            unknown_outcome: false,
            last_error: None,
            completed_at_ms: None,
            not_before_ms: None,
        }
    }

    fn outcome(status: &str) -> Outcome {
        PaymentOutcome {
            status: status.into(),
            provider_payment_id: Some("pi_1".into()),
            decline_code: (status == "declined").then(|| "insufficient_funds".into()),
            amount: 1999,
            currency: "usd".into(),
            reason: (status == "rejected").then(|| "amount_too_small: no".into()),
        }
        .to_outcome()
    }

    #[tokio::test]
    async fn a_payment_sent_to_the_queue_is_read_from_its_record() {
        let (api, tables) = api();
        assert_eq!(get(&api, "q").await.status, 404, "known nowhere");
        let set = |r: IdempotencyRecord| {
            tables.records.lock().unwrap().insert(
                "q".into(),
                IdempotencyRecord {
                    traceparent: None,
                    key: "q".into(),
                    ..r
                },
            );
        };
        set(record(RecordStatus::InProgress, "h", None));
        let working = json_of(&get(&api, "q").await);
        assert_eq!(working["status"], "processing");
        assert_eq!(working["source"], "queue");
        assert!(
            working["amount"].is_null(),
            "not known before the provider answers"
        );
        set(record(
            RecordStatus::Completed,
            "h",
            Some(outcome("succeeded")),
        ));
        let done = json_of(&get(&api, "q").await);
        assert_eq!(
            (
                &done["status"],
                &done["amount"],
                &done["currency"],
                &done["source"]
            ),
            (
                &json!("succeeded"),
                &json!(1999),
                &json!("usd"),
                &json!("queue")
            )
        );
        assert_eq!(done["provider_payment_id"], "pi_1");
        assert!(done.get("refunds").is_none(), "no refunds, no field");
        tables.refunds.lock().unwrap().insert(
            "q".into(),
            AfterCharge {
                refunded_amount: 500,
                refunds: vec![crate::api::view::RefundView {
                    refund_id: "rf-1".into(),
                    amount: 500,
                    state: "succeeded".into(),
                    provider_refund_id: Some("re_1".into()),
                    error_code: None,
                }],
                ..AfterCharge::default()
            },
        );
        let refunded = json_of(&get(&api, "q").await);
        assert_eq!(refunded["refunded_amount"], 500);
        assert_eq!(
            refunded["refunds"],
            json!([{"refund_id": "rf-1", "amount": 500, "state": "succeeded", "provider_refund_id": "re_1"}])
        );
    }

    #[tokio::test]
    async fn get_follows_the_processor_record_and_its_dead_letter_mark() {
        let (api, tables) = api();
        assert_eq!(post(&api, Some("p"), BODY).await.status, 202);
        let hash = tables.payments.lock().unwrap()["p"].request_hash.clone();
        let status = |r: ApiResponse| json_of(&r)["status"].as_str().unwrap().to_owned();
        assert_eq!(status(get(&api, "p").await), "pending");
        let set = |r: Option<IdempotencyRecord>| {
            let mut m = tables.records.lock().unwrap();
            match r {
                Some(r) => m.insert("p".into(), r),
                None => m.remove("p"),
            };
        };
        set(Some(record(RecordStatus::InProgress, &hash, None)));
        assert_eq!(status(get(&api, "p").await), "processing");
        set(Some(record(
            RecordStatus::Completed,
            &hash,
            Some(outcome("succeeded")),
        )));
        let done = json_of(&get(&api, "p").await);
        assert_eq!(done["status"], "succeeded");
        assert_eq!(done["provider_payment_id"], "pi_1");
        set(Some(record(
            RecordStatus::Completed,
            &hash,
            Some(outcome("declined")),
        )));
        assert_eq!(
            json_of(&get(&api, "p").await)["decline_code"],
            "insufficient_funds"
        );
        set(Some(record(
            RecordStatus::Completed,
            &hash,
            Some(outcome("requires_action")),
        )));
        let answer = json_of(&get(&api, "p").await);
        assert_eq!(answer["status"], "requires_action");
        assert!(
            answer["next_action"]
                .as_str()
                .is_some_and(|a| a.contains("on-session")),
            "{answer}"
        );
        set(Some(record(
            RecordStatus::Completed,
            &hash,
            Some(outcome("rejected")),
        )));
        let rejected = json_of(&get(&api, "p").await);
        assert_eq!(rejected["status"], "failed");
        assert_eq!(rejected["error_code"], "provider_rejected");

        // A mark for this payment's parameters says dead_lettered, unless a claim is live or
        // the payment completed; a mark for other parameters is not this payment's.
        let mark = |h: &str| DeadLetterMark {
            key: "p".into(),
            payload_hash: h.into(),
            error_code: "retries_exhausted".into(),
            error_message: "gave up".into(),
            at_ms: 1,
            expires_at_s: 0,
        };
        set(Some(record(RecordStatus::Failed, &hash, None)));
        assert_eq!(status(get(&api, "p").await), "processing");
        tables.marks.lock().unwrap().insert("p".into(), mark(&hash));
        let dead = json_of(&get(&api, "p").await);
        assert_eq!(dead["status"], "dead_lettered");
        assert_eq!(dead["error_code"], "retries_exhausted");
        set(Some(record(RecordStatus::InProgress, &hash, None)));
        assert_eq!(status(get(&api, "p").await), "processing");
        set(Some(record(
            RecordStatus::Completed,
            &hash,
            Some(outcome("succeeded")),
        )));
        assert_eq!(status(get(&api, "p").await), "succeeded");
        set(None);
        tables
            .marks
            .lock()
            .unwrap()
            .insert("p".into(), mark("other"));
        assert_eq!(status(get(&api, "p").await), "pending");
        // Percent-encoded ids are decoded.
        assert_eq!(post(&api, Some("ord:1"), BODY).await.status, 202);
        assert_eq!(get(&api, "ord%3A1").await.status, 200);
    }

    #[tokio::test]
    async fn a_payment_row_outlives_every_processor_record_of_its_key() {
        let (api, tables) = api();
        let before = SystemClock.now_ms() / 1000;
        assert_eq!(post(&api, Some("long"), BODY).await.status, 202);
        let row = tables.payments.lock().unwrap()["long"].clone();
        // The latest first claim: a message sent at the row's write, claimed just before it
        // would be refused as request_expired (retention + the clock skew allowed); its record
        // lives the retention from then.
        let retention = 86_400i64;
        let record_gone_by = before + retention + 300 + retention;
        assert!(
            row.expires_at_s > record_gone_by,
            "row expires at {}, a record of its key may live until {record_gone_by}",
            row.expires_at_s
        );
        // While the row lives, other parameters under the key are refused at the API.
        let other = BODY.replace("1999", "2999");
        let r = post(&api, Some("long"), &other).await;
        assert_eq!(r.status, 400);
        assert_eq!(json_of(&r)["error"]["type"], "idempotency_error");
    }

    #[tokio::test]
    async fn the_key_is_held_for_as_long_as_its_record_lives_after_the_row_is_gone() {
        let (api, tables) = api();
        assert_eq!(post(&api, Some("year"), BODY).await.status, 202);
        let hash = tables.payments.lock().unwrap()["year"].request_hash.clone();
        // Charged, and refunded months later: the record lives on; the row's TTL ended.
        tables.records.lock().unwrap().insert(
            "year".into(),
            record(RecordStatus::Completed, &hash, Some(outcome("succeeded"))),
        );
        tables.payments.lock().unwrap().remove("year");
        tables.outbox.lock().unwrap().clear();
        let other = BODY.replace("1999", "2999");
        let r = post(&api, Some("year"), &other).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(json_of(&r)["error"]["type"], "idempotency_error");
        let again = post(&api, Some("year"), BODY).await;
        assert_eq!(again.status, 202, "{}", again.body);
        assert_eq!(
            again.headers,
            vec![("idempotent-replayed", "true".to_owned())]
        );
        assert_eq!(json_of(&again)["amount"], 1999);
        assert!(
            tables.payments.lock().unwrap().is_empty() && tables.outbox.lock().unwrap().is_empty(),
            "nothing is written for a key that is taken: no second message"
        );
        // GET answers from the record for as long.
        let read = json_of(&get(&api, "year").await);
        assert_eq!(read["status"], "succeeded");
        // A record of a payment sent through the queue holds its key at the API too.
        tables.records.lock().unwrap().insert(
            "raw".into(),
            record(RecordStatus::InProgress, "payment/v1:other", None),
        );
        assert_eq!(post(&api, Some("raw"), BODY).await.status, 400);
        // An unfinished record of the same request (its message in the queue or dead-lettered
        // retries_exhausted, its row gone): replayed, nothing written. A second message would
        // carry a fresh first_sent_at and could claim the key after the record's TTL, without
        // its unknown-outcome mark: the redrive of the first message is the way on.
        assert_eq!(post(&api, Some("stuck"), BODY).await.status, 202);
        let stuck_row = tables.payments.lock().unwrap().remove("stuck").unwrap();
        let stuck = stuck_row.request_hash.clone();
        tables.outbox.lock().unwrap().clear();
        tables
            .records
            .lock()
            .unwrap()
            .insert("stuck".into(), record(RecordStatus::Failed, &stuck, None));
        let r = post(&api, Some("stuck"), BODY).await;
        assert_eq!(r.status, 202, "{}", r.body);
        assert_eq!(r.headers, vec![("idempotent-replayed", "true".to_owned())]);
        assert!(
            tables.payments.lock().unwrap().get("stuck").is_none()
                && tables.outbox.lock().unwrap().is_empty(),
            "no second message for an unfinished record"
        );
        tables
            .payments
            .lock()
            .unwrap()
            .insert("stuck".into(), stuck_row);
        // A row of this request under a key a raw message of other parameters claimed first
        // answers for itself (its stored answer), as before the record was read.
        tables.records.lock().unwrap().insert(
            "stuck".into(),
            record(RecordStatus::Completed, "payment/v1:other", None),
        );
        let r = post(&api, Some("stuck"), BODY).await;
        assert_eq!(r.status, 202, "{}", r.body);
        assert_eq!(r.headers, vec![("idempotent-replayed", "true".to_owned())]);
        assert_eq!(post(&api, Some("stuck"), &other).await.status, 400);
        // A record's store that cannot answer writes nothing either.
        tables.down.store(true, Ordering::SeqCst);
        assert_eq!(post(&api, Some("new"), BODY).await.status, 500);
        tables.down.store(false, Ordering::SeqCst);
        assert_eq!(post(&api, Some("new"), BODY).await.status, 202);
    }

    #[tokio::test]
    async fn a_request_the_processor_refused_as_key_reuse_reads_failed() {
        let (api, tables) = api();
        assert_eq!(post(&api, Some("k"), BODY).await.status, 202);
        let hash = tables.payments.lock().unwrap()["k"].request_hash.clone();
        // The key's record belongs to another request (a raw message sent before the POST).
        tables.records.lock().unwrap().insert(
            "k".into(),
            record(
                RecordStatus::Completed,
                "payment/v1:other",
                Some(outcome("succeeded")),
            ),
        );
        assert_eq!(
            json_of(&get(&api, "k").await)["status"],
            "pending",
            "not this payment's record"
        );
        tables.marks.lock().unwrap().insert(
            "k".into(),
            DeadLetterMark {
                key: "k".into(),
                payload_hash: hash,
                error_code: sqs_once::record::KEY_REUSED.into(),
                error_message: "k was already used for a different request".into(),
                at_ms: 1,
                expires_at_s: 0,
            },
        );
        let r = json_of(&get(&api, "k").await);
        assert_eq!(r["status"], "failed");
        assert_eq!(r["error_code"], "idempotency_key_reused");
    }

    #[tokio::test]
    async fn a_retry_of_a_payment_accepted_before_the_text_rule_is_answered_not_refused() {
        // An earlier release accepted this body (a control character in its description) and
        // stored its row; a caller's retry after the upgrade must get that answer back, not a
        // 400 that reads as "never happened" (a new key would then charge twice).
        let (api, tables) = api();
        let body = r#"{"amount":1999,"currency":"usd","customer_id":"cus_1","payment_method":"pm_card_visa","description":"bell \u0007"}"#;
        let refused = post(&api, Some("old"), body).await;
        assert_eq!(refused.status, 400, "a new payment holding it is refused");
        assert!(tables.payments.lock().unwrap().is_empty());
        let mut value: Value = serde_json::from_str(body).unwrap();
        value["payment_id"] = "old".into();
        let before = PaymentRequest::from_value_as_before(value).unwrap();
        assert!(before.refused_now.is_some());
        let entry = OutboxEntry {
            payment_id: "old".into(),
            message: before.to_message_body(),
            created_at: 1,
            customer_id: "cus_1".into(),
            ..OutboxEntry::default()
        };
        let row = StoredPayment {
            id: "old".into(),
            amount: 1999,
            currency: "usd".into(),
            customer_id: "cus_1".into(),
            created: 1,
            request_hash: before.payload_hash(),
            response_status: 202,
            response_body: r#"{"id":"old","status":"pending"}"#.into(),
            expires_at_s: i64::MAX / 1000,
            created_by: None,
        };
        tables.create(&row, &entry).await.unwrap();
        let retry = post(&api, Some("old"), body).await;
        assert_eq!(retry.status, 202, "{}", retry.body);
        assert_eq!(json_of(&retry)["id"], "old");
        // Other parameters under that key are still refused as such.
        let other = body.replace("1999", "2000");
        assert_eq!(post(&api, Some("old"), &other).await.status, 400);
    }
}
