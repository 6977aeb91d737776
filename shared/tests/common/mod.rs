//! What the payment-core tests share: queues that keep the dead letters, and SQS records.
#![allow(dead_code)] // each test binary uses a part of it

use std::sync::Mutex;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;
use sqs_once::queue::{DeadLetter, QueueError, QueueOps};
use sqs_once::runner::now_ms;

/// Queues that keep every dead letter and accept everything else.
#[derive(Default)]
pub struct Queues(pub Mutex<Vec<DeadLetter>>);

impl Queues {
    /// The dead letters so far.
    pub fn dead(&self) -> Vec<DeadLetter> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl QueueOps for Queues {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<(), QueueError> {
        self.0.lock().unwrap().push(l.clone());
        Ok(())
    }
    async fn delete(&self, _: &str, _: &str) -> Result<(), QueueError> {
        Ok(())
    }
    async fn change_visibility(&self, _: &str, _: &str, _: i32) -> Result<(), QueueError> {
        Ok(())
    }
    async fn max_receive_count(&self, _: &str) -> Result<Option<u32>, QueueError> {
        Ok(None)
    }
}

/// A first delivery of `body` from the queue `queue`, sent now.
pub fn msg(queue: &str, id: &str, body: &str) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.to_owned());
    m.receipt_handle = Some(format!("rh-{id}"));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some(format!("arn:aws:sqs:us-east-1:000000000000:{queue}"));
    m.attributes
        .insert("SentTimestamp".into(), now_ms().to_string());
    m.attributes
        .insert("ApproximateReceiveCount".into(), "1".into());
    m
}
