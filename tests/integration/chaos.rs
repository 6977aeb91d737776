//! The chaos checker's smaller run: 300 payments, three processor processes crashing at random
//! failpoints, provider faults on, and a tenth of the processes' AWS calls throttled, refused,
//! stalled or applied with the answer lost. It checks itself from the ledger, the table and
//! the DLQ and exits non-zero on any violation. Its events phase settles bank debits, a refund
//! that fails after pending and a dispute through the provider's events, applied by event
//! processes that crash the same way.

use crate::helpers::{bin, root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_of_300_payments_charges_each_once_and_loses_nothing() {
    // The checker runs its processors as `payctl run` processes of the same build.
    let proving = bin("proving");
    for bin in [&proving, &bin("payctl")] {
        assert!(
            bin.exists(),
            "build payctl and proving first (make test does): {}",
            bin.display()
        );
    }
    let out = tokio::process::Command::new(&proving)
        .current_dir(root())
        .args([
            "chaos",
            "--payments",
            "300",
            "--seed",
            "7",
            "--aws-faults",
            "0.1",
            "--max-seconds",
            "600",
        ])
        .output()
        .await
        .expect("running proving chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chaos run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("double charges:           0"), "{stdout}");
    assert!(stdout.contains("CHAOS OK (seed 7)"), "{stdout}");
    assert!(
        stdout.contains("events: every scenario settled through events under crashes: yes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("AWS calls through the fault proxy"),
        "the AWS faults were injected: {stdout}"
    );
}
