//! What one run does: its size, faults, outages, queues and mutation.

use std::collections::BTreeMap;

use crate::provider::Behaviour;
use crate::wire::Faults;

/// What one run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// Fixes every draw of the run.
    pub seed: u64,
    /// Payments the producer sends.
    pub payments: usize,
    /// Days the payments arrive over.
    pub arrival_days: f64,
    /// Days the run lasts in all (the provider's late settlements and the records' lifetimes
    /// play out after the last arrival).
    pub days: f64,
    /// Share of payments the producer sends twice (a retrying producer).
    pub duplicate_share: f64,
    /// Share of messages that are not a payment (bad JSON, a payment with a bad field).
    pub bad_input_share: f64,
    /// Share of payments carrying what shoppers type and paste in their description and a
    /// metadata value (any Unicode; one piece in five is what no door may take: U+FFFE or
    /// U+FFFF, a control character, a card number).
    pub shopper_text_share: f64,
    /// Share of the provider's events an insider forges (one who may send to the events
    /// queue): a copy of the event under a new id, sent straight to the queue with the object
    /// at a final state it may never reach (a PaymentIntent `canceled`, a refund `failed`, a
    /// dispute `won`).
    pub forged_event_share: f64,
    /// Share of payments sent again under the same id with another amount (a reused key).
    pub reused_key_share: f64,
    /// Share of card payments the merchant refunds (hours to ten days later).
    pub refund_share: f64,
    /// Share of refunds the merchant sends once more, late: when the refund's record expires,
    /// as a merchant's own retry after it lost track would (0: none, and no draw for it).
    pub late_refund_share: f64,
    /// The merchant sends its refunds in a nightly batch (every refund of a day at 02:00 the
    /// next night), not each as it comes: a burst on the refunds queue.
    pub nightly_refunds: bool,
    /// When the stack's webhook endpoint is away (deleted, and registered again under a new
    /// id when each ends): epoch ms, from and until.
    pub endpoint_gaps: Vec<(i64, i64)>,
    /// When the stack's webhook endpoint is disabled and enabled again: epoch ms, from and until.
    pub endpoint_disabled: Vec<(i64, i64)>,
    /// Share of failed debits whose customer pays again, 1 to 8 days after the failure: the
    /// PaymentIntent, recorded declined, is confirmed with another payment method and charged.
    pub repay_share: f64,
    /// Chance that an invocation's process is killed at a random moment of it.
    pub crash_rate: f64,
    /// AWS's faults (both services).
    pub aws: Faults,
    /// The provider's behaviour.
    pub provider: Behaviour,
    /// Chance a standard queue delivers a message twice.
    pub duplicate_delivery_rate: f64,
    /// Template parameters given to the provisioning (`MaxReceiveCount`, ...).
    pub parameters: BTreeMap<String, String>,
    /// Where `template.yaml` is.
    pub template: std::path::PathBuf,
    /// Keep every request in the trace (else only its digest).
    pub keep_trace: bool,
    /// A mutation put back into the system (the simulator's teeth), by name: see
    /// [`MUTATIONS`].
    pub mutation: Option<String>,
    /// The source queue's visibility timeout, when not the template's (users bring their own).
    pub visibility_timeout: Option<i32>,
    /// `maxReceiveCount`, when not the template's.
    pub max_receive_count: Option<i32>,
    /// Every queue FIFO (content-based deduplication; payments grouped by customer).
    pub fifo: bool,
    /// The provider down for a while: (from day, for hours).
    pub provider_outage: Option<(f64, f64)>,
    /// DynamoDB down from a day for some hours (every request `503`).
    pub dynamo_outage: Option<(f64, f64)>,
    /// SQS down from a day for some hours.
    pub sqs_outage: Option<(f64, f64)>,
    /// The webhook route down (every delivery fails) from a day for some hours.
    pub webhook_outage: Option<(f64, f64)>,
    /// The chance a charge is disputed, and the days after it a dispute opens within.
    pub disputes: (f64, (f64, f64)),
    /// The share of payments (and of the bad input) sent through the payments API and its
    /// outbox relay rather than straight to the queue (0: none, and no draw for it).
    pub api_share: f64,
    /// Each payment sent by a client of its own at its arrival (a load of hundreds a second),
    /// not by one producer after another (the default: a send waits for the one before).
    pub parallel_clients: bool,
}

impl Options {
    /// A run of `payments` payments over `days` days with the template's settings and modest
    /// faults everywhere.
    pub fn new(seed: u64, payments: usize, days: f64) -> Self {
        Self {
            seed,
            payments,
            arrival_days: (days / 3.0).min(days),
            days,
            duplicate_share: 0.05,
            bad_input_share: 0.01,
            shopper_text_share: 0.05,
            forged_event_share: 0.02,
            reused_key_share: 0.005,
            refund_share: 0.1,
            late_refund_share: 0.0,
            nightly_refunds: false,
            endpoint_gaps: Vec::new(),
            endpoint_disabled: Vec::new(),
            repay_share: 0.3,
            crash_rate: 0.02,
            aws: Faults {
                latency_ms: 8.0,
                error_rate: 0.002,
                throttle_rate: 0.002,
                lost_answer_rate: 0.002,
                stall_rate: 0.0005,
                stall_max_ms: 60_000,
                conflict_rate: 0.03,
                outage_from_ms: 0,
                outage_until_ms: 0,
            },
            provider: Behaviour {
                error_before_rate: 0.01,
                error_after_rate: 0.01,
                lost_answer_rate: 0.01,
                ..Behaviour::default()
            },
            duplicate_delivery_rate: 0.01,
            parameters: BTreeMap::new(),
            template: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"),
            keep_trace: false,
            mutation: None,
            visibility_timeout: None,
            max_receive_count: None,
            fifo: false,
            provider_outage: None,
            dynamo_outage: None,
            sqs_outage: None,
            webhook_outage: None,
            disputes: (0.01, (30.0, 120.0)),
            api_share: 0.0,
            parallel_clients: false,
        }
    }
}
