#!/usr/bin/env python3
"""Deploy and roll back safely, checked on one shape of the transformed template (shape.py):

- every function has a published version and an alias, and everything that invokes it (an
  event-source mapping, an API route's integration, an invoke permission, an EventBridge
  rule's target) names the alias: a deploy moves the alias, and a rollback moves it back, for
  every way in at once; a caller left on the function itself would run $LATEST, whatever the
  alias says;
- with `gradual` (GradualDeployment "true"), every function's alias is moved by a CodeDeploy
  deployment group that rolls back on alarm, and each group watches at least one alarm of the
  stack's that fires on that function's failures (its Errors, or a metric of the stack's own
  that the function publishes); without it, no CodeDeploy resource at all (an account or an
  emulator without CodeDeploy deploys the same template);
- a version is published again when a parameter its function's configuration reads changes,
  not only when the code does: SAM names a version after the code and the environment as
  written (`!Ref P`, not P's value), so a deploy that changes only P would update $LATEST and
  leave `live` on the old configuration. Each version's Description (SAM's VersionDescription)
  is therefore a Fn::Sub of every parameter the function's configuration reads, whose longest
  value fits Lambda's 256 characters; a parameter whose length has no bound (a string with no
  AllowedValues or MaxLength) cannot be in it: every description names the revision
  parameter (ConfigRevision), which an operator raises to publish after such a change (and
  which `payctl preflight`, comparing `live` with what the stack deployed, asks for), and every
  function's configuration reads it: Lambda refuses to publish a version of a function that did
  not change, so a raised revision that changed only the description would fail the deploy.

Usage: deployment.py SHAPE_JSON gradual|at-once; deployment.py --self-test
"""
import copy
import json
import re
import sys

from shape import function_behind

INVOKERS = {
    "AWS::Lambda::EventSourceMapping": lambda p: [p.get("FunctionName")],
    "AWS::Lambda::Permission": lambda p: [p.get("FunctionName")],
    "AWS::ApiGatewayV2::Integration": lambda p: [p.get("IntegrationUri")],
    "AWS::Events::Rule": lambda p: [t.get("Arn") for t in p.get("Targets", [])],
}


def named(value):
    """The resource a Ref or GetAtt names, and how: ("Ref", name) or ("GetAtt", name)."""
    if isinstance(value, dict) and isinstance(value.get("Ref"), str):
        return "Ref", value["Ref"]
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        att = value["Fn::GetAtt"]
        return "GetAtt", att[0] if isinstance(att, list) else str(att).split(".")[0]
    return None, None


DESCRIPTION_MAX = 256
REVISION = "ConfigRevision"
# A function's own settings, the same for every version: they need no new one.
FUNCTION_LEVEL = {"ReservedConcurrentExecutions"}


def parameters_read(value, params, conditions):
    """The parameters a value reads: Ref, Sub's ${P}, and those of the conditions of its Fn::If."""
    found = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref" and v in params:
                found.add(v)
            elif k == "Fn::Sub":
                text = v[0] if isinstance(v, list) else v
                found |= {n for n in re.findall(r"\$\{([^}!.]+)\}", text if isinstance(text, str) else "") if n in params}
                found |= parameters_read(v[1:] if isinstance(v, list) else None, params, conditions)
            elif k == "Fn::If" and isinstance(v, list):
                found |= parameters_read(conditions.get(v[0]), params, conditions) | parameters_read(v[1:], params, conditions)
            elif k == "Condition" and isinstance(v, str):
                found |= parameters_read(conditions.get(v), params, conditions)
            else:
                found |= parameters_read(v, params, conditions)
    elif isinstance(value, list):
        for v in value:
            found |= parameters_read(v, params, conditions)
    return found


def longest(param):
    """The most characters a parameter's value can have, or None when nothing bounds it."""
    if "AllowedValues" in param:
        return max(len(str(v)) for v in param["AllowedValues"])
    if param.get("Type") == "Number":
        if "MaxValue" not in param:
            return None
        return max(len(str(param["MaxValue"])), len(str(param.get("MinValue", ""))))
    return param.get("MaxLength")


