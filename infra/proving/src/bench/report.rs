//! The benchmark's results as Markdown, with the facts of the run (when, at which commit, on
//! what machine and emulator, with how many payments).

use serde_json::json;
use sqs_once::runner::now_ms;

use super::setup::*;
use crate::compare;

/// The better of two runs of one contender, measure by measure: the faster drain (with its
/// latencies), the lower CPU and the lower peak RSS.
pub(super) fn best_of(a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::MAX);
    let mut best = if f(&a, "payments_per_second") >= f(&b, "payments_per_second") {
        a.clone()
    } else {
        b.clone()
    };
    for k in [
        "cpu_ms_per_1000_payments",
        "system_cpu_ms_per_1000_payments",
        "peak_rss_kib",
        "billed_ms",
    ] {
        best[k] = if f(&a, k) <= f(&b, k) {
            a[k].clone()
        } else {
            b[k].clone()
        };
    }
    best["runs"] = json!([
        {"payments_per_second": a["payments_per_second"], "cpu_ms_per_1000_payments": a["cpu_ms_per_1000_payments"]},
        {"payments_per_second": b["payments_per_second"], "cpu_ms_per_1000_payments": b["cpu_ms_per_1000_payments"]},
    ]);
    best
}

/// When, what and where: the date, the commit, the machine, the emulator and the sizes, so
/// that a result can be compared with another only when these match.
pub(super) fn run_facts(opts: &BenchOptions) -> serde_json::Value {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    json!({
        "date": payctl::time::utc(now_ms()),
        "commit": commit,
        "machine": format!("{HOST_ARCH}, {cores} cores, {cpu}"),
        "emulator": opts.emulator,
        "payments": opts.payments,
        "duplicates": opts.payments / 10,
        "pollers": opts.pollers,
        "cold_start_runs": opts.cold_start_runs,
    })
}

