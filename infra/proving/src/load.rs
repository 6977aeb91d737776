//! Generated payment load with known expected results (sent with the operator's own
//! [`payctl::send`]).

pub use payctl::send::{payment_body, payment_body_in, send_all};
use serde_json::json;

/// What a message should end as, by the message contract and the simulator's test cards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Charged once, record `COMPLETED` with this status (`succeeded`).
    Charged(&'static str),
    /// The card needs the customer (off-session `authentication_required`): record
    /// `COMPLETED` as `requires_action` with its PaymentIntent, nothing charged.
    RequiresAction,
    /// Declined, recorded, not dead-lettered.
    Declined,
    /// Rejected by the provider: recorded, in the DLQ as `provider_rejected`.
    ProviderRejected,
    /// Another payload under a used payment id: in the DLQ as `idempotency_key_reused`.
    KeyReused,
    /// Bad input: in the DLQ with this code, never charged.
    Invalid(&'static str),
}

/// One message to send.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The exact body.
    pub body: String,
    /// The payment id, when the body has a valid one.
    pub payment_id: Option<String>,
    /// The expected end.
    pub expect: Expect,
    /// `unique`, `duplicate`, `concurrent`, `key_reuse` or `malformed`, for the summary.
    pub kind: &'static str,
}

/// The malformed bodies of the contract, each with the code it must be dead-lettered with.
pub fn malformed_bodies(id: &str) -> Vec<(String, &'static str)> {
    let good = |f: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        let mut v =
            serde_json::from_str::<serde_json::Value>(&payment_body(id, 1000, "pm_card_visa"))
                .unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            f(m);
        }
        v.to_string()
    };
    vec![
        ("{\"payment_id\": \"broken".to_owned(), "invalid_json"),
        ("not json at all".to_owned(), "invalid_json"),
        (good(&|m| { m.remove("amount"); }), "invalid_payment"),
        (good(&|m| { m.insert("amount".into(), json!("10.00")); }), "invalid_payment"),
        (good(&|m| { m.insert("amount".into(), json!(0)); }), "invalid_payment"),
        (good(&|m| { m.insert("amount".into(), json!(-100)); }), "invalid_payment"),
        (good(&|m| { m.insert("currency".into(), json!("zzz")); }), "invalid_payment"),
        (good(&|m| { m.insert("payment_method".into(), json!("4242 4242 4242 4242")); }), "invalid_payment"),
        (good(&|m| { m.insert("ammount".into(), json!(5)); }), "invalid_payment"),
        (good(&|m| { m.insert("payment_id".into(), json!("has space")); }), "invalid_payment"),
        (good(&|m| { m.remove("customer_id"); }), "invalid_payment"),
        (format!("{{\"payment_id\":\"{id}\",\"amount\":1,\"currency\":\"usd\",\"customer_id\":\"c\",\"payment_method\":\"pm\",\"description\":\"{}\"}}", "x".repeat(70_000)), "invalid_payment"),
    ]
}

/// A mixed load in two waves. The first: unique payments (mostly charged, some declined, some
/// needing the customer's authentication, some refused by the provider; usd and jpy), concurrent copies, malformed bodies. The
/// second, sent after the first drained: duplicates of completed payments and key reuse with
/// another amount. `size` is the number of unique payments.
pub fn mixed_load(prefix: &str, size: usize, seed: u64) -> (Vec<Planned>, Vec<Planned>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut first = Vec::new();
    let mut second = Vec::new();
    let mut valid: Vec<Planned> = Vec::new();
    for i in 0..size {
        let id = format!("{prefix}-{i:05}");
        let roll = rng.u32(0..100);
        let (pm, expect) = match roll {
            0..=9 => ("pm_card_chargeDeclined", Expect::Declined),
            10..=14 => ("pm_card_chargeDeclinedInsufficientFunds", Expect::Declined),
            15 => ("pm_card_threeDSecureRequired", Expect::RequiresAction),
            16..=17 => ("pm_card_authenticationRequired", Expect::RequiresAction),
            18..=19 => ("pm_card_invalid", Expect::ProviderRejected),
            _ => ("pm_card_visa", Expect::Charged("succeeded")),
        };
        // One in ten in a zero-decimal currency (whole yen, Stripe's minimum ¥50).
        let currency = if rng.u32(0..10) == 0 { "jpy" } else { "usd" };
        let p = Planned {
            body: payment_body_in(&id, rng.i64(100..500_000), currency, pm),
            payment_id: Some(id),
            expect,
            kind: "unique",
        };
        // Concurrent copies: the same message sent several times at once.
        if rng.u32(0..100) < 8 {
            for _ in 0..rng.usize(2..6) {
                first.push(Planned {
                    kind: "concurrent",
                    ..p.clone()
                });
            }
        }
        first.push(p.clone());
        valid.push(p);
    }
    for (body, code) in malformed_bodies(&format!("{prefix}-bad")) {
        first.push(Planned {
            body,
            payment_id: None,
            expect: Expect::Invalid(code),
            kind: "malformed",
        });
    }
    for p in &valid {
        let roll = rng.u32(0..100);
        if roll < 15 {
            second.push(Planned {
                kind: "duplicate",
                ..p.clone()
            });
        } else if roll < 20 {
            let id = p.payment_id.clone().unwrap_or_default();
            second.push(Planned {
                body: payment_body(&id, 999_999, "pm_card_visa"),
                payment_id: Some(id),
                expect: Expect::KeyReused,
                kind: "key_reuse",
            });
        }
    }
    rng.shuffle(&mut first);
    rng.shuffle(&mut second);
    (first, second)
}

/// "3 duplicate, 12 malformed, ..." for a load, by kind.
pub fn kinds(load: &[Planned]) -> String {
    let mut m: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for p in load {
        *m.entry(p.kind).or_default() += 1;
    }
    m.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}
