//! The payments API's client (`payctl pay`, `payctl get`, the demo and the tests): requests
//! signed with SigV4 for the `execute-api` service, as the API's `AWS_IAM` routes require, with
//! the credentials and region of the standard chain.

use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context, Result};
use aws_credential_types::provider::ProvideCredentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

/// One answer of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// `Idempotent-Replayed: true` was set.
    pub replayed: bool,
    /// The body, as sent.
    pub body: String,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body).with_context(|| {
            format!(
                "the API answered {} with a body that is not JSON: {}",
                self.status, self.body
            )
        })
    }
}

/// A signing client for one API base URL.
#[derive(Clone)]
pub struct ApiClient {
    base: String,
    http: reqwest::Client,
    sdk: aws_config::SdkConfig,
}

impl ApiClient {
    /// A client for `base` (the stack's `PaymentsApiUrl`).
    pub fn new(base: &str, sdk: &aws_config::SdkConfig) -> Result<Self> {
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            sdk: sdk.clone(),
        })
    }

    /// `POST /v1/payments` with `Idempotency-Key: key`.
    pub async fn create(&self, key: &str, body: &str) -> Result<Answer> {
        self.send("POST", "/v1/payments", Some(key), body).await
    }

    /// `GET /v1/payments/{id}`.
    pub async fn get(&self, id: &str) -> Result<Answer> {
        self.send("GET", &format!("/v1/payments/{id}"), None, "")
            .await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<Answer> {
        let url = format!("{}{path}", self.base);
        let credentials = self
            .sdk
            .credentials_provider()
            .ok_or_else(|| anyhow!("no AWS credentials configured: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"))?
            .provide_credentials()
            .await
            .context("reading AWS credentials to sign the request")?;
        let identity: Identity = credentials.into();
        let region = self
            .sdk
            .region()
            .map(|r| r.to_string())
            .ok_or_else(|| anyhow!("no AWS region configured: set AWS_REGION"))?;
        let host = reqwest::Url::parse(&url)
            .with_context(|| format!("bad API URL {url}"))?
            .host_str()
            .map(str::to_owned)
            .unwrap_or_default();
        let mut headers: Vec<(&str, String)> =
            vec![("host", host), ("content-type", "application/json".into())];
        if let Some(k) = key {
            headers.push(("idempotency-key", k.to_owned()));
        }
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&region)
            .name("execute-api")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .context("building the SigV4 parameters")?
            .into();
        let signable = SignableRequest::new(
            method,
            &url,
            headers.iter().map(|(k, v)| (*k, v.as_str())),
            SignableBody::Bytes(body.as_bytes()),
        )
        .context("preparing the request for signing")?;
        let (instructions, _) = sign(signable, &params)
            .context("signing the request")?
            .into_parts();
        let mut request = self
            .http
            .request(method.parse()?, &url)
            .body(body.to_owned());
        for (k, v) in headers.iter().filter(|(k, _)| *k != "host") {
            request = request.header(*k, v);
        }
        for (k, v) in instructions.headers() {
            request = request.header(k, v);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body = response.text().await?;
        Ok(Answer {
            status,
            replayed,
            body,
        })
    }
}
