//! The comparison as a reader sees it: the Markdown table and the PNG (the latency histogram
//! beside a bar per ratio).

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::prices;

/// The comparison's Markdown: the ratios, the concurrent-duplicate case and the cost table.
pub fn markdown(r: &Value) -> String {
    let c = &r["comparison"];
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let mut s =
        String::from("\n### Against the Powertools peer (same run, same stack, same backlog)\n\n");
    s.push_str(&format!(
        "The peer: {}. Each measure is the better of two runs (this, peer, this, peer).\n\n",
        c["peer"].as_str().unwrap_or("?")
    ));
    s.push_str("| measure | this project | Powertools peer | ratio (how many times better this is) |\n|---|---|---|---|\n");
    for row in c["rows"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1}× |\n",
            row["measure"].as_str().unwrap_or(""),
            row["this_text"].as_str().unwrap_or(""),
            row["peer_text"].as_str().unwrap_or(""),
            f(&row["ratio"])
        ));
    }
    s.push_str("\nGoals: ");
    let goals: Vec<String> = c["goals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            format!(
                "{} {} ({})",
                g["goal"].as_str().unwrap_or(""),
                if g["met"].as_bool().unwrap_or(false) {
                    "met"
                } else {
                    "NOT met"
                },
                g["measured"].as_str().unwrap_or("")
            )
        })
        .collect();
    s.push_str(&goals.join("; "));
    s.push_str(".\n\n");
    let d = &c["concurrent_duplicate"];
    s.push_str("Two copies of one payment in two concurrent batches, the provider answering in 2 s:\n\n| | until both copies are acknowledged | provider calls | charges |\n|---|---|---|---|\n");
    for who in ["this", "peer"] {
        s.push_str(&format!(
            "| {who} | {:.1} s | {} | {} |\n",
            f(&d[who]["seconds_until_both_acknowledged"]),
            d[who]["provider_calls"],
            d[who]["charges"]
        ));
    }
    let at = &r["at_latency"];
    for (key, when) in [
        (
            "cost_per_million_payments",
            "the provider answering at once".to_owned(),
        ),
        (
            "cost_per_million_payments_at_latency",
            format!(
                "the provider answering at its latency (p50 {:.0} ms, p99 {:.0} ms)",
                f(&at["p50_ms"]),
                f(&at["p99_ms"])
            ),
        ),
    ] {
        s.push_str(&cost_table(&c[key], &when));
    }
    s
}

/// One cost table and its usage per payment.
fn cost_table(cost: &Value, when: &str) -> String {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let mut s = format!(
        "\nCost of a million payments on AWS, {when} ({}; Lambda arm64 at the template's {} MB, billed duration and calls as measured here; a drain by one batch at a time):\n\n",
        prices::AS_OF,
        cost["this"]["memory_mb"]
    );
    s.push_str("| USD per million payments | this project | Powertools peer |\n|---|---|---|\n");
    for (key, label) in [
        ("lambda_compute", "Lambda compute (GB-seconds)"),
        ("lambda_requests", "Lambda requests"),
        ("dynamodb", "DynamoDB on demand (write + read units)"),
        ("sqs", "SQS requests"),
        ("cloudwatch_logs", "CloudWatch Logs ingestion"),
        ("total", "**total**"),
    ] {
        s.push_str(&format!(
            "| {label} | {:.2} | {:.2} |\n",
            f(&cost["this"]["usd"][key]),
            f(&cost["peer"]["usd"][key])
        ));
    }
    s.push_str("\n| usage per payment | this project | Powertools peer |\n|---|---|---|\n");
    for (key, label, digits) in [
        ("billed_ms", "billed duration, ms", 2),
        ("invocations", "invocations", 3),
        ("dynamodb_write_units", "DynamoDB write units", 2),
        ("dynamodb_read_units", "DynamoDB read units", 2),
        (
            "sqs_requests",
            "SQS requests (send, receive, delete, the function's own)",
            2,
        ),
        (
            "log_bytes",
            "log bytes (the function's output + Lambda's own lines)",
            1,
        ),
    ] {
        s.push_str(&format!(
            "| {label} | {:.digits$} | {:.digits$} |\n",
            f(&cost["this"]["usage_per_payment"][key]),
            f(&cost["peer"]["usage_per_payment"][key]),
        ));
    }
    s
}

