//! The command-line tools describe themselves: every command and option says what it is for,
//! the README's tables name every command, and each binary holds only its own room's commands.

use crate::helpers::{root, target_dir};

/// Every command and option of `payctl` and of the proving ground says what it is for in
/// `--help`, the README's command tables name every command, and `payctl` lists the operator's
/// commands only.
#[test]
fn every_payctl_option_is_described() {
    let operator: Vec<&str> = vec![
        "api serve",
        "conformance",
        "connect",
        "dlq list",
        "dlq redrive",
        "dlq show",
        "env",
        "events catch-up",
        "events checkpoint",
        "get",
        "health",
        "history",
        "outbox pending",
        "outbox republish",
        "pay",
        "preflight",
        "provision",
        "reconcile",
        "relay",
        "run",
        "send",
        "send-refund",
        "smoke",
        "status",
    ];
    let proving = vec![
        "bench",
        "chaos",
        "demo",
        "e2e-check",
        "stack-cost",
        "webhook-cost",
        "webhook-flood",
    ];
    for (bin, expected) in [("payctl", operator), ("proving", proving)] {
        let commands = described(bin);
        let mut names: Vec<String> = commands.iter().map(|p| p.join(" ")).collect();
        names.sort();
        assert_eq!(names, expected, "the commands of {bin}");
    }
}

/// The command paths of `bin`, each checked to describe every option, and named in the README.
fn described(bin: &str) -> Vec<Vec<String>> {
    let exe = target_dir().join("debug").join(bin);
    let help = |args: &[String]| {
        let out = std::process::Command::new(&exe)
            .args(args)
            .arg("--help")
            .output()
            .expect("running --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Every command path, subcommands included.
    let mut commands: Vec<Vec<String>> = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let text = help(&path);
        let listed: Vec<String> = text
            .split("Commands:\n")
            .nth(1)
            .map(|rest| {
                rest.lines()
                    .take_while(|l| !l.trim().is_empty())
                    .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                    .filter(|c| c != "help")
                    .collect()
            })
            .unwrap_or_default();
        if listed.is_empty() {
            commands.push(path);
        } else {
            todo.extend(listed.into_iter().map(|c| [path.clone(), vec![c]].concat()));
        }
    }
    let strip_brackets = |s: &str| {
        let mut out = String::new();
        let mut depth = 0;
        for c in s.chars() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ if depth == 0 => out.push(c),
                _ => {}
            }
        }
        out.trim().to_owned()
    };
    let mut undescribed = Vec::new();
    for path in &commands {
        let text = help(path);
        let mut current: Option<(String, String)> = None;
        let mut in_lists = false;
        let mut finish = |c: Option<(String, String)>| {
            if let Some((flag, desc)) = c {
                if strip_brackets(&desc).is_empty() {
                    undescribed.push(format!("{bin} {} {flag}", path.join(" ")));
                }
            }
        };
        for line in text.lines() {
            if line == "Options:" || line == "Arguments:" {
                in_lists = true;
                finish(current.take());
                continue;
            }
            if !in_lists {
                continue;
            }
            let is_item = line.starts_with("  -")
                || line.starts_with("      --")
                || line.starts_with("  <")
                || line.starts_with("  [");
            if is_item {
                finish(current.take());
                let body = line.trim();
                let (flag, desc) = match body.find("  ") {
                    Some(i) => (&body[..i], &body[i..]),
                    None => (body, ""),
                };
                current = Some((flag.to_owned(), desc.to_owned()));
            } else if let Some((_, desc)) = current.as_mut() {
                desc.push(' ');
                desc.push_str(line);
            }
        }
        finish(current.take());
    }
    assert!(
        undescribed.is_empty(),
        "options without a description: {undescribed:#?}"
    );
    // And the README's command table names every command.
    // The README and the docs/ pages it leads to.
    let mut readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    for page in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = page.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            readme += &std::fs::read_to_string(&path).expect("a docs/ page");
        }
    }
    let missing: Vec<String> = commands
        .iter()
        .map(|p| format!("`{bin} {}", p.join(" ")))
        .filter(|c| !readme.contains(c.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "commands the README does not document: {missing:?}"
    );
    commands
}
