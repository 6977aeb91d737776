//! Operating the stack: the dead-letter queue after a fix.

use payctl::dlq::{self, RedriveOptions};

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
        force: false,
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

/// A redrive refuses an unknown code (the CLI exits non-zero naming the known ones), never
/// moves the codes that can only be dead-lettered again unless forced (a full redrive keeps
/// them and says so), and a filter moves only its code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_keeps_what_is_never_redriven_and_refuses_unknown_codes() {
    let t = TestStack::new("redrive-code").await;
    let (done, stuck) = (t.pid("done"), t.pid("stuck"));
    t.send("{broken").await;
    t.send(&payment(&t.pid("refused"), 100, "pm_card_invalid"))
        .await;
    t.send(&payment(&done, 100, "pm_card_visa")).await;
    t.drain(1).await;
    t.send(&payment(&done, 999, "pm_card_visa")).await; // the key reused for another amount
    t.drain(1).await;
    // A payment the processor gave up on, as it dead-letters one.
    let dlq_url = t.config.dead_letter_queue_url.clone();
    t.sqs
        .send_message()
        .queue_url(&dlq_url)
        .message_body(payment(&stuck, 300, "pm_card_visa"))
        .message_attributes(
            "error_code",
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value("retries_exhausted")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();

    let cli = std::process::Command::new(bin("payctl"))
        .args([
            "dlq",
            "redrive",
            "--dlq-url",
            &dlq_url,
            "--queue-url",
            t.queue_url(),
        ])
        .args(["--error-code", "bogus"])
        .output()
        .expect("running payctl dlq redrive");
    assert!(!cli.status.success(), "an unknown code is an error");
    let said = String::from_utf8_lossy(&cli.stderr);
    assert!(
        said.contains("unknown error code") && said.contains("retries_exhausted"),
        "{said}"
    );

    let opts = |code: Option<&str>, force: bool| RedriveOptions {
        dlq_url: dlq_url.clone(),
        queue_url: t.queue_url().to_owned(),
        error_code: code.map(str::to_owned),
        max: None,
        force,
    };
    let refused = dlq::redrive(&t.sqs, &opts(Some("idempotency_key_reused"), false)).await;
    assert!(
        refused.unwrap_err().to_string().contains("never redriven"),
        "a reused key is not moved without --force"
    );
    let all = dlq::redrive(&t.sqs, &opts(None, false)).await.unwrap();
    assert_eq!(all.moved, 1, "only the payment that gave up moves");
    let kept: Vec<(&str, u64)> = all.kept.iter().map(|(c, n)| (c.as_str(), *n)).collect();
    assert_eq!(
        kept,
        vec![
            ("idempotency_key_reused", 1),
            ("invalid_json", 1),
            ("provider_rejected", 1)
        ]
    );
    assert_eq!(dlq::list(&t.sqs, &dlq_url, 10).await.unwrap().len(), 3);
    // A redrive of one code says nothing of the others: they were not asked for, not "kept".
    let one_code = dlq::redrive(&t.sqs, &opts(Some("retries_exhausted"), false))
        .await
        .unwrap();
    assert_eq!(one_code.moved, 0);
    assert!(one_code.kept.is_empty(), "{:?}", one_code.kept);
    let forced = dlq::redrive(&t.sqs, &opts(Some("invalid_json"), true))
        .await
        .unwrap();
    assert_eq!(forced.moved, 1);
    t.drain(1).await;
    assert_charged_once(&t, &stuck).await;
    assert_charged_once(&t, &done).await;
    let left: Vec<String> = t
        .dead_letters()
        .await
        .into_iter()
        .map(|d| d.error_code)
        .collect();
    assert_eq!(
        left.len(),
        3,
        "{left:?}: the forced invalid body came back to the DLQ"
    );
}

