//! Sending a message as a producer does: retried, backing off, until SQS takes it.

use std::time::Duration;

use super::super::World;

/// Sends one message as a producer does: retried until SQS takes it.
pub(in crate::world) async fn send(w: &World, sqs: &aws_sdk_sqs::Client, url: &str, body: &str) {
    // A FIFO queue's producer groups a customer's payments (content-based deduplication).
    let group = w.queue.ends_with(".fifo").then(|| {
        serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                // A payment's customer; an event's payment (its object's metadata); a refund's payment.
                v["customer_id"]
                    .as_str()
                    .or_else(|| v["data"]["object"]["metadata"]["payment_id"].as_str())
                    .or_else(|| v["payment_id"].as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "unreadable".into())
    });
    // Backing off as a producer does: 1 s, doubled at each failure, at most five minutes.
    let mut wait = Duration::from_secs(1);
    loop {
        match sqs
            .send_message()
            .queue_url(url)
            .message_body(body)
            .set_message_group_id(group.clone())
            .send()
            .await
        {
            Ok(_) => return,
            Err(_) => tokio::time::sleep(wait).await,
        }
        wait = (wait * 2).min(Duration::from_secs(300));
        w.note("producer: send retried".into());
    }
}
