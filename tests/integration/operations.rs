//! Operating the stack: the dead-letter queue after a fix.

use payment_infra::dlq::{self, RedriveOptions};

use crate::helpers::*;

/// A payment whose deliveries all failed (the provider was down) is dead-lettered by the
/// processor on its last delivery, with `retries_exhausted` and the last error, before SQS
/// would move it without a reason; redriven after the fix, it is charged once, although the
/// DLQ held it twice and the redrive ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_after_a_fix_charges_once_even_when_redriven_twice() {
    let t = TestStack::build("redrive", fast_settings(), false, 3).await;
    let pid = t.pid("p1");
    let body = payment(&pid, 2500, "pm_card_visa");
    t.fault(&pid, "down", None, 0).await;
    t.send(&body).await;
    t.drain(1).await; // three failed deliveries; the third dead-letters it with the reason
    assert_eq!(t.charges(&pid).await, 0);
    let dlq_url = t.config.dead_letter_queue_url.clone();
    let listed = dlq::list(&t.sqs, &dlq_url, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].error_code.as_deref(),
        Some("retries_exhausted"),
        "dead-lettered by the processor with a reason, not moved by SQS"
    );
    let why = listed[0].error_message.clone().unwrap_or_default();
    assert!(why.contains("delivery 3 of at most 3"), "{why}");
    assert_eq!(listed[0].payment_id.as_deref(), Some(pid.as_str()));

    // The DLQ holds the payment twice (it was dead-lettered twice).
    t.sqs
        .send_message()
        .queue_url(&dlq_url)
        .message_body(&body)
        .send()
        .await
        .unwrap();
    t.sim.clear_faults_for(&pid).await.unwrap();
    let opts = RedriveOptions {
        dlq_url: dlq_url.clone(),
        queue_url: t.queue_url().to_owned(),
        error_code: None,
        max: None,
    };
    let first = dlq::redrive(&t.sqs, &opts).await.unwrap();
    assert_eq!(
        first.moved, 2,
        "listing did not remove anything; both copies move"
    );
    let second = dlq::redrive(&t.sqs, &opts).await.unwrap();
    assert_eq!(second.moved, 0);
    t.drain(1).await;
    assert_charged_once(&t, &pid).await;
    assert!(t.dead_letters().await.is_empty());
}

/// A redrive filtered by error code moves only those dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_by_error_code_leaves_the_others() {
    let t = TestStack::new("redrive-code").await;
    let pid = t.pid("p1");
    t.send("{broken").await;
    t.send(&payment(&pid, 100, "pm_card_invalid")).await;
    t.drain(1).await;
    let dlq_url = t.config.dead_letter_queue_url.clone();
    let opts = RedriveOptions {
        dlq_url: dlq_url.clone(),
        queue_url: t.queue_url().to_owned(),
        error_code: Some("invalid_json".into()),
        max: None,
    };
    assert_eq!(dlq::redrive(&t.sqs, &opts).await.unwrap().moved, 1);
    let left = dlq::list(&t.sqs, &dlq_url, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].error_code.as_deref(), Some("provider_rejected"));
    assert_eq!(
        t.depth().await,
        1,
        "the invalid body is back on the source queue"
    );
}
