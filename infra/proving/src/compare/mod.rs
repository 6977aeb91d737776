//! The benchmark's peer and what it is compared on: the Powertools for AWS Lambda (Python)
//! processor in `infra/peer/`, run behind the same local Runtime API as the `bootstrap`; the
//! ledger check both must pass; DynamoDB item sizes; the cost of a million payments from the
//! measured usage and the prices in [`crate::prices`]; the ratios, as a table and as bars
//! (`report`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::prices;
use crate::sim::SimClient;

mod cost;
mod report;
pub mod stack_cost;

pub use cost::{cost_per_million, largest_item, wire_per_payment, COST_LINES};
pub use report::{chart, markdown};
/// Which function a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// This project's release `bootstrap`.
    This,
    /// The Powertools peer.
    Peer,
}

impl Contender {
    /// Its name in the results: `this` or `peer`.
    pub fn label(self) -> &'static str {
        match self {
            Contender::This => "this",
            Contender::Peer => "peer",
        }
    }
}

/// A contender's name in a chart's legend.
pub fn display_name(who: Contender) -> &'static str {
    match who {
        Contender::This => "this project",
        Contender::Peer => "Powertools peer",
    }
}

/// Where the peer is.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Its `bootstrap` (`infra/peer/bootstrap`, which runs `awslambdaric`).
    pub bootstrap: PathBuf,
    /// The Python interpreter of its virtualenv (pinned `aws-lambda-powertools`).
    pub python: PathBuf,
    /// Its name and versions, for the results.
    pub description: String,
}

/// The peer's environment, from the processor's: the same table, provider, key and timeout.
pub fn peer_environment(
    peer: &PeerOptions,
    this_env: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::from([("PEER_PYTHON".to_owned(), peer.python.display().to_string())]);
    for k in [
        "IDEMPOTENCY_TABLE",
        "PROVIDER_API_URL",
        "PAYMENT_API_KEY",
        "PAYMENT_API_TIMEOUT_SECONDS",
        "STRIPE_API_VERSION",
    ] {
        let v = this_env.get(k).with_context(|| {
            format!("the peer needs {k} from the processor's environment (the API key as PAYMENT_API_KEY, not a secret)")
        })?;
        env.insert(k.to_owned(), v.clone());
    }
    Ok(env)
}

/// Every id in `ids` was charged exactly once by the provider.
pub async fn charged_once(sim: &SimClient, ids: &[String], who: Contender) -> Result<()> {
    let ledger = sim.ledger().await?;
    let wrong: Vec<String> = ids
        .iter()
        .filter_map(|id| {
            let n = ledger.charges.get(id).map(Vec::len).unwrap_or(0);
            (n != 1).then(|| format!("{id} charged {n} times"))
        })
        .collect();
    if !wrong.is_empty() {
        bail!(
            "{}: {} of {} payments not charged exactly once: {}",
            who.label(),
            wrong.len(),
            ids.len(),
            wrong[..wrong.len().min(5)].join(", ")
        );
    }
    Ok(())
}

/// What the benchmark measured of both contenders, for [`comparison`].
pub struct Measured<'a> {
    /// The peer's name and versions.
    pub peer: String,
    /// The multi-batch concurrency.
    pub pollers: usize,
    /// Each contender's better run by (`this` | `peer`, concurrent batches).
    pub best: &'a BTreeMap<(&'static str, usize), Value>,
    /// Each contender's counted run.
    pub counted: &'a BTreeMap<&'static str, Value>,
    /// Each contender's concurrent-duplicate case.
    pub duplicate: &'a BTreeMap<&'static str, Value>,
    /// Median cold start, ms: (this, peer).
    pub cold_ms: (f64, f64),
    /// The same calls alone, CPU ms per payment: (1 batch, `pollers` batches).
    pub floor_ms: (f64, f64),
    /// The function's memory size in the template.
    pub memory_mb: u64,
    /// The runs at the provider's latency: `p50_ms`, `p99_ms`, and per contender its `drain`
    /// by one batch and its `open_loop` load.
    pub at_latency: &'a Value,
    /// The retry rows, with each contender's one transient failure.
    pub retries: &'a Value,
    /// The payments API's measurement, with its write units per payment.
    pub api: &'a Value,
}

