//! The command families of `payctl`, one module each: its options and what it does.

pub mod api;
pub mod checks;
pub mod dlq;
pub mod events;
pub mod health;
pub mod outbox;
pub mod reconcile;
pub mod run;
pub mod send;
pub mod stack;
pub mod status;

/// The provider options of the commands that call it (reconcile, events catch-up), read like
/// the functions' environment.
#[derive(clap::Args)]
pub struct ProviderArgs {
    /// The provider's base URL (as the function's PROVIDER_API_URL).
    #[arg(long, env = "PROVIDER_API_URL")]
    pub payment_api_url: String,
    /// The provider key's secret (or PAYMENT_API_KEY for local use).
    #[arg(long, env = "PAYMENT_API_KEY_SECRET_ARN")]
    pub payment_api_key_secret_arn: Option<String>,
    /// The Stripe-Version header of the calls.
    #[arg(long, env = "STRIPE_API_VERSION", default_value = payment_core::stripe::DEFAULT_API_VERSION)]
    pub stripe_api_version: String,
}

impl ProviderArgs {
    /// The provider client, its key read once; `why` says what the command needs it for.
    pub async fn client(
        &self,
        sdk: &aws_config::SdkConfig,
        why: &str,
    ) -> anyhow::Result<payment_core::stripe::StripeClient> {
        if !payment_core::stripe::is_api_version(&self.stripe_api_version) {
            anyhow::bail!("--stripe-api-version must be a Stripe API version such as {} (YYYY-MM-DD[.name]), got {:?}", payment_core::stripe::DEFAULT_API_VERSION, self.stripe_api_version);
        }
        let source = match (
            &self.payment_api_key_secret_arn,
            std::env::var("PAYMENT_API_KEY"),
        ) {
            (Some(arn), _) if !arn.trim().is_empty() => {
                payment_core::edges::config::ApiKeySource::SecretArn(arn.clone())
            }
            (_, Ok(key)) if !key.trim().is_empty() => {
                payment_core::edges::config::ApiKeySource::Plain(key.into())
            }
            _ => anyhow::bail!(
                "set PAYMENT_API_KEY_SECRET_ARN (or PAYMENT_API_KEY for local use): {why}"
            ),
        };
        let key = payment_core::edges::bootstrap::resolve_api_key(&source, sdk).await?;
        Ok(payment_core::stripe::StripeClient::new(
            &self.payment_api_url,
            key,
            &self.stripe_api_version,
            std::time::Duration::from_secs(10),
        )?)
    }
}
