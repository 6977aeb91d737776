//! The shipped function binary itself, run as Lambda runs it: its own process, configured only
//! by its environment, invoked through the Runtime API by the local event-source mapping.

use std::path::PathBuf;

use lambda_local::esm::{self, Function};
use lambda_local::runtime_api::FunctionProcess;
use proving::demo::function_environment;

use crate::helpers::*;

/// The `payment-processor` binary of this build (`cargo build` puts it beside the test's
/// `deps` directory).
fn function_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the target directory")
        .join("payment-processor");
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// Through the binary: a new payment is charged once and its copy acknowledged, a decline is
/// recorded, a malformed body is dead-lettered with its reason, a provider error is reported
/// as a batch item failure whose redelivery is charged once, and every invocation prints its
/// metrics in Embedded Metric Format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_binary_behind_the_runtime_api() {
    let t = TestStack::new("binary").await;
    let (paid, declined, flaky) = (t.pid("paid"), t.pid("declined"), t.pid("flaky"));
    t.fault(&flaky, "down", Some(3), 0).await; // every attempt of the first delivery
    t.send(&payment(&paid, 100, "pm_card_visa")).await;
    t.send(&payment(&paid, 100, "pm_card_visa")).await;
    t.send(&payment(&declined, 200, "pm_card_chargeDeclined"))
        .await;
    t.send(&payment(&flaky, 300, "pm_card_visa")).await;
    let malformed = t.send("{\"payment_id\": ").await;

    let (_, env) = function_environment(&t.stack, &fast_settings()).expect("configuration");
    let log_path = root().join(format!(".local/run/test-{}-function.log", t.name));
    std::fs::create_dir_all(log_path.parent().unwrap()).unwrap();
    let log = std::fs::File::create(&log_path).unwrap();
    let function = FunctionProcess::spawn(&function_binary(), &env, log)
        .await
        .expect("the function starts and asks for an invocation");
    let stats = esm::run(
        Function::Processes(vec![function.api()]),
        t.sqs.clone(),
        t.esm_options(1),
    )
    .await
    .expect("draining the queue through the function process");
    let usage = function.stop().await.expect("stopping the function");

    assert_eq!((stats.timeouts, stats.function_errors), (0, 0));
    // The failed message comes back once; a copy that met its original's live lease in the
    // same batch comes back too.
    assert!(stats.received >= 6, "five messages, the failed one twice");
    // Five messages end: four deleted by the mapping, the dead letter by the processor (the
    // mapping's own delete of it may or may not count, depending on the endpoint).
    assert!(stats.deleted() >= 4, "deleted {}", stats.deleted());
    assert_charged_once(&t, &paid).await;
    assert_charged_once(&t, &flaky).await;
    assert_eq!(t.charges(&declined).await, 0);
    let r = t.record(&declined).await.unwrap();
    assert_eq!(
        r.outcome.unwrap().text("decline_code"),
        Some("generic_decline")
    );
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0].error_code.as_str(),
            dead[0].source_message_id.as_str()
        ),
        ("invalid_json", malformed.as_str())
    );
    assert_eq!(t.depth().await, 0);

    let output = std::fs::read_to_string(&log_path).unwrap();
    let metrics: Vec<serde_json::Value> = output
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // The batch's lines (the provider's error metrics are lines of their own namespace).
        .filter(|v| {
            v.get("_aws").is_some()
                && v.get("Reason").is_none()
                && v["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "PaymentProcessor"
        })
        .collect();
    assert_eq!(
        metrics.len() as u64,
        stats.invocations,
        "one EMF line per invocation"
    );
    let total = |name: &str| metrics.iter().filter_map(|m| m[name].as_u64()).sum::<u64>();
    assert_eq!(
        (
            total("Charged"),
            total("Declined"),
            total("DuplicatesSuppressed"),
            total("DeadLettered"),
            total("Retried")
        ),
        (2, 1, 1, 1, stats.received - 5)
    );
    assert!(
        !output.contains("sk_test"),
        "the API key never reaches the output"
    );
    assert!(usage.cpu_seconds > 0.0 && usage.peak_rss_kib > 0);
}
