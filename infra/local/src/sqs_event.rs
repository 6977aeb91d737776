//! The SQS event record Lambda's event source builds for a received message.

use std::collections::HashMap;

use aws_lambda_events::event::sqs::{SqsMessage, SqsMessageAttribute};

/// The Lambda SQS event record of a received message, as Lambda's event source builds it.
pub fn to_record(m: &aws_sdk_sqs::types::Message, arn: &str, region: &str) -> SqsMessage {
    let mut r = SqsMessage::default();
    r.message_id = m.message_id().map(str::to_owned);
    r.receipt_handle = m.receipt_handle().map(str::to_owned);
    r.body = m.body().map(str::to_owned);
    r.md5_of_body = m.md5_of_body().map(str::to_owned);
    r.attributes = m
        .attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    r.message_attributes = m
        .message_attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| {
                    let mut attr = SqsMessageAttribute::default();
                    attr.string_value = v.string_value().map(str::to_owned);
                    attr.data_type = Some(v.data_type().to_owned());
                    (k.clone(), attr)
                })
                .collect::<HashMap<_, _>>()
        })
        .unwrap_or_default();
    r.event_source_arn = Some(arn.to_owned());
    r.event_source = Some("aws:sqs".to_owned());
    r.aws_region = Some(region.to_owned());
    r
}