/// The comparison: a row per measure with both values and the ratio (how many times better
/// this project is), the CPU goals, the concurrent-duplicate case and the cost table.
pub fn comparison(m: &Measured) -> Value {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let mut rows = Vec::new();
    let mut row = |measure: String,
                   short: String,
                   this: f64,
                   peer: f64,
                   higher_is_better: bool,
                   text: &dyn Fn(f64) -> String| {
        let ratio = if higher_is_better {
            this / peer.max(1e-9)
        } else {
            peer / this.max(1e-9)
        };
        rows.push(json!({
            "measure": measure, "short": short, "this": this, "peer": peer,
            "this_text": text(this), "peer_text": text(peer), "ratio": ratio,
        }));
    };
    let cpu = |v: &Value| f(&v["cpu_ms_per_1000_payments"]) / 1000.0;
    let mut goals = Vec::new();
    for (p, floor) in [(1, m.floor_ms.0), (m.pollers, m.floor_ms.1)] {
        let (this, peer) = (&m.best[&("this", p)], &m.best[&("peer", p)]);
        row(
            format!("payments/s, {p} concurrent batch(es)"),
            format!("payments/s ({p})"),
            f(&this["payments_per_second"]),
            f(&peer["payments_per_second"]),
            true,
            &|v| format!("{v:.0}"),
        );
        row(
            format!("function CPU per payment, {p} batch(es)"),
            format!("CPU/payment ({p})"),
            cpu(this),
            cpu(peer),
            false,
            &|v| format!("{v:.3} ms"),
        );
        goals.push(json!({
            "goal": format!("≤ 1.1× the same calls alone at {p} batch(es)"),
            "met": cpu(this) <= 1.1 * floor,
            "measured": format!("{:.3} / {floor:.3} ms = {:.2}×", cpu(this), cpu(this) / floor.max(1e-9)),
        }));
        goals.push(json!({
            "goal": format!("≥ 10× less CPU than the peer at {p} batch(es)"),
            "met": cpu(peer) >= 10.0 * cpu(this),
            "measured": format!("{:.1}×", cpu(peer) / cpu(this).max(1e-9)),
        }));
    }
    let rss = |who: &str| {
        [1, m.pollers]
            .iter()
            .map(|p| f(&m.best[&(who, *p)]["peak_rss_kib"]))
            .fold(0.0, f64::max)
            / 1024.0
    };
    row(
        "peak RSS of a function process".into(),
        "peak RSS".into(),
        rss("this"),
        rss("peer"),
        false,
        &|v| format!("{v:.1} MiB"),
    );
    row(
        "DynamoDB calls per payment (on the wire, 10 % duplicates)".into(),
        "DynamoDB calls".into(),
        f(&m.counted["this"]["wire"]["dynamodb_calls"]),
        f(&m.counted["peer"]["wire"]["dynamodb_calls"]),
        false,
        &|v| format!("{v:.2}"),
    );
    row(
        "cold start to first Runtime API request (median)".into(),
        "cold start".into(),
        m.cold_ms.0,
        m.cold_ms.1,
        false,
        &|v| format!("{v:.1} ms"),
    );
    row(
        "concurrent duplicate: until both copies are acknowledged".into(),
        "duplicate acked".into(),
        f(&m.duplicate["this"]["seconds_until_both_acknowledged"]),
        f(&m.duplicate["peer"]["seconds_until_both_acknowledged"]),
        false,
        &|v| format!("{v:.1} s"),
    );
    let cost =
        |who: &'static str| cost_per_million(&m.best[&(who, 1)], &m.counted[who], m.memory_mb);
    let (this_cost, peer_cost) = (cost("this"), cost("peer"));
    row(
        "cost of a million payments on AWS".into(),
        "cost / million".into(),
        f(&this_cost["usd"]["total"]),
        f(&peer_cost["usd"]["total"]),
        false,
        &|v| format!("${v:.2}"),
    );
    // At the provider's real answer time.
    let lat = m.at_latency;
    let at = format!(
        "at the provider's latency (p50 {:.0} ms, p99 {:.0} ms)",
        f(&lat["p50_ms"]),
        f(&lat["p99_ms"])
    );
    let drain = |who: &str| &lat["contenders"][who]["drain"];
    let open = |who: &str| &lat["contenders"][who]["open_loop"];
    let billed = |who: &str| f(&drain(who)["billed_ms"]) / f(&drain(who)["payments"]).max(1.0);
    row(
        format!("payments/s per concurrent batch, {at}"),
        "payments/s per batch (latency)".into(),
        f(&drain("this")["payments_per_second"]),
        f(&drain("peer")["payments_per_second"]),
        true,
        &|v| format!("{v:.1}"),
    );
    row(
        format!("billed duration per payment, {at}"),
        "billed/payment (latency)".into(),
        billed("this"),
        billed("peer"),
        false,
        &|v| format!("{v:.1} ms"),
    );
    let arrival = format!(
        "{} payments/s arriving, {} batches",
        f(&lat["open_loop_rate_per_second"]),
        m.pollers
    );
    for (q, short) in [("p50", "send→charged p50"), ("p99", "send→charged p99")] {
        row(
            format!("send → charged {q}, an open loop of {arrival}, {at}"),
            format!("{short} (latency)"),
            f(&open("this")["send_to_charged_ms"][q]),
            f(&open("peer")["send_to_charged_ms"][q]),
            false,
            &|v| format!("{v:.0} ms"),
        );
    }
    let cost_at_latency =
        |who: &'static str| cost_per_million(drain(who), &m.counted[who], m.memory_mb);
    let (this_cost_lat, peer_cost_lat) = (cost_at_latency("this"), cost_at_latency("peer"));
    row(
        format!("cost of a million payments on AWS, {at}"),
        "cost / million (latency)".into(),
        f(&this_cost_lat["usd"]["total"]),
        f(&peer_cost_lat["usd"]["total"]),
        false,
        &|v| format!("${v:.2}"),
    );
    let transient = |key: &str| f(&m.retries[key]["seconds_until_charged"]);
    let (this_transient, peer_transient) = (
        transient("one_transient_failure"),
        transient("peer_one_transient_failure"),
    );
    row(
        format!(
            "one transient provider failure (every call of the first delivery answers 429) → charged after, queue visibility timeout {} s",
            m.retries["one_transient_failure"]["visibility_timeout_seconds"]
        ),
        "transient → charged".into(),
        this_transient,
        peer_transient,
        false,
        &|v| format!("{v:.1} s"),
    );
    let mut goal = |goal: String, met: bool, measured: String| {
        goals.push(json!({"goal": goal, "met": met, "measured": measured}));
    };
    goal(
        format!("billed duration per payment ≤ 1/8 of the peer's, {at}"),
        billed("this") * 8.0 <= billed("peer"),
        format!(
            "{:.1} / {:.1} ms = 1/{:.1}",
            billed("this"),
            billed("peer"),
            billed("peer") / billed("this").max(1e-9)
        ),
    );
    let per_batch = |who: &str| f(&drain(who)["payments_per_second"]);
    goal(
        format!("payments/s per batch ≥ 8× the peer's, {at}"),
        per_batch("this") >= 8.0 * per_batch("peer"),
        format!(
            "{:.1} / {:.1} = {:.1}×",
            per_batch("this"),
            per_batch("peer"),
            per_batch("this") / per_batch("peer").max(1e-9)
        ),
    );
    for (name, this, peer, bound) in [
        ("at zero latency", &this_cost, &peer_cost, 0.8),
        (at.as_str(), &this_cost_lat, &peer_cost_lat, 0.5),
    ] {
        let (t, p) = (f(&this["usd"]["total"]), f(&peer["usd"]["total"]));
        goal(
            format!("cost per million ≤ {bound}× the peer's, {name}"),
            t <= bound * p,
            format!("${t:.3} / ${p:.3} = {:.2}×", t / p.max(1e-9)),
        );
        let over: Vec<String> = COST_LINES
            .iter()
            .filter(|k| f(&this["usd"][**k]) > f(&peer["usd"][**k]) + 1e-12)
            .map(|k| {
                format!(
                    "{k} ${:.4} > ${:.4}",
                    f(&this["usd"][*k]),
                    f(&peer["usd"][*k])
                )
            })
            .collect();
        goal(
            format!("every line of the cost table ≤ the peer's, {name}"),
            over.is_empty(),
            if over.is_empty() {
                "every line".into()
            } else {
                over.join(", ")
            },
        );
        let log = f(&this["usage_per_payment"]["log_bytes"]);
        goal(
            format!("log bytes per payment ≤ 60 with Lambda's own lines, {name}"),
            log <= 60.0,
            format!("{log:.1} B"),
        );
    }
    let units = f(&m.api["write_units_per_payment"]);
    goal(
        "API write units per payment ≤ 3 (POST to charged, on the wire)".into(),
        units <= 3.0,
        format!("{units:.2}"),
    );
    goal(
        "one transient failure → charged ≤ 10 s".into(),
        this_transient <= 10.0,
        format!("{this_transient:.1} s"),
    );
    json!({
        "peer": m.peer,
        "rows": rows,
        "goals": goals,
        "concurrent_duplicate": m.duplicate,
        "cost_per_million_payments": {"this": this_cost, "peer": peer_cost, "prices": prices::AS_OF},
        "cost_per_million_payments_at_latency": {"this": this_cost_lat, "peer": peer_cost_lat, "prices": prices::AS_OF},
        "counted_runs": m.counted.iter().map(|(k, v)| {
            let mut v = v.clone();
            v.as_object_mut().map(|o| o.remove("latencies_ms"));
            (k.to_string(), v)
        }).collect::<serde_json::Map<_, _>>(),
    })
}

