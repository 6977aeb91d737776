//! Putting payments and refunds on their queues.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::BufRead;
use std::path::PathBuf;

/// The options of `payctl send`.
#[derive(Args)]
pub struct SendArgs {
    /// The payments queue (the stack's PaymentsQueueUrl output).
    #[arg(long, env = "PAYMENTS_QUEUE_URL")]
    pub queue_url: String,
    /// One message body.
    #[arg(long, conflicts_with_all = ["file", "generate"])]
    pub body: Option<String>,
    /// A file with one body per line.
    #[arg(long, conflicts_with = "generate")]
    pub file: Option<PathBuf>,
    /// Generate this many valid payments.
    #[arg(long)]
    pub generate: Option<usize>,
    /// The number of the first generated payment: ids are PREFIX-000000 on from it (the same
    /// ids again are copies, which the processor absorbs as duplicates).
    #[arg(long, default_value_t = 0, requires = "generate")]
    pub first: usize,
    /// Payment id prefix of generated payments.
    #[arg(long, default_value = "pay")]
    pub prefix: String,
    /// Send the bodies as they are, even those the processor would dead-letter (to try the
    /// DLQ); by default each is checked with the processor's own validation first, and none is
    /// sent when one fails.
    #[arg(long)]
    pub no_validate: bool,
}

/// Runs `payctl send`.
pub async fn send(args: SendArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let SendArgs {
        queue_url,
        body,
        file,
        generate,
        first,
        prefix,
        no_validate,
    } = args;
    payctl::aws::check_queue(
        sdk,
        &queue_url,
        &format!("the payments queue {queue_url} (PAYMENTS_QUEUE_URL)"),
    )
    .await?;
    payctl::aws::announce(sdk, &format!("sending payments to {queue_url}")).await;
    let bodies: Vec<String> = if let Some(b) = body {
        vec![b]
    } else if let Some(f) = file {
        let reader: Box<dyn BufRead> = if f.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(&f).with_context(|| format!("opening {}", f.display()))?,
            ))
        };
        reader
            .lines()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|l| !l.trim().is_empty())
            .collect()
    } else if let Some(n) = generate {
        (first..first + n)
            .map(|i| {
                payctl::send::payment_body(
                    &format!("{prefix}-{i:06}"),
                    1000 + i as i64,
                    "pm_card_visa",
                )
            })
            .collect()
    } else {
        bail!("give --body, --file or --generate");
    };
    if !no_validate {
        check_bodies(&bodies)?;
    }
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let progress = payctl::send::Progress::default();
    let mut signals = payctl::stop::Signals::listen()?;
    let ids = tokio::select! {
        ids = payctl::send::send_all_observed(&sqs, &queue_url, &bodies, &progress) => ids?,
        status = signals.next() => {
            let (sent, from) = progress.done(bodies.len());
            payctl::say!("interrupted: {sent} of {} messages sent", bodies.len());
            if let (Some(n), Some(from)) = (generate, from) {
                payctl::say!(
                    "every payment before {prefix}-{:06} was sent: go on with --generate {} --first {} (any after it that went already are copies, charged once)",
                    first + from,
                    n - from,
                    first + from
                );
            } else if let Some(from) = from {
                payctl::say!("every body before line {} was sent: send from it again (copies of those that went are charged once)", from + 1);
            }
            std::process::exit(status);
        }
    };
    println!("sent {} messages", ids.len());
    if let Some(n) = generate.filter(|n| *n > 0) {
        let last = first + n - 1;
        println!(
            "payment ids {prefix}-{first:06} to {prefix}-{last:06}; new ones next: --first {} (the same ids again are copies, charged once)",
            last + 1
        );
    }
    Ok(())
}

/// Refuses the bodies the processor would dead-letter, with its own reasons: nothing is sent.
fn check_bodies(bodies: &[String]) -> Result<()> {
    let bad: Vec<String> = bodies
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            payment_core::domain::PaymentRequest::parse(b)
                .err()
                .map(|e| format!("body {}: {}: {e}", i + 1, e.code()))
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    bail!(
        "{} of {} bodies would be dead-lettered by the processor, so nothing was sent: {}{}; fix them, or pass --no-validate to send them as they are (to try the dead-letter queue)",
        bad.len(),
        bodies.len(),
        bad.iter().take(3).cloned().collect::<Vec<_>>().join("; "),
        if bad.len() > 3 { "; ..." } else { "" }
    )
}

/// Parses an amount in minor units, explaining them when given a decimal or a negative number.
pub fn minor_units(text: &str) -> Result<i64, String> {
    let explain = "amounts are whole minor units: cents for usd (19.99 usd is 1999), yen for jpy (which has no minor unit: 500 is 500 jpy)";
    if text.contains('.') || text.contains(',') {
        let digits: String = text.chars().filter(char::is_ascii_digit).collect();
        return Err(format!(
            "{text:?} is not a whole number: {explain}; did you mean {}?",
            digits.trim_start_matches('0')
        ));
    }
    match text.trim().parse::<i64>() {
        // Zero reaches the API or the processor, which refuse it with the currency's minimum.
        Ok(n) if n >= 0 => Ok(n),
        Ok(_) => Err(format!("{text} is negative: {explain}")),
        Err(_) => Err(format!("{text:?} is not a number: {explain}")),
    }
}

/// The options of `payctl send-refund`.
#[derive(Args)]
pub struct SendRefundArgs {
    /// The refunds queue (the stack's RefundsQueueUrl output).
    #[arg(long, env = "REFUNDS_QUEUE_URL")]
    pub queue_url: String,
    /// One message body: {"refund_id", "payment_id", "amount"?, "reason"?}.
    #[arg(long, conflicts_with_all = ["payment_id", "refund_id", "amount", "reason"])]
    pub body: Option<String>,
    /// The payment to refund.
    #[arg(long, requires = "refund_id")]
    pub payment_id: Option<String>,
    /// The refund's id: its idempotency key (send it again to retry the same refund).
    #[arg(long)]
    pub refund_id: Option<String>,
    /// Minor units (default: what is left of the charge).
    #[arg(long, allow_negative_numbers = true, value_parser = minor_units)]
    pub amount: Option<i64>,
    /// duplicate, fraudulent or requested_by_customer.
    #[arg(long)]
    pub reason: Option<String>,
}

/// Runs `payctl send-refund`.
pub async fn send_refund(args: SendRefundArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let SendRefundArgs {
        queue_url,
        body,
        payment_id,
        refund_id,
        amount,
        reason,
    } = args;
    let body = match (body, payment_id, refund_id) {
        (Some(b), _, _) => b,
        (None, Some(payment_id), Some(refund_id)) => payment_core::refunds::work::RefundRequest {
            refund_id,
            payment_id,
            amount,
            reason,
            contract_version: None,
        }
        .to_message_body(),
        _ => bail!("give --body, or --payment-id with --refund-id"),
    };
    // A refund the processor would refuse is refused here, with the same reason.
    payment_core::refunds::work::RefundRequest::parse(&body)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.code, e.message))?;
    payctl::aws::check_queue(
        sdk,
        &queue_url,
        &format!("the refunds queue {queue_url} (REFUNDS_QUEUE_URL)"),
    )
    .await?;
    payctl::aws::announce(sdk, &format!("sending a refund to {queue_url}")).await;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let ids = payctl::send::send_all(&sqs, &queue_url, &[body]).await?;
    println!("sent {} refund message(s)", ids.len());
    Ok(())
}
