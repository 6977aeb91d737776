#!/usr/bin/env python3
"""The operations dashboard in the transformed template shows what `payctl health` shows:

- exactly one AWS::CloudWatch::Dashboard, whose body (an Fn::Sub of JSON) names only the
  stack's resources and pseudo parameters and parses as JSON once substituted;
- its metric widgets show charges, declines and requires_action (`Charged`, `Declined`,
  `RequiresAction`), the provider's errors and 429s (`ProviderErrors`, `ProviderRateLimited`),
  the depth of every dead-letter queue and the oldest message of every queue that has one;
- every custom metric it names is one the code publishes (its namespace and name appear in the
  Rust sources as EMF names), so a renamed metric cannot leave an empty graph, and names this
  stack (its Stack dimension), so another stack's in the account cannot mix in;
- its alarm widget lists every alarm of the stack.

Usage: dashboard.py TRANSFORMED_JSON REPO_ROOT; dashboard.py --self-test
"""
import json
import pathlib
import re
import sys

REQUIRED_CUSTOM = ["Charged", "Declined", "RequiresAction", "ProviderErrors", "ProviderRateLimited"]
SQS_METRICS = {"ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage"}


def published_names(root):
    """Quoted strings of the Rust sources: the EMF namespaces and metric names are among them."""
    names = set()
    for path in pathlib.Path(root).glob("*/src/**/*.rs"):
        names.update(re.findall(r'"([A-Za-z]+)"', path.read_text()))
    return names


def substituted(body, resources, parameters=()):
    """The body with each ${X} or ${X.Attr} replaced; the names that are neither the stack's
    resources nor its parameters."""
    unknown = []

    def one(match):
        name = match.group(1).split(".")[0]
        if not name.startswith("AWS::") and name not in resources and name not in parameters:
            unknown.append(match.group(1))
        return "x-" + match.group(1).replace(".", "-").replace("::", "-")

    return re.sub(r"\$\{([^}!]+)\}", one, body), unknown


def check(template, published):
    problems = []
    resources = template.get("Resources", {})
    dashboards = [r for r in resources.values() if r.get("Type") == "AWS::CloudWatch::Dashboard"]
    if len(dashboards) != 1:
        return [f"{len(dashboards)} dashboards in the template, not one"]
    body = dashboards[0]["Properties"].get("DashboardBody")
    variables = {}
    if isinstance(body, dict) and "Fn::Sub" in body:
        body = body["Fn::Sub"]
        if isinstance(body, list) and len(body) == 2 and isinstance(body[1], dict):
            body, variables = body
    if not isinstance(body, str):
        return ["the dashboard's body is not a string or an Fn::Sub of one"]
    # The Fn::Sub's own variables (one shape's widgets, resolved by shape.py) go in first.
    for name, value in variables.items():
        if isinstance(value, dict) and "Fn::Sub" in value:
            value = value["Fn::Sub"]
        if not isinstance(value, str):
            return [f"the dashboard's variable {name} is not a string (resolve the template's shape first)"]
        body = body.replace("${" + name + "}", value)
    text, unknown = substituted(body, resources, template.get("Parameters", {}))
    problems += [f"the dashboard names ${{{u}}}, which is not the stack's" for u in unknown]
    try:
        widgets = json.loads(text)["widgets"]
    except (ValueError, KeyError) as e:
        return problems + [f"the dashboard's body is not JSON with widgets: {e}"]
    metrics, alarms = [], set()
    for w in widgets:
        props = w.get("properties", {})
        if w.get("type") == "metric":
            metrics += [m for m in props.get("metrics", []) if isinstance(m, list) and len(m) >= 2]
        if w.get("type") == "alarm":
            alarms.update(props.get("alarms", []))
    names = {m[1] for m in metrics}
    for want in REQUIRED_CUSTOM:
        if want not in names:
            problems.append(f"the dashboard does not show {want}")
    for m in metrics:
        ns, name = m[0], m[1]
        if ns == "AWS/SQS":
            if name not in SQS_METRICS:
                problems.append(f"the dashboard shows AWS/SQS {name}, not a metric this check knows")
        elif not ns.startswith("AWS/") and (ns not in published or name not in published):
            problems.append(f"the dashboard shows {ns} {name}, which the code does not publish")
        if not ns.startswith("AWS/") and "x-AWS-StackName" not in dict(zip(m[2::2], m[3::2])).get("Stack", ""):
            problems.append(f"the dashboard shows {ns} {name} without the Stack dimension of this stack: another stack's would mix in")
    shown = {(m[1], m[3]) for m in metrics if m[0] == "AWS/SQS" and len(m) >= 4}
    dlqs, sources = set(), set()
    for name, r in resources.items():
        if r.get("Type") != "AWS::SQS::Queue":
            continue
        target = r.get("Properties", {}).get("RedrivePolicy", {}).get("deadLetterTargetArn", {})
        dlq = target.get("Fn::GetAtt", [None])[0] if isinstance(target, dict) else None
        if dlq:
            dlqs.add(dlq)
            sources.add(name)
    # Where EventBridge leaves what a rule cannot deliver is a dead-letter queue too.
    for r in resources.values():
        if r.get("Type") == "AWS::Events::Rule":
            for target in r.get("Properties", {}).get("Targets", []):
                arn = target.get("DeadLetterConfig", {}).get("Arn", {})
                if isinstance(arn, dict) and arn.get("Fn::GetAtt", [None])[0] in resources:
                    dlqs.add(arn["Fn::GetAtt"][0])
    for q in sorted(dlqs):
        if ("ApproximateNumberOfMessagesVisible", f"x-{q}-QueueName") not in shown:
            problems.append(f"the dashboard does not show the depth of the dead-letter queue {q}")
    for q in sorted(sources):
        if ("ApproximateAgeOfOldestMessage", f"x-{q}-QueueName") not in shown:
            problems.append(f"the dashboard does not show the oldest message of {q}")
    for name, r in resources.items():
        if r.get("Type") == "AWS::CloudWatch::Alarm" and f"x-{name}-Arn" not in alarms:
            problems.append(f"the dashboard's alarm widget does not list {name}")
    return problems


