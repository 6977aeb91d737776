//! Refunds in Stripe's wire format: `POST /v1/refunds` (form encoded, `Idempotency-Key:
//! refund:<refund_id>`) and `GET /v1/refunds?payment_intent=...`, on the same client as the
//! payments. The key is namespaced because Stripe's idempotency keys are account-wide: a bare
//! refund id equal to some payment id would be refused as a key used on another endpoint.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde::Deserialize;

use crate::provider::{
    FoundRefund, ProviderError, ProviderResponse, RefundCall, RefundProvider, RefundResponse,
};
use crate::stripe::{interpret, listing, StripeClient};

#[derive(Deserialize)]
struct RefundBody {
    id: String,
    status: String,
    #[serde(default)]
    amount: i64,
    #[serde(default)]
    metadata: std::collections::HashMap<String, String>,
}

#[derive(Deserialize)]
struct RefundList {
    data: Vec<RefundBody>,
    #[serde(default)]
    has_more: bool,
}

impl StripeClient {
    /// The form body of a refund.
    pub fn refund_fields(call: &RefundCall) -> Vec<(String, String)> {
        let mut form = vec![
            ("payment_intent".to_owned(), call.payment_intent.clone()),
            ("amount".to_owned(), call.amount.to_string()),
            ("metadata[refund_id]".to_owned(), call.refund_id.clone()),
            ("metadata[payment_id]".to_owned(), call.payment_id.clone()),
        ];
        if let Some(r) = &call.reason {
            form.push(("reason".to_owned(), r.clone()));
        }
        form
    }
}

/// Maps a refund answer: the shapes are a payment's (an object with `id` and `status`, or
/// Stripe's error body), so the payment's classification applies.
fn interpret_refund(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
) -> Result<RefundResponse, ProviderError> {
    Ok(match interpret(status, headers, body)? {
        ProviderResponse::Charged {
            provider_payment_id,
            status,
            ..
        } => RefundResponse::Refunded {
            provider_refund_id: provider_payment_id,
            status,
        },
        ProviderResponse::NeedsAuthentication { .. } => RefundResponse::Rejected {
            code: "authentication_required".to_owned(),
            message: "the provider asked for the customer's authentication on a refund".to_owned(),
        },
        ProviderResponse::Declined { decline_code, .. } => RefundResponse::Rejected {
            code: decline_code.unwrap_or_else(|| "refund_declined".to_owned()),
            message: "the provider declined the refund".to_owned(),
        },
        ProviderResponse::Rejected { code, message } => RefundResponse::Rejected { code, message },
        ProviderResponse::KeyReused { message } => RefundResponse::KeyReused { message },
    })
}

fn interpret_list(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
) -> Result<Vec<FoundRefund>, ProviderError> {
    let list: RefundList = listing(status, headers, body, |l: &RefundList| l.has_more)?;
    Ok(list
        .data
        .into_iter()
        .map(|r| FoundRefund {
            refund_id: r.metadata.get("refund_id").cloned(),
            provider_refund_id: r.id,
            status: r.status,
            amount: r.amount,
        })
        .collect())
}

#[async_trait]
impl RefundProvider for StripeClient {
    fn request_timeout(&self) -> Duration {
        crate::provider::PaymentProvider::request_timeout(self)
    }

    async fn create_refund(&self, call: &RefundCall) -> Result<RefundResponse, ProviderError> {
        let (status, headers, body) = self
            .post_form(
                "/v1/refunds",
                &crate::domain::refund_key(&call.refund_id),
                &Self::refund_fields(call),
            )
            .await?;
        interpret_refund(status, &headers, &body)
    }

    async fn find_refunds(&self, payment_intent: &str) -> Result<Vec<FoundRefund>, ProviderError> {
        let (status, headers, body) = self
            .get(
                "/v1/refunds",
                &[("payment_intent", payment_intent), ("limit", "100")],
            )
            .await?;
        interpret_list(status, &headers, &body)
    }

    async fn payment_intents_of(&self, payment_id: &str) -> Result<Vec<String>, ProviderError> {
        // An id the processors refuse was never charged: nothing to search for.
        let Ok(id) = crate::domain::PaymentId::parse(payment_id) else {
            return Ok(Vec::new());
        };
        let query = crate::provider::PaymentQuery {
            payment_id: id,
            customer: None,
            created_from_s: None,
        };
        Ok(
            crate::provider::PaymentProvider::find_payments(self, &query)
                .await?
                .into_iter()
                .filter(|f| f.payment_id.as_deref() == Some(payment_id))
                .map(|f| f.provider_payment_id)
                .collect(),
        )
    }

    async fn payment_status(&self, payment_intent: &str) -> Result<Option<String>, ProviderError> {
        let now =
            crate::events::inbox::ProviderObjects::payment_intent(self, payment_intent).await?;
        Ok(Some(now.status).filter(|s| !s.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refund_answers_map_to_the_refund_contract() {
        let h = HeaderMap::new();
        assert_eq!(
            interpret_refund(
                StatusCode::OK,
                &h,
                r#"{"id":"re_1","object":"refund","status":"succeeded","amount":5}"#
            )
            .unwrap(),
            RefundResponse::Refunded {
                provider_refund_id: "re_1".into(),
                status: "succeeded".into()
            }
        );
        assert_eq!(
            interpret_refund(
                StatusCode::BAD_REQUEST,
                &h,
                r#"{"error":{"type":"invalid_request_error","code":"amount_too_large","message":"too much"}}"#
            )
            .unwrap(),
            RefundResponse::Rejected {
                code: "amount_too_large".into(),
                message: "too much".into()
            }
        );
        let e = interpret_refund(StatusCode::BAD_GATEWAY, &h, "").unwrap_err();
        assert!(e.is_ambiguous());
    }

    #[test]
    fn stripe_s_own_refund_parses() {
        let re = crate::stripe::client::tests::fixture("refund");
        assert_eq!(re["object"], "refund");
        let r = interpret_refund(StatusCode::OK, &HeaderMap::new(), &re.to_string()).unwrap();
        assert_eq!(
            r,
            RefundResponse::Refunded {
                provider_refund_id: re["id"].as_str().unwrap().into(),
                status: "succeeded".into()
            }
        );
        let mut mine = re.clone();
        mine["metadata"] = serde_json::json!({"refund_id": "rf-1", "payment_id": "p1"});
        let list = serde_json::json!({"object": "list", "url": "/v1/refunds", "has_more": false, "data": [mine]});
        let found = interpret_list(StatusCode::OK, &HeaderMap::new(), &list.to_string()).unwrap();
        assert_eq!(found[0].refund_id.as_deref(), Some("rf-1"));
        assert_eq!(found[0].amount, re["amount"].as_i64().unwrap());
    }

    #[test]
    fn a_listed_refund_names_its_refund_id() {
        let found = interpret_list(
            StatusCode::OK,
            &HeaderMap::new(),
            r#"{"object":"list","data":[{"id":"re_1","status":"succeeded","amount":7,"metadata":{"refund_id":"rf-1"}}],"has_more":false}"#,
        )
        .unwrap();
        assert_eq!(found[0].refund_id.as_deref(), Some("rf-1"));
        assert_eq!(found[0].amount, 7);
    }
}
