#!/usr/bin/env python3
"""The provider's pace in the transformed template, with the parameters' defaults resolved:

- every function given PROVIDER_REQUESTS_PER_SECOND takes it from the one stack parameter, with
  a PROVIDER_SHARE_PERCENT, and the shares add up to at most 100;
- its EVENT_SOURCE_MAX_CONCURRENCY is the MaximumConcurrency of its SQS event-source mapping
  (the instances that share the function's part, each pacing to its own share);
- one batch fits the function's timeout at that pace: its last message's slot, (BatchSize - 1)
  / (rate x share / 100 / instances), is no later than the runner's latest start, Timeout less
  the provider's timeout, its processing allowance (5 s), the claim's allowance (1 s) and the
  deadline safety (0.5 s) (otherwise every batch hands messages back unattempted, and a
  backlog drains slower than the budget allows).

Usage: provider_pace.py TRANSFORMED_JSON; provider_pace.py --self-test
"""
import json
import sys

from shape import function_behind

# The provider's processing allowance (5 s), the claim's allowance (1 s), the deadline safety
# (0.5 s): sqs-once's defaults.
ALLOWANCES = 6.5


def resolve(value, params):
    if isinstance(value, dict) and "Ref" in value and value["Ref"] in params:
        return params[value["Ref"]].get("Default")
    return value


def number(value, params):
    try:
        return float(resolve(value, params))
    except (TypeError, ValueError):
        return None


def function_name_of(mapping, resources):
    ref = mapping["Properties"].get("FunctionName")
    return function_behind(resources, ref.get("Ref")) if isinstance(ref, dict) else ref


def check(template):
    problems = []
    resources = template.get("Resources", {})
    params = template.get("Parameters", {})
    mappings = {function_name_of(r, resources): r for r in resources.values()
                if r.get("Type") == "AWS::Lambda::EventSourceMapping"}
    shares, sources = 0.0, set()
    for name, fn in resources.items():
        if fn.get("Type") != "AWS::Lambda::Function":
            continue
        env = fn["Properties"].get("Environment", {}).get("Variables", {})
        if "PROVIDER_REQUESTS_PER_SECOND" not in env:
            continue
        rate_ref = env["PROVIDER_REQUESTS_PER_SECOND"]
        sources.add(json.dumps(rate_ref, sort_keys=True))
        rate = number(rate_ref, params)
        share = number(env.get("PROVIDER_SHARE_PERCENT"), params)
        instances = number(env.get("EVENT_SOURCE_MAX_CONCURRENCY"), params)
        if rate is None or rate <= 0 or share is None or not 0 < share <= 100:
            problems.append(f"{name}: the provider's rate needs a positive PROVIDER_REQUESTS_PER_SECOND and a PROVIDER_SHARE_PERCENT from 1 to 100")
            continue
        shares += share
        mapping = mappings.get(name)
        if mapping is None:
            problems.append(f"{name} is paced but has no SQS event-source mapping")
            continue
        props = mapping["Properties"]
        most = number(props.get("ScalingConfig", {}).get("MaximumConcurrency"), params)
        if instances is None or most is None or instances != most:
            problems.append(f"{name}: EVENT_SOURCE_MAX_CONCURRENCY ({instances}) is not its event source's MaximumConcurrency ({most})")
            continue
        per_instance = rate * share / 100 / instances
        batch = number(props.get("BatchSize"), params) or 10
        timeout = number(fn["Properties"].get("Timeout"), params) or 3
        call = number(env.get("PAYMENT_API_TIMEOUT_SECONDS"), params) or 10
        last_slot = (batch - 1) / per_instance
        latest = timeout - call - ALLOWANCES
        if last_slot > latest:
            problems.append(f"{name}: the last of a batch of {batch:g} at {per_instance:g} requests a second starts {last_slot:.1f} s in, after the latest start of {latest:.1f} s its {timeout:g} s timeout allows")
    if shares > 100:
        problems.append(f"the functions' PROVIDER_SHARE_PERCENT add up to {shares:g}, over 100")
    if len(sources) > 1:
        problems.append("the functions take PROVIDER_REQUESTS_PER_SECOND from different places; give them the one parameter")
    return problems


def self_test():
    def template(batch=10, share=(60, 40), most=10, instances=10, rate="20", timeout=60):
        t = {"Parameters": {"Rate": {"Type": "String", "Default": rate}, "Most": {"Type": "Number", "Default": most}},
             "Resources": {}}
        for i, s in enumerate(share):
            t["Resources"][f"Fn{i}"] = {"Type": "AWS::Lambda::Function", "Properties": {
                "Timeout": timeout,
                "Environment": {"Variables": {
                    "PROVIDER_REQUESTS_PER_SECOND": {"Ref": "Rate"}, "PROVIDER_SHARE_PERCENT": str(s),
                    "EVENT_SOURCE_MAX_CONCURRENCY": instances if i else {"Ref": "Most"},
                    "PAYMENT_API_TIMEOUT_SECONDS": "10"}}}}
            t["Resources"][f"Fn{i}Aliaslive"] = {"Type": "AWS::Lambda::Alias", "Properties": {
                "FunctionName": {"Ref": f"Fn{i}"}, "Name": "live"}}
            t["Resources"][f"Map{i}"] = {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {
                "FunctionName": {"Ref": f"Fn{i}Aliaslive"}, "BatchSize": batch,
                "ScalingConfig": {"MaximumConcurrency": {"Ref": "Most"}}}}
        return t
    assert check(template()) == [], check(template())
    assert len(check(template(share=(60, 50)))) == 1  # over 100
    assert len(check(template(instances=5))) == 1  # not the mapping's MaximumConcurrency
    # 20 x 40 % / 10 = 0.8 a second: the 50th of a batch starts 61 s in; at 60 %, 41 s (<= 43.5).
    assert len(check(template(batch=50))) == 1
    assert len(check(template(rate="2"))) == 2  # 0.12 and 0.08 a second: no batch of 10 fits
    print("provider_pace self-test: 5 cases ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    found = check(json.load(open(sys.argv[1], encoding="utf-8")))
    for p in found:
        print(p, file=sys.stderr)
    if found:
        sys.exit(1)
    print("the provider's pace: one stack rate, shares within 100, each function's instances its event source's, and a batch fits its timeout at its pace")
