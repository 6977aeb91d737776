#!/usr/bin/env python3
"""The alarms reach someone, cover the failures nothing else shows, and read this stack's own
metrics, checked on one shape of the transformed template (shape.py):

- every alarm notifies a topic (AlarmActions not empty in this shape: the operator's
  AlarmTopicArn, or the stack's own AlarmTopic), and a topic the stack makes is encrypted;
- an alarm fires on the provider refusing the key (`Provider` `ProviderAuthenticationFailures`:
  401 and 403 are a batch item's failure, which no function error alarm counts); on Lambda
  throttling each function of the shape (`AWS/Lambda` `Throttles` by its FunctionName); on
  DynamoDB throttling each table (`ReadThrottleEvents` and `WriteThrottleEvents`); on the
  catch-up's lag (`ProviderEvents` `CatchUpLagMinutes`);
- every metric an alarm reads from a namespace of the code's (not `AWS/`) is one the code
  publishes (its namespace and name are in the Rust sources) and carries the `Stack` dimension
  set to the stack's name; every function is given `STACK_NAME` = the stack's name, which the
  code puts on every metric line: two stacks in one account and region keep apart.

Usage: alarms.py SHAPE_JSON REPO_ROOT; alarms.py --self-test
"""
import json
import pathlib
import re
import sys

STACK = {"Ref": "AWS::StackName"}


def stack_var(root):
    """The variable the code reads the stack's name from (`STACK_VAR` of shared/src/telemetry/mod.rs)."""
    text = (pathlib.Path(root) / "shared/src/telemetry/mod.rs").read_text()
    found = re.search(r'pub const STACK_VAR: &str = "([A-Z_]+)";', text)
    return found.group(1) if found else None


def published_names(root):
    names = set()
    for path in pathlib.Path(root).glob("*/src/**/*.rs"):
        names.update(re.findall(r'"([A-Za-z]+)"', path.read_text()))
    return names


def metrics_of(alarm):
    """(namespace, name, {dimension: value}) of every metric an alarm reads."""
    p = alarm.get("Properties", {})
    out = []
    if "MetricName" in p:
        out.append((p.get("Namespace"), p["MetricName"], {d["Name"]: d["Value"] for d in p.get("Dimensions", [])}))
    for m in p.get("Metrics", []):
        metric = m.get("MetricStat", {}).get("Metric")
        if metric:
            out.append((metric.get("Namespace"), metric.get("MetricName"),
                        {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}))
    return out


def check(template, published, var="STACK_NAME"):
    problems = []
    resources = template.get("Resources", {})
    alarms = {n: r for n, r in resources.items() if r.get("Type") == "AWS::CloudWatch::Alarm"}
    functions = {n: r for n, r in resources.items() if r.get("Type") == "AWS::Lambda::Function"}
    tables = [n for n, r in resources.items() if r.get("Type") == "AWS::DynamoDB::Table"]
    for name, r in sorted(resources.items()):
        if r.get("Type") == "AWS::SNS::Topic" and not r.get("Properties", {}).get("KmsMasterKeyId"):
            problems.append(f"the alarm topic {name} is not encrypted")
    read = []
    for name, alarm in sorted(alarms.items()):
        if not alarm.get("Properties", {}).get("AlarmActions"):
            problems.append(f"{name} notifies no one (no AlarmActions in this shape)")
        for ns, metric, dims in metrics_of(alarm):
            read.append((ns, metric, dims))
            if ns and not ns.startswith("AWS/"):
                if ns not in published or metric not in published:
                    problems.append(f"{name} reads {ns} {metric}, which the code does not publish")
                if dims.get("Stack") != STACK:
                    problems.append(f"{name} reads {ns} {metric} without the Stack dimension of this stack: another stack's in the account would trip it")
    for name, f in sorted(functions.items()):
        env = f.get("Properties", {}).get("Environment", {}).get("Variables", {})
        if not var or env.get(var) != STACK:
            problems.append(f"{name} is not given {var} = the stack's name (the variable the code reads): its metrics would carry no Stack dimension")

    def watched(ns, metric, dim, value):
        return any(n == ns and m == metric and d.get(dim) == value for n, m, d in read)

    if not any(n == "Provider" and m == "ProviderAuthenticationFailures" for n, m, _ in read):
        problems.append("no alarm fires on the provider refusing the key (Provider ProviderAuthenticationFailures)")
    if not any(n == "ProviderEvents" and m == "CatchUpLagMinutes" for n, m, _ in read):
        problems.append("no alarm fires on the catch-up's lag (ProviderEvents CatchUpLagMinutes)")
    for name, f in sorted(functions.items()):
        fname = f.get("Properties", {}).get("FunctionName")
        if not watched("AWS/Lambda", "Throttles", "FunctionName", fname):
            problems.append(f"no alarm fires on Lambda throttling {name} (AWS/Lambda Throttles by its FunctionName)")
    for table in tables:
        for metric in ("ReadThrottleEvents", "WriteThrottleEvents"):
            if not watched("AWS/DynamoDB", metric, "TableName", {"Ref": table}):
                problems.append(f"no alarm fires on {metric} of {table}")
    return problems