/// Registers DejaVu Sans as the charts' font.
fn register_font() -> Result<()> {
    use plotters::prelude::FontStyle;
    let font_bytes = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").context(
        "reading DejaVuSans.ttf (Debian package fonts-dejavu-core) for the chart's text",
    )?;
    let _ = plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font_bytes.into_boxed_slice()),
    );
    Ok(())
}

/// One PNG: on the left, a histogram per series (each contender's send → charged times of
/// the open-loop load at the provider's latency) over the same buckets; on the right, when the
/// peer ran, a bar per ratio (how many times better this project is than the peer, log scale;
/// 1 is a tie), at zero latency and at the provider's.
pub fn chart(series: &[(String, Vec<f64>)], ratios: &[(String, f64)], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    register_font()?;
    let width = if ratios.is_empty() { 900 } else { 1800 };
    let root = BitMapBackend::new(path, (width, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = if ratios.is_empty() {
        (root.clone(), None)
    } else {
        let (l, r) = root.split_horizontally(900);
        (l, Some(r))
    };
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0, f64::max);
    let buckets = 40usize;
    let bucket = max / buckets as f64;
    let counts: Vec<Vec<u32>> = series
        .iter()
        .map(|(_, values)| {
            let mut c = vec![0u32; buckets];
            for l in values {
                c[((l / bucket) as usize).min(buckets - 1)] += 1;
            }
            c
        })
        .collect();
    let top = counts.iter().flatten().copied().max().unwrap_or(1);
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "Send → charged (ms), open loop at the provider's latency",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..max, 0u32..top + top / 10 + 1)?;
    chart
        .configure_mesh()
        .x_desc("milliseconds")
        .y_desc("payments")
        .label_style(("sans-serif", 14))
        .draw()?;
    let colours = [BLUE, RED, GREEN];
    for (k, ((name, _), c)) in series.iter().zip(&counts).enumerate() {
        let colour = colours[k % colours.len()];
        chart
            .draw_series(c.iter().enumerate().map(|(i, n)| {
                let x0 = i as f64 * bucket;
                Rectangle::new([(x0, 0), (x0 + bucket, *n)], colour.mix(0.45).filled())
            }))?
            .label(name.clone())
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.mix(0.45).filled())
            });
    }
    if !series.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()?;
    }
    if let Some(right) = right {
        let top = ratios.iter().map(|(_, r)| *r).fold(10.0, f64::max) * 2.0;
        let bottom = ratios.iter().map(|(_, r)| *r).fold(0.5, f64::min) / 1.5;
        let mut bars = ChartBuilder::on(&right)
            .caption(
                "How many times better than the Powertools peer (log scale, 1 = tie)",
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(170)
            .build_cartesian_2d(
                (bottom..top).log_scale(),
                (0..ratios.len()).into_segmented(),
            )?;
        let names: Vec<String> = ratios.iter().map(|(n, _)| n.clone()).collect();
        bars.configure_mesh()
            .disable_y_mesh()
            .label_style(("sans-serif", 15))
            .y_labels(ratios.len())
            .y_label_formatter(&|y| match y {
                SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_label_formatter(&|x| format!("{x}×"))
            .draw()?;
        bars.draw_series(
            Histogram::horizontal(&bars)
                .margin(8)
                .baseline(1.0)
                .style_func(|_, r| {
                    if *r >= 1.0 {
                        GREEN.mix(0.7).filled()
                    } else {
                        RED.mix(0.7).filled()
                    }
                })
                .data(
                    ratios
                        .iter()
                        .enumerate()
                        .map(|(i, (_, r))| (i, r.max(bottom))),
                ),
        )?;
        bars.draw_series(ratios.iter().enumerate().map(|(i, (_, r))| {
            Text::new(
                format!("{r:.1}×"),
                (r.max(1.0) * 1.08, SegmentValue::CenterOf(i)),
                ("sans-serif", 15),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}
