#!/usr/bin/env python3
"""How the provider's events arrive, checked on one shape of the transformed template (shape.py):

- webhook: no event bus and no rule on one;
- eventbridge: no public route, no function holding the webhook's signing secret, and nothing
  that names WebhookSecretArn;
- eventbridge or both: one bus named for and on the partner event source StripeEventSourceName;
  one rule on it whose pattern is that source alone and exactly the event types the inbox
  applies (the `EVENT_TYPES` of shared/src/events/listing.rs), nothing else; its one target the
  queue the event processor reads, retried for at least an hour, with a dead-letter queue that
  the stack's key does not encrypt and an alarm watches from its first message, and an alarm on
  what could not even be dead-lettered; EventBridge may send to the queue and to that DLQ only as
  that rule (aws:SourceArn, written out so that the rule waits for the policies), and may use
  the queue's key only as that rule, to decrypt and make data keys;
- webhook: no bus, no rule, and nothing that lets EventBridge send or use the key.

Usage: eventbridge.py SHAPE_JSON REPO_ROOT DELIVERY; eventbridge.py --self-test
"""
import json
import pathlib
import re
import sys

SERVICE = "events.amazonaws.com"


def event_types(root):
    text = (pathlib.Path(root) / "shared/src/events/listing.rs").read_text()
    block = re.search(r"pub const EVENT_TYPES: &\[&str\] = &\[(.*?)\];", text, flags=re.S)
    return re.findall(r'"([^"]+)"', block.group(1)) if block else []


def of_type(resources, kind):
    return {k: r for k, r in resources.items() if r.get("Type") == kind}


def refers(value, name):
    """Whether a value is Ref/GetAtt/Sub of `name` (a parameter or a resource)."""
    text = json.dumps(value)
    return (f'{{"Ref": "{name}"}}' in text or f'["{name}",' in text or f'"{name}.' in text
            or "${" + name + "}" in text or "${" + name + "." in text)


