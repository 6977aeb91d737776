//! `payctl smoke`: the processors' own provider client against a real Stripe account in test
//! mode (or the simulator): a customer, three charges with one idempotency key (one
//! PaymentIntent, the second and third replayed), a refund, and everything read back. It proves
//! that what the processors send is what the account accepts, with the pinned `Stripe-Version`,
//! off-session.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use payment_core::domain::PaymentRequest;
use payment_core::provider::{
    PaymentProvider, PaymentQuery, ProviderResponse, RefundCall, RefundProvider, RefundResponse,
};
use payment_core::stripe::StripeClient;
use secrecy::{ExposeSecret, SecretString};

/// The amount charged (19.99 usd, test mode) and the part refunded.
const AMOUNT: i64 = 1_999;
const REFUNDED: i64 = 500;

/// Refuses a live key: the smoke run charges, and is for test mode only.
pub fn check_test_key(key: &SecretString) -> Result<()> {
    let k = key.expose_secret();
    if k.starts_with("sk_live_") || k.starts_with("rk_live_") {
        bail!("this is a live-mode key: payctl smoke charges 19.99 usd and runs with a test-mode key (sk_test_...) only");
    }
    Ok(())
}

/// Runs the smoke test, printing each step; an error names the step that failed.
pub async fn run(client: &StripeClient, run_id: &str) -> Result<()> {
    println!(
        "smoke {run_id}: against the provider with Stripe-Version {}",
        client.api_version()
    );
    let customer = client
        .create_customer(
            &format!("{run_id}-customer"),
            &format!("sqs-once smoke run {run_id}"),
        )
        .await
        .context("creating the customer")?;
    println!("  customer        {customer}");
    let payment_id = format!("{run_id}-pay");
    let request = PaymentRequest::parse(
        &serde_json::json!({
            "payment_id": payment_id, "amount": AMOUNT, "currency": "usd",
            "customer_id": customer, "payment_method": "pm_card_visa",
            "description": format!("sqs-once smoke run {run_id}"),
            "metadata": {"smoke_run": run_id, "note": "café & crème = 100%"}
        })
        .to_string(),
    )
    .map_err(|e| anyhow::anyhow!("the smoke payment is invalid: {e}"))?;
    let since = sqs_once::runner::now_ms() / 1000 - 60;
    let mut intents = Vec::new();
    for n in 1..=3 {
        match client
            .create_payment(&request)
            .await
            .with_context(|| format!("charge {n} of 3"))?
        {
            ProviderResponse::Charged {
                provider_payment_id,
                status,
                replayed,
            } => {
                println!(
                    "  charge {n}/3      {provider_payment_id} {status}{}",
                    if replayed { " (replayed)" } else { "" }
                );
                ensure!(
                    status == "succeeded",
                    "charge {n} answered {status}, not succeeded"
                );
                ensure!(
                    replayed == (n > 1),
                    "charge {n}: Idempotent-Replayed was {replayed}"
                );
                intents.push(provider_payment_id);
            }
            other => bail!("charge {n} of 3 was not charged: {other:?}"),
        }
    }
    ensure!(
        intents.iter().all(|i| *i == intents[0]),
        "three charges with one key made several PaymentIntents: {intents:?}"
    );
    let intent = intents[0].clone();
    let refund_id = format!("{run_id}-refund");
    let call = RefundCall {
        refund_id: refund_id.clone(),
        payment_id: payment_id.clone(),
        payment_intent: intent.clone(),
        amount: REFUNDED,
        reason: Some("requested_by_customer".into()),
    };
    let refund = match client.create_refund(&call).await.context("the refund")? {
        RefundResponse::Refunded {
            provider_refund_id,
            status,
        } => {
            println!("  refund          {provider_refund_id} {status} ({REFUNDED} of {AMOUNT})");
            ensure!(
                matches!(status.as_str(), "succeeded" | "pending"),
                "the refund is {status}"
            );
            provider_refund_id
        }
        other => bail!("the refund was refused: {other:?}"),
    };
    // Read back: the intent itself, the customer's list (the processors' lookup), the refunds.
    let got = client
        .retrieve_payment(&intent)
        .await
        .context("reading the PaymentIntent back")?;
    ensure!(
        got.status == "succeeded" && got.amount == Some(AMOUNT),
        "the PaymentIntent reads back as {got:?}"
    );
    let listed = client
        .find_payments(&PaymentQuery {
            payment_id: request.payment_id.clone(),
            customer: Some(customer.clone()),
            created_from_s: Some(since),
        })
        .await
        .context("listing the customer's PaymentIntents")?;
    ensure!(
        listed.len() == 1 && listed[0].provider_payment_id == intent,
        "the customer's list holds {} PaymentIntents for {payment_id}: {listed:?}",
        listed.len()
    );
    println!("  listed          1 PaymentIntent for {payment_id} (metadata[payment_id])");
    let refunds = client
        .find_refunds(&intent)
        .await
        .context("listing the refunds")?;
    ensure!(
        refunds.iter().any(|r| r.provider_refund_id == refund
            && r.refund_id.as_deref() == Some(refund_id.as_str())
            && r.amount == REFUNDED),
        "the refund does not read back: {refunds:?}"
    );
    println!("  refunds listed  {refund} for {refund_id}");
    println!("smoke {run_id}: OK (one PaymentIntent for three calls, one refund, all read back)");
    Ok(())
}

/// The client of a smoke run.
pub fn client(base_url: &str, key: SecretString, api_version: &str) -> Result<StripeClient> {
    check_test_key(&key)?;
    ensure!(
        payment_core::stripe::is_api_version(api_version),
        "--stripe-api-version {api_version:?} is not a Stripe API version (YYYY-MM-DD[.name])"
    );
    Ok(StripeClient::new(
        base_url,
        key,
        api_version,
        Duration::from_secs(20),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_key_is_refused() {
        assert!(check_test_key(&SecretString::from("sk_live_abc")).is_err());
        assert!(check_test_key(&SecretString::from("rk_live_abc")).is_err());
        assert!(check_test_key(&SecretString::from("sk_test_abc")).is_ok());
    }
}
