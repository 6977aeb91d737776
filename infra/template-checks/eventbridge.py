#!/usr/bin/env python3
"""How the provider's events arrive, checked on one shape of the transformed template (shape.py):

- webhook: no event bus and no rule on one;
- eventbridge: no public route, no function holding the webhook's signing secret, and nothing
  that names WebhookSecretArn;
- eventbridge or both: one bus on the partner event source StripeEventSourceName; one rule on
  it whose pattern names that source alone and exactly the event types the inbox applies (the
  `EVENT_TYPES` of shared/src/events/catch_up.rs); its one target the queue the event processor
  reads, with a retry policy and a dead-letter queue that an alarm watches; EventBridge may send
  to the queue and to that DLQ only as that rule (aws:SourceArn), and may use their KMS key only
  as that rule.

Usage: eventbridge.py SHAPE_JSON REPO_ROOT DELIVERY; eventbridge.py --self-test
"""
import json
import pathlib
import re
import sys

SERVICE = "events.amazonaws.com"


def event_types(root):
    text = (pathlib.Path(root) / "shared/src/events/catch_up.rs").read_text()
    block = re.search(r"pub const EVENT_TYPES: &\[&str\] = &\[(.*?)\];", text, flags=re.S)
    return re.findall(r'"([^"]+)"', block.group(1)) if block else []


def of_type(resources, kind):
    return {k: r for k, r in resources.items() if r.get("Type") == kind}


def refers(value, name):
    """Whether a value is Ref/GetAtt/Sub of `name` (a parameter or a resource)."""
    text = json.dumps(value)
    return (f'{{"Ref": "{name}"}}' in text or f'["{name}",' in text or f'"{name}.' in text
            or "${" + name + "}" in text or "${" + name + "." in text)


def grants(resources, queue, rule):
    """(conditioned, unconditioned) Allow statements to EventBridge on `queue` in its policies."""
    good, bad = [], []
    for r in of_type(resources, "AWS::SQS::QueuePolicy").values():
        props = r.get("Properties", {})
        for st in props.get("PolicyDocument", {}).get("Statement", []):
            principal = json.dumps(st.get("Principal", ""))
            if st.get("Effect") != "Allow" or SERVICE not in principal or not refers(st.get("Resource"), queue):
                continue
            arn = st.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn")
            (good if arn is not None and refers(arn, rule) else bad).append(st)
    return good, bad


