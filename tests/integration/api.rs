//! The payments API, its outbox (each payment row, through the table's stream) and the relay,
//! against the local AWS endpoint and the provider simulator: the failure tests of the API.
//! Each test serves the API and relays the stream of its own stack (provisioned from
//! `template.yaml`, the payments table and its stream included); processes are killed where a
//! crash is the subject.
//!
//! Why one file of ~600 lines: the payments API's path (API, table, stream, relay, queue,
//! processor) tested end to end on one harness.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use lambda_local::http::LocalHttp;
use lambda_local::stream::StreamMapping;
use payctl::client::{Answer, ApiClient};
use payment_core::api::PaymentsApi;
use payment_core::edges::config::{ApiConfig, RelayConfig};

use crate::helpers::*;
use crate::proxy::AnswerDroppingProxy;

const BODY: &str =
    r#"{"amount":2500,"currency":"usd","customer_id":"cus_api","payment_method":"pm_card_visa"}"#;

pub(crate) fn api_config(t: &TestStack) -> ApiConfig {
    ApiConfig::from_lookup(|k| {
        t.stack
            .var_of("PaymentsApiFunction", k)
            .ok()
            .map(str::to_owned)
    })
    .expect("the API's configuration from the template")
}

pub(crate) fn relay_config(t: &TestStack) -> RelayConfig {
    RelayConfig::from_lookup(|k| {
        t.stack
            .var_of("OutboxRelayFunction", k)
            .ok()
            .map(str::to_owned)
    })
    .expect("the relay's configuration from the template")
}

async fn serve(t: &TestStack, ddb: aws_sdk_dynamodb::Client) -> LocalHttp {
    let api: PaymentsApi = payment_core::edges::bootstrap::build_api(&api_config(t), ddb);
    payctl::api::serve(Arc::new(api), None, "127.0.0.1:0")
        .await
        .expect("serving the API")
}

pub(crate) async fn relay(t: &TestStack) -> StreamMapping {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let relay = payment_core::edges::bootstrap::build_relay(&relay_config(t), &sdk);
    payctl::relay::start(&sdk, t.stack.payments_table().unwrap(), Arc::new(relay))
        .await
        .expect("relaying the outbox stream")
}

pub(crate) async fn client(url: &str) -> ApiClient {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    ApiClient::new(url, &sdk).expect("API client")
}

/// The stack's API served in this process, and a signing client for it.
pub(crate) async fn served(t: &TestStack) -> (LocalHttp, ApiClient) {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let server = serve(t, aws_sdk_dynamodb::Client::new(&sdk)).await;
    let c = client(server.url()).await;
    (server, c)
}

/// The stack's API whose DynamoDB calls go through `proxy`, and a signing client for it.
async fn served_through(t: &TestStack, proxy: &AnswerDroppingProxy) -> (LocalHttp, ApiClient) {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let through_proxy = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(&proxy.url)
            .build(),
    );
    let server = serve(t, through_proxy).await;
    let c = client(server.url()).await;
    (server, c)
}

/// Relays the outbox until `n` messages are on the queue, then drains it.
async fn relay_and_drain(t: &TestStack, n: u64) -> lambda_local::esm::EsmStats {
    let mapping = relay(t).await;
    relayed(&mapping, n).await;
    t.drain(1).await
}