def version_descriptions(template):
    problems, left = [], set()
    resources = template.get("Resources", {})
    params = template.get("Parameters", {})
    conditions = template.get("Conditions", {})
    for fn, res in sorted(resources.items()):
        if res.get("Type") != "AWS::Lambda::Function":
            continue
        props = {k: v for k, v in res.get("Properties", {}).items() if k not in FUNCTION_LEVEL}
        read = parameters_read(props, params, conditions)
        bounded = {p for p in read if longest(params[p]) is not None}
        left |= read - bounded
        versions = [r for r in resources.values() if r.get("Type") == "AWS::Lambda::Version"
                    and named(r.get("Properties", {}).get("FunctionName"))[1] == fn]
        for version in versions:
            desc = version.get("Properties", {}).get("Description")
            text = desc.get("Fn::Sub") if isinstance(desc, dict) else None
            if not isinstance(text, str):
                if bounded:
                    problems.append(f"{fn}'s version is not published again when {', '.join(sorted(bounded))} change: "
                                    "give it a VersionDescription that is a Fn::Sub of them")
                continue
            names = set(re.findall(r"\$\{([^}!.]+)\}", text))
            missing = (bounded | ({REVISION} if REVISION in params else set())) - names
            if REVISION in params and REVISION not in read:
                problems.append(f"{fn}'s configuration does not read {REVISION}: raising it would change only the "
                                "version's description, and Lambda refuses to publish an unchanged function")
            if missing:
                problems.append(f"{fn}'s VersionDescription leaves out {', '.join(sorted(missing))}: a change of "
                                "only these would leave its live alias on the old configuration")
            unbounded = sorted(n for n in names if n in params and longest(params[n]) is None)
            if unbounded:
                problems.append(f"{fn}'s VersionDescription names {', '.join(unbounded)}, whose length nothing bounds")
                continue
            worst = len(re.sub(r"\$\{[^}]+\}", "", text)) + sum(longest(params[n]) for n in names if n in params)
            if worst > DESCRIPTION_MAX:
                problems.append(f"{fn}'s VersionDescription can be {worst} characters, over Lambda's {DESCRIPTION_MAX}")
    return problems, left


def check(template, gradual):
    problems = []
    resources = template.get("Resources", {})
    of_type = lambda t: {n: r for n, r in resources.items() if r.get("Type") == t}  # noqa: E731
    functions, aliases = of_type("AWS::Lambda::Function"), of_type("AWS::Lambda::Alias")
    alias_of = {function_behind(resources, a): a for a in aliases}
    for fn in sorted(functions):
        if fn not in alias_of:
            problems.append(f"{fn} has no alias: a deploy cannot be rolled back by moving one")
    for name, res in sorted(resources.items()):
        refs = INVOKERS.get(res.get("Type"), lambda p: [])(res.get("Properties", {}))
        for ref in refs:
            how, target = named(ref)
            if target in functions:
                problems.append(f"{name} invokes {target} itself ({how}), not its alias {alias_of.get(target)}")
    problems += version_descriptions(template)[0]
    groups = of_type("AWS::CodeDeploy::DeploymentGroup")
    if not gradual:
        if groups or of_type("AWS::CodeDeploy::Application"):
            problems.append("CodeDeploy resources without GradualDeployment: an account without CodeDeploy cannot deploy")
        return problems
    alarms = of_type("AWS::CloudWatch::Alarm")
    for fn, alias in sorted((f, a) for f, a in alias_of.items() if f in functions):
        update = resources[alias].get("UpdatePolicy", {}).get("CodeDeployLambdaAliasUpdate", {})
        _, group = named(update.get("DeploymentGroupName"))
        props = groups.get(group, {}).get("Properties", {})
        if not props:
            problems.append(f"{alias} is moved at once: no CodeDeploy deployment group shifts it")
            continue
        rollback = props.get("AutoRollbackConfiguration", {})
        if not rollback.get("Enabled") or "DEPLOYMENT_STOP_ON_ALARM" not in rollback.get("Events", []):
            problems.append(f"{group} does not roll back when an alarm fires")
        watched = [named(a.get("Name"))[1] for a in props.get("AlarmConfiguration", {}).get("Alarms", [])]
        if not props.get("AlarmConfiguration", {}).get("Enabled"):
            watched = []
        fname = functions[fn].get("Properties", {}).get("FunctionName")
        own = [a for a in watched if a in alarms and watches(alarms[a], fn, fname)]
        if not own:
            problems.append(f"{group} watches no alarm of {fn}'s failures ({', '.join(map(str, watched)) or 'none'})")
        missing = [a for a in watched if a not in alarms]
        if missing:
            problems.append(f"{group} watches alarms this shape does not have: {', '.join(map(str, missing))}")
    return problems


