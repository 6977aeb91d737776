//! What the operator's tools show of a payment, whichever way it came in.

use crate::helpers::{payment, TestStack};

/// A payment sent to the queue itself (not through the API) exists for the API too: `GET`
/// answers from the processor's record, marked as come by the queue, with its amount and
/// currency once charged; a payment known nowhere is still `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_sent_to_the_queue_exists_for_the_api() {
    let t = TestStack::new("raw-get").await;
    let pid = t.pid("p1");
    t.send(&payment(&pid, 1234, "pm_card_visa")).await;
    t.drain(1).await;
    let (_server, client) = crate::api::served(&t).await;
    let answer = client.get(&pid).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let got = answer.json().unwrap();
    assert_eq!(got["status"], "succeeded", "{got}");
    assert_eq!(got["source"], "queue", "{got}");
    assert_eq!(got["amount"], 1234, "{got}");
    assert_eq!(got["currency"], "usd", "{got}");
    assert_eq!(client.get(&t.pid("never")).await.unwrap().status, 404);
}
