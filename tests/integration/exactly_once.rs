//! The exactly-once promise against the emulator's table and queues: fencing on the real
//! conditional writes, a lost claim answer, a crashed worker's payment finished by another
//! process within the queue's receive budget, and twenty concurrent copies of one payment.

use std::time::Duration;

use payment_core::domain::PaymentRequest;
use sqs_once::record::{
    ClaimRequest, FailureNote, IdempotencyStore, Outcome, RecordStatus, StoreError,
};
use sqs_once::runner::now_ms;

use crate::helpers::*;
use crate::proxy::AnswerDroppingProxy;

/// `complete`, `fail` and `renew_lease` by an attempt that does not hold the lease are refused
/// by DynamoDB's condition, and leave the owner's record as it was; a failure that proves
/// nothing never clears the unknown-outcome mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_and_the_sticky_mark_hold_on_the_real_table() {
    let t = TestStack::new("fencing").await;
    let pid = t.pid("p1");
    let req = PaymentRequest::parse(&payment(&pid, 100, "pm_card_visa")).unwrap();
    let now = now_ms();
    let claim = |owner: &str, now: i64| ClaimRequest {
        traceparent: None,
        key: req.payment_id.as_str().to_owned(),
        payload_hash: req.payload_hash(),
        owner: owner.into(),
        now_ms: now,
        lease_expires_at_ms: now + 60_000,
        expires_at_s: now / 1000 + 86_400,
    };
    t.store.claim(&claim("owner", now)).await.unwrap();
    let outcome = Outcome::new("succeeded").with_text("provider_payment_id", "pi_zombie");
    let note = |unknown: bool| FailureNote {
        error: "zombie".into(),
        unknown_outcome: unknown,
        not_before_ms: None,
    };
    assert!(matches!(
        t.store
            .complete(req.payment_id.as_str(), "zombie", &outcome, None)
            .await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        t.store
            .fail(req.payment_id.as_str(), "zombie", now, &note(false))
            .await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        t.store
            .renew_lease(req.payment_id.as_str(), "zombie", now + 600_000)
            .await,
        Err(StoreError::LeaseLost)
    ));
    let r = t.record(&pid).await.unwrap();
    assert_eq!(
        (r.status, r.lease_owner.as_deref(), r.lease_expires_at_ms),
        (RecordStatus::InProgress, Some("owner"), now + 60_000)
    );

    // The owner records an ambiguous failure, a later owner one that proves nothing: the mark
    // stays. not_before refuses claims until it passes.
    t.store
        .fail(
            req.payment_id.as_str(),
            "owner",
            now,
            &FailureNote {
                not_before_ms: Some(now + 2_000),
                ..note(true)
            },
        )
        .await
        .unwrap();
    assert!(matches!(
        t.store.claim(&claim("early", now + 1_000)).await,
        Ok(sqs_once::record::ClaimResult::Conflict(_))
    ));
    t.store.claim(&claim("later", now + 3_000)).await.unwrap();
    t.store
        .fail(req.payment_id.as_str(), "later", now + 3_000, &note(false))
        .await
        .unwrap();
    let r = t.record(&pid).await.unwrap();
    assert_eq!((r.status, r.unknown_outcome), (RecordStatus::Failed, true));
}

