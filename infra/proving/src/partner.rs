//! Stripe's side of its Amazon EventBridge event destination, for local runs.
//!
//! At Stripe, a destination of type Amazon EventBridge creates a partner event source in the
//! customer's account (`aws.partner/stripe.com/ed_...`) and publishes each event on it:
//! `source` the partner source, `detail-type` the event's type, `detail` the event. Only a
//! partner may publish `aws.partner` sources (EventBridge refuses them from `PutEvents`, on AWS
//! and on ministack), and ministack answers `PutPartnerEvents` without routing what it is
//! given; so the local runs create the partner source as Stripe would and publish under a
//! `local.partner/stripe.com/...` source with `PutEvents` on the partner bus. From the bus on,
//! everything is the stack's: its rule and pattern, the target, the queue, the inbox.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use payment_core::events::queue::EventQueue;
use payment_core::provider::event::ProviderEvent;

/// `PutEvents` takes at most ten entries.
const ENTRIES: usize = 10;

/// The partner event source's name for a local stack (`local.partner/stripe.com/ed_<stack>`).
pub fn local_source(stack_name: &str) -> String {
    let id: String = stack_name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    format!("local.partner/stripe.com/ed_{id}")
}

/// Creates the partner event source in the caller's account, as Stripe does when its
/// destination is created (an existing one is kept).
pub async fn create_source(sdk: &aws_config::SdkConfig, name: &str) -> Result<()> {
    let account = payctl::aws::account(sdk).await?;
    let client = aws_sdk_eventbridge::Client::new(sdk);
    match client
        .create_partner_event_source()
        .name(name)
        .account(&account)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_already_exists_exception()) =>
        {
            Ok(())
        }
        Err(e) => bail!(
            "creating the partner event source {name}: {}",
            aws_sdk_eventbridge::error::DisplayErrorContext(&e)
        ),
    }
}

/// Publishes Stripe's events on the partner event bus, as Stripe's destination does.
pub struct PartnerBus {
    client: aws_sdk_eventbridge::Client,
    bus: String,
    source: String,
}

impl PartnerBus {
    /// The partner bus `bus` on the partner source `source`.
    pub fn new(sdk: &aws_config::SdkConfig, bus: &str, source: &str) -> Self {
        Self {
            client: aws_sdk_eventbridge::Client::new(sdk),
            bus: bus.to_owned(),
            source: source.to_owned(),
        }
    }

    /// Publishes each event (its raw body in `detail`); `Ok` once EventBridge took them all.
    pub async fn publish(&self, events: &[(ProviderEvent, String)]) -> Result<()> {
        for chunk in events.chunks(ENTRIES) {
            let entries = chunk
                .iter()
                .map(|(e, body)| {
                    PutEventsRequestEntry::builder()
                        .event_bus_name(&self.bus)
                        .source(&self.source)
                        .detail_type(&e.kind)
                        .detail(body)
                        .build()
                })
                .collect();
            let out = self
                .client
                .put_events()
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "publishing on {}: {}",
                        self.bus,
                        aws_sdk_eventbridge::error::DisplayErrorContext(&e)
                    )
                })?;
            if out.failed_entry_count() > 0 {
                let why: Vec<String> = out
                    .entries()
                    .iter()
                    .filter_map(|e| e.error_message().map(str::to_owned))
                    .collect();
                bail!(
                    "EventBridge refused {} events: {why:?}",
                    out.failed_entry_count()
                );
            }
        }
        Ok(())
    }
}

#[async_trait]
impl EventQueue for PartnerBus {
    async fn enqueue(&self, event: &ProviderEvent, body: &str) -> Result<(), String> {
        self.publish(&[(event.clone(), body.to_owned())])
            .await
            .map_err(|e| format!("{e:#}"))
    }
}

/// Serves the partner's side on an ephemeral local port: the simulator's signed deliveries are
/// verified (as Stripe's own event stream is trusted) and published on the partner bus, and the
/// simulator's webhook is pointed there, with its duplicates and its overtaking deliveries.
pub async fn serve(
    sdk: &aws_config::SdkConfig,
    sim: &crate::sim::SimClient,
    bus: &str,
    source: &str,
    secret: &str,
) -> Result<(lambda_local::http::LocalHttp, String)> {
    use payment_core::stripe::receiver::{EventReceiver, FixedSecrets, EVENTS_PATH};
    let receiver = EventReceiver::new(
        Arc::new(FixedSecrets(vec![secret.to_owned().into()])),
        Arc::new(PartnerBus::new(sdk, bus, source)),
        payment_core::stripe::webhook::DEFAULT_TOLERANCE_SECONDS,
    );
    let server = payctl::api::serve_events(Arc::new(receiver), "127.0.0.1:0")
        .await
        .context("serving the partner's side of EventBridge")?;
    let endpoint = format!("{}{EVENTS_PATH}", server.url());
    crate::events_check::point_webhook(sim, &endpoint, secret).await?;
    Ok((server, endpoint))
}
