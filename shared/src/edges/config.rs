//! Typed function configuration, read from the environment once at init.
//!
//! The variable names are the contract shared by `template.yaml`, the local runner and the
//! tests. A missing or invalid value is a [`ConfigError`] naming the variable, so the init fails
//! loudly instead of the first payment failing obscurely.
//!
//! Why ~520 lines: ~150 of them are the unit tests of the refusals, beside the rules they
//! check.

use std::time::Duration;

use secrecy::SecretString;

use sqs_once::settings::{Settings, DEFAULT_TTL_SECONDS};

/// How long Stripe remembers an idempotency key.
pub const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(24 * 3600);

pub use crate::payments::charge::MAX_CLOCK_SKEW;

/// Where the provider's API key comes from.
#[derive(Debug, Clone)]
pub enum ApiKeySource {
    /// `PAYMENT_API_KEY_SECRET_ARN`: read from Secrets Manager once at init.
    SecretArn(String),
    /// `PAYMENT_API_KEY`: plain, for local use.
    Plain(SecretString),
}

/// The processor's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `IDEMPOTENCY_TABLE`: the idempotency table's name.
    pub idempotency_table: String,
    /// `DEAD_LETTER_QUEUE_URL`: where bad messages go, with a reason.
    pub dead_letter_queue_url: String,
    /// `PROVIDER_API_URL`: the provider's base URL.
    pub payment_api_url: String,
    /// The provider key's source.
    pub api_key: ApiKeySource,
    /// `STRIPE_API_VERSION` (default [`crate::stripe::DEFAULT_API_VERSION`]): the
    /// `Stripe-Version` header of every provider request.
    pub stripe_api_version: String,
    /// `PAYMENT_API_TIMEOUT_SECONDS` (default 10): the provider client's timeout.
    pub provider_timeout: Duration,
    /// `PROVIDER_KEY_RETENTION_SECONDS` (default 24 hours, Stripe's): how long the provider
    /// remembers an idempotency key.
    pub provider_key_retention: Duration,
    /// Protocol tunables (`IDEMPOTENCY_TTL_SECONDS` or `IDEMPOTENCY_TTL_DAYS`, `MAX_CONCURRENCY`, `LEASE_SECONDS`,
    /// `PROVIDER_MAX_ATTEMPTS`, `REDELIVERY_BASE_DELAY_SECONDS`, `REDELIVERY_MAX_DELAY_SECONDS`,
    /// `QUEUE_VISIBILITY_TIMEOUT_SECONDS`, `PROVIDER_KEY_RETENTION_SECONDS`,
    /// `PROVIDER_KEY_RETENTION_MARGIN_SECONDS`, `PROVIDER_PROCESSING_ALLOWANCE_SECONDS`,
    /// `PROVIDER_SEARCH_LAG_SECONDS`, `RETRY_HORIZON_SECONDS`, `QUEUE_MAX_RECEIVE_COUNT`,
    /// `RETENTION_MARGIN_SECONDS`, default the visibility timeout).
    pub settings: Settings,
    /// `REFUND_WINDOW_DAYS` (default 365, [`crate::payments::charge::DEFAULT_REFUND_WINDOW`]): how long
    /// after a charge refunds are accepted; the charge's record, which holds its refund
    /// ledger, is kept that long (never less than the record retention).
    pub refund_window: Duration,
    /// `SOURCE_QUEUE_URL` (optional): the queue the function's event source mapping reads.
    /// When set, the init reads its redrive policy and retention and refuses a retry horizon
    /// that does not end the retention margin before the retention.
    pub source_queue_url: Option<String>,
    /// `PAYMENTS_TABLE` (optional, the refund processor's): the payments API's table, where
    /// a payment accepted but not yet processed has its row. A refund of a payment that has
    /// neither a record nor a row there, or a row older than a record can still be claimed
    /// (its record expired), is dead-lettered `payment_unknown` at once.
    pub payments_table: Option<String>,
    /// `PROVIDER_EVENTS_QUEUE_URL` (optional, the event function's): where its scheduled
    /// catch-up queues the events it lists.
    pub provider_events_queue_url: Option<String>,
    /// Requests a second this process may send the provider (`None`: unpaced), from
    /// `PROVIDER_REQUESTS_PER_SECOND` (the stack's share of the account's limit), times
    /// `PROVIDER_SHARE_PERCENT` (default 100: this function's part of it), divided by
    /// `EVENT_SOURCE_MAX_CONCURRENCY` (default 1: the instances the event-source mapping runs
    /// at most, which share it). See [`sqs_once::pace`].
    pub provider_pace: Option<f64>,
    /// The scheduled catch-up's rate (`None`: unpaced): `PROVIDER_REQUESTS_PER_SECOND` times
    /// `PROVIDER_SHARE_PERCENT`, not divided among the event source's instances. A run is one
    /// invocation at a time, with no batch in its instance, and it lists pages one after
    /// another (docs/events.md, "The catch-up's capacity").
    pub catch_up_pace: Option<f64>,
    /// What the scheduled catch-up lists, from `PROVIDER_EVENTS_DELIVERY` (`webhook`, the
    /// default, and `both`: only the events not delivered to every webhook endpoint;
    /// `eventbridge`: every event of the inbox's types, as Stripe's undelivered filter says
    /// nothing of an EventBridge destination).
    pub catch_up_lists: crate::events::catch_up::Listed,
    /// This stack's webhook endpoint as registered at the provider (`PROVIDER_EVENTS_URL`, the
    /// template's `ProviderEventsUrl`): the one the catch-up must find enabled and sent every
    /// type before it lists only the undelivered. Unset: every endpoint at the receiver's path.
    pub provider_events_url: Option<String>,
    /// `REFUNDS_QUEUE_URL` (optional, the event function's): where the refunds a payment
    /// held are sent again once it settled ([`crate::refunds::held`]). Unset: none are.
    pub refunds_queue_url: Option<String>,
    /// `HELD_REFUND_HORIZON_DAYS` (default 30, 1 to 365): how long after its charge began a
    /// payment that holds refunds may still be settling before the catch-up's sweep counts it
    /// overdue (`HeldRefundsOverdue`).
    pub held_refund_horizon: Duration,
}