/// The comparison's ratios for the chart: (short name, how many times better this is).
pub fn ratios(comparison: &Value) -> Vec<(String, f64)> {
    comparison["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["short"].as_str().unwrap_or("").to_owned(),
                r["ratio"].as_f64().unwrap_or(0.0),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_chart_has_the_comparison_panel_beside_the_histogram() {
        let dir = std::env::temp_dir().join(format!("chart-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let width = |path: &Path| {
            let png = std::fs::read(path).unwrap();
            assert_eq!(&png[1..4], b"PNG");
            u32::from_be_bytes(png[16..20].try_into().unwrap())
        };
        let latencies = vec![
            (
                "this".to_owned(),
                (0..100).map(|i| i as f64 * 3.0).collect(),
            ),
            (
                "peer".to_owned(),
                (0..100).map(|i| i as f64 * 9.0).collect(),
            ),
        ];
        let alone = dir.join("alone.png");
        chart(&latencies, &[], &alone).unwrap();
        assert_eq!(width(&alone), 900);
        let both = dir.join("both.png");
        let ratios = vec![
            ("CPU/payment (1)".to_owned(), 25.0),
            ("cost / million".to_owned(), 0.9),
        ];
        chart(&latencies, &ratios, &both).unwrap();
        assert_eq!(width(&both), 1800);
        std::fs::remove_dir_all(&dir).ok();
    }
}
