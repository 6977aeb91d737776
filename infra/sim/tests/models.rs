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