/// The claim's `UpdateItem` is applied but its answer is lost on the way back; the SDK retries
/// it and the retry is refused by the first write. The attempt recognises its own lease and
/// charges, once, on this delivery: it is not "busy" behind itself for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_answer_is_our_own_claim_not_busy() {
    let t = TestStack::new("lostclaim").await;
    let pid = t.pid("p1");
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let proxy = AnswerDroppingProxy::start(
        &endpoint,
        "DynamoDB_20120810.UpdateItem",
        &format!("payment#{pid}"),
    )
    .await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(&proxy.url)
            .build(),
    );
    let processor = payment_core::edges::bootstrap::build_processor_with(
        &t.config,
        &sdk,
        dynamodb,
        aws_sdk_sqs::Client::new(&sdk),
    )
    .await
    .unwrap();
    t.send(&payment(&pid, 100, "pm_card_visa")).await;
    let records = t.receive_records(1).await;
    let (response, summary) = processor.handle_batch(records, now_ms() + 30_000).await;
    assert_eq!(proxy.dropped(), 1, "the claim's answer was dropped");
    assert!(proxy.matching() >= 3, "claim, its retry, the completion");
    assert!(
        response.batch_item_failures.is_empty(),
        "charged on this delivery"
    );
    assert_eq!(summary.done("charged"), 1);
    assert_charged_once(&t, &pid).await;
    assert_eq!(t.calls(&pid).await, 1);
    let r = t.record(&pid).await.unwrap();
    assert_eq!(r.attempts, 1, "one claim, applied once");
}

