#!/usr/bin/env python3
"""Every public route (AuthorizationType NONE) of the transformed template has a throttle of its
own in its stage's RouteSettings, keyed by its RouteKey, and the stage depends on the route;
the throttle's rate and burst (parameters' defaults resolved) are positive, the rate at least
what the README says the provider delivers, and what the throttle passes on stays within the
reserved concurrency of the function behind the route, at the README's measured cost of its
worst request (Lambda refuses an invocation over it, so a forged burst would crowd out genuine
deliveries):

    rate x worst request's seconds <= reserved concurrency
    burst <= reserved concurrency (a bucket's worth arriving at once)

The README states both figures in one sentence each (section "What the public route costs"):
"The provider delivers at most about N events a second" and "The worst request costs the
function about M ms at S MB" (S must be the function's MemorySize).

Usage: route_throttle.py TRANSFORMED_JSON README; route_throttle.py --self-test
"""
import json
import re
import sys

from shape import function_behind


def resolve(value, params):
    if isinstance(value, dict) and "Ref" in value and value["Ref"] in params:
        return params[value["Ref"]].get("Default")
    return value


def number(value, params):
    v = resolve(value, params)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def readme_figures(readme):
    delivered = re.search(r"The provider delivers at most about (\d+) events a second", readme)
    worst = re.search(r"The worst request costs the function about (\d+(?:\.\d+)?) ms at (\d+) MB", readme)
    return (int(delivered.group(1)) if delivered else None,
            (float(worst.group(1)), int(worst.group(2))) if worst else None)


def function_of_route(route, resources):
    """The Lambda function a route's integration invokes."""
    target = route["Properties"].get("Target", "")
    if isinstance(target, dict):
        target = target.get("Fn::Sub", "")
    m = re.search(r"integrations/\$\{([A-Za-z0-9]+)\}", target if isinstance(target, str) else "")
    if not m:
        return None
    uri = resources.get(m.group(1), {}).get("Properties", {}).get("IntegrationUri", {})
    if isinstance(uri, dict) and "Ref" in uri:
        return function_behind(resources, uri["Ref"])
    arn = uri.get("Fn::GetAtt") if isinstance(uri, dict) else None
    return arn[0] if isinstance(arn, list) else (arn.split(".")[0] if isinstance(arn, str) else None)


def check(template, readme):
    problems = []
    resources = template.get("Resources", {})
    params = template.get("Parameters", {})
    delivered, worst = readme_figures(readme)
    if delivered is None:
        problems.append("the README does not say how many events a second the provider delivers")
    if worst is None:
        problems.append("the README does not say what the worst request costs the function")
    stages = {k: r for k, r in resources.items() if r.get("Type") == "AWS::ApiGatewayV2::Stage"}
    for name, route in resources.items():
        if route.get("Type") != "AWS::ApiGatewayV2::Route":
            continue
        if route["Properties"].get("AuthorizationType", "NONE") != "NONE":
            continue
        key = route["Properties"]["RouteKey"]
        api = route["Properties"].get("ApiId")
        found = [(s, r) for s, r in stages.items() if r["Properties"].get("ApiId") == api]
        if not found:
            problems.append(f"the public route {key} ({name}) has no stage")
            continue
        for stage_name, stage in found:
            settings = stage["Properties"].get("RouteSettings", {}).get(key)
            if not settings:
                problems.append(f"the public route {key} has no throttle of its own in {stage_name}'s RouteSettings")
                continue
            depends = stage.get("DependsOn", [])
            depends = [depends] if isinstance(depends, str) else depends
            # A conditional route is waited for through a handle whose Metadata refers to it.
            through = [d for d in depends
                       if {"Ref": name} in resources.get(d, {}).get("Metadata", {}).values()]
            if name not in depends and not through:
                problems.append(f"{stage_name} names the route {key} in RouteSettings but does not depend on {name}")
            rate = number(settings.get("ThrottlingRateLimit"), params)
            burst = number(settings.get("ThrottlingBurstLimit"), params)
            if not rate or not burst or rate <= 0 or burst <= 0:
                problems.append(f"the public route {key}'s throttle needs a positive rate and burst (rate {rate}, burst {burst})")
                continue
            if delivered is not None and rate < delivered:
                problems.append(f"the public route {key} passes {rate:g}/s, below the {delivered} events/s the README says the provider delivers")
            function = function_of_route(route, resources)
            props = resources.get(function, {}).get("Properties", {})
            reserved = number(props.get("ReservedConcurrentExecutions"), params)
            memory = number(props.get("MemorySize"), params)
            if reserved is None:
                problems.append(f"the function behind {key} ({function}) has no reserved concurrency")
            elif burst > reserved:
                problems.append(f"the public route {key} passes bursts of {burst:g} at once, over the {reserved:g} instances reserved for {function}")
            if reserved is not None and worst is not None:
                ms, mb = worst
                if memory is not None and int(memory) != mb:
                    problems.append(f"the README's worst request is measured at {mb} MB; {function} has {memory:g} MB")
                if rate * ms / 1000 > reserved:
                    problems.append(f"at {rate:g}/s and {ms:g} ms each, {key} keeps {rate * ms / 1000:g} instances busy, over the {reserved:g} reserved")
    return problems


