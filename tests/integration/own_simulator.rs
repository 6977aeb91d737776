//! A provider simulator of a test's own, for what is the whole account's at Stripe (the
//! account's rate limit, its webhook endpoints), and a request to any simulator as the
//! project's client sends it.

use std::time::Duration;

use crate::helpers::root;

/// A simulator of the test's own, for what is the whole account's (its rate limit, its webhook
/// endpoints), where the shared one serves the other tests; stopped when dropped. Its requests
/// are in the contract test's record too (`SIM_RECORD`, when the suite keeps one).
pub struct OwnSimulator {
    child: std::process::Child,
    pub url: String,
    _dir: std::path::PathBuf,
}

impl OwnSimulator {
    pub fn start(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sim-{tag}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port_file = dir.join("port");
        let child = std::process::Command::new("python3")
            .arg(root().join("infra/provider-sim/simulator.py"))
            .args(["--port", "0", "--port-file"])
            .arg(&port_file)
            .args(["--api-key", "sk_test_local"])
            .args(
                std::env::var("SIM_RECORD")
                    .ok()
                    .map(|f| vec!["--record".to_owned(), f])
                    .unwrap_or_default(),
            )
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting a simulator");
        let started = std::time::Instant::now();
        while !port_file.exists()
            || std::fs::read_to_string(&port_file)
                .unwrap()
                .trim()
                .is_empty()
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the simulator did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = std::fs::read_to_string(&port_file)
            .unwrap()
            .trim()
            .to_owned();
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// The account's limit, requests a second (`POST /_sim/rate_limit`).
    pub async fn limit(&self, per_second: u32) {
        reqwest::Client::new()
            .post(format!("{}/_sim/rate_limit", self.url))
            .json(&serde_json::json!({ "per_second": per_second }))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }

    /// The `/v1` requests let through and refused since the limit was set.
    pub async fn counts(&self) -> (f64, f64) {
        let counts: serde_json::Value = reqwest::get(format!("{}/_sim/rate_limit", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            counts["allowed"].as_f64().unwrap(),
            counts["refused"].as_f64().unwrap(),
        )
    }
}

impl Drop for OwnSimulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `/v1` request to a provider simulator at `base` as the project's client sends it (the
/// key as bearer, the pinned `Stripe-Version`, a form under `idempotency_key` when there is
/// one): its JSON answer.
pub async fn stripe_call(
    base: &str,
    api_key: &str,
    method: reqwest::Method,
    path: &str,
    query: &[(&str, &str)],
    form: &[(&str, &str)],
    idempotency_key: &str,
) -> serde_json::Value {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(api_key)
        .header("Stripe-Version", payment_core::stripe::DEFAULT_API_VERSION)
        .query(query);
    if !form.is_empty() {
        req = req.header("Idempotency-Key", idempotency_key).form(form);
    }
    req.send().await.unwrap().json().await.unwrap()
}