/// A worker process is killed (SIGKILL) right after the provider committed its charge, on a
/// queue whose visibility timeout (10 s) is a third of the lease and whose `maxReceiveCount` is
/// 5. Another `payctl run` process finishes the payment within the receive budget: COMPLETED,
/// one charge, an empty DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_charged_payment_is_finished_by_another_process() {
    let settings = env(&[
        ("LEASE_SECONDS", "30"),
        ("PAYMENT_API_TIMEOUT_SECONDS", "3"),
    ]);
    let t = TestStack::build_with_visibility("sigkill", settings.clone(), false, 5, 10).await;
    let pid = t.pid("p1");
    // The provider books the charge, then holds the answer: the worker dies meanwhile.
    t.fault(&pid, "delay_after_commit", Some(1), 20_000).await;
    t.send(&payment(&pid, 4200, "pm_card_visa")).await;
    let payctl = bin("payctl");
    assert!(payctl.exists(), "build payctl first: {}", payctl.display());
    let spawn = |until_empty: bool| {
        let mut cmd = tokio::process::Command::new(&payctl);
        cmd.args([
            "run",
            "--queue-url",
            t.queue_url(),
            "--function-timeout",
            "60",
        ]);
        if until_empty {
            cmd.arg("--until-empty");
        }
        cmd.env("IDEMPOTENCY_TABLE", &t.config.idempotency_table)
            .env("DEAD_LETTER_QUEUE_URL", &t.config.dead_letter_queue_url)
            .env("QUEUE_VISIBILITY_TIMEOUT_SECONDS", "10")
            .envs(&settings)
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting payctl run")
    };
    let mut first = spawn(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while t.charges(&pid).await == 0 {
        assert!(std::time::Instant::now() < deadline, "never charged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.kill().await.expect("SIGKILL"); // tokio's kill is SIGKILL
    assert_eq!(
        t.record(&pid).await.unwrap().status,
        RecordStatus::InProgress
    );

    let second = spawn(true);
    let out = tokio::time::timeout(Duration::from_secs(150), second.wait_with_output())
        .await
        .expect("the second process drained the queue")
        .expect("payctl run");
    assert!(
        out.status.success(),
        "payctl run --until-empty: {:?}",
        out.status
    );
    assert_charged_once(&t, &pid).await;
    assert!(t.dead_letters().await.is_empty(), "nothing dead-lettered");
    assert_eq!(t.depth().await, 0);
}

/// Twenty copies of one payment, received by four pollers at once while the provider takes
/// half a second: exactly one request reaches the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_copies_send_one_provider_request() {
    let t = TestStack::new("twenty").await;
    let pid = t.pid("p1");
    t.fault(&pid, "latency", Some(1), 500).await;
    t.send_copies(&payment(&pid, 700, "pm_card_visa"), 20).await;
    let mut options = t.esm_options(4);
    options.batch_size = 5;
    let stats = lambda_local::esm::run(t.processor.clone(), t.sqs.clone(), options)
        .await
        .expect("draining");
    assert_eq!(t.calls(&pid).await, 1, "one provider request in all");
    assert_charged_once(&t, &pid).await;
    assert_eq!(stats.summary.done("charged") + stats.summary.duplicates, 20);
    assert!(t.dead_letters().await.is_empty());
}

/// `payctl reconcile`'s core: a record left FAILED and unknown while the provider holds the
/// charge is settled from the provider's search (COMPLETED with that charge, nothing charged);
/// a record whose payment the provider never saw is reported as such and left alone; a
/// record a processor holds is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_settles_from_the_provider_and_never_charges() {
    use payctl::reconcile::{self, Action, ReconcileSettings};
    let t = TestStack::with_env("reconcile", env(&[("PROVIDER_MAX_ATTEMPTS", "1")])).await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let provider = payment_core::edges::bootstrap::provider_from(&t.config, &sdk)
        .await
        .unwrap();
    let settings = ReconcileSettings {
        key_retention: Duration::from_secs(86_400),
        search_lag: Duration::from_secs(1),
        refund_window: Duration::from_secs(365 * 86_400),
    };

    // Charged, answer lost: FAILED, marked unknown, the charge at the provider.
    let charged = t.pid("charged");
    t.fault(&charged, "drop_after_commit", Some(1), 0).await;
    t.send(&payment(&charged, 1234, "pm_card_visa")).await;
    t.invoke(t.receive_records(1).await).await;
    let r = t.record(&charged).await.unwrap();
    assert!(r.status == RecordStatus::Failed && r.unknown_outcome);
    assert_eq!(t.charges(&charged).await, 1);
    tokio::time::sleep(Duration::from_millis(3_500)).await; // past not_before and the lag
    let calls = t.calls(&charged).await;
    let action = reconcile::reconcile_one(&t.store, &provider, &charged, settings)
        .await
        .unwrap();
    let Action::Settled(outcome) = &action else {
        panic!("not settled: {action:?}");
    };
    assert_eq!((outcome.amount, outcome.currency.as_str()), (1234, "usd"));
    // The settled charge holds its refund ledger: kept for the refund window from now, not
    // the record retention of its first claim (disputes come 30 to 120 days after a charge).
    let kept = t.record(&charged).await.unwrap().expires_at_s;
    assert!(
        kept >= now_ms() / 1000 + 364 * 86_400,
        "a reconciled charge is kept for the refund window: expires_at {kept}"
    );
    assert_charged_once(&t, &charged).await;
    assert_eq!(t.calls(&charged).await, calls, "reconcile never charges");
    assert!(reconcile::describe(&charged, &action, now_ms()).contains("settled from the provider"));
    // The listing of unsettled records no longer names it.
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let left = reconcile::unsettled_ids(&ddb, &t.config.idempotency_table)
        .await
        .unwrap();
    assert!(!left.contains(&charged));

    // Never reached the provider: reported, left unsettled.
    let never = t.pid("never");
    let body = payment(&never, 500, "pm_card_visa");
    let req = PaymentRequest::parse(&body).unwrap();
    t.claim_as(&body, "gone").await;
    let now = now_ms();
    let held = reconcile::reconcile_one(&t.store, &provider, &never, settings)
        .await
        .unwrap();
    assert!(
        matches!(held, Action::Held(_)),
        "a live lease is left alone: {held:?}"
    );
    t.store
        .fail(
            req.payment_id.as_str(),
            "gone",
            now,
            &FailureNote {
                error: "timeout".into(),
                unknown_outcome: true,
                not_before_ms: Some(now - 5_000),
            },
        )
        .await
        .unwrap();
    let unsettled = reconcile::unsettled_ids(&ddb, &t.config.idempotency_table)
        .await
        .unwrap();
    assert_eq!(unsettled, vec![never.clone()]);
    let action = reconcile::reconcile_one(&t.store, &provider, &never, settings)
        .await
        .unwrap();
    assert!(
        matches!(
            action,
            Action::NothingAtProvider {
                proof_from_ms: None,
                ..
            }
        ),
        "{action:?}"
    );
    let said = reconcile::describe(&never, &action, now_ms());
    assert!(
        said.contains("no payment exists at the provider")
            && said.contains("still remembers the key"),
        "{said}"
    );
    assert_eq!(t.record(&never).await.unwrap().status, RecordStatus::Failed);
    assert_eq!(t.charges(&never).await, 0);
}

