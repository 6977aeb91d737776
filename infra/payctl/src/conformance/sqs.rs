//! The SQS probes: visibility changes and receive counts, redrive after `maxReceiveCount`, and
//! FIFO group blocking.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};

pub(super) async fn queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    attrs: &[(QueueAttributeName, String)],
) -> Result<String> {
    let mut req = sqs.create_queue().queue_name(name);
    for (k, v) in attrs {
        req = req.attributes(k.clone(), v);
    }
    let out = req.send().await.map_err(|e| {
        anyhow::anyhow!(
            "CreateQueue {name}: {}",
            aws_sdk_sqs::error::DisplayErrorContext(&e)
        )
    })?;
    out.queue_url().map(str::to_owned).context("no queue URL")
}

pub(super) async fn arn_of(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String> {
    let a = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?;
    a.attributes()
        .and_then(|m| m.get(&QueueAttributeName::QueueArn))
        .cloned()
        .context("no QueueArn")
}

/// Receives up to one message, waiting at most `wait` seconds.
pub(super) async fn receive_one(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    wait: i32,
) -> Result<Option<aws_sdk_sqs::types::Message>> {
    let out = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(1)
        .wait_time_seconds(wait)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await?;
    Ok(out.messages().first().cloned())
}

/// Runs a check on its queues, then deletes them whatever the check found.
pub(super) async fn with_queues<F, Fut>(
    sqs: &aws_sdk_sqs::Client,
    urls: Vec<String>,
    f: F,
) -> Result<String>
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    let r = f(urls.clone()).await;
    for u in &urls {
        let _ = sqs.delete_queue().queue_url(u).send().await;
    }
    r
}

pub(super) async fn visibility_and_receive_count(
    sqs: &aws_sdk_sqs::Client,
    prefix: &str,
) -> Result<String> {
    let url = queue(
        sqs,
        &format!("{prefix}-vis"),
        &[(QueueAttributeName::VisibilityTimeout, "60".into())],
    )
    .await?;
    let urls = vec![url];
    with_queues(sqs, urls, |urls| async move {
        let url = &urls[0];
        sqs.send_message()
            .queue_url(url)
            .message_body("v")
            .send()
            .await?;
        let m = receive_one(sqs, url, 2)
            .await?
            .context("the message was not received")?;
        let rh = m.receipt_handle().context("no receipt handle")?;
        if receive_one(sqs, url, 0).await?.is_some() {
            bail!("the message was received again while hidden for 60 s");
        }
        sqs.change_message_visibility()
            .queue_url(url)
            .receipt_handle(rh)
            .visibility_timeout(0)
            .send()
            .await?;
        let again = receive_one(sqs, url, 2)
            .await?
            .context("ChangeMessageVisibility 0 did not make the message visible")?;
        let attr =
            |k: MessageSystemAttributeName| again.attributes().and_then(|a| a.get(&k)).cloned();
        let count = attr(MessageSystemAttributeName::ApproximateReceiveCount);
        if count.as_deref() != Some("2") {
            bail!("ApproximateReceiveCount is {count:?} on the second receive, not 2");
        }
        if attr(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp).is_none() {
            bail!("no ApproximateFirstReceiveTimestamp");
        }
        Ok("hidden for its visibility, visible again at 0, received twice = count 2".into())
    })
    .await
}

pub(super) async fn redrive(sqs: &aws_sdk_sqs::Client, prefix: &str) -> Result<String> {
    let dlq = queue(sqs, &format!("{prefix}-dlq"), &[]).await?;
    let mut urls = vec![dlq.clone()];
    let dlq_arn = arn_of(sqs, &dlq).await?;
    let policy =
        serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}).to_string();
    let src = queue(
        sqs,
        &format!("{prefix}-src"),
        &[
            (QueueAttributeName::VisibilityTimeout, "1".into()),
            (QueueAttributeName::RedrivePolicy, policy),
        ],
    )
    .await?;
    urls.push(src.clone());
    with_queues(sqs, urls, |_| async move {
        sqs.send_message().queue_url(&src).message_body("r").send().await?;
        for n in 1..=2 {
            receive_one(sqs, &src, 3).await?.with_context(|| format!("receive {n} of 2 got nothing"))?;
            tokio::time::sleep(Duration::from_millis(1_300)).await;
        }
        // The third receive must find the message moved, not deliver it a third time.
        if let Some(m) = receive_one(sqs, &src, 2).await? {
            let count = m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount)).cloned();
            bail!("received a third time (ApproximateReceiveCount {count:?}) instead of moving to the DLQ");
        }
        receive_one(sqs, &dlq, 3).await?.context("the message is in neither queue")?;
        Ok("moved to the DLQ after maxReceiveCount 2".into())
    })
    .await
}

pub(super) async fn fifo_group_blocking(sqs: &aws_sdk_sqs::Client, prefix: &str) -> Result<String> {
    let url = queue(
        sqs,
        &format!("{prefix}-group.fifo"),
        &[
            (QueueAttributeName::FifoQueue, "true".into()),
            (QueueAttributeName::VisibilityTimeout, "30".into()),
        ],
    )
    .await?;
    let urls = vec![url];
    with_queues(sqs, urls, |urls| async move {
        let url = &urls[0];
        for (i, body) in ["first", "second"].iter().enumerate() {
            sqs.send_message()
                .queue_url(url)
                .message_body(*body)
                .message_group_id("g")
                .message_deduplication_id(format!("d{i}"))
                .send()
                .await?;
        }
        let first = receive_one(sqs, url, 2)
            .await?
            .context("nothing received")?;
        if first.body() != Some("first") {
            bail!("received {:?} before \"first\"", first.body());
        }
        if let Some(m) = receive_one(sqs, url, 1).await? {
            bail!(
                "received {:?} while \"first\" of its group was in flight",
                m.body()
            );
        }
        sqs.delete_message()
            .queue_url(url)
            .receipt_handle(first.receipt_handle().context("no receipt handle")?)
            .send()
            .await?;
        let second = receive_one(sqs, url, 2)
            .await?
            .context("\"second\" never came after \"first\" was deleted")?;
        if second.body() != Some("second") {
            bail!("received {:?} instead of \"second\"", second.body());
        }
        Ok("the group waited for its message in flight, then went on in order".into())
    })
    .await
}