/// Waits until the relay has put `n` messages on the queue.
pub(crate) async fn relayed(mapping: &StreamMapping, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while mapping
        .stats
        .handled
        .load(std::sync::atomic::Ordering::Relaxed)
        < n
    {
        assert!(
            Instant::now() < deadline,
            "the relay did not publish {n} messages"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Items of the payments table: each must be a payment row with its outbox fields (the
/// message, `created_at`), the only kind of item the API writes.
pub(crate) async fn rows(t: &TestStack) -> usize {
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let out = aws_sdk_dynamodb::Client::new(&sdk)
        .scan()
        .table_name(t.stack.payments_table().unwrap())
        .consistent_read(true)
        .send()
        .await
        .expect("scanning the payments table");
    for i in out.items() {
        let kind = i.get("kind").and_then(|v| v.as_s().ok());
        assert_eq!(kind.map(String::as_str), Some("payment"), "{i:?}");
        assert!(
            i.contains_key("message") && i.contains_key("created_at"),
            "a row without its outbox fields: {i:?}"
        );
    }
    out.items().len()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `payctl relay` of the stack's outbox as its own process, with `failpoints`, its stderr to
/// `stderr`.
pub(crate) fn relay_process(
    t: &TestStack,
    failpoints: &str,
    stderr: std::process::Stdio,
) -> tokio::process::Command {
    let config = relay_config(t);
    let mut cmd = tokio::process::Command::new(bin("payctl"));
    cmd.args([
        "relay",
        "--table",
        t.stack.payments_table().unwrap(),
        "--queue-url",
        &config.queue_url,
    ])
    .env("FAILPOINTS", failpoints)
    .kill_on_drop(true)
    .stdout(std::process::Stdio::null())
    .stderr(stderr);
    cmd
}

/// `payctl api serve` as its own process (so that a failpoint can kill it).
async fn api_process(t: &TestStack, port: u16, failpoints: Option<&str>) -> tokio::process::Child {
    api_process_with(t, port, failpoints, std::process::Stdio::null()).await
}

/// `payctl api serve` as its own process, its stderr to `stderr`.
pub(crate) async fn api_process_with(
    t: &TestStack,
    port: u16,
    failpoints: Option<&str>,
    stderr: std::process::Stdio,
) -> tokio::process::Child {
    let config = api_config(t);
    let mut cmd = tokio::process::Command::new(bin("payctl"));
    cmd.args(["api", "serve", "--address", &format!("127.0.0.1:{port}")])
        .env("PAYMENTS_TABLE", &config.payments_table)
        .env("IDEMPOTENCY_TABLE", &config.idempotency_table)
        .env_remove("FAILPOINTS")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    if let Some(f) = failpoints {
        cmd.env("FAILPOINTS", f);
    }
    let child = cmd.spawn().expect("starting payctl api serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "payctl api serve did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child
}

/// 50 concurrent POSTs with one key: one payment row (its own outbox entry), every answer the
/// same bytes (one creation, 49 replays), and one charge once relayed and processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_fifty_concurrent_posts_with_one_key_make_one_payment() {
    let t = TestStack::new("api-fifty").await;
    let (_server, c) = served(&t).await;
    let key = t.pid("p1");
    let answers: Vec<Answer> = join_all((0..50).map(|_| c.create(&key, BODY)))
        .await
        .into_iter()
        .map(|a| a.expect("an answer"))
        .collect();
    assert!(answers.iter().all(|a| a.status == 202), "{answers:?}");
    assert_eq!(
        answers.iter().filter(|a| !a.replayed).count(),
        1,
        "one creation"
    );
    assert!(
        answers.iter().all(|a| a.body == answers[0].body),
        "identical bodies"
    );
    assert_eq!(rows(&t).await, 1);

    relay_and_drain(&t, 1).await;
    assert_charged_once(&t, &key).await;
    let got = c.get(&key).await.unwrap().json().unwrap();
    assert_eq!(got["status"], "succeeded");
    assert_eq!(got["amount"], 2500);
    assert_eq!(t.record(&key).await.unwrap().attempts, 1);
}

/// The API killed between its write and its answer: the client sees a broken connection,
/// retries with the same key against the restarted API, gets the stored answer, and the
/// payment is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_killed_after_the_write_a_retry_gets_the_same_payment() {
    let t = TestStack::new("api-killed").await;
    let port = free_port();
    let mut crashing = api_process(&t, port, Some("api_after_write=return")).await;
    let c = client(&format!("http://127.0.0.1:{port}")).await;
    let key = t.pid("p1");
    assert!(
        c.create(&key, BODY).await.is_err(),
        "the API died before answering"
    );
    let status = crashing.wait().await.expect("the crashed API's exit");
    assert!(!status.success(), "killed at the failpoint: {status:?}");
    assert_eq!(rows(&t).await, 1, "the write committed");

    let _restarted = api_process(&t, port, None).await;
    let retry = c.create(&key, BODY).await.expect("the retry's answer");
    assert_eq!(retry.status, 202, "{}", retry.body);
    assert!(retry.replayed, "the stored answer");
    assert_eq!(retry.json().unwrap()["id"], key.as_str());
    relay_and_drain(&t, 1).await;
    assert_charged_once(&t, &key).await;
    assert_eq!(rows(&t).await, 1);
}

/// The relay killed after `SendMessageBatch` and before the stream's checkpoint: the restarted
/// relay sends the message again; the processor charges once and absorbs the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_after_sending_sends_again_and_the_payment_is_charged_once() {
    let t = TestStack::new("relay-killed").await;
    let (_server, c) = served(&t).await;
    let key = t.pid("p1");
    assert_eq!(c.create(&key, BODY).await.unwrap().status, 202);

    let status = relay_process(&t, "relay_after_send=return", std::process::Stdio::null()).status();
    let status = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("the relay crashed at its failpoint within 30 s")
        .expect("running payctl relay");
    assert!(!status.success(), "killed after sending: {status:?}");
    assert_eq!(t.depth().await, 1, "the message was sent before the crash");

    let mapping = relay(&t).await;
    relayed(&mapping, 1).await;
    assert_eq!(
        t.depth().await,
        2,
        "sent again: the stream's checkpoint never moved past it"
    );
    let stats = t.drain(1).await;
    assert_charged_once(&t, &key).await;
    assert_eq!(stats.summary.done("charged"), 1);
    assert_eq!(
        stats.summary.duplicates, 1,
        "the copy is absorbed by the record"
    );
    assert_eq!(
        c.get(&key).await.unwrap().json().unwrap()["status"],
        "succeeded"
    );
}

/// The table refusing the write: the client gets a 5xx, nothing is stored (no row, so nothing
/// for the relay either; GET is 404), and the retry with the same key creates the payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_a_5xx_stores_nothing_and_the_retry_works() {
    let t = TestStack::new("api-refused").await;
    let key = t.pid("p1");
    let upstream = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let proxy =
        AnswerDroppingProxy::start_refusing(&upstream, "DynamoDB_20120810.PutItem", &key).await;
    let (_server, c) = served_through(&t, &proxy).await;
    let refused = c.create(&key, BODY).await.unwrap();
    assert_eq!(refused.status, 500, "{}", refused.body);
    assert_eq!(refused.json().unwrap()["error"]["type"], "api_error");
    assert!(proxy.matching() >= 1);
    assert_eq!(c.get(&key).await.unwrap().status, 404, "nothing stored");
    assert_eq!(rows(&t).await, 0);

    proxy.refuse(false);
    let created = c.create(&key, BODY).await.unwrap();
    assert_eq!(created.status, 202, "{}", created.body);
    assert!(!created.replayed, "created by the retry, not replayed");
    relay_and_drain(&t, 1).await;
    assert_charged_once(&t, &key).await;
}

/// The write's answer lost on the way back: the SDK retries it, the retry's condition meets the
/// committed row, and the client's first request already gets the payment (the same bytes a
/// later retry gets); the relay publishes the one row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_answer_is_answered_with_the_stored_payment() {
    let t = TestStack::new("api-lost").await;
    let key = t.pid("p1");
    let upstream = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let proxy = AnswerDroppingProxy::start(&upstream, "DynamoDB_20120810.PutItem", &key).await;
    let (_server, c) = served_through(&t, &proxy).await;
    let first = c.create(&key, BODY).await.unwrap();
    assert_eq!(proxy.dropped(), 1, "the write's answer was dropped");
    assert_eq!(first.status, 202, "{}", first.body);
    let again = c.create(&key, BODY).await.unwrap();
    assert_eq!(again.body, first.body);
    assert!(again.replayed);
    assert_eq!(rows(&t).await, 1);
    let stats = relay_and_drain(&t, 1).await;
    assert_eq!(stats.received, 1, "one message for one stored row");
    assert_charged_once(&t, &key).await;
}

/// A payment the provider refused reads back `failed` with the code of its dead letter; a
/// payment the processor gave up on (provider down through every delivery of a queue with
/// `maxReceiveCount` 2) reads back `dead_lettered` with its code and reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_dead_lettered_payments_read_back_with_their_error_code() {
    let t = TestStack::build("api-dead", fast_settings(), false, 2).await;
    let (_server, c) = served(&t).await;
    let refused = t.pid("refused");
    let stuck = t.pid("stuck");
    t.fault(&stuck, "down", None, 0).await;
    let rejected_body = BODY.replace("pm_card_visa", "pm_card_invalid");
    assert_eq!(
        c.create(&refused, &rejected_body).await.unwrap().status,
        202
    );
    assert_eq!(c.create(&stuck, BODY).await.unwrap().status, 202);
    assert_eq!(
        c.get(&stuck).await.unwrap().json().unwrap()["status"],
        "pending"
    );
    relay_and_drain(&t, 2).await;
    let got = c.get(&refused).await.unwrap().json().unwrap();
    assert_eq!(got["status"], "failed", "{got}");
    assert_eq!(got["error_code"], "provider_rejected");
    let got = c.get(&stuck).await.unwrap().json().unwrap();
    assert_eq!(got["status"], "dead_lettered", "{got}");
    assert_eq!(got["error_code"], "retries_exhausted");
    assert!(
        got["error_message"]
            .as_str()
            .unwrap_or_default()
            .contains("503"),
        "the last error: {got}"
    );
    assert_eq!(t.dead_letters().await.len(), 2);
    assert_eq!(t.charges(&stuck).await, 0);
    t.sim.clear_faults_for(&stuck).await.unwrap();
}