/// A configuration problem, naming the variable.
#[derive(Debug, thiserror::Error)]
#[error("configuration error in {var}: {reason}")]
pub struct ConfigError {
    /// The environment variable at fault.
    pub var: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn err(var: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        reason: reason.into(),
    }
}

impl Config {
    /// Refuses a pace whose slots come further apart than the lease less a call: a work that
    /// reads before it writes (a refund looking its earlier reservation up) could then never
    /// send both in one attempt, and its message would only ever wait. The refund function's
    /// init checks it (`ProviderRequestsPerSecond` at least 0.15 times `MaximumConcurrency`
    /// with the template's lease and timeout).
    pub fn check_read_and_write_fit_a_lease(&self) -> Result<(), ConfigError> {
        let Some(rate) = self.provider_pace else {
            return Ok(());
        };
        let room = self
            .settings
            .lease
            .saturating_sub(self.provider_timeout + self.settings.processing_allowance);
        if rate * room.as_secs_f64() >= 1.0 {
            return Ok(());
        }
        Err(err(
            "PROVIDER_REQUESTS_PER_SECOND",
            format!(
                "this instance's share, {rate:.4} requests a second (the stack's rate times PROVIDER_SHARE_PERCENT, divided by EVENT_SOURCE_MAX_CONCURRENCY), sends one every {:.0} s: a refund's lookup and its write must both start within LEASE_SECONDS less PAYMENT_API_TIMEOUT_SECONDS and PROVIDER_PROCESSING_ALLOWANCE_SECONDS ({} s). Raise ProviderRequestsPerSecond, or lower MaximumConcurrency",
                1.0 / rate,
                room.as_secs()
            ),
        ))
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads configuration through `get` (the environment, or a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let required = |var: &'static str| required_var(&get, var);
        let number = |var: &'static str, default: u64, min: u64, max: u64| {
            number_var(&get, var, default, min, max)
        };
        let (payment_api_url, renamed) = provider_api_url(&get)?;
        if let Some(warning) = renamed {
            tracing::warn!("{warning}");
        }
        if !(payment_api_url.starts_with("https://") || payment_api_url.starts_with("http://")) {
            return Err(err("PROVIDER_API_URL", "must be an http(s) URL"));
        }
        let api_key = match (get("PAYMENT_API_KEY_SECRET_ARN"), get("PAYMENT_API_KEY")) {
            (Some(arn), _) if !arn.trim().is_empty() => {
                ApiKeySource::SecretArn(arn.trim().to_owned())
            }
            (_, Some(key)) if !key.trim().is_empty() => {
                ApiKeySource::Plain(SecretString::from(key.trim().to_owned()))
            }
            _ => {
                return Err(err(
                    "PAYMENT_API_KEY_SECRET_ARN",
                    "is required (or PAYMENT_API_KEY for local use)",
                ))
            }
        };
        let stripe_api_version = stripe_api_version(&get)?;
        let defaults = Settings::default();
        let settings = Settings {
            record_ttl: record_ttl(&get)?,
            max_concurrency: number("MAX_CONCURRENCY", defaults.max_concurrency as u64, 1, 1_000)?
                as usize,
            lease: Duration::from_secs(number(
                "LEASE_SECONDS",
                defaults.lease.as_secs(),
                2,
                43_200,
            )?),
            call_attempts: number(
                "PROVIDER_MAX_ATTEMPTS",
                defaults.call_attempts as u64,
                1,
                20,
            )? as usize,
            redelivery_base_delay: Duration::from_secs(number(
                "REDELIVERY_BASE_DELAY_SECONDS",
                defaults.redelivery_base_delay.as_secs(),
                0,
                43_200,
            )?),
            redelivery_max_delay: Duration::from_secs(number(
                "REDELIVERY_MAX_DELAY_SECONDS",
                defaults.redelivery_max_delay.as_secs(),
                0,
                43_200,
            )?),
            visibility_timeout: Duration::from_secs(number(
                "QUEUE_VISIBILITY_TIMEOUT_SECONDS",
                defaults.visibility_timeout.as_secs(),
                1,
                43_200,
            )?),
            key_retention_margin: Duration::from_secs(number(
                "PROVIDER_KEY_RETENTION_MARGIN_SECONDS",
                defaults.key_retention_margin.as_secs(),
                0,
                86_400,
            )?),
            processing_allowance: Duration::from_secs(number(
                "PROVIDER_PROCESSING_ALLOWANCE_SECONDS",
                defaults.processing_allowance.as_secs(),
                0,
                300,
            )?),
            search_lag: Duration::from_secs(number(
                "PROVIDER_SEARCH_LAG_SECONDS",
                defaults.search_lag.as_secs(),
                0,
                86_400,
            )?),
            retry_horizon: Duration::from_secs(number(
                "RETRY_HORIZON_SECONDS",
                defaults.retry_horizon.as_secs(),
                0,
                14 * 86_400,
            )?),
            max_receive_count: match get("QUEUE_MAX_RECEIVE_COUNT") {
                Some(v) if !v.trim().is_empty() => {
                    Some(number("QUEUE_MAX_RECEIVE_COUNT", 0, 1, 1_000)? as u32)
                }
                _ => None,
            },
            ..defaults
        };
        // What one delivery can take before it hands the message back or dead-letters it is
        // under the visibility timeout (the template's is 6x the function's timeout).
        let settings = Settings {
            retention_margin: Duration::from_secs(number(
                "RETENTION_MARGIN_SECONDS",
                settings.visibility_timeout.as_secs(),
                1,
                86_400,
            )?),
            ..settings
        };
        let provider_timeout =
            Duration::from_secs(number("PAYMENT_API_TIMEOUT_SECONDS", 10, 1, 300)?);
        let provider_key_retention = Duration::from_secs(number(
            "PROVIDER_KEY_RETENTION_SECONDS",
            DEFAULT_KEY_RETENTION.as_secs(),
            1,
            30 * 86_400,
        )?);
        let call_window = provider_timeout + settings.processing_allowance;
        if call_window >= settings.lease {
            return Err(err(
                "LEASE_SECONDS",
                format!(
                    "must be longer than PAYMENT_API_TIMEOUT_SECONDS + PROVIDER_PROCESSING_ALLOWANCE_SECONDS ({} s): a call is only sent while the lease outlasts both",
                    call_window.as_secs()
                ),
            ));
        }
        // The longest attempt (a lease, and a call sent at its end) plus clock skew with the
        // provider: a smaller margin lets a blind call land after the key may be forgotten.
        let least_margin = settings.lease + call_window + MAX_CLOCK_SKEW;
        if settings.key_retention_margin < least_margin {
            return Err(err(
                "PROVIDER_KEY_RETENTION_MARGIN_SECONDS",
                format!(
                    "must be at least LEASE_SECONDS + PAYMENT_API_TIMEOUT_SECONDS + PROVIDER_PROCESSING_ALLOWANCE_SECONDS + {} s of clock skew = {} s, got {} s",
                    MAX_CLOCK_SKEW.as_secs(),
                    least_margin.as_secs(),
                    settings.key_retention_margin.as_secs()
                ),
            ));
        }
        let refund_window_days = number(
            "REFUND_WINDOW_DAYS",
            crate::payments::charge::DEFAULT_REFUND_WINDOW.as_secs() / 86_400,
            1,
            3_650,
        )?;
        let held_refund_horizon_days = number("HELD_REFUND_HORIZON_DAYS", 30, 1, 365)?;
        let refunds_queue_url = get("REFUNDS_QUEUE_URL").filter(|v| !v.trim().is_empty());
        // A settling payment's record, and the refunds it holds, live the refund window from
        // the hold: the overdue alarm must fire while they still do.
        if refunds_queue_url.is_some() && held_refund_horizon_days >= refund_window_days {
            return Err(err(
                "HELD_REFUND_HORIZON_DAYS",
                format!(
                    "must be less than REFUND_WINDOW_DAYS ({refund_window_days}), got {held_refund_horizon_days}: a payment holding refunds and their records live the refund window from the hold, and one still settling must be reported overdue before they expire"
                ),
            ));
        }
        Ok(Self {
            idempotency_table: required("IDEMPOTENCY_TABLE")?,
            dead_letter_queue_url: required("DEAD_LETTER_QUEUE_URL")?,
            payment_api_url,
            api_key,
            stripe_api_version,
            provider_timeout,
            provider_key_retention,
            settings,
            source_queue_url: get("SOURCE_QUEUE_URL").filter(|v| !v.trim().is_empty()),
            payments_table: get("PAYMENTS_TABLE").filter(|v| !v.trim().is_empty()),
            provider_events_queue_url: get("PROVIDER_EVENTS_QUEUE_URL")
                .filter(|v| !v.trim().is_empty()),
            provider_pace: provider_pace(&get)?.map(|p| p.instance),
            catch_up_pace: provider_pace(&get)?.map(|p| p.function),
            catch_up_lists: catch_up_lists(&get)?,
            provider_events_url: get("PROVIDER_EVENTS_URL").filter(|v| !v.trim().is_empty()),
            refunds_queue_url,
            held_refund_horizon: Duration::from_secs(held_refund_horizon_days * 86_400),
            refund_window: Duration::from_secs(refund_window_days * 86_400),
        })
    }
}