def check(template, types, delivery):
    problems = []
    resources = template.get("Resources", {})
    buses = of_type(resources, "AWS::Events::EventBus")
    rules = {k: r for k, r in of_type(resources, "AWS::Events::Rule").items()
             if "EventBusName" in r.get("Properties", {})}
    public = [r["Properties"].get("RouteKey") for r in of_type(resources, "AWS::ApiGatewayV2::Route").values()
              if r["Properties"].get("AuthorizationType", "NONE") == "NONE"]
    if delivery == "webhook":
        if buses or rules:
            problems.append(f"the webhook shape has an event bus or a rule on one: {sorted(buses) + sorted(rules)}")
        if not public:
            problems.append("the webhook shape has no public route for the provider's events")
        return problems
    if delivery == "eventbridge":
        if public:
            problems.append(f"the eventbridge shape has a public route: {public}")
        named = [k for k, r in resources.items() if refers(r, "WebhookSecretArn")]
        if named:
            problems.append(f"the eventbridge shape still names WebhookSecretArn in {sorted(named)}")
    elif not public:
        problems.append("the shape with both deliveries has no public route")
    if len(buses) != 1:
        return problems + [f"{len(buses)} event buses, not one on Stripe's partner event source"]
    bus_name, bus = next(iter(buses.items()))
    props = bus.get("Properties", {})
    if not refers(props.get("EventSourceName"), "StripeEventSourceName") or not refers(props.get("Name"), "StripeEventSourceName"):
        problems.append(f"{bus_name} is not named for and on the partner event source StripeEventSourceName")
    on_bus = {k: r for k, r in rules.items() if refers(r["Properties"].get("EventBusName"), bus_name)}
    if len(on_bus) != 1:
        return problems + [f"{len(on_bus)} rules on {bus_name}, not one"]
    rule_name, rule = next(iter(on_bus.items()))
    rp = rule["Properties"]
    pattern = rp.get("EventPattern", {})
    source = pattern.get("source")
    if not (isinstance(source, list) and len(source) == 1 and refers(source[0], "StripeEventSourceName")):
        problems.append(f"{rule_name}'s pattern does not name the partner source alone: {json.dumps(source)}")
    detail_types = pattern.get("detail-type", [])
    if sorted(detail_types) != sorted(types) or len(set(detail_types)) != len(detail_types):
        missing = sorted(set(types) - set(detail_types))
        extra = sorted(set(detail_types) - set(types))
        problems.append(f"{rule_name}'s detail-type is not the inbox's EVENT_TYPES (missing {missing}, extra {extra})")
    if rp.get("State", "ENABLED") != "ENABLED":
        problems.append(f"{rule_name} is not enabled")
    targets = rp.get("Targets", [])
    if len(targets) != 1:
        return problems + [f"{rule_name} has {len(targets)} targets, not the provider-events queue alone"]
    target = targets[0]
    consumers = [r for r in of_type(resources, "AWS::Lambda::EventSourceMapping").values()
                 if refers(r["Properties"].get("EventSourceArn"), "ProviderEventsQueue")]
    if not refers(target.get("Arn"), "ProviderEventsQueue") or not consumers:
        problems.append(f"{rule_name}'s target is not the provider-events queue the event processor reads: {json.dumps(target.get('Arn'))}")
    if "RetryPolicy" not in target:
        problems.append(f"{rule_name}'s target has no retry policy")
    dlq = target.get("DeadLetterConfig", {}).get("Arn", {})
    dlq = dlq.get("Fn::GetAtt", [None])[0] if isinstance(dlq, dict) else None
    if dlq not in resources:
        problems.append(f"{rule_name}'s target has no dead-letter queue of the stack")
    else:
        watched = [a for a in of_type(resources, "AWS::CloudWatch::Alarm").values()
                   if any(refers(d.get("Value"), dlq) for d in a["Properties"].get("Dimensions", []))]
        if not watched:
            problems.append(f"no alarm watches {dlq}, where EventBridge leaves what it cannot deliver")
    for queue in ["ProviderEventsQueue"] + ([dlq] if dlq in resources else []):
        good, bad = grants(resources, queue, rule_name)
        if not good:
            problems.append(f"EventBridge may not send to {queue} as {rule_name} (a queue policy with aws:SourceArn)")
        for st in bad:
            problems.append(f"{queue}'s policy lets EventBridge send without naming {rule_name}: {st.get('Sid')}")
        key = resources.get(queue, {}).get("Properties", {}).get("KmsMasterKeyId")
        key = key.get("Ref") if isinstance(key, dict) else None
        if key in resources:
            statements = resources[key]["Properties"].get("KeyPolicy", {}).get("Statement", [])
            usable = [st for st in statements if SERVICE in json.dumps(st.get("Principal", ""))
                      and "rule/" in json.dumps(st.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn", ""))]
            if not usable:
                problems.append(f"EventBridge may not use {queue}'s key {key} as the rule (a key policy statement with its aws:SourceArn)")
    return problems


def self_test():
    types = ["payment_intent.succeeded", "refund.failed"]
    good = {"Resources": {
        "Key": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Statement": [
            {"Effect": "Allow", "Principal": {"Service": SERVICE}, "Action": ["kms:GenerateDataKey"],
             "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::Sub": "arn:aws:events:r:a:rule/${StripeEventSourceName}/x"}}}}]}}},
        "ProviderEventsQueue": {"Type": "AWS::SQS::Queue", "Properties": {"KmsMasterKeyId": {"Ref": "Key"}}},
        "Dlq": {"Type": "AWS::SQS::Queue", "Properties": {"KmsMasterKeyId": {"Ref": "Key"}}},
        "Map": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {"EventSourceArn": {"Fn::GetAtt": ["ProviderEventsQueue", "Arn"]}}},
        "Bus": {"Type": "AWS::Events::EventBus", "Properties": {"Name": {"Fn::Sub": "${StripeEventSourceName}"},
                                                               "EventSourceName": {"Fn::Sub": "${StripeEventSourceName}"}}},
        "Rule": {"Type": "AWS::Events::Rule", "Properties": {
            "EventBusName": {"Ref": "Bus"}, "State": "ENABLED",
            "EventPattern": {"source": [{"Ref": "StripeEventSourceName"}], "detail-type": list(types)},
            "Targets": [{"Id": "q", "Arn": {"Fn::GetAtt": ["ProviderEventsQueue", "Arn"]}, "RetryPolicy": {},
                         "DeadLetterConfig": {"Arn": {"Fn::GetAtt": ["Dlq", "Arn"]}}}]}},
        "Policy": {"Type": "AWS::SQS::QueuePolicy", "Properties": {"PolicyDocument": {"Statement": [
            {"Effect": "Allow", "Principal": {"Service": SERVICE}, "Resource": {"Fn::GetAtt": ["ProviderEventsQueue", "Arn"]},
             "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["Rule", "Arn"]}}}},
            {"Effect": "Allow", "Principal": {"Service": SERVICE}, "Resource": {"Fn::GetAtt": ["Dlq", "Arn"]},
             "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["Rule", "Arn"]}}}}]}}},
        "Alarm": {"Type": "AWS::CloudWatch::Alarm", "Properties": {"Dimensions": [
            {"Name": "QueueName", "Value": {"Fn::GetAtt": ["Dlq", "QueueName"]}}]}},
    }}
    assert check(good, types, "eventbridge") == [], check(good, types, "eventbridge")

    def refused(change, want, delivery="eventbridge"):
        t = json.loads(json.dumps(good))
        change(t["Resources"])
        problems = check(t, types, delivery)
        assert any(want in p for p in problems), (want, problems)

    rule = lambda r: r["Rule"]["Properties"]
    refused(lambda r: rule(r)["EventPattern"]["detail-type"].pop(), "missing ['refund.failed']")
    refused(lambda r: rule(r)["EventPattern"]["detail-type"].append("customer.created"), "extra ['customer.created']")
    refused(lambda r: rule(r)["EventPattern"].pop("source"), "partner source alone")
    refused(lambda r: rule(r)["Targets"][0].pop("DeadLetterConfig"), "no dead-letter queue")
    refused(lambda r: r.pop("Alarm"), "no alarm watches Dlq")
    refused(lambda r: r["Policy"]["Properties"]["PolicyDocument"]["Statement"][0].pop("Condition"),
            "lets EventBridge send without naming Rule")
    refused(lambda r: r["Key"]["Properties"]["KeyPolicy"]["Statement"].clear(), "may not use ProviderEventsQueue's key")
    refused(lambda r: r.update({"Route": {"Type": "AWS::ApiGatewayV2::Route", "Properties": {"RouteKey": "POST /e"}}}),
            "has a public route")
    refused(lambda r: r.update({"Fn": {"Type": "AWS::Lambda::Function", "Properties": {
        "Environment": {"Variables": {"WEBHOOK_SECRET_ARN": {"Ref": "WebhookSecretArn"}}}}}}), "names WebhookSecretArn")
    refused(lambda r: None, "has an event bus or a rule", delivery="webhook")
    print("eventbridge.py self-test: 10 bad shapes refused, the good one passes")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    template = json.load(open(sys.argv[1], encoding="utf-8"))
    types = event_types(sys.argv[2])
    if not types:
        print("eventbridge: EVENT_TYPES not found in shared/src/events/catch_up.rs", file=sys.stderr)
        sys.exit(1)
    delivery = sys.argv[3]
    problems = check(template, types, delivery)
    for p in problems:
        print(f"eventbridge ({delivery}): {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"eventbridge ({delivery}): the events arrive as this shape says, and only as it says")


if __name__ == "__main__":
    main()