/// Rows the relay never published (its event source gave up) are found by `payctl outbox
/// pending`, without any mark, as payments the processor has never seen, and sent by `payctl
/// outbox republish`; once the processor has seen it, the payment is pending no more, and it
/// is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_processor_never_saw_are_republished() {
    let t = TestStack::new("republish").await;
    let (_server, c) = served(&t).await;
    let key = t.pid("p1");
    assert_eq!(c.create(&key, BODY).await.unwrap().status, 202);
    let config = relay_config(&t);
    let payctl = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bin("payctl"));
        cmd.args(["outbox"])
            .args(args)
            .args(["--table", t.stack.payments_table().unwrap()])
            .args(["--records-table", &api_config(&t).idempotency_table]);
        let out = cmd.output().expect("running payctl outbox");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // By default a young entry is left to the live relay, and the listing says so.
    let young = payctl(&["pending"]);
    assert!(
        young.contains("0 payments older than 60 s")
            && young.contains("that the processor has never seen")
            && young.contains("1 younger than 60 s left to the live relay (--older-than 0"),
        "{young}"
    );
    let pending = payctl(&["pending", "--older-than", "0"]);
    assert!(pending.contains(&key), "{pending}");
    assert!(pending.contains("\n1 payments older than 0 s"), "{pending}");
    assert!(
        pending.contains("\tcreated 20") && pending.contains("Z ("),
        "UTC times: {pending}"
    );
    let sent = payctl(&[
        "republish",
        "--queue-url",
        &config.queue_url,
        "--older-than",
        "0",
    ]);
    assert!(sent.contains("republished 1 of 1"), "{sent}");
    assert_eq!(t.depth().await, 1);
    t.drain(1).await;
    assert_charged_once(&t, &key).await;
    let again = payctl(&[
        "republish",
        "--queue-url",
        &config.queue_url,
        "--older-than",
        "0",
    ]);
    assert!(again.contains("republished 0 of 0"), "seen now: {again}");
    assert_eq!(t.depth().await, 0);
}