def watches(alarm, fn, fname):
    """An alarm on the function's failures: its AWS/Lambda Errors (by function name), or a
    metric of the stack's own (any namespace but AWS's) or of the API that invokes it."""
    props = alarm.get("Properties", {})
    namespace = props.get("Namespace", "")
    if namespace == "AWS/Lambda":
        dims = {d.get("Name"): d.get("Value") for d in props.get("Dimensions", [])}
        value = dims.get("FunctionName")
        return props.get("MetricName") == "Errors" and (value == fname or named(value)[1] == fn)
    return not namespace.startswith("AWS/") or namespace == "AWS/ApiGateway"


def good_template():
    def alarm(namespace, metric, dims):
        return {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "Namespace": namespace, "MetricName": metric, "Dimensions": dims}}
    return {"Parameters": {"Pace": {"Type": "Number", "MaxValue": 100}, "Mode": {"Type": "String", "AllowedValues": ["a", "bb"]},
                           REVISION: {"Type": "Number", "MaxValue": 999999},
                           "Url": {"Type": "String"}, "Reserved": {"Type": "Number"}},
            "Resources": {
        "Fn": {"Type": "AWS::Lambda::Function", "Properties": {
            "FunctionName": "fn", "ReservedConcurrentExecutions": {"Ref": "Reserved"},
            "Environment": {"Variables": {"PACE": {"Ref": "Pace"}, "MODE": {"Fn::Sub": "${Mode}"}, "URL": {"Ref": "Url"},
                                          "REVISION": {"Ref": REVISION}}}}},
        "FnVersion": {"Type": "AWS::Lambda::Version", "Properties": {
            "FunctionName": {"Ref": "Fn"}, "Description": {"Fn::Sub": "parameters ${ConfigRevision} ${Pace} ${Mode}"}}},
        "FnAliaslive": {"Type": "AWS::Lambda::Alias", "Properties": {"FunctionName": {"Ref": "Fn"}},
                        "UpdatePolicy": {"CodeDeployLambdaAliasUpdate": {"DeploymentGroupName": {"Ref": "Group"}}}},
        "Group": {"Type": "AWS::CodeDeploy::DeploymentGroup", "Properties": {
            "AlarmConfiguration": {"Enabled": True, "Alarms": [{"Name": {"Ref": "Errors"}}]},
            "AutoRollbackConfiguration": {"Enabled": True, "Events": ["DEPLOYMENT_FAILURE", "DEPLOYMENT_STOP_ON_ALARM"]}}},
        "App": {"Type": "AWS::CodeDeploy::Application"},
        "Errors": alarm("AWS/Lambda", "Errors", [{"Name": "FunctionName", "Value": {"Ref": "Fn"}}]),
        "Other": alarm("AWS/Lambda", "Errors", [{"Name": "FunctionName", "Value": "other"}]),
        "Map": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {"FunctionName": {"Ref": "FnAliaslive"}}},
        "Perm": {"Type": "AWS::Lambda::Permission", "Properties": {"FunctionName": {"Ref": "FnAliaslive"}}},
        "Int": {"Type": "AWS::ApiGatewayV2::Integration", "Properties": {"IntegrationUri": {"Ref": "FnAliaslive"}}},
        "Rule": {"Type": "AWS::Events::Rule", "Properties": {"Targets": [{"Arn": {"Ref": "FnAliaslive"}}]}},
    }}