/// `STRIPE_API_VERSION`, or the pinned default; a malformed version is refused.
pub fn stripe_api_version(get: &impl Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    match get("STRIPE_API_VERSION") {
        Some(v) if !v.trim().is_empty() => {
            let v = v.trim();
            if crate::stripe::is_api_version(v) {
                Ok(v.to_owned())
            } else {
                Err(err(
                    "STRIPE_API_VERSION",
                    format!(
                        "must be a Stripe API version such as {} (YYYY-MM-DD[.name]), got {v:?}",
                        crate::stripe::DEFAULT_API_VERSION
                    ),
                ))
            }
        }
        _ => Ok(crate::stripe::DEFAULT_API_VERSION.to_owned()),
    }
}

/// The provider's (Stripe's) base URL: `PROVIDER_API_URL`, or, when it is unset, the variable's
/// old name `PAYMENT_API_URL` (one letter from `PAYMENTS_API_URL`, this system's own API, on the
/// neighbouring line of an operator's shell), with the warning to give for it.
pub fn provider_api_url(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(String, Option<String>), ConfigError> {
    match required_var(get, "PROVIDER_API_URL") {
        Ok(url) => Ok((url, None)),
        Err(missing) => match required_var(get, OLD_PROVIDER_API_URL) {
            Ok(url) => Ok((
                url,
                Some(format!(
                    "{OLD_PROVIDER_API_URL} is the old name of PROVIDER_API_URL (the provider's base URL, not PAYMENTS_API_URL, this system's API): it is read for now; rename it"
                )),
            )),
            Err(_) => Err(missing),
        },
    }
}

/// The old name of `PROVIDER_API_URL`, still read (with a warning) when the new one is unset.
pub const OLD_PROVIDER_API_URL: &str = "PAYMENT_API_URL";

fn required_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<String, ConfigError> {
    match get(var) {
        Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        _ => Err(err(var, "is required")),
    }
}

/// The variables of the provider's pace ([`Config::provider_pace`]): the deployment's; the
/// local tools pass them only when set in their own environment.
pub const PACE_VARS: [&str; 3] = [
    "PROVIDER_REQUESTS_PER_SECOND",
    "PROVIDER_SHARE_PERCENT",
    "EVENT_SOURCE_MAX_CONCURRENCY",
];

/// `PROVIDER_EVENTS_DELIVERY` (see [`Config::catch_up_lists`]).
fn catch_up_lists(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<crate::events::catch_up::Listed, ConfigError> {
    use crate::events::catch_up::Listed;
    match get("PROVIDER_EVENTS_DELIVERY").as_deref().map(str::trim) {
        None | Some("") | Some("webhook") | Some("both") => Ok(Listed::Undelivered),
        Some("eventbridge") => Ok(Listed::All),
        Some(other) => Err(err(
            "PROVIDER_EVENTS_DELIVERY",
            format!("must be webhook, eventbridge or both, got {other:?}"),
        )),
    }
}

/// The provider's rate for one instance of the function, and for the function as a whole.
#[derive(Debug, Clone, Copy)]
struct Rates {
    instance: f64,
    function: f64,
}

/// The process's share of the provider's rate (see [`Config::provider_pace`]).
fn provider_pace(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Rates>, ConfigError> {
    let total = match get("PROVIDER_REQUESTS_PER_SECOND") {
        Some(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 && r <= 100_000.0 => r,
            _ => {
                return Err(err(
                    "PROVIDER_REQUESTS_PER_SECOND",
                    format!("must be a number of requests a second above 0, got {v:?}"),
                ))
            }
        },
        _ => return Ok(None),
    };
    let share = number_var(get, "PROVIDER_SHARE_PERCENT", 100, 1, 100)?;
    let instances = number_var(get, "EVENT_SOURCE_MAX_CONCURRENCY", 1, 1, 10_000)?;
    let function = total * share as f64 / 100.0;
    Ok(Some(Rates {
        instance: function / instances as f64,
        function,
    }))
}

fn number_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    match get(var) {
        None => Ok(default),
        Some(v) if v.trim().is_empty() => Ok(default),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(err(
                var,
                format!("must be an integer from {min} to {max}, got {v:?}"),
            )),
        },
    }
}

/// `IDEMPOTENCY_TTL_SECONDS`, else `IDEMPOTENCY_TTL_DAYS`: seconds (the contract) win; days are
/// what the SAM template can pass without arithmetic.
fn record_ttl(get: &impl Fn(&str) -> Option<String>) -> Result<Duration, ConfigError> {
    let ttl_days = number_var(
        get,
        "IDEMPOTENCY_TTL_DAYS",
        DEFAULT_TTL_SECONDS / 86_400,
        1,
        365,
    )?;
    Ok(Duration::from_secs(number_var(
        get,
        "IDEMPOTENCY_TTL_SECONDS",
        ttl_days * 86_400,
        3600,
        365 * 86_400,
    )?))
}

/// The payments API's configuration.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// `PAYMENTS_TABLE`: payment rows and their outbox entries.
    pub payments_table: String,
    /// `IDEMPOTENCY_TABLE`: the processor's records, read for a payment's status.
    pub idempotency_table: String,
    /// `IDEMPOTENCY_TTL_SECONDS` / `IDEMPOTENCY_TTL_DAYS`: payment rows and their stored
    /// answers live as long as the processor's records.
    pub retention: Duration,
    /// `MESSAGE_CONTRACT_VERSION` (1 unless set): the message contract the API writes
    /// ([`crate::domain::contract`]).
    pub contract: u64,
}

