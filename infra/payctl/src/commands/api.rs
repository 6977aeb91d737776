//! The payments API: create and read payments through it, or serve it locally.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum ApiCommand {
    /// Serve POST/GET /v1/payments on a local address until stopped, and POST
    /// /v1/provider-events (the provider's signed events, queued to PROVIDER_EVENTS_QUEUE_URL)
    /// when WEBHOOK_SECRET or WEBHOOK_SECRET_ARN is set.
    Serve {
        /// Address to listen on. A loopback address only (the API has no authentication of its
        /// own and acts with your credentials) unless --behind-authenticating-proxy.
        #[arg(long, default_value = "127.0.0.1:8080")]
        address: String,
        /// Serve a non-loopback address and requests of any Host: only behind something that
        /// authenticates every request (without it, requests whose Host is not localhost,
        /// 127.x.x.x or [::1] are refused, which stops a web page from reaching the API by DNS
        /// rebinding).
        #[arg(long)]
        behind_authenticating_proxy: bool,
        /// The payments table (the stack's PaymentsTableName output).
        #[arg(long, env = "PAYMENTS_TABLE")]
        table: String,
        /// The processor's idempotency table, read for GET's status.
        #[arg(long, env = "IDEMPOTENCY_TABLE")]
        idempotency_table: String,
    },
}

/// Prints an API answer (the body, pretty) and fails on an error status; `retry` is the exact
/// command that repeats a create with the same key, printed when the answer says to try again.
fn print_answer(answer: &payctl::client::Answer, retry: Option<&str>) -> Result<()> {
    let body = answer.json()?;
    println!("{}", serde_json::to_string_pretty(&body)?);
    if answer.replayed {
        payctl::say!(
            "(replayed: the API already held this Idempotency-Key; nothing new was created)"
        );
    }
    if answer.status >= 400 {
        // 408, 429 and 5xx may be answered before or after the payment was stored: only a retry
        // with the same key is safe, and it is always safe.
        let again = answer.status >= 500 || answer.status == 408 || answer.status == 429;
        match (again, retry) {
            (true, Some(cmd)) => {
                bail!("the API answered {}; retry with the same key (safe whether or not it was stored): {cmd}", answer.status)
            }
            _ => bail!("the API answered {}", answer.status),
        }
    }
    Ok(())
}