def self_test():
    assert check(good_template(), True) == [], check(good_template(), True)
    at_once = copy.deepcopy(good_template())
    for n in ("Group", "App"):
        del at_once["Resources"][n]
    assert check(at_once, False) == [], check(at_once, False)
    r = lambda t: t["Resources"]  # noqa: E731
    breaks = {
        "no alias": (lambda t: [r(t).pop("FnAliaslive"), r(t)["Map"]["Properties"].update(FunctionName={"Ref": "X"})], True),
        "a mapping on the function": (lambda t: r(t)["Map"]["Properties"].update(FunctionName={"Ref": "Fn"}), True),
        "a route on $LATEST": (lambda t: r(t)["Int"]["Properties"].update(IntegrationUri={"Fn::GetAtt": ["Fn", "Arn"]}), True),
        "a schedule on $LATEST": (lambda t: r(t)["Rule"]["Properties"]["Targets"][0].update(Arn={"Fn::GetAtt": "Fn.Arn"}), True),
        "a permission on the function": (lambda t: r(t)["Perm"]["Properties"].update(FunctionName={"Ref": "Fn"}), False),
        "moved at once": (lambda t: r(t)["FnAliaslive"].pop("UpdatePolicy"), True),
        "no rollback on alarm": (lambda t: r(t)["Group"]["Properties"]["AutoRollbackConfiguration"].update(
            Events=["DEPLOYMENT_FAILURE"]), True),
        "alarms off": (lambda t: r(t)["Group"]["Properties"]["AlarmConfiguration"].update(Enabled=False), True),
        "another function's alarm": (lambda t: r(t)["Group"]["Properties"]["AlarmConfiguration"].update(
            Alarms=[{"Name": {"Ref": "Other"}}]), True),
        "an alarm the shape lacks": (lambda t: r(t)["Group"]["Properties"]["AlarmConfiguration"]["Alarms"].append(
            {"Name": {"Ref": "Gone"}}), True),
        "CodeDeploy without GradualDeployment": (lambda t: None, False),
        "a parameter the version does not follow": (lambda t: r(t)["FnVersion"]["Properties"].update(
            Description={"Fn::Sub": "parameters ${ConfigRevision} ${Pace}"}), True),
        "no revision to raise": (lambda t: r(t)["FnVersion"]["Properties"].update(
            Description={"Fn::Sub": "parameters ${Pace} ${Mode}"}), True),
        "no description at all": (lambda t: r(t)["FnVersion"]["Properties"].pop("Description"), True),
        "an unbounded parameter in it": (lambda t: r(t)["FnVersion"]["Properties"].update(
            Description={"Fn::Sub": "parameters ${ConfigRevision} ${Pace} ${Mode} ${Url}"}), True),
        "a revision the function does not read": (lambda t: r(t)["Fn"]["Properties"]["Environment"]["Variables"].pop(
            "REVISION"), True),
        "a description that can outgrow 256": (lambda t: t["Parameters"]["Mode"].update(AllowedValues=["x" * 250]), True),
    }
    for what, (breaking, gradual) in breaks.items():
        t = copy.deepcopy(good_template() if gradual or what.startswith("CodeDeploy") else at_once)
        breaking(t)
        assert len(check(t, gradual)) == 1, f"{what}: {check(t, gradual)}"
    print(f"deployment self-test: {len(breaks)} bad templates refused, the good ones pass")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    mode = sys.argv[2]
    assert mode in ("gradual", "at-once"), mode
    shape = json.load(open(sys.argv[1], encoding="utf-8"))
    found = check(shape, mode == "gradual")
    for p in found:
        print(p, file=sys.stderr)
    if found:
        sys.exit(1)
    left = sorted(version_descriptions(shape)[1])
    print(f"deployment ({mode}): every function behind its alias, everything invoking the alias, each version "
          f"published again when a parameter its configuration reads or {REVISION} changes (unbounded, "
          f"published by raising {REVISION}: {', '.join(left) or 'none'})"
          + (", each alias shifted by CodeDeploy and rolled back on its function's alarms" if mode == "gradual"
             else ", no CodeDeploy resource"))
