//! The provider adapter for Stripe's wire format (`POST /v1/payment_intents`, form encoded).
//!
//! It works against Stripe (test or live mode) and against the project's simulator. Every
//! request carries `Stripe-Version` (the pinned [`DEFAULT_API_VERSION`] unless configured), so
//! what a request means does not depend on the account's default version. A payment is created
//! and confirmed **off-session** (`confirm=true&off_session=true`): the customer is not in a
//! checkout flow, so no `return_url` is needed, and a card that needs the customer answers
//! `402 authentication_required` instead of waiting in `requires_action` for nobody.
//! It maps HTTP answers to [`ProviderResponse`] / [`ProviderError`].
//! The API key is a [`SecretString`]: it is only exposed to build the `Authorization` header and
//! never appears in a log line or an error.
//!
//! Why ~900 lines: ~320 of them are unit tests of the wire format against Stripe's published
//! fixtures; the adapter itself is ~520.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqs_once::pace::Pace;
use tracing::Instrument;

use crate::domain::PaymentRequest;
use crate::provider::{
    FailureKind, FoundPayment, PaymentProvider, PaymentQuery, ProviderError, ProviderResponse,
    RateLimit,
};

/// The Stripe API version the project is built and tested against: the one the official
/// `stripe` Python package 16.1.0 pins (`stripe/_api_version.py`). `STRIPE_API_VERSION`
/// overrides it; the contract test (`make test`) checks this constant against the package.
pub const DEFAULT_API_VERSION: &str = "2026-10-28.endive";

/// True for a well-formed Stripe API version: `YYYY-MM-DD`, optionally `.name`
/// (`2026-10-28.endive`, `2023-08-16`).
pub fn is_api_version(v: &str) -> bool {
    let (date, name) = v.split_once('.').unwrap_or((v, "a"));
    let parts: Vec<&str> = date.split('-').collect();
    let num = |p: &str, len: usize, range: std::ops::RangeInclusive<u32>| {
        p.len() == len
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| range.contains(&n))
    };
    parts.len() == 3
        && num(parts[0], 4, 2011..=2099)
        && num(parts[1], 2, 1..=12)
        && num(parts[2], 2, 1..=31)
        && !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase())
}

/// Pages of a customer's PaymentIntents read by one lookup (100 each): a lookup covers the
/// customer's intents since the payment's first attempt, which are few unless the customer is
/// charged thousands of times a day.
const MAX_LOOKUP_PAGES: usize = 20;

/// Stripe-style HTTP client.
pub struct StripeClient {
    /// Shared connection pool.
    pub(crate) http: reqwest::Client,
    /// Base URL without a trailing slash, e.g. `https://api.stripe.com`.
    pub(crate) base_url: String,
    /// The secret key, sent as a bearer token.
    pub(crate) api_key: SecretString,
    /// `Stripe-Version` of every request.
    api_version: String,
    /// Per-call timeout (connect + send + read).
    timeout: Duration,
    /// The process's request pace (`None`: unpaced).
    pace: Option<Arc<Pace>>,
}

impl std::fmt::Debug for StripeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeClient")
            .field("base_url", &self.base_url)
            .field("api_version", &self.api_version)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct IntentBody {
    id: String,
    status: String,
    #[serde(default)]
    amount: Option<i64>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    metadata: std::collections::HashMap<String, String>,
    #[serde(default)]
    last_payment_error: Option<ErrorDetail>,
}

impl IntentBody {
    fn found(self) -> FoundPayment {
        FoundPayment {
            failure_code: self
                .last_payment_error
                .and_then(|e| e.decline_code.or(e.code)),
            payment_id: self.metadata.get("payment_id").cloned(),
            provider_payment_id: self.id,
            status: self.status,
            amount: self.amount,
            currency: self.currency,
        }
    }
}

#[derive(Deserialize)]
struct SearchBody {
    data: Vec<IntentBody>,
    #[serde(default)]
    has_more: bool,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize, Default)]
struct ErrorDetail {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    decline_code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    payment_intent: Option<IntentRef>,
}

#[derive(Deserialize)]
struct IntentRef {
    id: String,
}