/// A word as a POSIX shell reads it back unchanged.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The options of `payctl pay`.
#[derive(Args)]
pub struct PayArgs {
    /// The API's base URL (the stack's PaymentsApiUrl output).
    #[arg(long, env = "PAYMENTS_API_URL")]
    pub api_url: String,
    /// Minor units (1999 is 19.99 USD).
    #[arg(long, allow_negative_numbers = true, value_parser = super::send::minor_units)]
    pub amount: i64,
    /// ISO 4217 code.
    #[arg(long)]
    pub currency: String,
    /// The provider's customer id.
    #[arg(long)]
    pub customer: String,
    /// A provider payment method id (never a card number).
    #[arg(long, default_value = "pm_card_visa")]
    pub payment_method: String,
    /// Free text shown on the provider's dashboard.
    #[arg(long)]
    pub description: Option<String>,
    /// The payment's id end to end; a random one when not given (printed).
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

/// Runs `payctl pay`.
pub async fn pay(args: PayArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let PayArgs {
        api_url,
        amount,
        currency,
        customer,
        payment_method,
        description,
        idempotency_key,
    } = args;
    let key = idempotency_key.unwrap_or_else(|| format!("pay_{}", uuid::Uuid::new_v4().simple()));
    let mut body = serde_json::json!({
        "amount": amount, "currency": currency, "customer_id": customer,
        "payment_method": payment_method,
    });
    let mut retry = vec![
        "payctl pay".to_owned(),
        format!("--api-url {}", shell_word(&api_url)),
        format!("--amount {amount}"),
        format!("--currency {}", shell_word(&currency)),
        format!("--customer {}", shell_word(&customer)),
        format!("--payment-method {}", shell_word(&payment_method)),
    ];
    if let Some(d) = description {
        retry.push(format!("--description {}", shell_word(&d)));
        body["description"] = d.into();
    }
    retry.push(format!("--idempotency-key {}", shell_word(&key)));
    let retry = retry.join(" ");
    // Said before anything is sent: whatever happens next, the retry can use the same key.
    payctl::say!("idempotency key: {key}");
    payctl::aws::announce(sdk, &format!("creating payment {key} through {api_url}")).await;
    let client = payctl::client::ApiClient::new(&api_url, sdk)?;
    let answer = match client.create(&key, &body.to_string()).await {
        Ok(a) => a,
        Err(e) => bail!(
            "{e:#}: the payment may or may not have been stored; retry with the same key (safe either way): {retry}"
        ),
    };
    print_answer(&answer, Some(&retry))?;
    Ok(())
}

/// The options of `payctl get`.
#[derive(Args)]
pub struct GetArgs {
    /// The payment's id (its Idempotency-Key).
    pub payment_id: String,
    /// The payments API's base URL (the stack's PaymentsApiUrl output).
    #[arg(long, env = "PAYMENTS_API_URL")]
    pub api_url: String,
}

/// Runs `payctl get`.
pub async fn get(args: GetArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let GetArgs {
        payment_id,
        api_url,
    } = args;
    let client = payctl::client::ApiClient::new(&api_url, sdk)?;
    let answer = client.get(&payment_id).await?;
    print_answer(&answer, None)?;
    Ok(())
}

/// The options of `payctl api`.
#[derive(Args)]
pub struct ApiArgs {
    #[command(subcommand)]
    pub command: ApiCommand,
}

/// Runs `payctl api`.
pub async fn api(args: ApiArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let ApiArgs {
        command:
            ApiCommand::Serve {
                address,
                table,
                idempotency_table,
                behind_authenticating_proxy,
            },
    } = args;
    if !behind_authenticating_proxy && !payctl::api::is_loopback_address(&address) {
        bail!("payctl api serve: {address} is not a loopback address; the API has no authentication of its own and acts with your AWS credentials: listen on 127.0.0.1, or put it behind something that authenticates every request and pass --behind-authenticating-proxy");
    }
    let config = payment_core::edges::config::ApiConfig::from_lookup(|k| match k {
        "PAYMENTS_TABLE" => Some(table.clone()),
        "IDEMPOTENCY_TABLE" => Some(idempotency_table.clone()),
        other => std::env::var(other).ok(),
    })?;
    let api =
        payment_core::edges::bootstrap::build_api(&config, aws_sdk_dynamodb::Client::new(sdk));
    let set = |v: &str| std::env::var(v).is_ok_and(|s| !s.trim().is_empty());
    let webhook = ["WEBHOOK_SECRET", "WEBHOOK_SECRET_ARN"]
        .iter()
        .any(|v| set(v));
    // The route needs its queue too: a shell with the local scripts' secret and no stack
    // variables serves the payments API alone, and says so.
    if webhook && !set("PROVIDER_EVENTS_QUEUE_URL") {
        payctl::say!("payctl: no provider-events route: WEBHOOK_SECRET is set but PROVIDER_EVENTS_QUEUE_URL is not (eval \"$(payctl env --stack-name NAME)\" sets both)");
    }
    let events = if webhook && set("PROVIDER_EVENTS_QUEUE_URL") {
        let config =
            payment_core::edges::config::ReceiverConfig::from_lookup(|k| std::env::var(k).ok())?;
        Some(std::sync::Arc::new(
            payment_core::edges::bootstrap::build_receiver(&config, sdk),
        ))
    } else {
        None
    };
    payctl::aws::announce(sdk, &format!("serving the payments API over {table}")).await;
    let has_events = events.is_some();
    let mut signals = payctl::stop::Signals::listen()?;
    let server = payctl::api::serve_exposed(
        std::sync::Arc::new(api),
        events,
        &address,
        behind_authenticating_proxy,
    )
    .await?;
    payctl::say!("payments API on {} (PAYMENTS_API_URL)", server.url());
    if has_events {
        payctl::say!(
            "provider events on {}{} (the webhook endpoint)",
            server.url(),
            payment_core::stripe::receiver::EVENTS_PATH
        );
    }
    let status = signals.next().await;
    payctl::say!(
        "stopping: no new connection is accepted; the requests being answered ({}) are finished first. Again to stop at once.",
        server.in_flight()
    );
    let in_flight = server.in_flight_gauge();
    tokio::select! {
        stopped = server.stop() => {
            stopped?;
            payctl::say!("stopped: every request was answered");
        }
        _ = signals.next() => payctl::say!(
            "stopped at once, requests cut off unanswered: {}; a client sending again with the same Idempotency-Key gets the payment created once",
            in_flight.load(std::sync::atomic::Ordering::SeqCst)
        ),
    }
    std::process::exit(status);
}
