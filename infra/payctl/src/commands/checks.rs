//! Checking the endpoint (`conformance`) and the provider account (`smoke`).

use anyhow::{bail, Result};
use clap::Args;

/// Runs `payctl conformance`.
pub async fn conformance(sdk: &aws_config::SdkConfig) -> Result<()> {
    let endpoint = payctl::aws::endpoint(sdk);
    let results = payctl::conformance::run(sdk).await;
    payctl::conformance::report(&endpoint, &results)?;
    Ok(())
}

/// The options of `payctl smoke`.
#[derive(Args)]
pub struct SmokeArgs {
    /// The environment variable that holds the test-mode secret key (sk_test_...).
    #[arg(long, default_value = "STRIPE_TEST_KEY")]
    pub stripe_key_env: String,
    /// The provider's base URL.
    #[arg(
        long,
        env = "PROVIDER_API_URL",
        default_value = "https://api.stripe.com"
    )]
    pub payment_api_url: String,
    /// The Stripe-Version header of every request.
    #[arg(long, env = "STRIPE_API_VERSION", default_value = payment_core::stripe::DEFAULT_API_VERSION)]
    pub stripe_api_version: String,
    /// Names the run's customer, payment and refund (default: smoke-<epoch ms>).
    #[arg(long)]
    pub run_id: Option<String>,
}

/// Runs `payctl smoke`.
pub async fn smoke(args: SmokeArgs) -> Result<()> {
    let SmokeArgs {
        stripe_key_env,
        payment_api_url,
        stripe_api_version,
        run_id,
    } = args;
    let key = match std::env::var(&stripe_key_env) {
        Ok(k) if !k.trim().is_empty() => secrecy::SecretString::from(k.trim().to_owned()),
        _ => bail!("set {stripe_key_env} to a Stripe test-mode secret key (sk_test_...), or name another variable with --stripe-key-env"),
    };
    let client = payctl::smoke::client(&payment_api_url, key, &stripe_api_version)?;
    let run_id = run_id.unwrap_or_else(|| format!("smoke-{}", sqs_once::runner::now_ms()));
    payctl::smoke::run(&client, &run_id).await?;
    Ok(())
}