def self_test():
    published = {"PaymentProcessor", "Charged", "Declined", "RequiresAction", "Provider",
                 "ProviderErrors", "ProviderRateLimited"}
    body = json.dumps({"widgets": [
        {"type": "metric", "properties": {"metrics": [
            ["PaymentProcessor", "Charged", "Stack", "${AWS::StackName}"],
            ["PaymentProcessor", "Declined", "Stack", "${AWS::StackName}"],
            ["PaymentProcessor", "RequiresAction", "Stack", "${AWS::StackName}"],
            ["Provider", "ProviderErrors", "Stack", "${AWS::StackName}"],
            ["Provider", "ProviderRateLimited", "Stack", "${AWS::StackName}"],
            ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", "${Dlq.QueueName}"],
            ["AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", "${Q.QueueName}"]]}},
        {"type": "alarm", "properties": {"alarms": ["${A.Arn}"]}}]})
    good = {"Resources": {
        "Dlq": {"Type": "AWS::SQS::Queue"},
        "Q": {"Type": "AWS::SQS::Queue", "Properties": {"RedrivePolicy": {
            "deadLetterTargetArn": {"Fn::GetAtt": ["Dlq", "Arn"]}}}},
        "A": {"Type": "AWS::CloudWatch::Alarm"},
        "D": {"Type": "AWS::CloudWatch::Dashboard", "Properties": {"DashboardBody": {"Fn::Sub": body}}}}}
    assert check(good, published) == [], check(good, published)

    def variant(change):
        t = json.loads(json.dumps(good))
        change(t["Resources"])
        return check(t, published)

    def refused(change, want):
        problems = variant(change)
        assert any(want in p for p in problems), (want, problems)

    refused(lambda r: r.update({"B": {"Type": "AWS::CloudWatch::Alarm"}}), "does not list B")
    refused(lambda r: r["D"]["Properties"].update(
        {"DashboardBody": {"Fn::Sub": body.replace("Declined", "Declines")}}), "does not show Declined")
    refused(lambda r: r["D"]["Properties"].update(
        {"DashboardBody": {"Fn::Sub": body.replace("ProviderErrors", "ProviderFailures")}}),
        "Provider ProviderFailures, which the code does not publish")
    refused(lambda r: r["D"]["Properties"].update(
        {"DashboardBody": {"Fn::Sub": body.replace("${Q.QueueName}", "${Gone.QueueName}")}}), "${Gone.QueueName}")
    refused(lambda r: r.update({"Q2": {"Type": "AWS::SQS::Queue", "Properties": {"RedrivePolicy": {
        "deadLetterTargetArn": {"Fn::GetAtt": ["Dlq2", "Arn"]}}}}, "Dlq2": {"Type": "AWS::SQS::Queue"}}),
        "dead-letter queue Dlq2")
    refused(lambda r: r.pop("D"), "0 dashboards")
    refused(lambda r: r["D"]["Properties"].update({"DashboardBody": {"Fn::Sub": body.replace(
        '"Declined", "Stack", "${AWS::StackName}"', '"Declined"')}}), "Declined without the Stack dimension")
    # A shape's widgets as Fn::Sub variables: the alarm of that shape must be in them.
    split = body.replace('"${A.Arn}"', '${Alarms}')
    as_variables = lambda alarms: lambda r: r["D"]["Properties"].update(
        {"DashboardBody": {"Fn::Sub": [split, {"Alarms": alarms}]}})
    assert variant(as_variables({"Fn::Sub": '"${A.Arn}"'})) == [], variant(as_variables({"Fn::Sub": '"${A.Arn}"'}))
    refused(as_variables('"x"'), "does not list A")
    refused(lambda r: r.update({"EbDlq": {"Type": "AWS::SQS::Queue"}, "Rule": {"Type": "AWS::Events::Rule", "Properties": {
        "Targets": [{"DeadLetterConfig": {"Arn": {"Fn::GetAtt": ["EbDlq", "Arn"]}}}]}}}), "dead-letter queue EbDlq")
    print("dashboard.py self-test: 9 bad dashboards refused, the good ones pass")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    template = json.loads(pathlib.Path(sys.argv[1]).read_text())
    problems = check(template, published_names(sys.argv[2]))
    for p in problems:
        print(f"dashboard: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print("dashboard: every outcome, dead-letter queue, oldest age, provider error metric and alarm is shown")


if __name__ == "__main__":
    main()
