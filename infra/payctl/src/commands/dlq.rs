//! The dead-letter queues: list, show, redrive.

use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum DlqCommand {
    /// List dead letters, one line each: message id, error_code, payment or refund id, age and
    /// the error message's start. With --json, each whole on one JSON line: error_code,
    /// error_message, payment_id, source_message_id, first_sent_at, age, receive count (as SQS
    /// counts it), every attribute and the body.
    List {
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
        dlq_url: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
        /// Each dead letter whole, one JSON line each.
        #[arg(long)]
        json: bool,
    },
    /// Show a dead letter by its message id or source_message_id, or every dead letter of a
    /// payment or a refund by its id.
    Show {
        /// The dead letter's message id or source_message_id, or a payment_id or refund_id.
        id: String,
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
        dlq_url: String,
    },
    /// Move dead letters back to the source queue (after fixing the cause).
    Redrive {
        /// The dead-letter queue (the stack's DeadLetterQueueUrl output).
        #[arg(long, env = "DEAD_LETTER_QUEUE_URL")]
        dlq_url: String,
        /// The queue to move them back to (default: the one queue whose redrive policy names
        /// this DLQ, asked of SQS); refused unless its redrive policy names this DLQ.
        #[arg(long)]
        queue_url: Option<String>,
        /// Only this error_code (max_receives: moved by SQS after maxReceiveCount).
        #[arg(long)]
        error_code: Option<String>,
        /// At most this many messages.
        #[arg(long)]
        max: Option<usize>,
        /// Move the codes that are never redriven too (payments: invalid_json, invalid_payment,
        /// idempotency_key_reused, provider_rejected, request_expired; refunds: invalid_json,
        /// invalid_refund, payment_unknown, payment_not_refundable, refund_exceeds_charge,
        /// refund_limit_reached, refund_failed).
        #[arg(long)]
        force: bool,
    },
}

/// The options of `payctl dlq`.
#[derive(Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    pub command: DlqCommand,
}

/// Runs `payctl dlq`.
pub async fn dlq(args: DlqArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let DlqArgs { command } = args;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let (DlqCommand::List { dlq_url, .. }
    | DlqCommand::Show { dlq_url, .. }
    | DlqCommand::Redrive { dlq_url, .. }) = &command;
    payctl::aws::check_queue(
        sdk,
        dlq_url,
        &format!("the dead-letter queue {dlq_url} (DEAD_LETTER_QUEUE_URL)"),
    )
    .await?;
    if let DlqCommand::Redrive {
        queue_url: Some(queue_url),
        ..
    } = &command
    {
        payctl::aws::check_queue(
            sdk,
            queue_url,
            &format!("the source queue {queue_url} (--queue-url)"),
        )
        .await?;
    }
    match command {
        DlqCommand::List { dlq_url, max, json } => {
            let letters = payctl::dlq::list(&sqs, &dlq_url, max).await?;
            for l in &letters {
                if json {
                    println!("{}", l.to_json());
                } else {
                    println!("{}", l.line());
                }
            }
            payctl::say!(
                "{} dead letters (listing receives each one: its receive_count grew by one)",
                letters.len()
            );
        }
        DlqCommand::Show { id, dlq_url } => {
            for letter in payctl::dlq::show(&sqs, &dlq_url, &id).await? {
                println!("{}", serde_json::to_string_pretty(&letter.to_json())?);
            }
        }
        DlqCommand::Redrive {
            dlq_url,
            queue_url,
            error_code,
            max,
            force,
        } => {
            // A given queue is checked by the redrive itself; without one, ask SQS.
            let queue_url = match queue_url {
                Some(q) => q,
                None => payctl::dlq::home_queue(&sqs, &dlq_url, None).await?,
            };
            payctl::aws::announce(sdk, &format!("redriving {dlq_url}")).await;
            println!("redriving {dlq_url} to {queue_url}");
            let report = payctl::dlq::redrive(
                &sqs,
                &payctl::dlq::RedriveOptions {
                    dlq_url,
                    queue_url,
                    error_code,
                    max,
                    force,
                },
            )
            .await?;
            println!("moved {} messages back ({})", report.moved, report.method);
            if report.method == "StartMessageMoveTask" {
                println!("SQS's move task sets a new SentTimestamp: a message SQS moved by itself (max_receives) has no first_sent_at, so its age starts again; the processor's own dead letters keep their first_sent_at");
            }
            for (code, n) in &report.kept {
                println!(
                    "kept {n} {code} in the DLQ: {} (--force moves them)",
                    payctl::dlq::never_redriven(code).unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}