/// `dlq list` shows each dead letter whole (body, source message, first send, every attribute,
/// the receive count as SQS counts it) and `dlq show` finds one by either message id or by its
/// payment's id; an unknown id is an error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_list_and_show_give_the_whole_dead_letter() {
    let t = TestStack::new("dlq-show").await;
    let body = payment(&t.pid("p1"), 100, "pm_card_invalid");
    let source = t.send(&body).await;
    t.drain(1).await;
    let dlq_url = t.config.dead_letter_queue_url.clone();
    let payctl = |args: &[&str]| {
        let out = std::process::Command::new(bin("payctl"))
            .args(["dlq"])
            .args(args)
            .args(["--dlq-url", &dlq_url])
            .output()
            .expect("running payctl dlq");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, listed, said) = payctl(&["list", "--json"]);
    assert!(ok, "{said}");
    let line: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(line["error_code"], "provider_rejected");
    assert_eq!(line["source_message_id"], source.as_str());
    assert_eq!(line["body"], body.as_str());
    assert!(
        line["first_sent_at"].as_str().unwrap().ends_with('Z'),
        "{line}"
    );
    assert_eq!(line["attributes"]["error_code"], "provider_rejected");
    assert!(line["receive_count_means"]
        .as_str()
        .unwrap()
        .contains("listings included"));
    let first_count = line["receive_count"].as_u64().unwrap();
    let (ok, shown, _) = payctl(&["show", &source]);
    assert!(ok);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["body"], body.as_str());
    assert_eq!(
        shown["receive_count"].as_u64().unwrap(),
        first_count + 1,
        "stated plainly: each look receives it"
    );
    // ... and by the payment's own id, which is what an operator has at hand.
    let (ok, by_payment, err) = payctl(&["show", &t.pid("p1")]);
    assert!(ok, "{err}");
    let by_payment: serde_json::Value = serde_json::from_str(&by_payment).unwrap();
    assert_eq!(by_payment["source_message_id"], source.as_str());
    let (ok, _, err) = payctl(&["show", "no-such-id"]);
    assert!(!ok);
    assert!(err.contains("no dead letter with message id"), "{err}");
}

/// A redrive goes home: the refunds' dead letters go back to the refunds queue, never to the
/// payments queue, where the payment processor would refuse them as invalid payments and they
/// would be lost. A queue is accepted only when its redrive policy names the DLQ; without one
/// given, the source is asked of SQS, or the operator is told to name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_goes_back_to_the_queue_that_dead_letters_to_the_dlq() {
    let t = TestStack::new("redrive-home").await;
    let q = |id: &str| t.stack.queues[id].clone();
    let (payments, refunds, refunds_dlq) = (
        q("PaymentsQueue"),
        q("RefundsQueue"),
        q("RefundsDeadLetterQueue"),
    );
    let refund = r#"{"refund_id":"rf-home","payment_id":"p-home","amount":100}"#;
    t.sqs
        .send_message()
        .queue_url(&refunds_dlq)
        .message_body(refund)
        .send()
        .await
        .unwrap();
    let to = |queue_url: &str| RedriveOptions {
        dlq_url: refunds_dlq.clone(),
        queue_url: queue_url.to_owned(),
        error_code: None,
        max: None,
        force: false,
    };
    let wrong = dlq::redrive(&t.sqs, &to(&payments)).await.unwrap_err();
    assert!(
        wrong.to_string().contains("does not dead-letter to"),
        "{wrong}"
    );
    let cli = std::process::Command::new(bin("payctl"))
        .args([
            "dlq",
            "redrive",
            "--dlq-url",
            &refunds_dlq,
            "--queue-url",
            &payments,
        ])
        .output()
        .expect("running payctl dlq redrive");
    assert!(!cli.status.success(), "the CLI refuses the wrong queue");
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("REFUNDS_QUEUE_URL"),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert_eq!(
        dlq::list(&t.sqs, &refunds_dlq, 10).await.unwrap().len(),
        1,
        "nothing moved"
    );
    // Without --queue-url: the one source SQS names, or a plain request to name it.
    match dlq::home_queue(&t.sqs, &refunds_dlq, None).await {
        Ok(home) => assert_eq!(home, refunds),
        Err(e) => assert!(e.to_string().contains("pass --queue-url"), "{e}"),
    }
    let moved = dlq::redrive(&t.sqs, &to(&refunds)).await.unwrap();
    assert_eq!(moved.moved, 1);
    let back = t
        .sqs
        .receive_message()
        .queue_url(&refunds)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    assert_eq!(back.messages()[0].body(), Some(refund));
    let none = t
        .sqs
        .receive_message()
        .queue_url(&payments)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert!(
        none.messages().is_empty(),
        "nothing reached the payments queue"
    );
}