pub(super) fn markdown(r: &serde_json::Value, opts: &BenchOptions) -> String {
    let mut s = String::new();
    let run = &r["run"];
    s.push_str(&format!(
        "Run {} at commit {} on {}, against {}: {} payments + {} duplicates, 1 and {} concurrent batches.\n\n",
        run["date"].as_str().unwrap_or("?"),
        run["commit"].as_str().unwrap_or("?"),
        run["machine"].as_str().unwrap_or("?"),
        run["emulator"].as_str().unwrap_or("?"),
        run["payments"],
        run["duplicates"],
        run["pollers"]
    ));
    s.push_str("| measure | value |\n|---|---|\n");
    for t in r["throughput"].as_array().into_iter().flatten() {
        let p = t["pollers"].as_u64().unwrap_or(0);
        let cap = r["stack_capacity_per_second"][p.to_string()]
            .as_f64()
            .unwrap_or(0.0);
        s.push_str(&format!(
            "| throughput, {p} concurrent batch(es) | {:.0} payments/s ({:.0} messages/s); the local stack alone, same calls and concurrency: {:.0} messages/s; {:.0} % of it |\n",
            t["payments_per_second"].as_f64().unwrap_or(0.0),
            t["messages_per_second"].as_f64().unwrap_or(0.0),
            cap,
            100.0 * t["messages_per_second"].as_f64().unwrap_or(0.0) / cap.max(1e-9)
        ));
        s.push_str(&format!(
            "| latency send → acknowledged, {p} batch(es) (p50 / p95 / p99) | {:.0} / {:.0} / {:.0} ms |\n",
            t["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            t["latency_ms"]["p95"].as_f64().unwrap_or(0.0),
            t["latency_ms"]["p99"].as_f64().unwrap_or(0.0)
        ));
        s.push_str(&format!(
            "| function CPU per payment, {p} batch(es) (all {p} `bootstrap` processes, user + system) | {:.3} ms, of which system {:.3} ms; the same calls alone, from the benchmark's build: {:.3} ms |\n",
            t["cpu_ms_per_1000_payments"].as_f64().unwrap_or(0.0) / 1000.0,
            t["system_cpu_ms_per_1000_payments"].as_f64().unwrap_or(0.0) / 1000.0,
            r["bare_calls_cpu_ms_per_payment"][p.to_string()]
                .as_f64()
                .unwrap_or(0.0)
        ));
    }
    let api = &r["api"];
    s.push_str(&format!(
        "| payments API, POST /v1/payments ({} requests, {} clients; API served in-process, DynamoDB on the emulator) | {:.0} requests/s, p50 {:.1} ms, p99 {:.1} ms |\n",
        api["requests"], api["clients"],
        api["requests_per_second"].as_f64().unwrap_or(0.0),
        api["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
        api["latency_ms"]["p99"].as_f64().unwrap_or(0.0)
    ));
    s.push_str(&format!(
        "| POST → GET says succeeded (API, outbox stream, relay, queue, processor, provider; {} payments, 5 at a time) (p50 / p95 / p99) | {:.0} / {:.0} / {:.0} ms |\n",
        api["post_to_succeeded_ms"]["samples"],
        api["post_to_succeeded_ms"]["p50"].as_f64().unwrap_or(0.0),
        api["post_to_succeeded_ms"]["p95"].as_f64().unwrap_or(0.0),
        api["post_to_succeeded_ms"]["p99"].as_f64().unwrap_or(0.0)
    ));
    s.push_str(&format!(
        "| DynamoDB write units per payment accepted through the API (POST to charged: API, relay, processor; on the wire, items ≤ {} B) | {:.2} ({:.2} write requests, transactional items counted twice) |\n",
        api["largest_item_bytes"],
        api["write_units_per_payment"].as_f64().unwrap_or(0.0),
        api["write_requests_per_payment"].as_f64().unwrap_or(0.0),
    ));
    s.push_str(&crate::webhook::markdown(&r["webhook"]));
    let at = &r["at_latency"];
    let this = &at["contenders"]["this"];
    let (drain, open) = (&this["drain"], &this["open_loop"]);
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    s.push_str(&format!(
        "| at the provider's latency (log-normal, p50 {:.0} ms, p99 {:.0} ms): {} payments drained by one batch at a time | {:.1} payments/s per batch, billed {:.1} ms per payment, {:.1} log bytes per payment (the function's own) |\n",
        f(&at["p50_ms"]),
        f(&at["p99_ms"]),
        drain["payments"],
        f(&drain["payments_per_second"]),
        f(&drain["billed_ms"]) / f(&drain["payments"]).max(1.0),
        f(&drain["log_bytes"]) / f(&drain["payments"]).max(1.0),
    ));
    s.push_str(&format!(
        "| at the provider's latency: an open loop of {} payments/s ({} payments, {} batches), send → charged (p50 / p99 / max) | {:.0} / {:.0} / {:.0} ms |\n",
        f(&open["rate_per_second"]),
        open["payments"],
        open["pollers"],
        f(&open["send_to_charged_ms"]["p50"]),
        f(&open["send_to_charged_ms"]["p99"]),
        f(&open["send_to_charged_ms"]["max"]),
    ));
    s.push_str(&rate_markdown(&r["provider_rate"]));
    for c in r["calls_per_payment"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| calls: {} | {} DynamoDB, {} SQS, {} provider |\n",
            c["case"].as_str().unwrap_or(""),
            c["dynamodb"],
            c["sqs"],
            c["provider"]
        ));
    }
    s.push_str(&format!(
        "| function peak RSS (the largest `bootstrap` process) | {:.1} MiB |\n",
        r["peak_rss_kib"].as_f64().unwrap_or(0.0) / 1024.0
    ));
    for (arch, ms) in r["cold_start_ms_median"].as_object().into_iter().flatten() {
        s.push_str(&format!(
            "| cold start to first Runtime API request ({arch}, median of {}) | {:.1} ms |\n",
            opts.cold_start_runs,
            ms.as_f64().unwrap_or(0.0)
        ));
    }
    for (arch, b) in r["bootstrap_bytes"].as_object().into_iter().flatten() {
        s.push_str(&format!(
            "| `bootstrap` size ({arch}, stripped) | {:.1} MiB |\n",
            b.as_f64().unwrap_or(0.0) / 1048576.0
        ));
    }
    s.push_str(&traces_markdown(&r["traces"]));
    s.push_str(&super::retries::markdown(&r["retries"]));
    if r.get("comparison").is_some() {
        s.push_str(&compare::markdown(r));
    }
    s
}

