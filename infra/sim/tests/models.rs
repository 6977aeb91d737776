//! The models answer as the emulator does: payctl's conformance probes (the same requests
//! `make test` sends to ministack before every run) pass against them through the official SDK.

use std::sync::Arc;

use simulator::wire::Wire;
use sqs_once::clock::TokioClock;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_models_keep_every_promise_the_conformance_probes_check() {
    let wire = Wire::new(7, Arc::new(TokioClock::starting_at(1_767_225_600_000)));
    let results = payctl::conformance::run(&wire.sdk_config()).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.outcome.as_ref().err().map(|e| format!("{}: {e}", r.name)))
        .collect();
    assert!(results.len() >= 9, "{} checks ran", results.len());
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// payctl's provisioning reads the outbox relay's stream mapping as the template declares it:
/// what the simulator's model of Lambda's stream mapping runs on.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_relays_stream_mapping_is_read_from_the_template() {
    let wire = Wire::new(7, Arc::new(TokioClock::starting_at(1_767_225_600_000)));
    let template = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
    let stack = payctl::template::provision(
        &wire.sdk_config(),
        &template,
        &payctl::template::ProvisionOptions {
            stack_name: "models".into(),
            parameters: Default::default(),
            visibility_timeout: None,
            max_receive_count: None,
            fifo: false,
            read_only: false,
        },
    )
    .await
    .unwrap();
    let s = &stack.stream_sources["OutboxRelayFunction"];
    assert_eq!(Some(&s.table), stack.tables.get("PaymentsTable"));
    assert_eq!(
        (
            s.batch_size,
            s.batching_window_seconds,
            s.function_timeout_seconds
        ),
        (100, 1, 30)
    );
    assert_eq!(
        (s.maximum_retry_attempts, s.maximum_record_age_seconds),
        (20, 86_400)
    );
    assert!(s.bisect_on_error && s.report_batch_item_failures);
    assert_eq!(s.filters.len(), 1);
    let pattern: serde_json::Value = serde_json::from_str(&s.filters[0]).unwrap();
    assert_eq!(pattern["dynamodb"]["NewImage"]["kind"]["S"][0], "payment");
    assert_eq!(
        s.on_failure_queue_url.as_deref(),
        stack.queues.get("RelayFailuresQueue").map(String::as_str)
    );
    // Only the relay reads a stream.
    assert_eq!(stack.stream_sources.len(), 1);
    // The payments API's clients meet its function's timeout (10 s) before the integration's
    // (12 s): the simulator's API reads both, where it had API Gateway's 30 s.
    assert_eq!(stack.function_timeouts["PaymentsApiFunction"], 10);
    let shape = payctl::template::shape_of(&template, &Default::default()).unwrap();
    assert_eq!(shape.integration_timeouts_ms["PaymentsApiFunction"], 12_000);
    assert_eq!(
        shape.integration_timeouts_ms["ProviderEventsFunction"],
        12_000
    );
    // The payments API's throttle is the template's parameters' (a Capacity tier raises them).
    assert_eq!(shape.api_throttle, Some((100.0, 200.0)));
    let raised = payctl::template::shape_of(
        &template,
        &[("PaymentsApiRateLimit".to_owned(), "1000".to_owned())]
            .into_iter()
            .collect(),
    )
    .unwrap();
    assert_eq!(raised.api_throttle, Some((1000.0, 200.0)));
}