impl StripeClient {
    /// Builds a client that sends `Stripe-Version: api_version` (check it with
    /// [`is_api_version`] first). Fails only when the TLS stack cannot be initialised.
    pub fn new(
        base_url: &str,
        api_key: SecretString,
        api_version: &str,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            api_version: api_version.to_owned(),
            timeout,
            pace: None,
        })
    }

    /// Paces every request with `pace` (share it with the runner, see [`sqs_once::pace`]):
    /// each waits for its slot, a `429` about the account or an endpoint slows the pace down,
    /// an answer speeds it back up.
    pub fn with_pace(mut self, pace: Arc<Pace>) -> Self {
        self.pace = Some(pace);
        self
    }

    /// Waits for the request's slot; outside a runner's call, for at most the call timeout.
    /// A `GET` only reads: when the pace refuses a later request of the same call, the call
    /// changed nothing and its attempt is not spent ([`sqs_once::pace::Requests::only_read`]).
    async fn slot(&self, method: &reqwest::Method) -> Result<(), ProviderError> {
        let Some(pace) = &self.pace else {
            return Ok(());
        };
        let slot = if *method == reqwest::Method::GET {
            pace.acquire_read(self.timeout).await
        } else {
            pace.acquire(self.timeout).await
        };
        slot.map_err(|e| ProviderError::new(FailureKind::NotSent, e.to_string()))
    }

    /// Counts the provider's refusals (`429`), errors (a `5xx`, no answer) and authentication
    /// failures (`401`, `403`: a wrong, revoked or restricted key) as metrics (in a Lambda
    /// function: EMF lines for the dashboard and the alarms, at most ten a second each), and
    /// tells the pace what the provider answered.
    fn observed(&self, answer: &Result<(StatusCode, HeaderMap, String), ProviderError>) {
        static RATE_LIMITED: crate::telemetry::LineBudget = crate::telemetry::LineBudget::new();
        static ERRORS: crate::telemetry::LineBudget = crate::telemetry::LineBudget::new();
        static AUTHENTICATION: crate::telemetry::LineBudget = crate::telemetry::LineBudget::new();
        let metric = provider_metric_of(answer.as_ref().map(|(status, _, _)| *status).ok());
        let budget = match metric {
            Some(RATE_LIMITED_METRIC) => Some(&RATE_LIMITED),
            Some(AUTHENTICATION_METRIC) => Some(&AUTHENTICATION),
            Some(_) => Some(&ERRORS),
            None => None,
        };
        if let (Some(name), Some(budget)) = (metric, budget) {
            if crate::telemetry::metrics_on() {
                if let Some(count) = budget.tally(std::time::Instant::now()) {
                    println!(
                        "{}",
                        crate::telemetry::provider_metric(name, count, sqs_once::runner::now_ms())
                    );
                }
            }
        }
        self.paced(answer);
    }

    /// Tells the pace what the provider answered.
    fn paced(&self, answer: &Result<(StatusCode, HeaderMap, String), ProviderError>) {
        let (Some(pace), Ok((status, headers, body))) = (&self.pace, answer) else {
            return;
        };
        if *status == StatusCode::TOO_MANY_REQUESTS {
            match rate_limit_of(headers, body) {
                RateLimit::Account | RateLimit::Endpoint => pace.slowed(retry_after_of(headers)),
                RateLimit::Object => {}
            }
        } else if !status.is_server_error() {
            pace.succeeded();
        }
    }

    /// One request to `{base}{path}` with the key and `Stripe-Version`, `shape` adding the
    /// rest: the answer's status, headers and body, or a [`ProviderError`] when no answer came
    /// (classified for its ambiguity). Paced, and its answer counted and told to the pace.
    ///
    /// Its span (`POST /v1/payment_intents`, kind client) says the method, the route, the
    /// `Idempotency-Key`, the runner's attempt, the paced wait, the status and Stripe's
    /// `Request-Id`: never the body, the key or a query's values.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        idempotency_key: Option<&str>,
        shape: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<(StatusCode, HeaderMap, String), ProviderError> {
        let route = route_of(path);
        let span = tracing::info_span!(
            target: "otel",
            "provider request",
            otel.name = format!("{method} {route}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            http.request.method = method.as_str(),
            url.template = route.as_str(),
            server.address = host_of(&self.base_url),
            idempotency.key = idempotency_key,
            sqs_once.attempt = sqs_once::trace::attempt(),
            pace.wait_ms = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            stripe.request_id = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        async {
            let waiting = std::time::Instant::now();
            let slot = self.slot(&method).await;
            if self.pace.is_some() {
                span.record("pace.wait_ms", waiting.elapsed().as_millis() as i64);
            }
            if let Err(e) = slot {
                span.record("error.type", "not_sent");
                return Err(e);
            }
            let url = format!("{}{path}", self.base_url);
            let mut request = self
                .http
                .request(method, &url)
                .bearer_auth(self.api_key.expose_secret())
                .header("Stripe-Version", &self.api_version);
            if let Some(key) = idempotency_key {
                request = request.header("Idempotency-Key", key);
            }
            let answer = answer_of(shape(request).send().await, &url).await;
            match &answer {
                Ok((status, headers, _)) => {
                    span.record("http.response.status_code", status.as_u16());
                    if let Some(id) = headers.get("request-id").and_then(|v| v.to_str().ok()) {
                        span.record("stripe.request_id", id);
                    }
                    if status.is_client_error() || status.is_server_error() {
                        span.record("error.type", status.as_str());
                        span.record("otel.status_code", "ERROR");
                    }
                }
                Err(e) => {
                    span.record("error.type", format!("{:?}", e.kind).to_lowercase());
                    span.record("otel.status_code", "ERROR");
                }
            }
            self.observed(&answer);
            answer
        }
        .instrument(span.clone())
        .await
    }

    /// `POST {path}` with a form body and an `Idempotency-Key`.
    pub(crate) async fn post_form(
        &self,
        path: &str,
        idempotency_key: &str,
        form: &[(String, String)],
    ) -> Result<(StatusCode, HeaderMap, String), ProviderError> {
        self.send(reqwest::Method::POST, path, Some(idempotency_key), |r| {
            r.form(form)
        })
        .await
    }

    /// `GET {path}?{query}`.
    pub(crate) async fn get(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<(StatusCode, HeaderMap, String), ProviderError> {
        self.send(reqwest::Method::GET, path, None, |r| r.query(query))
            .await
    }

    /// `DELETE {path}`.
    pub(crate) async fn delete(
        &self,
        path: &str,
    ) -> Result<(StatusCode, HeaderMap, String), ProviderError> {
        self.send(reqwest::Method::DELETE, path, None, |r| r).await
    }

    /// The `Stripe-Version` this client sends.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// `POST /v1/customers` with an `Idempotency-Key`: the new customer's id (`payctl smoke`
    /// charges a customer of its own).
    pub async fn create_customer(
        &self,
        idempotency_key: &str,
        description: &str,
    ) -> Result<String, ProviderError> {
        let form = [("description".to_owned(), description.to_owned())];
        let (status, headers, body) = self
            .post_form("/v1/customers", idempotency_key, &form)
            .await?;
        #[derive(Deserialize)]
        struct Created {
            id: String,
        }
        if !status.is_success() {
            let refused = interpret(status, &headers, &body)?;
            return Err(ProviderError::new(
                FailureKind::Unexpected,
                format!("creating a customer was refused: {refused:?}"),
            ));
        }
        serde_json::from_str::<Created>(&body)
            .map(|c| c.id)
            .map_err(|e| {
                ProviderError::new(FailureKind::Network, format!("unreadable customer: {e}"))
            })
    }

    /// `GET /v1/payment_intents/{id}`: one PaymentIntent as the provider holds it now.
    pub async fn retrieve_payment(&self, id: &str) -> Result<FoundPayment, ProviderError> {
        let (status, headers, body) = self.get(&format!("/v1/payment_intents/{id}"), &[]).await?;
        listing(status, &headers, &body, |_: &IntentBody| false).map(IntentBody::found)
    }

    /// The form body of a create-and-confirm call, in Stripe's encoding of nested fields:
    /// confirmed off-session, since the customer is not present when a queue is worked.
    pub fn form_fields(request: &PaymentRequest) -> Vec<(String, String)> {
        let mut form = vec![
            ("amount".to_owned(), request.money.amount.to_string()),
            ("currency".to_owned(), request.money.currency.clone()),
            ("customer".to_owned(), request.customer_id.clone()),
            ("payment_method".to_owned(), request.payment_method.clone()),
            ("confirm".to_owned(), "true".to_owned()),
            ("off_session".to_owned(), "true".to_owned()),
        ];
        if let Some(d) = &request.description {
            form.push(("description".to_owned(), d.clone()));
        }
        if let Some(suffix) = &request.statement_descriptor_suffix {
            form.push(("statement_descriptor_suffix".to_owned(), suffix.clone()));
        }
        for (k, v) in &request.metadata {
            form.push((format!("metadata[{k}]"), v.clone()));
        }
        form.push((
            "metadata[payment_id]".to_owned(),
            request.payment_id.as_str().to_owned(),
        ));
        form
    }
}

/// A request path as its span names it: an object's id (`pi_3Mt...`, `re_1Q...`) becomes `{id}`,
/// so that every request to one endpoint has one name.
fn route_of(path: &str) -> String {
    let path = path.split('?').next().unwrap_or_default();
    path.split('/')
        .map(|segment| match segment.split_once('_') {
            Some((prefix, rest))
                if !prefix.is_empty()
                    && prefix.bytes().all(|b| b.is_ascii_lowercase())
                    && rest
                        .bytes()
                        .any(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) =>
            {
                "{id}"
            }
            _ => segment,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The host a base URL names (`api.stripe.com`).
fn host_of(base_url: &str) -> &str {
    let rest = base_url.split_once("://").map_or(base_url, |(_, r)| r);
    rest.split(['/', ':']).next().unwrap_or(rest)
}

/// The status, headers and body of a sent request, or a [`ProviderError`] classified by how
/// the exchange failed.
async fn answer_of(
    sent: Result<reqwest::Response, reqwest::Error>,
    url: &str,
) -> Result<(StatusCode, HeaderMap, String), ProviderError> {
    let failed = |e: reqwest::Error, what: &str| {
        ProviderError::new(
            classify_send_error(&e),
            format!("{what} failed: {}", e.without_url()),
        )
    };
    let response = sent.map_err(|e| failed(e, &format!("request to {url}")))?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .text()
        .await
        .map_err(|e| failed(e, "reading the answer"))?;
    Ok((status, headers, body))
}

/// A read's body (a search, a list, one object): a refusal is classified as an answer is;
/// an unreadable body is a network failure (retried); more than one page is not a state this
/// processor creates.
pub(crate) fn listing<T: serde::de::DeserializeOwned>(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    has_more: impl Fn(&T) -> bool,
) -> Result<T, ProviderError> {
    if !status.is_success() {
        interpret(status, headers, body)?;
        return Err(ProviderError::new(
            FailureKind::Misconfigured,
            format!("lookup refused with HTTP {status}"),
        ));
    }
    let found: T = serde_json::from_str(body).map_err(|e| {
        ProviderError::new(
            FailureKind::Network,
            format!("unreadable lookup answer: {e}"),
        )
    })?;
    if has_more(&found) {
        return Err(ProviderError::new(
            FailureKind::Misconfigured,
            "lookup returned more than 100 results for one id",
        ));
    }
    Ok(found)
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(crate) fn classify_send_error(e: &reqwest::Error) -> FailureKind {
    if e.is_timeout() {
        FailureKind::Timeout
    } else if e.is_connect() {
        FailureKind::Connect
    } else {
        FailureKind::Network
    }
}

/// `Retry-After` in whole seconds, when sent.
fn retry_after_of(headers: &HeaderMap) -> Option<Duration> {
    header_str(headers, "retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// What a `429` was about: `Stripe-Rate-Limited-Reason` (`global-rate`, `global-concurrency`,
/// `endpoint-rate`, `endpoint-concurrency`, `resource-specific`), else the error's code
/// (`lock_timeout`: another request holds the object); a `429` that says neither is taken as
/// the account's limit.
pub(crate) fn rate_limit_of(headers: &HeaderMap, body: &str) -> RateLimit {
    match header_str(headers, "stripe-rate-limited-reason").map(str::trim) {
        Some("global-rate" | "global-concurrency") => RateLimit::Account,
        Some("endpoint-rate" | "endpoint-concurrency") => RateLimit::Endpoint,
        Some("resource-specific") => RateLimit::Object,
        _ => {
            let code = serde_json::from_str::<ErrorBody>(body)
                .ok()
                .and_then(|b| b.error.code);
            if code.as_deref() == Some("lock_timeout") {
                RateLimit::Object
            } else {
                RateLimit::Account
            }
        }
    }
}

/// Maps one HTTP answer to the contract's outcome classes.
pub(crate) fn interpret(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
) -> Result<ProviderResponse, ProviderError> {
    let retry_after = retry_after_of(headers);
    let should_retry = header_str(headers, "stripe-should-retry").map(|v| v == "true");
    let replayed = header_str(headers, "idempotent-replayed") == Some("true");
    let rate_limit =
        (status == StatusCode::TOO_MANY_REQUESTS).then(|| rate_limit_of(headers, body));
    let fail = |kind: FailureKind, message: String| ProviderError {
        kind,
        message,
        retry_after,
        should_retry,
        replayed,
        rate_limit,
    };
    if status.is_success() {
        return match serde_json::from_str::<IntentBody>(body) {
            Ok(intent) => Ok(ProviderResponse::Charged {
                provider_payment_id: intent.id,
                status: intent.status,
                replayed,
            }),
            // A 2xx we cannot read may still be a charge: ambiguous, retried with the key.
            Err(e) => Err(fail(
                FailureKind::Network,
                format!("unreadable {status} answer: {e}"),
            )),
        };
    }
    let detail = serde_json::from_str::<ErrorBody>(body)
        .map(|b| b.error)
        .unwrap_or_default();
    let message = detail
        .message
        .clone()
        .unwrap_or_else(|| format!("HTTP {status}"));
    match status.as_u16() {
        402 if detail.code.as_deref() == Some("authentication_required")
            || detail.decline_code.as_deref() == Some("authentication_required") =>
        {
            Ok(ProviderResponse::NeedsAuthentication {
                provider_payment_id: detail.payment_intent.map(|p| p.id),
            })
        }
        402 => Ok(ProviderResponse::Declined {
            provider_payment_id: detail.payment_intent.map(|p| p.id),
            decline_code: detail.decline_code.or(detail.code),
        }),
        400 if detail.kind.as_deref() == Some("idempotency_error") => {
            Ok(ProviderResponse::KeyReused { message })
        }
        400 => Ok(ProviderResponse::Rejected {
            code: detail
                .code
                .or(detail.kind)
                .unwrap_or_else(|| "invalid_request".to_owned()),
            message,
        }),
        409 => Err(fail(FailureKind::KeyInUse, message)),
        429 => Err(fail(FailureKind::RateLimited, message)),
        500..=599 => Err(fail(
            FailureKind::ServerError,
            format!("HTTP {status}: {message}"),
        )),
        401 | 403 | 404 => Err(fail(
            FailureKind::Misconfigured,
            format!("HTTP {status} (check PROVIDER_API_URL and the API key): {message}"),
        )),
        _ => Err(fail(
            FailureKind::Unexpected,
            format!("unexpected HTTP {status}: {message}"),
        )),
    }
}

/// Maps a search answer: the intents found, or why the lookup could not be made.
fn interpret_search(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
) -> Result<Vec<FoundPayment>, ProviderError> {
    let found: SearchBody = listing(status, headers, body, |f: &SearchBody| f.has_more)?;
    Ok(found.data.into_iter().map(IntentBody::found).collect())
}

/// One page of a customer's PaymentIntents: those of the payment, and where the next page
/// starts (`None` on the last).
fn interpret_list_page(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    payment_id: &str,
) -> Result<(Vec<FoundPayment>, Option<String>), ProviderError> {
    let page: SearchBody = listing(status, headers, body, |_: &SearchBody| false)?;
    let next = if page.has_more {
        page.data.last().map(|i| i.id.clone())
    } else {
        None
    };
    let mine = page
        .data
        .into_iter()
        .map(IntentBody::found)
        .filter(|f| f.payment_id.as_deref() == Some(payment_id))
        .collect();
    Ok((mine, next))
}

impl StripeClient {
    /// `GET /v1/payment_intents?customer=…&created[gte]=…`, every page, keeping the
    /// payment's intents: a list is consistent, unlike search.
    async fn list_payments(
        &self,
        payment_id: &str,
        customer: &str,
        created_from_s: Option<i64>,
    ) -> Result<Vec<FoundPayment>, ProviderError> {
        let from = created_from_s.map(|t| t.to_string());
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_LOOKUP_PAGES {
            let mut query = vec![("customer", customer), ("limit", "100")];
            if let Some(f) = &from {
                query.push(("created[gte]", f.as_str()));
            }
            if let Some(a) = &after {
                query.push(("starting_after", a.as_str()));
            }
            let (status, headers, body) = self.get("/v1/payment_intents", &query).await?;
            let (mine, next) = interpret_list_page(status, &headers, &body, payment_id)?;
            found.extend(mine);
            match next {
                Some(n) => after = Some(n),
                None => return Ok(found),
            }
        }
        Err(ProviderError::new(
            FailureKind::Network,
            format!(
                "customer {customer} has more than {} PaymentIntents since the payment's first attempt: the lookup stopped",
                MAX_LOOKUP_PAGES * 100
            ),
        ))
    }
}

#[async_trait]
impl PaymentProvider for StripeClient {
    fn request_timeout(&self) -> Duration {
        self.timeout
    }

    async fn create_payment(
        &self,
        request: &PaymentRequest,
    ) -> Result<ProviderResponse, ProviderError> {
        let (status, headers, body) = self
            .post_form(
                "/v1/payment_intents",
                request.payment_id.as_str(),
                &Self::form_fields(request),
            )
            .await?;
        interpret(status, &headers, &body)
    }

    async fn find_payments(&self, q: &PaymentQuery) -> Result<Vec<FoundPayment>, ProviderError> {
        if let Some(customer) = &q.customer {
            return self
                .list_payments(q.payment_id.as_str(), customer, q.created_from_s)
                .await;
        }
        // Payment ids are [A-Za-z0-9_:.-], so they need no escaping inside the quotes.
        let query = format!("metadata['payment_id']:'{}'", q.payment_id.as_str());
        let (status, headers, body) = self
            .get(
                "/v1/payment_intents/search",
                &[("query", query.as_str()), ("limit", "100")],
            )
            .await?;
        interpret_search(status, &headers, &body)
    }
}

const RATE_LIMITED_METRIC: &str = "ProviderRateLimited";
const ERRORS_METRIC: &str = "ProviderErrors";
const AUTHENTICATION_METRIC: &str = "ProviderAuthenticationFailures";

/// The `Provider` metric an answer counts under (`None`: no answer at all, a transport
/// failure): `429` is a refusal of the pace, a `5xx` or no answer an error, `401` and `403`
/// a key the provider does not take (wrong, revoked, of the other mode, or a restricted key
/// without the permission): the template alarms on the first of those, as no retry mends it.
fn provider_metric_of(status: Option<StatusCode>) -> Option<&'static str> {
    match status {
        Some(StatusCode::TOO_MANY_REQUESTS) => Some(RATE_LIMITED_METRIC),
        Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => Some(AUTHENTICATION_METRIC),
        Some(status) if status.is_server_error() => Some(ERRORS_METRIC),
        Some(_) => None,
        None => Some(ERRORS_METRIC),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_key_the_provider_refuses_is_counted_apart_from_errors_and_refusals() {
        use reqwest::StatusCode as S;
        assert_eq!(
            provider_metric_of(Some(S::UNAUTHORIZED)),
            Some("ProviderAuthenticationFailures")
        );
        assert_eq!(
            provider_metric_of(Some(S::FORBIDDEN)),
            Some("ProviderAuthenticationFailures")
        );
        assert_eq!(
            provider_metric_of(Some(S::TOO_MANY_REQUESTS)),
            Some("ProviderRateLimited")
        );
        assert_eq!(
            provider_metric_of(Some(S::BAD_GATEWAY)),
            Some("ProviderErrors")
        );
        assert_eq!(provider_metric_of(None), Some("ProviderErrors"));
        for fine in [
            S::OK,
            S::PAYMENT_REQUIRED,
            S::BAD_REQUEST,
            S::NOT_FOUND,
            S::CONFLICT,
        ] {
            assert_eq!(provider_metric_of(Some(fine)), None, "{fine}");
        }
    }

    fn h(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn success_records_the_intent_status() {
        let r = interpret(
            StatusCode::OK,
            &h(&[("idempotent-replayed", "true")]),
            r#"{"id":"pi_1","status":"requires_action"}"#,
        );
        assert_eq!(
            r.unwrap(),
            ProviderResponse::Charged {
                provider_payment_id: "pi_1".into(),
                status: "requires_action".into(),
                replayed: true
            }
        );
    }

    /// A client of nothing that answers, paced with `pace`.
    fn paced_client(pace: &Arc<Pace>) -> StripeClient {
        StripeClient::new(
            "http://127.0.0.1:9",
            SecretString::from("sk_test_x".to_owned()),
            DEFAULT_API_VERSION,
            Duration::from_secs(1),
        )
        .unwrap()
        .with_pace(Arc::clone(pace))
    }

    #[test]
    fn a_429_says_what_it_is_about_and_only_the_rate_s_slow_the_pace() {
        let lock =
            r#"{"error":{"type":"invalid_request_error","code":"lock_timeout","message":"x"}}"#;
        let rate =
            r#"{"error":{"type":"invalid_request_error","code":"rate_limit","message":"x"}}"#;
        for (headers, body, want) in [
            (
                h(&[("stripe-rate-limited-reason", "global-rate")]),
                rate,
                RateLimit::Account,
            ),
            (
                h(&[("stripe-rate-limited-reason", "global-concurrency")]),
                rate,
                RateLimit::Account,
            ),
            (
                h(&[("stripe-rate-limited-reason", "endpoint-rate")]),
                rate,
                RateLimit::Endpoint,
            ),
            (
                h(&[("stripe-rate-limited-reason", "endpoint-concurrency")]),
                rate,
                RateLimit::Endpoint,
            ),
            (
                h(&[("stripe-rate-limited-reason", "resource-specific")]),
                rate,
                RateLimit::Object,
            ),
            (h(&[]), lock, RateLimit::Object),
            (h(&[]), rate, RateLimit::Account),
        ] {
            let e = interpret(StatusCode::TOO_MANY_REQUESTS, &headers, body).unwrap_err();
            assert_eq!(
                (e.kind, e.rate_limit),
                (FailureKind::RateLimited, Some(want))
            );
            assert!(!e.is_ambiguous() && e.retry_now());
        }
        let pace = Arc::new(Pace::new(8.0));
        let client = paced_client(&pace);
        let answer = |status: u16, headers: HeaderMap, body: &str| {
            Ok((
                StatusCode::from_u16(status).unwrap(),
                headers,
                body.to_owned(),
            ))
        };
        // A lock on one object: the pace is not the cause.
        client.paced(&answer(429, h(&[]), lock));
        assert_eq!(pace.rate(), 8.0);
        client.paced(&answer(
            429,
            h(&[("stripe-rate-limited-reason", "global-rate")]),
            rate,
        ));
        assert_eq!(pace.rate(), 4.0);
        // An answer, even a refusal of the request itself, grows it back; a 5xx does not.
        client.paced(&answer(500, h(&[]), "{}"));
        assert_eq!(pace.rate(), 4.0);
        client.paced(&answer(402, h(&[]), "{}"));
        assert!((pace.rate() - 4.08).abs() < 1e-9, "{}", pace.rate());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_a_slot_in_time_is_not_sent() {
        let pace = Arc::new(Pace::new(1.0));
        let client = paced_client(&pace);
        // The only slot of the next two seconds is taken.
        pace.book(tokio::time::Instant::now()).unwrap();
        let latest = tokio::time::Instant::now() + Duration::from_millis(500);
        let e = sqs_once::pace::within(latest, client.get("/v1/payment_intents/pi_1", &[]))
            .await
            .0
            .unwrap_err();
        assert_eq!(e.kind, FailureKind::NotSent);
        assert!(!e.is_ambiguous() && !e.retry_now(), "{e}");
    }

    #[test]
    fn api_versions_are_checked_for_their_form() {
        for ok in [DEFAULT_API_VERSION, "2023-08-16", "2024-06-20"] {
            assert!(is_api_version(ok), "{ok}");
        }
        for bad in [
            "",
            "latest",
            "2024-13-01",
            "2024-6-20",
            "2024-06-20.",
            "2024-06-20.Acacia",
            "2024-06-20; beta=v1",
        ] {
            assert!(!is_api_version(bad), "{bad}");
        }
    }

    #[test]
    fn an_off_session_card_that_needs_the_customer_is_not_a_decline() {
        let r = interpret(
            StatusCode::PAYMENT_REQUIRED,
            &h(&[]),
            r#"{"error":{"type":"card_error","code":"authentication_required","decline_code":"authentication_required","payment_intent":{"id":"pi_9","status":"requires_payment_method"}}}"#,
        );
        assert_eq!(
            r.unwrap(),
            ProviderResponse::NeedsAuthentication {
                provider_payment_id: Some("pi_9".into())
            }
        );
    }

    #[test]
    fn decline_and_rejections_are_definitive() {
        let d = interpret(
            StatusCode::PAYMENT_REQUIRED,
            &h(&[]),
            r#"{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","payment_intent":{"id":"pi_2"}}}"#,
        );
        assert_eq!(
            d.unwrap(),
            ProviderResponse::Declined {
                provider_payment_id: Some("pi_2".into()),
                decline_code: Some("insufficient_funds".into())
            }
        );
        let k = interpret(
            StatusCode::BAD_REQUEST,
            &h(&[]),
            r#"{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}"#,
        );
        assert!(matches!(k.unwrap(), ProviderResponse::KeyReused { .. }));
        let r = interpret(
            StatusCode::BAD_REQUEST,
            &h(&[]),
            r#"{"error":{"type":"invalid_request_error","code":"resource_missing","message":"No such customer"}}"#,
        );
        assert!(
            matches!(r.unwrap(), ProviderResponse::Rejected { code, .. } if code == "resource_missing")
        );
    }

    #[test]
    fn transient_statuses_carry_retry_hints() {
        let e = interpret(
            StatusCode::TOO_MANY_REQUESTS,
            &h(&[("retry-after", "2"), ("stripe-should-retry", "true")]),
            "{}",
        )
        .unwrap_err();
        assert_eq!(e.kind, FailureKind::RateLimited);
        assert_eq!(e.retry_after, Some(Duration::from_secs(2)));
        assert!(e.retry_now() && !e.is_ambiguous());
        let e = interpret(
            StatusCode::INTERNAL_SERVER_ERROR,
            &h(&[("stripe-should-retry", "false")]),
            "",
        )
        .unwrap_err();
        assert!(e.is_ambiguous() && !e.retry_now());
        let e = interpret(
            StatusCode::INTERNAL_SERVER_ERROR,
            &h(&[("idempotent-replayed", "true")]),
            "",
        )
        .unwrap_err();
        assert!(e.replayed && !e.retry_now(), "a replayed 500 never changes");
        let e = interpret(StatusCode::CONFLICT, &h(&[]), "{}").unwrap_err();
        assert_eq!(e.kind, FailureKind::KeyInUse);
        assert!(
            e.is_ambiguous(),
            "a 409: another call with the key may charge"
        );
        for s in [401u16, 403, 404] {
            let e = interpret(StatusCode::from_u16(s).unwrap(), &h(&[]), "{}").unwrap_err();
            assert_eq!(e.kind, FailureKind::Misconfigured);
            assert!(!e.is_ambiguous(), "{s} is refused before execution");
        }
        for s in [302u16, 418, 422] {
            let e = interpret(StatusCode::from_u16(s).unwrap(), &h(&[]), "{}").unwrap_err();
            assert_eq!(e.kind, FailureKind::Unexpected);
            assert!(e.is_ambiguous(), "{s} proves nothing");
        }
        let e = interpret(StatusCode::TOO_MANY_REQUESTS, &h(&[]), "{}").unwrap_err();
        assert!(!e.is_ambiguous(), "a 429 is refused before execution");
    }

    #[test]
    fn search_lists_the_intents_found() {
        let found = interpret_search(
            StatusCode::OK,
            &h(&[]),
            r#"{"object":"search_result","data":[{"id":"pi_1","status":"succeeded"}],"has_more":false}"#,
        )
        .unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].is_charge());
        let (mine, next) = interpret_list_page(
            StatusCode::OK,
            &h(&[]),
            r#"{"object":"list","data":[{"id":"pi_3","status":"succeeded","metadata":{"payment_id":"other"}},{"id":"pi_2","status":"processing","metadata":{"payment_id":"p1"}}],"has_more":true}"#,
            "p1",
        )
        .unwrap();
        assert_eq!(mine.len(), 1, "only the payment's own intents");
        assert!(!mine[0].is_charge() && mine[0].is_pending());
        assert_eq!(
            next.as_deref(),
            Some("pi_2"),
            "the next page starts after the last"
        );
        let e = interpret_search(StatusCode::TOO_MANY_REQUESTS, &h(&[]), "{}").unwrap_err();
        assert_eq!(e.kind, FailureKind::RateLimited);
    }

    #[test]
    fn form_carries_the_payment_id_in_metadata() {
        let p = PaymentRequest::parse(
            r#"{"payment_id":"pay_1","amount":500,"currency":"USD","customer_id":"c","payment_method":"pm","metadata":{"a":"b"}}"#,
        )
        .unwrap();
        let f = StripeClient::form_fields(&p);
        assert!(f.contains(&("currency".into(), "usd".into())));
        assert!(f.contains(&("confirm".into(), "true".into())));
        assert!(f.contains(&("off_session".into(), "true".into())));
        assert!(f.contains(&("metadata[a]".into(), "b".into())));
        assert!(f.contains(&("metadata[payment_id]".into(), "pay_1".into())));
    }

    /// Stripe's published example of an API object (`tests/fixtures/stripe`).
    pub(crate) fn fixture(name: &str) -> serde_json::Value {
        use std::io::Read;
        let gz: &[u8] = include_bytes!("../../tests/fixtures/stripe/fixtures3.json.gz");
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_string(&mut text)
            .unwrap();
        let all: serde_json::Value = serde_json::from_str(&text).unwrap();
        all["resources"][name].clone()
    }

    #[test]
    fn stripe_s_own_payment_intent_parses_and_only_succeeded_is_a_charge() {
        let pi = fixture("payment_intent");
        assert_eq!(pi["object"], "payment_intent");
        let id = pi["id"].as_str().unwrap().to_owned();
        for status in [
            "succeeded",
            "processing",
            "requires_action",
            "requires_payment_method",
        ] {
            let mut answer = pi.clone();
            answer["status"] = status.into();
            let r = interpret(StatusCode::OK, &h(&[]), &answer.to_string()).unwrap();
            assert_eq!(
                r,
                ProviderResponse::Charged {
                    provider_payment_id: id.clone(),
                    status: status.into(),
                    replayed: false
                }
            );
            let request = PaymentRequest::parse(
                r#"{"payment_id":"p1","amount":1099,"currency":"usd","customer_id":"cus_1","payment_method":"pm_card_visa"}"#,
            )
            .unwrap();
            let (o, dead) = crate::payments::charge::outcome_of(&request, &r);
            assert!(dead.is_none());
            assert_eq!(o.is_charge(), status == "succeeded", "{status}");
        }
        // In a list, as GET /v1/payment_intents answers: found by its metadata[payment_id].
        let mut mine = pi.clone();
        mine["metadata"] = serde_json::json!({"payment_id": "p1"});
        let list = serde_json::json!({"object": "list", "url": "/v1/payment_intents", "has_more": false, "data": [pi, mine]});
        let (found, next) =
            interpret_list_page(StatusCode::OK, &h(&[]), &list.to_string(), "p1").unwrap();
        assert_eq!((found.len(), next), (1, None));
        assert_eq!(found[0].amount, Some(1099));
        assert_eq!(found[0].currency.as_deref(), Some("usd"));
    }

    #[test]
    fn debug_output_hides_the_key() {
        let c = StripeClient::new(
            "http://x",
            SecretString::from("sk_test_secret"),
            DEFAULT_API_VERSION,
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("sk_test_secret"));
    }
}
