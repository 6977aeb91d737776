//! `payctl preflight` against the stand-in of a deployed stack that `connect`'s test uses: a
//! connected stack passes every check; each fault planted on its own (a test key where live is
//! asked, a restricted key without a permission the processors use, the endpoint disabled,
//! nobody on the alarm topic, a quota the reservations do not fit, a topic in another region)
//! exits 2 naming its check and its fix. The account's default version older than the pin is
//! said and is no fault.

use serde_json::{json, Value};

use crate::connect::{endpoints_at, sim_control, stripe, StandIn};

/// `payctl preflight` on the stand-in: the lines it printed that need fixing.
async fn preflight(s: &StandIn, stack: &str, extra: &[&str]) -> (i32, Vec<String>, String) {
    let mut args = vec!["preflight", "--stack-name", stack];
    args.extend_from_slice(extra);
    let (code, out) = s.payctl(&args).await;
    let fix = out
        .lines()
        .filter(|l| l.starts_with("FIX"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_owned())
        .collect();
    (code, fix, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_passes_a_connected_stack_and_names_each_planted_fault_with_its_fix() {
    let s = StandIn::new("preflight").await;
    let sns = aws_sdk_sns::Client::new(&s.sdk);
    let topic = sns
        .create_topic()
        .name(format!("{}-alarms", s.name))
        .send()
        .await
        .unwrap()
        .topic_arn()
        .unwrap()
        .to_owned();
    let subscription = sns
        .subscribe()
        .topic_arn(&topic)
        .protocol("email")
        .endpoint("oncall@example.com")
        .return_subscription_arn(true)
        .send()
        .await
        .unwrap()
        .subscription_arn()
        .unwrap()
        .to_owned();
    s.deploy(&s.name, &[], &[("AlarmNotificationTopicArn", &topic)])
        .await;
    let (code, out) = s.connect().await;
    assert_eq!(code, 0, "{out}");

    let (code, fix, out) = preflight(&s, &s.name, &[]).await;
    assert_eq!((code, fix.len()), (0, 0), "{out}");
    for check in [
        "region",
        "quota",
        "key",
        "permission",
        "version",
        "versions",
        "alarms",
        "events",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("ok") && l.split_whitespace().nth(1) == Some(check)),
            "{check}: {out}"
        );
    }
    assert!(out.contains("ready for traffic"), "{out}");

    // Each fault on its own: exit 2, the check named, its fix printed.
    let (code, fix, out) = preflight(&s, &s.name, &["--mode", "live"]).await;
    assert_eq!((code, fix), (2, vec!["key".to_owned()]), "{out}");
    assert!(out.contains("deploy live as its own stack"), "{out}");

    // A restricted key that may read refunds but not make them.
    let all: serde_json::Map<String, Value> = [
        "payment_intents",
        "charges",
        "disputes",
        "events",
        "webhook_endpoints",
    ]
    .iter()
    .map(|r| ((*r).to_owned(), json!("write")))
    .chain([("refunds".to_owned(), json!("read"))])
    .collect();
    sim_control(&s.sim, "/_sim/keys", json!({ "rk_test_narrow": all })).await;
    let put = |v: &'static str| {
        s.sm.put_secret_value()
            .secret_id(&s.key_arn)
            .secret_string(v)
            .send()
    };
    put("rk_test_narrow").await.unwrap();
    let (code, fix, out) = preflight(&s, &s.name, &[]).await;
    put("sk_test_local").await.unwrap();
    assert_eq!((code, fix), (2, vec!["permission".to_owned()]), "{out}");
    assert!(
        out.contains("refunds write: the key lacks it (403)"),
        "{out}"
    );
    assert!(out.contains("Write access to refunds"), "{out}");

    // The account's default version older than the pinned one: its newest event says so, and
    // it is no fault (the inbox reads what it applies at the pin); no upgrade is asked.
    sim_control(
        &s.sim,
        "/_sim/account",
        json!({"api_version": "2025-03-31.basil"}),
    )
    .await;
    let sim = &s.sim;
    let pay = |pid: &'static str| async move {
        let form = [
            ("amount", "1999"),
            ("currency", "usd"),
            ("customer", "cus_1"),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("off_session", "true"),
            ("metadata[payment_id]", pid),
        ];
        stripe(
            sim,
            reqwest::Method::POST,
            "/v1/payment_intents",
            &form,
            pid,
        )
        .await
    };
    pay("preflight-old").await;
    let (code, fix, out) = preflight(&s, &s.name, &[]).await;
    sim_control(
        &s.sim,
        "/_sim/account",
        json!({"api_version": payment_core::stripe::DEFAULT_API_VERSION}),
    )
    .await;
    pay("preflight-new").await;
    assert_eq!((code, fix.len()), (0, 0), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("ok")
            && l.contains("version")
            && l.contains("2025-03-31.basil")),
        "{out}"
    );
    assert!(!out.contains("upgrade the account"), "{out}");

    // The endpoint disabled at Stripe: named; connect mends it.
    let id = endpoints_at(&s.sim, &s.url).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    stripe(
        &s.sim,
        reqwest::Method::POST,
        &format!("/v1/webhook_endpoints/{id}"),
        &[("disabled", "true")],
        "disable",
    )
    .await;
    let (code, fix, out) = preflight(&s, &s.name, &[]).await;
    assert_eq!((code, fix), (2, vec!["events".to_owned()]), "{out}");
    assert!(
        out.contains("it is disabled") && out.contains("payctl connect --stack-name"),
        "{out}"
    );
    assert_eq!(s.connect().await.0, 0);
    assert_eq!(preflight(&s, &s.name, &[]).await.0, 0);

    // Nobody subscribed to the alarm topic.
    sns.unsubscribe()
        .subscription_arn(&subscription)
        .send()
        .await
        .unwrap();
    let (code, fix, out) = preflight(&s, &s.name, &[]).await;
    assert_eq!((code, fix), (2, vec!["alarms".to_owned()]), "{out}");
    assert!(out.contains("reaches no one"), "{out}");
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("email")
        .endpoint("oncall@example.com")
        .send()
        .await
        .unwrap();

    // A stack that reserves more than the account's quota leaves, with a topic in another
    // region.
    let other = format!("{}-q", s.name);
    s.deploy(
        &other,
        &[
            ("ReservedConcurrency", "200"),
            (
                "AlarmTopicArn",
                "arn:aws:sns:eu-west-1:000000000000:elsewhere",
            ),
        ],
        &[("AlarmNotificationTopicArn", &topic)],
    )
    .await;
    let (code, fix, out) = preflight(&s, &other, &[]).await;
    assert_eq!(
        (code, fix),
        (2, vec!["region".to_owned(), "quota".to_owned()]),
        "{out}"
    );
    assert!(
        out.contains("eu-west-1") && out.contains("L-B99A9384"),
        "{out}"
    );
}
