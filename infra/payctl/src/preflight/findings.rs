//! `payctl preflight`'s findings: what each check's readings mean, and what to do about them
//! (no I/O: each is decided from what was read, and tested on planted readings).
//!
//! Why ~500 lines: every check's finding and its fix are read side by side, and half the file
//! is their tests on planted readings.

use payment_core::stripe::permissions::Access;

use crate::deployed::Deployed;

/// One check's finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The check (`region`, `quota`, `key`, `permission`, `version`, `versions`, `alarms`,
    /// `events`).
    pub check: &'static str,
    /// Fine as it is.
    pub ok: bool,
    /// What was found.
    pub said: String,
    /// What to do (for a finding that is not ok).
    pub fix: Option<String>,
}

pub(crate) fn ok(check: &'static str, said: impl Into<String>) -> Finding {
    Finding {
        check,
        ok: true,
        said: said.into(),
        fix: None,
    }
}

pub(crate) fn bad(check: &'static str, said: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding {
        check,
        ok: false,
        said: said.into(),
        fix: Some(fix.into()),
    }
}

/// Lambda keeps this many concurrent executions unreserved in every account.
pub const UNRESERVED_FLOOR: i64 = 100;

/// What the stack reserves (its parameters as deployed): the three processors, the API and the
/// webhook receiver (when deployed), and the relay's 5.
pub fn reserved_by(stack: &Deployed) -> i64 {
    let n = |k: &str, d: i64| stack.param(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (webhook, _) = stack.delivery();
    3 * n("ReservedConcurrency", 20)
        + n("ApiReservedConcurrency", 20) * if webhook { 2 } else { 1 }
        + 5
}

/// The account's concurrency quota against what the stack reserves.
pub fn quota(limit: i64, reserved: i64) -> Finding {
    if reserved + UNRESERVED_FLOOR > limit {
        bad(
            "quota",
            format!("the account's concurrency quota is {limit}; the stack reserves {reserved} and Lambda keeps {UNRESERVED_FLOOR} unreserved"),
            format!("ask for at least {} (Service Quotas, Lambda, Concurrent executions, L-B99A9384), or lower ReservedConcurrency and ApiReservedConcurrency", reserved + UNRESERVED_FLOOR),
        )
    } else {
        ok(
            "quota",
            format!("concurrency quota {limit}: the stack reserves {reserved}, {} left beside Lambda's {UNRESERVED_FLOOR} unreserved", limit - reserved - UNRESERVED_FLOOR),
        )
    }
}

/// The key's mode from its prefix, against the mode wanted (`live`: `Some(true)`).
pub fn key_mode(key: &str, live: Option<bool>) -> Finding {
    let (mode, restricted) = match key.get(..8) {
        Some("sk_live_") => ("live", false),
        Some("rk_live_") => ("live", true),
        Some("sk_test_") => ("test", false),
        Some("rk_test_") => ("test", true),
        _ => ("unknown", false),
    };
    let kind = if restricted { "restricted" } else { "secret" };
    match (mode, live) {
        ("unknown", _) => bad(
            "key",
            "the provider key is neither a secret (sk_) nor a restricted (rk_) key",
            "put the account's secret or restricted key in the stack's PaymentApiKeySecretArn",
        ),
        ("test", Some(true)) => bad(
            "key",
            format!("a test-mode {kind} key: no live money moves"),
            "deploy live as its own stack with a live key (docs/deploy.md, Go live, step 6)",
        ),
        ("live", Some(false)) => bad(
            "key",
            format!("a live-mode {kind} key where test mode was asked for"),
            "give the test stack a test key",
        ),
        _ => ok("key", format!("a {mode}-mode {kind} key")),
    }
}

/// A probe's answer: `2xx` (a read) or `400` (a write refused for its empty form) shows the
/// permission; `403` its lack; `401` a key refused.
pub fn permission(resource: &str, access: Access, status: u16, body: &str) -> Finding {
    let what = format!(
        "{resource} {}",
        if access == Access::Write {
            "write"
        } else {
            "read"
        }
    );
    match status {
        200..=299 => ok("permission", what),
        // A write of an empty form is refused for its missing parameters once the key may
        // write; a read answers 400 only when the request itself is wrong (the version, say).
        400 if access == Access::Write => ok("permission", what),
        401 => bad(
            "permission",
            format!("{what}: the key is refused (401)"),
            "put a valid key in the stack's PaymentApiKeySecretArn",
        ),
        403 => bad(
            "permission",
            format!("{what}: the key lacks it (403)"),
            format!(
                "give the restricted key {} access to {resource} (Dashboard, API keys)",
                if access == Access::Write {
                    "Write"
                } else {
                    "Read"
                }
            ),
        ),
        other => bad(
            "permission",
            format!(
                "{what}: could not tell (HTTP {other}: {})",
                body.chars().take(160).collect::<String>()
            ),
            "run preflight again; if it stays, the answer above says why",
        ),
    }
}

/// The account's version (that of its newest event, rendered in the account's default
/// version when it was made) beside the pinned one. Never a fault: an event only names the
/// object the inbox reads, by id at the pinned version, before it applies anything
/// (`payment_core::provider::event`), so the account's default may be older or newer than the
/// pin, and no operator is asked to change it (it changes every other integration on the
/// account).
pub fn version(pinned: &str, account: Option<&str>) -> Finding {
    match account {
        Some(v) if v == pinned => ok("version", format!("the account's events are rendered in {v}, the pinned version")),
        Some(v) => ok("version", format!("the account's events are rendered in {v}; the stack reads every object it applies at its pinned {pinned}, so the account's default needs no change")),
        None => ok("version", format!("no event in the last 30 days; the stack reads every object it applies at its pinned {pinned}")),
    }
}

/// The alarm topic: who it reaches (confirmed subscriptions) and how many alarms notify it.
pub fn alarms(
    topic: &str,
    confirmed: usize,
    pending: usize,
    notifying: usize,
    alarms: usize,
) -> Finding {
    if confirmed == 0 {
        let why = if pending > 0 {
            format!("{pending} subscription(s) wait for confirmation")
        } else {
            "no one is subscribed".to_owned()
        };
        return bad(
            "alarms",
            format!("the alarm topic {topic} reaches no one: {why}"),
            "confirm the mail SNS sent, or subscribe (AlarmEmail, or aws sns subscribe)",
        );
    }
    if notifying < alarms {
        return bad(
            "alarms",
            format!("{notifying} of the stack's {alarms} alarms notify {topic}"),
            "deploy the stack again from this project's template",
        );
    }
    ok(
        "alarms",
        format!(
            "{alarms} alarms notify {topic}, which reaches {confirmed} confirmed subscription(s)"
        ),
    )
}

/// Whether the stack's secret-holding and topic ARNs are in the stack's region.
pub fn region(region: &str, arns: &[(&str, &str)]) -> Finding {
    let elsewhere: Vec<String> = arns
        .iter()
        .filter(|(_, arn)| arn.split(':').nth(3).is_some_and(|r| r != region))
        .map(|(what, arn)| format!("{what} {arn}"))
        .collect();
    if elsewhere.is_empty() {
        ok(
            "region",
            format!("{region}: the stack's secrets and topic are here"),
        )
    } else {
        bad(
            "region",
            format!("outside {region}: {}", elsewhere.join(", ")),
            "create them in the stack's region and deploy with their ARNs",
        )
    }
}

/// The findings as lines, each not-ok one with its fix.
pub fn render(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        out += &format!(
            "{:<4} {:<10} {}\n",
            if f.ok { "ok" } else { "FIX" },
            f.check,
            f.said
        );
        if let Some(fix) = &f.fix {
            out += &format!("     {:<10} -> {fix}\n", "");
        }
    }
    out
}