def rule_arn(rule):
    """The rule's ARN as the policies must write it: on the partner bus, by the rule's name."""
    name = rule.get("Properties", {}).get("Name")
    name = name.get("Fn::Sub") if isinstance(name, dict) else name
    if not isinstance(name, str):
        return None
    return {"Fn::Sub": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:rule/${StripeEventSourceName}/" + name}


def service_statements(statements):
    return [st for st in statements if st.get("Effect") == "Allow" and SERVICE in json.dumps(st.get("Principal", ""))]


def queue_grants(resources):
    """Every Allow to EventBridge or to anyone in the queue policies: (policy, the queues it is
    attached to, the statement)."""
    out = []
    for name, r in of_type(resources, "AWS::SQS::QueuePolicy").items():
        props = r.get("Properties", {})
        for st in props.get("PolicyDocument", {}).get("Statement", []):
            anyone = st.get("Principal") in ("*", {"AWS": "*"})
            if service_statements([st]) or (st.get("Effect") == "Allow" and anyone):
                out.append((name, props.get("Queues", []), st))
    return out


def key_of(queue):
    """The stack key a queue is encrypted with (Ref or GetAtt of it), or None."""
    key = queue.get("Properties", {}).get("KmsMasterKeyId")
    if isinstance(key, dict):
        return key.get("Ref") or (key.get("Fn::GetAtt") or [None])[0]
    return None


def key_grants(resources):
    out = []
    for name, r in of_type(resources, "AWS::KMS::Key").items():
        for st in service_statements(r.get("Properties", {}).get("KeyPolicy", {}).get("Statement", [])):
            out.append((name, st))
    return out


def number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


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
        if [g for g in queue_grants(resources) if service_statements([g[2]])] or key_grants(resources):
            problems.append("the webhook shape still lets EventBridge send to a queue or use the key")
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
    on_source = [{"Ref": "StripeEventSourceName"}, {"Fn::Sub": "${StripeEventSourceName}"}]
    if props.get("EventSourceName") not in on_source or props.get("Name") not in on_source:
        problems.append(f"{bus_name} is not named for and on the partner event source StripeEventSourceName")
    on_bus = {k: r for k, r in rules.items() if refers(r["Properties"].get("EventBusName"), bus_name)}
    if len(on_bus) != 1:
        return problems + [f"{len(on_bus)} rules on {bus_name}, not one"]
    rule_name, rule = next(iter(on_bus.items()))
    rp = rule["Properties"]
    pattern = rp.get("EventPattern", {})
    if set(pattern) != {"source", "detail-type"}:
        problems.append(f"{rule_name}'s pattern matches on {sorted(pattern)}, not on the source and the type alone")
    if pattern.get("source") != [{"Ref": "StripeEventSourceName"}]:
        problems.append(f"{rule_name}'s pattern does not name the partner source alone: {json.dumps(pattern.get('source'))}")
    detail_types = pattern.get("detail-type", [])
    if sorted(detail_types) != sorted(types) or len(set(detail_types)) != len(detail_types):
        missing = sorted(set(types) - set(detail_types))
        extra = sorted(set(detail_types) - set(types))
        problems.append(f"{rule_name}'s detail-type is not the inbox's EVENT_TYPES (missing {missing}, extra {extra})")
    if rp.get("State", "ENABLED") != "ENABLED":
        problems.append(f"{rule_name} is not enabled")
    arn = rule_arn(rule)
    if arn is None:
        problems.append(f"{rule_name} has no Name of its own, so no policy can name its ARN before it exists")
    targets = rp.get("Targets", [])
    if len(targets) != 1:
        return problems + [f"{rule_name} has {len(targets)} targets, not the provider-events queue alone"]
    target = targets[0]
    consumers = [r for r in of_type(resources, "AWS::Lambda::EventSourceMapping").values()
                 if refers(r["Properties"].get("EventSourceArn"), "ProviderEventsQueue")]
    if not refers(target.get("Arn"), "ProviderEventsQueue") or not consumers:
        problems.append(f"{rule_name}'s target is not the provider-events queue the event processor reads: {json.dumps(target.get('Arn'))}")
    retry = target.get("RetryPolicy", {})
    attempts, age = number(retry.get("MaximumRetryAttempts")), number(retry.get("MaximumEventAgeInSeconds"))
    if attempts is None or age is None or attempts < 10 or age < 3600:
        problems.append(f"{rule_name}'s target gives up too soon (MaximumRetryAttempts {attempts}, MaximumEventAgeInSeconds {age}; at least 10 and an hour)")
    dlq = target.get("DeadLetterConfig", {}).get("Arn", {})
    dlq = dlq.get("Fn::GetAtt", [None])[0] if isinstance(dlq, dict) else None
    if dlq not in resources:
        problems.append(f"{rule_name}'s target has no dead-letter queue of the stack")
    else:
        if resources[dlq].get("Properties", {}).get("SqsManagedSseEnabled") is not True \
                or "KmsMasterKeyId" in resources[dlq].get("Properties", {}):
            problems.append(f"{dlq} is not encrypted by SQS alone (SqsManagedSseEnabled): under a key of the stack, what the queue could not take when the key refuses EventBridge is lost with it")
        watched = [a["Properties"] for a in of_type(resources, "AWS::CloudWatch::Alarm").values()
                   if any(refers(d.get("Value"), dlq) for d in a["Properties"].get("Dimensions", []))]
        if not any(a.get("MetricName") == "ApproximateNumberOfMessagesVisible" and number(a.get("Threshold")) == 0
                   and a.get("ComparisonOperator") == "GreaterThanThreshold" for a in watched):
            problems.append(f"no alarm fires on the first message in {dlq}, where EventBridge leaves what it cannot deliver")
    def dimension(alarm, name):
        return next((d.get("Value") for d in alarm.get("Dimensions", []) if d.get("Name") == name), None)

    lost = [a["Properties"] for a in of_type(resources, "AWS::CloudWatch::Alarm").values()
            if a["Properties"].get("Namespace") == "AWS/Events"
            and a["Properties"].get("MetricName") == "InvocationsFailedToBeSentToDlq"]
    if not any(dimension(a, "RuleName") == rp.get("Name") and dimension(a, "EventBusName") in on_source
               and number(a.get("Threshold")) == 0 and a.get("ComparisonOperator") == "GreaterThanThreshold"
               for a in lost):
        problems.append(f"no alarm fires on the first of {rule_name}'s InvocationsFailedToBeSentToDlq (its RuleName and EventBusName dimensions): events EventBridge could not even dead-letter would go unseen")
    depends = rule.get("DependsOn", [])
    depends = [depends] if isinstance(depends, str) else depends
    grants = queue_grants(resources)
    for queue in ["ProviderEventsQueue"] + ([dlq] if dlq in resources else []):
        policies = [p for p, r in of_type(resources, "AWS::SQS::QueuePolicy").items()
                    if any(refers(q, queue) for q in r.get("Properties", {}).get("Queues", []))]
        if len(policies) > 1:
            problems.append(f"{queue} has {len(policies)} queue policies: one replaces the other")
        mine = [(p, st) for p, queues, st in grants
                if any(refers(q, queue) for q in queues) and (refers(st.get("Resource"), queue) or st.get("Resource") == "*")]
        good = [(p, st) for p, st in mine if st.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn") == arn
                and st.get("Action") in ("sqs:SendMessage", ["sqs:SendMessage"])]
        if not good:
            problems.append(f"EventBridge may not send to {queue} as {rule_name} (a queue policy with aws:SourceArn of the rule, written out)")
        for p, _ in good:
            if p not in depends:
                problems.append(f"{rule_name} does not wait for {p}: events it matches before the policy exists are refused")
    for p, _, st in grants:
        if st.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn") != arn:
            problems.append(f"{p} lets EventBridge (or anyone) send without naming {rule_name}: {st.get('Sid')}")
        elif st.get("Action") not in ("sqs:SendMessage", ["sqs:SendMessage"]):
            problems.append(f"{p} gives EventBridge more than sqs:SendMessage: {st.get('Action')}")
    key = key_of(resources.get("ProviderEventsQueue", {}))
    if key in resources:
        usable = [st for k, st in key_grants(resources) if k == key
                  and st.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn") == arn]
        if not usable:
            problems.append(f"EventBridge may not use the queue's key {key} as {rule_name} (a key policy statement with its aws:SourceArn)")
    for k, st in key_grants(resources):
        actions = set(st.get("Action", []) if isinstance(st.get("Action"), list) else [st.get("Action")])
        if st.get("Condition", {}).get("ArnEquals", {}).get("aws:SourceArn") != arn:
            problems.append(f"{k} lets EventBridge use it without naming {rule_name}: {st.get('Sid')}")
        elif not actions <= {"kms:Decrypt", "kms:GenerateDataKey"}:
            problems.append(f"{k} gives EventBridge more than it needs to send: {sorted(actions)}")
    return problems


def self_test():
    types = ["payment_intent.succeeded", "refund.failed"]
    arn = {"Fn::Sub": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:rule/${StripeEventSourceName}/${AWS::StackName}-x"}
    allow = lambda queue: {"Effect": "Allow", "Principal": {"Service": SERVICE}, "Action": "sqs:SendMessage",
                           "Resource": {"Fn::GetAtt": [queue, "Arn"]}, "Condition": {"ArnEquals": {"aws:SourceArn": arn}}}
    good = {"Resources": {
        "Key": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Statement": [
            {"Effect": "Allow", "Principal": {"Service": SERVICE}, "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
             "Condition": {"ArnEquals": {"aws:SourceArn": arn}}}]}}},
        "ProviderEventsQueue": {"Type": "AWS::SQS::Queue", "Properties": {"KmsMasterKeyId": {"Ref": "Key"}}},
        "Dlq": {"Type": "AWS::SQS::Queue", "Properties": {"SqsManagedSseEnabled": True}},
        "Map": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {"EventSourceArn": {"Fn::GetAtt": ["ProviderEventsQueue", "Arn"]}}},
        "Bus": {"Type": "AWS::Events::EventBus", "Properties": {"Name": {"Fn::Sub": "${StripeEventSourceName}"},
                                                               "EventSourceName": {"Fn::Sub": "${StripeEventSourceName}"}}},
        "Rule": {"Type": "AWS::Events::Rule", "DependsOn": ["Policy", "DlqPolicy"], "Properties": {
            "Name": {"Fn::Sub": "${AWS::StackName}-x"}, "EventBusName": {"Ref": "Bus"}, "State": "ENABLED",
            "EventPattern": {"source": [{"Ref": "StripeEventSourceName"}], "detail-type": list(types)},
            "Targets": [{"Id": "q", "Arn": {"Fn::GetAtt": ["ProviderEventsQueue", "Arn"]},
                         "RetryPolicy": {"MaximumRetryAttempts": 185, "MaximumEventAgeInSeconds": 86400},
                         "DeadLetterConfig": {"Arn": {"Fn::GetAtt": ["Dlq", "Arn"]}}}]}},
        "Policy": {"Type": "AWS::SQS::QueuePolicy", "Properties": {"Queues": [{"Ref": "ProviderEventsQueue"}],
                                                                  "PolicyDocument": {"Statement": [allow("ProviderEventsQueue")]}}},
        "DlqPolicy": {"Type": "AWS::SQS::QueuePolicy", "Properties": {"Queues": [{"Ref": "Dlq"}],
                                                                     "PolicyDocument": {"Statement": [allow("Dlq")]}}},
        "Alarm": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "MetricName": "ApproximateNumberOfMessagesVisible", "Threshold": 0, "ComparisonOperator": "GreaterThanThreshold",
            "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["Dlq", "QueueName"]}}]}},
        "Lost": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "Namespace": "AWS/Events", "MetricName": "InvocationsFailedToBeSentToDlq", "Threshold": 0,
            "ComparisonOperator": "GreaterThanThreshold",
            "Dimensions": [{"Name": "EventBusName", "Value": {"Ref": "StripeEventSourceName"}},
                           {"Name": "RuleName", "Value": {"Fn::Sub": "${AWS::StackName}-x"}}]}},
    }}
    assert check(good, types, "eventbridge") == [], check(good, types, "eventbridge")
    cases = 1

    def refused(change, want, delivery="eventbridge"):
        nonlocal cases
        t = json.loads(json.dumps(good))
        change(t["Resources"])
        problems = check(t, types, delivery)
        assert any(want in p for p in problems), (want, problems)
        cases += 1

    rule = lambda r: r["Rule"]["Properties"]
    other = {"Fn::Sub": arn["Fn::Sub"].replace("-x", "-y")}
    refused(lambda r: rule(r)["EventPattern"]["detail-type"].pop(), "missing ['refund.failed']")
    refused(lambda r: rule(r)["EventPattern"]["detail-type"].append("customer.created"), "extra ['customer.created']")
    refused(lambda r: rule(r)["EventPattern"].pop("source"), "partner source alone")
    refused(lambda r: rule(r)["EventPattern"].update({"source": [{"prefix": "aws.partner/stripe.com"}]}), "partner source alone")
    refused(lambda r: rule(r)["EventPattern"].update({"detail": {"livemode": [True]}}), "not on the source and the type alone")
    refused(lambda r: r["Bus"]["Properties"].update({"Name": {"Fn::Sub": "${StripeEventSourceName}-x"}}), "not named for and on")
    refused(lambda r: rule(r)["Targets"][0].pop("DeadLetterConfig"), "no dead-letter queue")
    refused(lambda r: rule(r)["Targets"][0].update({"RetryPolicy": {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}}), "gives up too soon")
    refused(lambda r: r["Dlq"]["Properties"].update({"KmsMasterKeyId": {"Ref": "Key"}}), "not encrypted by SQS alone")
    refused(lambda r: r.pop("Alarm"), "no alarm fires on the first message in Dlq")
    refused(lambda r: r["Alarm"]["Properties"].update({"MetricName": "NumberOfMessagesSent", "Threshold": 1000}), "no alarm fires on the first message")
    refused(lambda r: r.pop("Lost"), "InvocationsFailedToBeSentToDlq")
    refused(lambda r: r["Lost"]["Properties"]["Dimensions"].pop(0), "InvocationsFailedToBeSentToDlq")
    refused(lambda r: r["Lost"]["Properties"].update({"Threshold": 1000}), "InvocationsFailedToBeSentToDlq")
    refused(lambda r: r["Dlq"]["Properties"].update({"SqsManagedSseEnabled": False}), "not encrypted by SQS alone")
    refused(lambda r: r["Policy"]["Properties"].update({"Queues": [{"Ref": "Dlq"}]}), "may not send to ProviderEventsQueue")
    refused(lambda r: r.update({"Policy2": {"Type": "AWS::SQS::QueuePolicy", "Properties": {
        "Queues": [{"Ref": "ProviderEventsQueue"}], "PolicyDocument": {"Statement": []}}}}), "2 queue policies")
    refused(lambda r: r["Policy"]["Properties"]["PolicyDocument"]["Statement"][0].update({"Action": "sqs:*"}), "more than sqs:SendMessage")
    refused(lambda r: r["Policy"]["Properties"]["PolicyDocument"]["Statement"].append(
        {"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}), "or anyone")
    refused(lambda r: [r["ProviderEventsQueue"]["Properties"].update({"KmsMasterKeyId": {"Fn::GetAtt": ["Key", "Arn"]}}),
                       r["Key"]["Properties"]["KeyPolicy"]["Statement"].clear()], "may not use the queue's key")
    refused(lambda r: r["Policy"]["Properties"]["PolicyDocument"]["Statement"][0].pop("Condition"),
            "send without naming Rule")
    refused(lambda r: r["Policy"]["Properties"]["PolicyDocument"]["Statement"].append(
        {"Effect": "Allow", "Principal": {"Service": SERVICE}, "Action": "sqs:*", "Resource": "*"}), "send without naming Rule")
    refused(lambda r: r["Policy"]["Properties"]["PolicyDocument"]["Statement"][0]["Condition"]["ArnEquals"].update(
        {"aws:SourceArn": {"Fn::GetAtt": ["Rule", "Arn"]}}), "may not send to ProviderEventsQueue")
    refused(lambda r: r["Rule"].pop("DependsOn"), "does not wait for Policy")
    refused(lambda r: rule(r).update({"Name": {"Fn::Sub": "${AWS::StackName}-y"}}), "lets EventBridge use it without naming Rule")
    refused(lambda r: r["Key"]["Properties"]["KeyPolicy"]["Statement"][0].update({"Action": ["kms:Encrypt", "kms:Decrypt"]}), "more than it needs")
    refused(lambda r: r["Key"]["Properties"]["KeyPolicy"]["Statement"][0]["Condition"]["ArnEquals"].update({"aws:SourceArn": other}), "may not use the queue's key")
    refused(lambda r: r.update({"Route": {"Type": "AWS::ApiGatewayV2::Route", "Properties": {"RouteKey": "POST /e"}}}),
            "has a public route")
    refused(lambda r: r.update({"Fn": {"Type": "AWS::Lambda::Function", "Properties": {
        "Environment": {"Variables": {"WEBHOOK_SECRET_ARN": {"Ref": "WebhookSecretArn"}}}}}}), "names WebhookSecretArn")
    refused(lambda r: None, "has an event bus or a rule", delivery="webhook")
    refused(lambda r: [r.pop(k) for k in ("Bus", "Rule")], "still lets EventBridge send", delivery="webhook")
    print(f"eventbridge.py self-test: {cases - 1} bad shapes refused, the good one passes")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    template = json.load(open(sys.argv[1], encoding="utf-8"))
    types = event_types(sys.argv[2])
    if not types:
        print("eventbridge: EVENT_TYPES not found in shared/src/events/listing.rs", file=sys.stderr)
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