/// The provider-rate rows ([`super::rate`]), with this project's goals and whether each was met.
pub(super) fn rate_markdown(r: &serde_json::Value) -> String {
    use super::rate::{
        GOALS_FROM_PAYMENTS, GOAL_DRAIN_OVER_FLOOR, GOAL_PER_PAYMENT, GOAL_REFUSED_SHARE,
    };
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let mut s = format!(
        "| the provider's rate: {} payments queued at once, the provider answering in p50 {:.0} / p99 {:.0} ms, the merchant's own traffic at {:.0} % of the account's limit (one request in ten a checkout's `POST /v1/payment_intents`, the rest reads of three other endpoints); the payment processor alone | |\n",
        r["payments"],
        f(&r["latency_ms"]["p50"]),
        f(&r["latency_ms"]["p99"]),
        100.0 * f(&r["foreground_share_of_limit"]),
    );
    // A backlog this small is mostly its start and its last batches: the goals are not judged.
    let small = r["payments"].as_u64().unwrap_or(0) < GOALS_FROM_PAYMENTS;
    if small {
        s.push_str(&format!(
            "| (goals not judged below {GOALS_FROM_PAYMENTS} payments) | |\n"
        ));
    }
    for run in r["runs"].as_array().into_iter().flatten() {
        let who = run["function"].as_str().unwrap_or("?");
        let name = if who == "this" {
            "this project"
        } else {
            "the peer"
        };
        let mark = |met: bool| {
            if who != "this" || small {
                ""
            } else if met {
                " (goal met)"
            } else {
                " (GOAL MISSED)"
            }
        };
        let (ratio, share, per_charge, claims) = (
            f(&run["drain_over_floor"]),
            f(&run["refused_share"]),
            f(&run["provider_requests_per_charge"]),
            f(&run["claims_per_payment"]),
        );
        let (dead, merchant_refused) = (
            run["dead_letters"].as_u64().unwrap_or(u64::MAX),
            run["merchant"]["refused"].as_u64().unwrap_or(u64::MAX),
        );
        let sustained = f(&run["sustained_payments_per_second"]);
        let (drain_mark, sustained_mark) = match run["tier_payments_per_second"].as_f64() {
            Some(tier) => ("", mark(sustained >= tier)),
            None => (mark(ratio <= GOAL_DRAIN_OVER_FLOOR), ""),
        };
        s.push_str(&format!(
            "| rate, {name}, {}: {:.0}/s in all, {:.0}/s an endpoint; `ProviderRequestsPerSecond` {}, the payments' part {:.1}/s over {} instances | {sustained:.1} payments/s sustained{sustained_mark}, {:.1} overall: drained in {:.1} s = {ratio:.2}× the floor ({:.1} s){drain_mark}; {} provider requests, {:.1} % refused `429`{}; {per_charge:.3} provider requests per charge{}; {claims:.3} claims per payment{}; {:.2} deliveries per payment; {} invocations failed; {dead} dead letters{}; the merchant's {} requests: {merchant_refused} refused{}; the limiter's refusals by reason (both clients): {} |\n",
            run["account"].as_str().unwrap_or("?"),
            f(&run["limit_per_second"]),
            f(&run["endpoint_limit_per_second"]),
            run["provider_requests_per_second"],
            f(&run["budget_per_second"]),
            run["instances"],
            f(&run["payments"]) / f(&run["seconds"]),
            f(&run["seconds"]),
            f(&run["floor_seconds"]),
            run["provider_requests"],
            100.0 * share,
            mark(share <= GOAL_REFUSED_SHARE),
            mark(per_charge <= GOAL_PER_PAYMENT),
            mark(claims <= GOAL_PER_PAYMENT),
            f(&run["deliveries_per_payment"]),
            run["function_errors"],
            mark(dead == 0),
            run["merchant"]["requests"],
            mark(merchant_refused == 0),
            run["refused_by_reason_all"]
                .as_object()
                .filter(|o| !o.is_empty())
                .map(|o| o
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_else(|| "none".into()),
        ));
    }
    s.push_str(&format!(
        "| rate goals (this project) | drain ≤ {GOAL_DRAIN_OVER_FLOOR}× the floor (a capacity tier's account: its payments a second sustained, the charges' 10th to 90th percentile), ≤ {:.0} % refused, ≤ {GOAL_PER_PAYMENT} provider requests per charge and claims per payment, 0 dead letters, 0 of the merchant's requests refused |\n",
        100.0 * GOAL_REFUSED_SHARE
    ));
    s
}

/// The traces rows: each figure with the function exporting nothing (off) and exporting every
/// payment's spans to a local OTLP receiver (on).
pub(super) fn traces_markdown(t: &serde_json::Value) -> String {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let row = |what: &str, key: &str, unit: &str, digits: usize| {
        let (off, on) = (f(&t[key]["off"]), f(&t[key]["on"]));
        format!(
            "| traces off / on: {what} | {off:.digits$}{unit} / {on:.digits$}{unit} ({:+.0} %) |\n",
            (on / off - 1.0) * 100.0
        )
    };
    let mut s = format!(
        "| traces off / on (OTLP/HTTP to a local receiver, every payment sampled, flushed before each invocation answers): {} payments drained by one process, {:.1} spans a payment | |\n",
        t["payments"],
        f(&t["spans_per_payment"])
    );
    s.push_str(&row("CPU per payment", "cpu_ms_per_payment", " ms", 3));
    s.push_str(&row(
        "billed duration per payment",
        "billed_ms_per_payment",
        " ms",
        2,
    ));
    s.push_str(&row("payments/s", "payments_per_second", "", 1));
    s.push_str(&row(
        "cold start to first Runtime API request",
        "cold_start_ms_median",
        " ms",
        1,
    ));
    s.push_str(&format!(
        "| traces off / on: function peak RSS | {:.1} / {:.1} MiB |\n",
        f(&t["peak_rss_kib"]["off"]) / 1024.0,
        f(&t["peak_rss_kib"]["on"]) / 1024.0
    ));
    s
}