/// The alias every invoker of the stack's functions names (the template's AutoPublishAlias).
pub const LIVE_ALIAS: &str = "live";

/// One function's `live` alias as read, beside what the stack deployed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LiveVersion {
    pub name: String,
    /// The version `live` names (none: no alias).
    pub version: Option<String>,
    /// The version CodeDeploy is shifting `live` to, and its share of the invocations.
    pub shifting: Option<(String, f64)>,
    /// The version the stack's `AWS::Lambda::Version` published (none: not read).
    pub deployed: Option<String>,
    /// The settings in which `live` differs from the function's own configuration ($LATEST).
    pub differs: Vec<String>,
    /// Why the configurations could not be compared (an environment the caller may not
    /// decrypt is returned without its variables, which would compare as equal).
    pub unreadable: Option<String>,
}

/// The names of the settings whose values differ between two sorted lists (one missing on a
/// side differs too). Names only: an environment's values are not printed.
pub fn differences(latest: &[(String, String)], live: &[(String, String)]) -> Vec<String> {
    let mut names: Vec<String> = latest
        .iter()
        .filter(|kv| !live.contains(kv))
        .chain(live.iter().filter(|kv| !latest.contains(kv)))
        .map(|(k, _)| k.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether each function's `live` alias runs what the stack deployed: the version its
/// CloudFormation resource published, with the configuration the function holds. SAM
/// publishes when the code changes or a parameter its VersionDescription names does; a deploy
/// that changed only an unbounded one (the secrets' ARNs, PaymentApiUrl,
/// ProviderEventsPublicUrl) or a setting SAM does not follow updates the function and leaves
/// `live` behind until `ConfigRevision` is raised. An alias moved by hand (a quick rollback)
/// is what CloudFormation does not know: a later deploy's rollback would move it back.
pub fn live_versions_finding(functions: &[LiveVersion], revision: Option<i64>) -> Finding {
    if functions.is_empty() {
        return ok("versions", "the stack has no function");
    }
    let next = revision.map_or("a higher ConfigRevision".to_owned(), |r| {
        format!("ConfigRevision={}", r + 1)
    });
    let mut said = Vec::new();
    let mut fixes = Vec::new();
    for f in functions {
        let n = &f.name;
        let (what, fix) = match (&f.version, &f.shifting, &f.deployed) {
            (None, _, _) => (
                format!("{n} has no {LIVE_ALIAS} alias"),
                "deploy this release's template (it gives each function its alias)".to_owned(),
            ),
            (Some(_), _, _) if f.unreadable.is_some() => (
                format!("could not compare {n}'s {LIVE_ALIAS} configuration with the stack's: {}", f.unreadable.as_deref().unwrap_or_default()),
                "run preflight as a principal with kms:Decrypt on the stack's key (PaymentsKey; docs/deploy.md, Go live step 5)".to_owned(),
            ),
            (Some(v), Some((to, share)), _) => (
                format!("{n}'s {LIVE_ALIAS} alias is shifting from version {v} to {to} ({:.0} % on it)", share * 100.0),
                "let the CodeDeploy deployment finish (or stop it), then run preflight again".to_owned(),
            ),
            (Some(v), None, Some(d)) if d != v => (
                format!("{n}'s {LIVE_ALIAS} alias runs version {v}, the stack deployed {d}: moved outside CloudFormation, which a later deploy's rollback would undo"),
                format!("move it back (aws lambda update-alias --function-name {n} --name {LIVE_ALIAS} --function-version {d}), or keep version {v}'s release by deploying its build with {next} (a deploy of the same build and parameters publishes nothing)"),
            ),
            (Some(v), None, _) if f.differs.iter().any(|d| d == "CodeSha256") => (
                format!("{n}'s $LATEST holds other code than its {LIVE_ALIAS} version {v}: code was pushed outside CloudFormation, and the next version published (a deploy with a higher ConfigRevision included) would run it"),
                format!("put the release's code back before any deploy: aws lambda update-function-code --function-name {n} with the S3 location the stack names (aws cloudformation get-template --template-stage Processed), or deploy a build whose code differs"),
            ),
            (Some(v), None, _) if !f.differs.is_empty() => (
                format!("{n}'s {LIVE_ALIAS} alias runs version {v}, not the configuration the stack deployed (differing: {})", f.differs.join(", ")),
                format!("deploy again with {next}: every function is published and its alias moved"),
            ),
            _ => continue,
        };
        said.push(what);
        if !fixes.contains(&fix) {
            fixes.push(fix);
        }
    }
    if said.is_empty() {
        return ok(
            "versions",
            format!(
                "each of the {} functions' {LIVE_ALIAS} alias runs what the stack deployed",
                functions.len()
            ),
        );
    }
    bad("versions", said.join("; "), fixes.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_under_the_reservations_and_lambda_s_floor_is_named_with_what_to_ask_for() {
        let f = quota(200, 105);
        assert!(!f.ok);
        assert!(f.fix.unwrap().contains("at least 205"));
        assert!(quota(205, 105).ok);
        let stack = Deployed {
            parameters: [
                ("ReservedConcurrency".into(), "50".into()),
                ("ProviderEventsDelivery".into(), "eventbridge".into()),
            ]
            .into(),
            ..Default::default()
        };
        assert_eq!(reserved_by(&stack), 3 * 50 + 20 + 5);
    }

    #[test]
    fn the_key_s_mode_is_read_from_its_prefix_and_held_to_the_mode_asked() {
        assert!(key_mode("sk_live_abc", Some(true)).ok);
        assert!(!key_mode("rk_test_abc", Some(true)).ok);
        assert!(!key_mode("sk_live_abc", Some(false)).ok);
        assert!(key_mode("rk_test_abc", None).ok);
        assert!(!key_mode("pk_live_abc", None).ok);
        assert_eq!(
            key_mode("rk_live_x", None).said,
            "a live-mode restricted key"
        );
    }

    #[test]
    fn a_probe_s_answer_says_whether_the_key_has_the_permission() {
        assert!(permission("refunds", Access::Write, 400, "").ok);
        assert!(permission("events", Access::Read, 200, "").ok);
        let lacking = permission("refunds", Access::Write, 403, "");
        assert!(!lacking.ok && lacking.fix.unwrap().contains("Write access to refunds"));
        assert!(!permission("events", Access::Read, 401, "").ok);
        assert!(!permission("events", Access::Read, 500, "").ok);
        // An invalid version makes every request a 400: a read says so.
        assert!(!permission("events", Access::Read, 400, "").ok);
    }

    #[test]
    fn versions_topics_and_regions_are_named_when_off() {
        assert!(version("2026-10-28.endive", Some("2026-10-28.endive")).ok);
        // Older or newer than the pin, the account's default is said, never a fault.
        for account in ["2024-06-20", "2019-01-14", "2027-03-31.future"] {
            let f = version("2026-10-28.endive", Some(account));
            assert!(f.ok, "{account}");
            assert!(f.said.contains(account), "{}", f.said);
        }
        assert!(version("2026-10-28.endive", None).ok);
        assert!(!alarms("t", 0, 1, 29, 29).ok);
        assert!(!alarms("t", 1, 0, 28, 29).ok);
        assert!(alarms("t", 1, 0, 29, 29).ok);
        let arns = [(
            "WebhookSecretArn",
            "arn:aws:secretsmanager:us-east-1:1:secret:w",
        )];
        assert!(region("us-east-1", &arns).ok);
        assert!(!region("eu-west-1", &arns).ok);
    }

    #[test]
    fn a_live_alias_that_runs_other_than_what_the_stack_deployed_is_named_with_its_fix() {
        let kv = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let latest = [
            kv("PROVIDER_EVENTS_URL", "https://new"),
            kv("Timeout", "60"),
        ];
        let live = [
            kv("PROVIDER_EVENTS_URL", "https://old"),
            kv("Timeout", "60"),
        ];
        assert_eq!(differences(&latest, &live), ["PROVIDER_EVENTS_URL"]);
        assert!(differences(&latest, &latest).is_empty());
        assert_eq!(differences(&latest[..1], &[]), ["PROVIDER_EVENTS_URL"]);
        let f = |name: &str, version: Option<&str>, deployed: Option<&str>, differs: &[&str]| {
            LiveVersion {
                name: name.into(),
                version: version.map(str::to_owned),
                deployed: deployed.map(str::to_owned),
                differs: differs.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            }
        };
        let fine = f("s-relay", Some("3"), Some("3"), &[]);
        assert!(live_versions_finding(std::slice::from_ref(&fine), Some(0)).ok);
        // A parameter the version cannot follow: raise ConfigRevision.
        let behind = live_versions_finding(
            &[
                fine.clone(),
                f(
                    "s-event-processor",
                    Some("4"),
                    Some("4"),
                    &["PROVIDER_EVENTS_URL"],
                ),
            ],
            Some(2),
        );
        assert!(!behind.ok);
        assert!(behind.said.contains("s-event-processor's live alias runs version 4, not the configuration the stack deployed (differing: PROVIDER_EVENTS_URL)"));
        assert!(!behind.said.contains("s-relay"));
        assert!(behind
            .fix
            .unwrap()
            .contains("deploy again with ConfigRevision=3"));
        // Moved by hand: CloudFormation's version is another.
        let moved = live_versions_finding(
            &[f("s-payment-processor", Some("5"), Some("7"), &[])],
            Some(0),
        );
        assert!(!moved.ok && moved.said.contains("runs version 5, the stack deployed 7"));
        assert!(moved.fix.unwrap().starts_with("move it back (aws lambda update-alias --function-name s-payment-processor --name live --function-version 7), or keep version 5's release by deploying its build with ConfigRevision=1"));
        // Code pushed to $LATEST by hand: raising ConfigRevision would publish it.
        let pushed = live_versions_finding(
            &[f(
                "s-refund-processor",
                Some("6"),
                Some("6"),
                &["CodeSha256", "Timeout"],
            )],
            Some(0),
        );
        assert!(
            !pushed.ok
                && pushed
                    .said
                    .contains("code was pushed outside CloudFormation")
        );
        let fix = pushed.fix.unwrap();
        assert!(
            fix.contains("update-function-code --function-name s-refund-processor")
                && !fix.contains("deploy again with")
        );
        // An environment the caller may not decrypt compares as empty on both sides: not fine.
        let unread = LiveVersion {
            unreadable: Some("KMSAccessDeniedException: not authorized".into()),
            ..fine.clone()
        };
        let unread = live_versions_finding(&[unread], Some(0));
        assert!(
            !unread.ok
                && unread
                    .said
                    .contains("could not compare s-relay's live configuration"),
            "{}",
            unread.said
        );
        assert!(unread.fix.unwrap().contains("kms:Decrypt"));
        // No alias; a shift in progress.
        assert!(live_versions_finding(&[f("s-api", None, None, &[])], None)
            .said
            .contains("has no live alias"));
        let shifting = LiveVersion {
            shifting: Some(("8".into(), 0.1)),
            ..f("s-api", Some("7"), Some("8"), &["CodeSha256"])
        };
        let during = live_versions_finding(&[shifting], Some(0));
        assert!(
            during
                .said
                .contains("shifting from version 7 to 8 (10 % on it)"),
            "{}",
            during.said
        );
        assert!(during
            .fix
            .unwrap()
            .starts_with("let the CodeDeploy deployment finish"));
    }
}