impl ApiConfig {
    /// Reads configuration through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            payments_table: required_var(&get, "PAYMENTS_TABLE")?,
            idempotency_table: required_var(&get, "IDEMPOTENCY_TABLE")?,
            retention: record_ttl(&get)?,
            contract: crate::domain::contract::writes(get("MESSAGE_CONTRACT_VERSION").as_deref())
                .map_err(|reason| err("MESSAGE_CONTRACT_VERSION", reason))?,
        })
    }
}

/// The outbox relay's configuration.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `PAYMENTS_QUEUE_URL`: the processor's queue (the stack's reference, never built by hand).
    pub queue_url: String,
    /// `FIFO_GROUP_BY` (`customer`, the default, or `payment`): a FIFO queue's message groups.
    pub group_by: crate::payments::outbox::GroupBy,
    /// `IDEMPOTENCY_TABLE`: where a payment whose message the queue refuses is marked set
    /// aside (`message_refused`); without it such a row is retried as any other failure.
    pub idempotency_table: Option<String>,
}

impl RelayConfig {
    /// Reads configuration through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let group = get("FIFO_GROUP_BY").unwrap_or_default();
        Ok(Self {
            queue_url: required_var(&get, "PAYMENTS_QUEUE_URL")?,
            idempotency_table: get("IDEMPOTENCY_TABLE").filter(|t| !t.trim().is_empty()),
            group_by: crate::payments::outbox::GroupBy::parse(&group).ok_or_else(|| {
                err(
                    "FIFO_GROUP_BY",
                    format!("must be customer or payment, got {group:?}"),
                )
            })?,
        })
    }
}

