//! The signed test event `connect` sends through the deployed route, and its wait for the
//! inbox's record of it.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Posts a signed test event (a `payment_intent.canceled` of no payment of this system's: the
/// inbox records it `foreign` and changes nothing) to `url` until it is accepted: the receiver
/// reads a changed secret again at most every 30 s after a mismatch. Returns its id.
pub(super) async fn send_test_event(url: &str, secret: &str, version: &str) -> Result<String> {
    let id = format!("evt_connect_{}", uuid::Uuid::new_v4().simple());
    let now = sqs_once::runner::now_ms() / 1000;
    let body = serde_json::json!({
        "id": id, "object": "event", "api_version": version, "created": now, "livemode": false,
        "pending_webhooks": 1, "request": {"id": null, "idempotency_key": null},
        "type": "payment_intent.canceled",
        "data": {"object": {"id": format!("pi_connect_{}", uuid::Uuid::new_v4().simple()),
                            "object": "payment_intent", "status": "canceled", "metadata": {}}},
    })
    .to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(75);
    loop {
        let t = sqs_once::runner::now_ms() / 1000;
        let header = payment_core::stripe::webhook::sign(&[secret], t, body.as_bytes());
        let answer = http
            .post(url)
            .header("Content-Type", "application/json; charset=utf-8")
            .header("Stripe-Signature", header)
            .body(body.clone())
            .send()
            .await;
        let why = match answer {
            Ok(r) if r.status().is_success() => return Ok(id),
            Ok(r) => format!(
                "HTTP {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => e.without_url().to_string(),
        };
        if Instant::now() >= deadline {
            bail!("the stack's events route {url} refused a test event signed with the stored secret ({why}): is the stack deployed and its ProviderEventsFunction healthy? (its logs say why)");
        }
        crate::say!("payctl connect: test event not accepted yet ({why}); the route reads a new secret within 30 s, trying again in 10 s");
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// Waits until the inbox has completed event `id`'s record.
pub(super) async fn wait_applied(
    sdk: &aws_config::SdkConfig,
    table: &str,
    id: &str,
    wait: Duration,
) -> Result<()> {
    use sqs_once::record::{IdempotencyStore, RecordStatus};
    let store = payment_core::events::event_store(aws_sdk_dynamodb::Client::new(sdk), table);
    let deadline = Instant::now() + wait;
    loop {
        let record = store
            .get(id)
            .await
            .map_err(|e| anyhow::anyhow!("reading {id} from {table}: {e}"))?;
        if record
            .as_ref()
            .is_some_and(|r| r.status == RecordStatus::Completed)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the test event {id} was accepted but the inbox has not recorded it in {table} within {} s: look at the provider-events queue and the event processor's logs",
                wait.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
