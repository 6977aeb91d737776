//! Where resumed held refunds go: the refunds queue ([`RefundQueue`]), on SQS
//! ([`SqsRefundQueue`]), standard or FIFO.

use async_trait::async_trait;

/// Where resumed refunds go: the refunds queue.
#[async_trait]
pub trait RefundQueue: Send + Sync {
    /// Sends each body as one message; an error when any was not taken.
    async fn send(&self, bodies: &[String]) -> Result<(), String>;
}

/// The refunds queue on SQS.
#[derive(Debug, Clone)]
pub struct SqsRefundQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl SqsRefundQueue {
    /// The queue at `url`.
    pub fn new(client: aws_sdk_sqs::Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }
}

#[async_trait]
impl RefundQueue for SqsRefundQueue {
    async fn send(&self, bodies: &[String]) -> Result<(), String> {
        for chunk in bodies.chunks(10) {
            let mut batch = self.client.send_message_batch().queue_url(&self.url);
            for (i, body) in chunk.iter().enumerate() {
                let mut entry = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body);
                if self.url.ends_with(".fifo") {
                    // A FIFO queue refuses a message without its group: a payment's refunds
                    // go in its group. Each send is its own message (a deduplication id of
                    // its own): a resume that must send again within SQS's five minutes
                    // (reopened, held again, settled again) is not dropped as a copy, and the
                    // refund's record absorbs any copy that does arrive.
                    let (group, dedup) = fifo_ids(body, &sqs_once::token::new())?;
                    entry = entry
                        .message_group_id(group)
                        .message_deduplication_id(dedup);
                }
                batch = batch.entries(entry.build().map_err(|e| e.to_string())?);
            }
            let out = batch.send().await.map_err(|e| {
                format!(
                    "sending held refunds to {}: {}",
                    self.url,
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                )
            })?;
            if let Some(f) = out.failed().first() {
                return Err(format!(
                    "the refunds queue refused a held refund: {} {}",
                    f.code(),
                    f.message().unwrap_or_default()
                ));
            }
        }
        Ok(())
    }
}

/// A refund's FIFO group (its payment's id) and a deduplication id of this send's own (its
/// refund id and `nonce`). SQS takes at most 128 characters of `[A-Za-z0-9]` and punctuation
/// for each, where ids may have 255: a longer group is its SHA-256 ([`sqs_once::queue::fifo_id`]:
/// the same payment, the same group), and the deduplication id is always one.
pub fn fifo_ids(body: &str, nonce: &str) -> Result<(String, String), String> {
    use sha2::{Digest, Sha256};
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("a held refund's body: {e}"))?;
    let (Some(payment_id), Some(refund_id)) = (v["payment_id"].as_str(), v["refund_id"].as_str())
    else {
        return Err(format!(
            "a held refund's body names no payment_id and refund_id: {body}"
        ));
    };
    let group = sqs_once::queue::fifo_id(payment_id);
    let dedup = hex::encode(Sha256::digest(format!("{refund_id}\n{nonce}").as_bytes()));
    Ok((group, dedup))
}

#[cfg(test)]
mod tests {
    use crate::refunds::request::RefundRequest;

    fn body(refund_id: &str, payment_id: &str) -> String {
        RefundRequest::parse(
            &serde_json::json!({"refund_id": refund_id, "payment_id": payment_id, "amount": 5})
                .to_string(),
        )
        .unwrap()
        .to_message_body()
    }

    #[test]
    fn a_resumed_refund_goes_in_its_payments_fifo_group_and_each_send_is_its_own_message() {
        let b = body("r-1", "p-9");
        let (group, first) = super::fifo_ids(&b, "n1").unwrap();
        let (_, again) = super::fifo_ids(&b, "n2").unwrap();
        assert_eq!(group, "p-9");
        // A second send within SQS's five minutes is not dropped as a copy of the first.
        assert_ne!(first, again);
        assert!(first.len() <= 128);
        assert!(super::fifo_ids(r#"{"refund_id":"r-1"}"#, "n").is_err());
    }

    #[test]
    fn ids_longer_than_a_fifo_queue_takes_still_make_a_valid_group() {
        let long = "p".repeat(255);
        let (group, dedup) = super::fifo_ids(&body(&"r".repeat(255), &long), "n").unwrap();
        assert!(group.len() <= 128 && dedup.len() <= 128);
        // Stable: the same payment, the same group, whatever the refund.
        assert_eq!(group, super::fifo_ids(&body("r-2", &long), "m").unwrap().0);
    }
}