/// Where the webhook signing secret comes from.
#[derive(Debug, Clone)]
pub enum SigningSecretSource {
    /// `WEBHOOK_SECRET_ARN`: Secrets Manager, cached.
    SecretArn(String),
    /// `WEBHOOK_SECRET`: plain (one `whsec_...`, or two comma-separated), for local use.
    Plain(String),
}

/// The provider-events receiver's configuration.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// `PROVIDER_EVENTS_QUEUE_URL`: where verified events go (the stack's reference).
    pub queue_url: String,
    /// The signing secret's source.
    pub secret: SigningSecretSource,
    /// `WEBHOOK_TOLERANCE_SECONDS` (default 300, Stripe's libraries'; 0 turns the age check
    /// off): how old a signature's timestamp may be.
    pub tolerance_s: u64,
}

impl ReceiverConfig {
    /// Reads configuration through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let secret = match (get("WEBHOOK_SECRET_ARN"), get("WEBHOOK_SECRET")) {
            (Some(arn), _) if !arn.trim().is_empty() => {
                SigningSecretSource::SecretArn(arn.trim().to_owned())
            }
            (_, Some(s)) if !s.trim().is_empty() => SigningSecretSource::Plain(s),
            _ => {
                return Err(err(
                    "WEBHOOK_SECRET_ARN",
                    "is required (or WEBHOOK_SECRET for local use)",
                ))
            }
        };
        Ok(Self {
            queue_url: required_var(&get, "PROVIDER_EVENTS_QUEUE_URL")?,
            secret,
            tolerance_s: number_var(
                &get,
                "WEBHOOK_TOLERANCE_SECONDS",
                crate::stripe::webhook::DEFAULT_TOLERANCE_SECONDS,
                0,
                86_400,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const BASE: &[(&str, &str)] = &[
        ("IDEMPOTENCY_TABLE", "t"),
        ("DEAD_LETTER_QUEUE_URL", "http://q/dlq"),
        ("PROVIDER_API_URL", "http://127.0.0.1:1"),
        ("PAYMENT_API_KEY", "sk_test_1"),
    ];

    #[test]
    fn minimal_configuration_uses_defaults() {
        let c = Config::from_lookup(env(BASE)).unwrap();
        assert_eq!(c.settings.max_concurrency, 10);
        assert_eq!(
            c.settings.record_ttl,
            Duration::from_secs(DEFAULT_TTL_SECONDS)
        );
        assert!(matches!(c.api_key, ApiKeySource::Plain(_)));
    }

    #[test]
    fn the_provider_s_pace_is_the_stack_s_rate_times_the_share_over_the_instances() {
        assert_eq!(Config::from_lookup(env(BASE)).unwrap().provider_pace, None);
        let with = |extra: &[(&'static str, &'static str)]| {
            let pairs: Vec<_> = BASE.iter().copied().chain(extra.iter().copied()).collect();
            Config::from_lookup(env(&pairs))
        };
        let paced = with(&[
            ("PROVIDER_REQUESTS_PER_SECOND", "20"),
            ("PROVIDER_SHARE_PERCENT", "60"),
            ("EVENT_SOURCE_MAX_CONCURRENCY", "10"),
        ])
        .unwrap();
        assert!((paced.provider_pace.unwrap() - 1.2).abs() < 1e-9);
        // The catch-up runs alone in its instance: the function's share, undivided.
        assert!((paced.catch_up_pace.unwrap() - 12.0).abs() < 1e-9);
        assert_eq!(
            with(&[("PROVIDER_REQUESTS_PER_SECOND", "12.5")])
                .unwrap()
                .provider_pace,
            Some(12.5)
        );
        // The refund function's pace must let a lookup and a write start within one lease
        // less a call (50 - 10 - 5 = 35 s by default): 1.5 a second at the refunds' 20 % over
        // 10 instances is one request in 33 s, 1.4 one in 36 s.
        let refunds = |rate: &'static str| {
            with(&[
                ("PROVIDER_REQUESTS_PER_SECOND", rate),
                ("PROVIDER_SHARE_PERCENT", "20"),
                ("EVENT_SOURCE_MAX_CONCURRENCY", "10"),
                ("LEASE_SECONDS", "50"),
            ])
            .unwrap()
            .check_read_and_write_fit_a_lease()
        };
        assert!(refunds("1.5").is_ok());
        assert!(refunds("20").is_ok());
        let refused = refunds("1.4").unwrap_err();
        assert_eq!(refused.var, "PROVIDER_REQUESTS_PER_SECOND");
        assert!(
            refused.reason.contains("one every 36 s"),
            "{}",
            refused.reason
        );
        assert!(Config::from_lookup(env(BASE))
            .unwrap()
            .check_read_and_write_fit_a_lease()
            .is_ok());
        for (var, bad) in [
            ("PROVIDER_REQUESTS_PER_SECOND", "0"),
            ("PROVIDER_REQUESTS_PER_SECOND", "fast"),
            ("PROVIDER_SHARE_PERCENT", "150"),
            ("EVENT_SOURCE_MAX_CONCURRENCY", "0"),
        ] {
            let mut extra = vec![("PROVIDER_REQUESTS_PER_SECOND", "20")];
            extra.retain(|(k, _)| *k != var);
            extra.push((var, bad));
            assert_eq!(with(&extra).unwrap_err().var, var, "{var}={bad}");
        }
    }

    #[test]
    fn the_provider_url_s_old_name_is_read_with_a_warning_and_the_new_one_wins() {
        let old: Vec<_> = BASE
            .iter()
            .map(|&(k, v)| {
                if k == "PROVIDER_API_URL" {
                    ("PAYMENT_API_URL", "http://old:1")
                } else {
                    (k, v)
                }
            })
            .collect();
        assert_eq!(
            Config::from_lookup(env(&old)).unwrap().payment_api_url,
            "http://old:1"
        );
        let (url, warning) = provider_api_url(&env(&old)).unwrap();
        assert_eq!(url, "http://old:1");
        assert!(warning.unwrap().contains("rename it"));
        let mut both = old.clone();
        both.push(("PROVIDER_API_URL", "http://new:1"));
        assert_eq!(
            provider_api_url(&env(&both)).unwrap(),
            ("http://new:1".into(), None)
        );
    }

    #[test]
    fn each_missing_variable_is_named() {
        for missing in [
            "IDEMPOTENCY_TABLE",
            "DEAD_LETTER_QUEUE_URL",
            "PROVIDER_API_URL",
        ] {
            let pairs: Vec<_> = BASE
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let e = Config::from_lookup(env(&pairs)).unwrap_err();
            assert_eq!(e.var, missing);
        }
        let pairs: Vec<_> = BASE
            .iter()
            .copied()
            .filter(|(k, _)| *k != "PAYMENT_API_KEY")
            .collect();
        assert_eq!(
            Config::from_lookup(env(&pairs)).unwrap_err().var,
            "PAYMENT_API_KEY_SECRET_ARN"
        );
    }

    #[test]
    fn the_stripe_version_is_pinned_and_a_malformed_one_refused() {
        let c = Config::from_lookup(env(BASE)).unwrap();
        assert_eq!(c.stripe_api_version, crate::stripe::DEFAULT_API_VERSION);
        let mut pairs = BASE.to_vec();
        pairs.push(("STRIPE_API_VERSION", "2023-08-16"));
        assert_eq!(
            Config::from_lookup(env(&pairs)).unwrap().stripe_api_version,
            "2023-08-16"
        );
        pairs.push(("STRIPE_API_VERSION", "latest"));
        let e = Config::from_lookup(env(&pairs)).unwrap_err();
        assert_eq!(e.var, "STRIPE_API_VERSION");
        assert!(e.to_string().contains("YYYY-MM-DD"), "{e}");
    }

    #[test]
    fn ttl_in_days_or_seconds() {
        let mut pairs = BASE.to_vec();
        pairs.push(("IDEMPOTENCY_TTL_DAYS", "30"));
        assert_eq!(
            Config::from_lookup(env(&pairs))
                .unwrap()
                .settings
                .record_ttl,
            Duration::from_secs(30 * 86_400)
        );
        pairs.push(("IDEMPOTENCY_TTL_SECONDS", "7200"));
        assert_eq!(
            Config::from_lookup(env(&pairs))
                .unwrap()
                .settings
                .record_ttl,
            Duration::from_secs(7200)
        );
    }

    #[test]
    fn protocol_tunables_are_read() {
        let mut pairs = BASE.to_vec();
        pairs.extend([
            ("QUEUE_VISIBILITY_TIMEOUT_SECONDS", "30"),
            ("PROVIDER_KEY_RETENTION_SECONDS", "600"),
            ("PROVIDER_KEY_RETENTION_MARGIN_SECONDS", "120"),
            ("LEASE_SECONDS", "45"),
            ("PROVIDER_SEARCH_LAG_SECONDS", "30"),
            ("RETRY_HORIZON_SECONDS", "7200"),
            ("QUEUE_MAX_RECEIVE_COUNT", "7"),
        ]);
        let c = Config::from_lookup(env(&pairs)).unwrap();
        assert_eq!(c.settings.visibility_timeout, Duration::from_secs(30));
        assert_eq!(c.provider_key_retention, Duration::from_secs(600));
        assert_eq!(c.settings.key_retention_margin, Duration::from_secs(120));
        assert_eq!(c.settings.heartbeat_interval(), Duration::from_secs(10));
        assert_eq!(c.settings.search_lag, Duration::from_secs(30));
        assert_eq!(c.settings.retry_horizon, Duration::from_secs(7200));
        assert_eq!(c.settings.max_receive_count, Some(7));
    }

    #[test]
    fn a_margin_shorter_than_the_longest_attempt_plus_skew_is_refused() {
        // 45 s lease + 10 s timeout + 5 s allowance + 60 s skew = 120 s.
        let mut pairs = BASE.to_vec();
        pairs.extend([
            ("LEASE_SECONDS", "45"),
            ("PROVIDER_KEY_RETENTION_MARGIN_SECONDS", "119"),
        ]);
        let e = Config::from_lookup(env(&pairs)).unwrap_err();
        assert_eq!(e.var, "PROVIDER_KEY_RETENTION_MARGIN_SECONDS");
        assert!(e.to_string().contains("120 s"), "{e}");
    }

    #[test]
    fn a_lease_that_cannot_hold_one_call_is_refused() {
        let mut pairs = BASE.to_vec();
        pairs.extend([
            ("LEASE_SECONDS", "14"),
            ("PAYMENT_API_TIMEOUT_SECONDS", "10"),
            ("PROVIDER_PROCESSING_ALLOWANCE_SECONDS", "4"),
        ]);
        assert_eq!(
            Config::from_lookup(env(&pairs)).unwrap_err().var,
            "LEASE_SECONDS"
        );
    }

    #[test]
    fn invalid_numbers_are_named_and_the_key_is_not_printed() {
        let mut pairs = BASE.to_vec();
        pairs.push(("MAX_CONCURRENCY", "zero"));
        let e = Config::from_lookup(env(&pairs)).unwrap_err();
        assert_eq!(e.var, "MAX_CONCURRENCY");
        assert!(!e.to_string().contains("sk_test_1"));
        let c = Config::from_lookup(env(BASE)).unwrap();
        assert!(!format!("{c:?}").contains("sk_test_1"));
    }
}