/// After an outage that refused every attempt before the provider's execution (here: every
/// call rate-limited), nothing was charged and the record is not marked unknown: the provider
/// stored nothing for the key. Reconcile says a redrive now is charged once (not "wait for the
/// key to be forgotten"), and the redrive is charged once, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_says_a_redrive_is_safe_at_once_after_an_outage_that_reached_nothing() {
    use payctl::reconcile::{self, ReconcileSettings};
    let t = TestStack::with_env("reconcile-outage", env(&[("PROVIDER_MAX_ATTEMPTS", "1")])).await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let provider = payment_core::edges::bootstrap::provider_from(&t.config, &sdk)
        .await
        .unwrap();
    let settings = ReconcileSettings {
        key_retention: Duration::from_secs(86_400),
        search_lag: Duration::from_secs(1),
        refund_window: Duration::from_secs(365 * 86_400),
    };
    let outage = t.pid("outage");
    t.fault(&outage, "429", None, 0).await;
    t.send(&payment(&outage, 700, "pm_card_visa")).await;
    t.invoke(t.receive_records(1).await).await;
    let r = t.record(&outage).await.unwrap();
    assert!(
        r.status == RecordStatus::Failed && !r.unknown_outcome,
        "{r:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await; // past the search lag
    let action = reconcile::reconcile_one(&t.store, &provider, &outage, settings)
        .await
        .unwrap();
    let said = reconcile::describe(&outage, &action, now_ms());
    assert!(said.contains("a redrive now is charged once"), "{said}");
    t.sim.clear_faults_for(&outage).await.unwrap();
    t.send(&payment(&outage, 700, "pm_card_visa")).await;
    let stats = t.drain(1).await;
    assert!(stats.summary.done("charged") >= 1, "{:?}", stats.summary);
    assert_charged_once(&t, &outage).await;
}

/// On the real table: a key-reuse mark is written where no mark is, and never over the mark of
/// the key's own request (a conditional write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reuse_mark_never_replaces_the_key_s_own_mark_on_the_real_table() {
    let t = TestStack::new("reusemark").await;
    let mark = |key: &str, code: &str, hash: &str| sqs_once::record::DeadLetterMark {
        key: key.to_owned(),
        payload_hash: hash.to_owned(),
        error_code: code.to_owned(),
        error_message: format!("{code} for {hash}"),
        at_ms: now_ms(),
        expires_at_s: now_ms() / 1000 + 3600,
    };
    let (fresh, owned) = (t.pid("fresh"), t.pid("owned"));
    t.store
        .mark_dead_lettered(&mark(&fresh, "idempotency_key_reused", "other"))
        .await
        .unwrap();
    t.store
        .mark_dead_lettered(&mark(&owned, "retries_exhausted", "own"))
        .await
        .unwrap();
    t.store
        .mark_dead_lettered(&mark(&owned, "idempotency_key_reused", "other"))
        .await
        .expect("a refused yield is not an error");
    let read = |key: String| {
        let store = &t.store;
        async move {
            let (_, mark) = store.record_and_mark(&key).await.unwrap();
            let m = mark.expect("a mark");
            (m.error_code, m.payload_hash)
        }
    };
    assert_eq!(
        read(fresh).await,
        ("idempotency_key_reused".to_owned(), "other".to_owned())
    );
    assert_eq!(
        read(owned).await,
        ("retries_exhausted".to_owned(), "own".to_owned())
    );
}