/// On a FIFO payments queue the relay sets MessageDeduplicationId = payment_id and groups by
/// customer: one customer's payments in acceptance order, in one group. A payment id longer
/// than the 128 characters SQS takes for the id (ids may have 255) is sent as its SHA-256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_gets_customer_groups_and_payment_dedup_ids() {
    let t = TestStack::fifo("api-fifo").await;
    let (_server, c) = served(&t).await;
    let mut keys: Vec<String> = (0..3).map(|i| t.pid(&format!("p{i}"))).collect();
    let long = format!("{}-{}", t.pid("long"), "x".repeat(255));
    keys.push(long[..255].to_owned());
    for k in &keys {
        assert_eq!(c.create(k, BODY).await.unwrap().status, 202);
    }
    let mapping = relay(&t).await;
    relayed(&mapping, 4).await;
    drop(mapping);
    let records = t.receive_records(4).await;
    let seen: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            let body: serde_json::Value =
                serde_json::from_str(r.body.as_deref().unwrap_or("{}")).unwrap();
            (
                body["payment_id"].as_str().unwrap_or_default().to_owned(),
                r.attributes
                    .get("MessageGroupId")
                    .cloned()
                    .unwrap_or_default(),
                r.attributes
                    .get("MessageDeduplicationId")
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect();
    let ids: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        ids,
        keys.iter().map(String::as_str).collect::<Vec<_>>(),
        "in order"
    );
    for (id, group, dedup) in &seen[..3] {
        assert_eq!(group, "cus_api");
        assert_eq!(dedup, id);
    }
    let (_, group, dedup) = &seen[3];
    assert_eq!(group, "cus_api");
    assert_eq!(dedup, &sqs_once::queue::fifo_id(&keys[3]));
    assert_eq!(dedup.len(), 64);
    let response = t.invoke(records).await;
    assert!(response.batch_item_failures.is_empty());
    for k in &keys {
        assert_charged_once(&t, k).await;
    }
}