def self_test():
    def template(rate=100, burst=20, depends=("EventsRoute",), settings=True, reserved=20, memory=256):
        stage = {"Type": "AWS::ApiGatewayV2::Stage", "DependsOn": list(depends),
                 "Properties": {"ApiId": {"Ref": "Api"}}}
        if settings:
            stage["Properties"]["RouteSettings"] = {"POST /v1/e": {
                "ThrottlingRateLimit": {"Ref": "Rate"}, "ThrottlingBurstLimit": burst}}
        return {
            "Parameters": {"Rate": {"Type": "Number", "Default": rate}},
            "Resources": {
                "Stage": stage,
                "EventsRoute": {"Type": "AWS::ApiGatewayV2::Route", "Properties": {
                    "ApiId": {"Ref": "Api"}, "RouteKey": "POST /v1/e", "AuthorizationType": "NONE",
                    "Target": {"Fn::Sub": "integrations/${Int}"}}},
                "IamRoute": {"Type": "AWS::ApiGatewayV2::Route", "Properties": {
                    "ApiId": {"Ref": "Api"}, "RouteKey": "POST /v1/p", "AuthorizationType": "AWS_IAM"}},
                "Int": {"Type": "AWS::ApiGatewayV2::Integration", "Properties": {
                    "IntegrationUri": {"Ref": "FnAliaslive"}}},
                "FnAliaslive": {"Type": "AWS::Lambda::Alias", "Properties": {"FunctionName": {"Ref": "Fn"}}},
                "Fn": {"Type": "AWS::Lambda::Function", "Properties": {
                    "ReservedConcurrentExecutions": reserved, "MemorySize": memory}},
            },
        }
    readme = "The provider delivers at most about 50 events a second. The worst request costs the function about 100 ms at 256 MB."
    assert check(template(), readme) == [], check(template(), readme)
    assert len(check(template(settings=False), readme)) == 1
    assert len(check(template(depends=()), readme)) == 1
    handle = template(depends=("Ready",))
    handle["Resources"]["Ready"] = {"Type": "AWS::CloudFormation::WaitConditionHandle",
                                    "Metadata": {"Route": {"Ref": "EventsRoute"}}}
    assert check(handle, readme) == [], check(handle, readme)
    handle["Resources"]["Ready"]["Metadata"]["Route"] = "none"
    assert len(check(handle, readme)) == 1
    assert len(check(template(burst=50), readme)) == 1  # a burst over the reserved concurrency
    assert len(check(template(rate=40), readme)) == 1  # below what is delivered
    assert len(check(template(reserved=5, burst=5), readme)) == 1  # 100/s x 0.1 s = 10 > 5
    assert len(check(template(memory=512), readme)) == 1  # measured at another size
    assert len(check(template(), "nothing said")) == 2
    print("route_throttle self-test: 10 cases ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    template = json.load(open(sys.argv[1], encoding="utf-8"))
    readme = open(sys.argv[2], encoding="utf-8").read()
    found = check(template, readme)
    for p in found:
        print(p, file=sys.stderr)
    if found:
        sys.exit(1)
    print("every public route has its own throttle, above the provider's delivery rate and within its function's reserved concurrency at the worst request's measured cost")