def self_test():
    published = {"Provider", "ProviderAuthenticationFailures", "ProviderEvents", "CatchUpLagMinutes"}
    stack_dim = [{"Name": "Stack", "Value": STACK}]

    def stat(ns, metric, dims):
        return {"Id": metric.lower(), "MetricStat": {"Metric": {"Namespace": ns, "MetricName": metric, "Dimensions": dims}}}

    good = {"Resources": {
        "Fn": {"Type": "AWS::Lambda::Function", "Properties": {"FunctionName": {"Fn::Sub": "${AWS::StackName}-fn"},
                                                               "Environment": {"Variables": {"STACK_NAME": STACK}}}},
        "Table": {"Type": "AWS::DynamoDB::Table"},
        "Topic": {"Type": "AWS::SNS::Topic", "Properties": {"KmsMasterKeyId": {"Ref": "Key"}}},
        "Auth": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "Namespace": "Provider", "MetricName": "ProviderAuthenticationFailures", "Dimensions": stack_dim,
            "AlarmActions": [{"Ref": "Topic"}]}},
        "Lag": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "Namespace": "ProviderEvents", "MetricName": "CatchUpLagMinutes", "Dimensions": stack_dim,
            "AlarmActions": [{"Ref": "Topic"}]}},
        "Throttles": {"Type": "AWS::CloudWatch::Alarm", "Properties": {"AlarmActions": [{"Ref": "Topic"}], "Metrics": [
            {"Id": "sum", "Expression": "FILL(a, 0)"},
            stat("AWS/Lambda", "Throttles", [{"Name": "FunctionName", "Value": {"Fn::Sub": "${AWS::StackName}-fn"}}]),
            stat("AWS/DynamoDB", "ReadThrottleEvents", [{"Name": "TableName", "Value": {"Ref": "Table"}}]),
            stat("AWS/DynamoDB", "WriteThrottleEvents", [{"Name": "TableName", "Value": {"Ref": "Table"}}])]}}}}
    assert check(good, published) == [], check(good, published)

    def refused(change, want):
        t = json.loads(json.dumps(good))
        change(t["Resources"])
        problems = check(t, published)
        assert any(want in p for p in problems), (want, problems)

    refused(lambda r: r["Auth"]["Properties"].pop("AlarmActions"), "Auth notifies no one")
    refused(lambda r: r["Topic"]["Properties"].pop("KmsMasterKeyId"), "is not encrypted")
    refused(lambda r: r["Lag"]["Properties"].update(Dimensions=[{"Name": "Service", "Value": "event-processor"}]),
            "Lag reads ProviderEvents CatchUpLagMinutes without the Stack dimension")
    refused(lambda r: r["Lag"]["Properties"].update(MetricName="CatchUpLag"), "which the code does not publish")
    refused(lambda r: r.pop("Auth"), "refusing the key")
    refused(lambda r: r.pop("Lag"), "catch-up's lag")
    refused(lambda r: r["Fn"]["Properties"]["Environment"]["Variables"].pop("STACK_NAME"), "not given STACK_NAME")
    refused(lambda r: r.update(Other={"Type": "AWS::Lambda::Function", "Properties": {
        "FunctionName": "other", "Environment": {"Variables": {"STACK_NAME": STACK}}}}), "throttling Other")
    refused(lambda r: r["Throttles"]["Properties"]["Metrics"].pop(3), "WriteThrottleEvents of Table")
    assert any("not given STACK" in p for p in check(good, published, var="STACK"))  # the code reads another
    assert any("not given None" in p for p in check(good, published, var=None))  # the code's const is gone
    print("alarms self-test: 11 bad templates refused, the good one passes")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    found = check(json.load(open(sys.argv[1], encoding="utf-8")), published_names(sys.argv[2]), stack_var(sys.argv[2]))
    for p in found:
        print(f"alarms: {p}", file=sys.stderr)
    if found:
        sys.exit(1)
    print("alarms: each notifies a topic; the key, throttles and the catch-up's lag are watched; the code's metrics carry this stack's name")