/// `payctl pay` and `payctl get` sign their requests (an unsigned request is refused), print
/// the API's answer, and say when an answer was a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payctl_pay_and_get_sign_their_requests() {
    let t = TestStack::new("api-cli").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let server = serve(&t, aws_sdk_dynamodb::Client::new(&sdk)).await;
    let unsigned = reqwest::Client::new()
        .post(format!("{}/v1/payments", server.url()))
        .header("idempotency-key", t.pid("unsigned"))
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        unsigned.status().as_u16(),
        403,
        "no SigV4 Authorization header"
    );
    let key = t.pid("cli");
    let payctl = |args: &[&str]| {
        let out = std::process::Command::new(bin("payctl"))
            .args(args)
            .args(["--api-url", server.url()])
            .output()
            .expect("running payctl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let pay = [
        "pay",
        "--amount",
        "1999",
        "--currency",
        "usd",
        "--customer",
        "cus_cli",
        "--idempotency-key",
        &key,
    ];
    let (ok, first, _) = payctl(&pay);
    assert!(ok, "{first}");
    assert!(first.contains("\"status\": \"pending\""), "{first}");
    let (ok, again, note) = payctl(&pay);
    assert!(ok);
    assert_eq!(again, first, "the same answer");
    assert!(note.contains("replayed"), "{note}");
    let (ok, got, _) = payctl(&["get", &key]);
    assert!(ok, "{got}");
    assert!(got.contains(&format!("\"id\": \"{key}\"")), "{got}");
    let (ok, _, err) = payctl(&["get", &t.pid("missing")]);
    assert!(!ok, "a 404 is an error");
    assert!(err.contains("404"), "{err}");
    let (ok, _, err) = payctl(&[
        "pay",
        "--amount",
        "0",
        "--currency",
        "usd",
        "--customer",
        "cus_cli",
    ]);
    assert!(!ok);
    assert!(err.contains("400"), "{err}");
}

/// The whole path under AWS faults: the API, the relay and the processor reach DynamoDB and SQS
/// through a proxy that throttles, answers `500`, stalls and loses answers of calls that took
/// effect (a fifth of all calls). A client retries a `5xx` with the same key, as the README
/// says. Every payment is charged exactly once and reads back `succeeded`; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_aws_faults_the_api_the_relay_and_the_processor_charge_each_payment_once() {
    let t = TestStack::new("aws-faults").await;
    let sdk = payment_core::edges::bootstrap::sdk_config().await;
    let proxy = proving::aws_faults::FaultProxy::start(&required_env("AWS_ENDPOINT_URL"), 0.2, 5)
        .await
        .expect("the fault proxy");
    let ddb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(&proxy.url)
            .build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&sdk)
            .endpoint_url(&proxy.url)
            .build(),
    );
    let server = serve(&t, ddb.clone()).await;
    let c = client(server.url()).await;
    let rc = relay_config(&t);
    let relay =
        payment_core::payments::outbox::Relay::new(sqs.clone(), rc.queue_url.clone(), rc.group_by);
    let mapping = payctl::relay::start(&sdk, t.stack.payments_table().unwrap(), Arc::new(relay))
        .await
        .expect("relaying the outbox stream");
    let keys: Vec<String> = (0..20).map(|i| t.pid(&format!("p{i:02}"))).collect();
    for key in &keys {
        let mut tries = 0;
        loop {
            tries += 1;
            match c.create(key, BODY).await {
                Ok(a) if a.status == 202 => break,
                Ok(a) if a.status >= 500 => {}
                Ok(a) => panic!("POST {key}: {} {}", a.status, a.body),
                Err(_) => {}
            }
            assert!(tries < 20, "POST {key} never accepted");
        }
    }
    relayed(&mapping, keys.len() as u64).await;
    let mut config = t.config.clone();
    config.source_queue_url = None;
    let processor = payment_core::edges::bootstrap::build_processor_with(&config, &sdk, ddb, sqs)
        .await
        .expect("the processor");
    lambda_local::esm::run(processor, t.sqs.clone(), t.esm_options(2))
        .await
        .expect("draining the queue");
    for key in &keys {
        assert_charged_once(&t, key).await;
    }
    assert!(t.dead_letters().await.is_empty());
    for key in &keys {
        let mut status = String::new();
        for _ in 0..20 {
            if let Ok(a) = c.get(key).await {
                if a.status == 200 {
                    status = a.json().unwrap()["status"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned();
                    break;
                }
            }
        }
        assert_eq!(status, "succeeded", "{key}");
    }
    println!("{}", proxy.counts.summary());
    assert!(
        proxy.counts.total() > 10,
        "faults were injected: {}",
        proxy.counts.summary()
    );
}
