#!/usr/bin/env python3
"""One shape of a (SAM-transformed) template: the template as CloudFormation would deploy it
for some parameter values, so that the offline checks read each shape the template can take.

- the Conditions are evaluated (Fn::Equals, Fn::Not, Fn::And, Fn::Or, Fn::Join, Condition, Ref of a
  parameter: its given value, else its default);
- a resource or an output whose Condition is false is left out;
- every Fn::If is replaced by the branch its condition picks, and AWS::NoValue removes the
  key or the list item that holds it;
- a value outside the parameter's AllowedValues or AllowedPattern is refused, and the Rules are
  asserted: a shape whose parameters a rule refuses is refused here too (CloudFormation refuses
  to create it), naming the rule's AssertDescription.

Usage: shape.py TEMPLATE_JSON OUT_JSON [Name=Value ...]; shape.py --self-test
"""
import copy
import json
import re
import sys

NO_VALUE = object()


class Refused(Exception):
    pass


def function_behind(resources, ref):
    """The function a mapping, a route or a rule invokes by `ref`: that function, or the
    function of the alias (SAM's AutoPublishAlias) it names."""
    res = resources.get(ref, {})
    if res.get("Type") == "AWS::Lambda::Alias":
        return (res.get("Properties", {}).get("FunctionName") or {}).get("Ref")
    return ref


def parameter_values(template, given):
    values = {}
    for name, p in template.get("Parameters", {}).items():
        if name in given:
            values[name] = given[name]
        elif "Default" in p:
            values[name] = str(p["Default"])
    unknown = set(given) - set(template.get("Parameters", {}))
    if unknown:
        raise Refused(f"no such parameter: {', '.join(sorted(unknown))}")
    for name, value in given.items():
        p = template["Parameters"][name]
        if "AllowedValues" in p and value not in [str(v) for v in p["AllowedValues"]]:
            raise Refused(f"{name}={value} is not one of {p['AllowedValues']}")
        if "AllowedPattern" in p and not re.fullmatch(p["AllowedPattern"], value):
            raise Refused(f"{name}={value} does not match {p['AllowedPattern']}")
    return values


def evaluate(expr, values, conditions, template):
    """The truth or the value of a condition expression."""
    if isinstance(expr, dict) and len(expr) == 1:
        (fn, arg), = expr.items()
        if fn == "Fn::Equals":
            a, b = (evaluate(x, values, conditions, template) for x in arg)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not evaluate(arg[0], values, conditions, template)
        if fn == "Fn::And":
            return all(evaluate(x, values, conditions, template) for x in arg)
        if fn == "Fn::Or":
            return any(evaluate(x, values, conditions, template) for x in arg)
        if fn == "Condition":
            return condition(arg, values, conditions, template)
        if fn == "Fn::Join":
            # Of a list, or of a CommaDelimitedList parameter (its value as given: "a,b").
            sep, items = arg
            if isinstance(items, dict):
                items = str(evaluate(items, values, conditions, template)).split(",")
            return sep.join(str(evaluate(x, values, conditions, template)) for x in items)
        if fn == "Ref":
            if arg not in values:
                raise Refused(f"the condition needs the parameter {arg}, which has no value")
            return values[arg]
    if isinstance(expr, (str, int, float, bool)):
        return expr
    raise Refused(f"cannot evaluate {json.dumps(expr)} offline")


def condition(name, values, conditions, template):
    if name not in conditions:
        expr = template.get("Conditions", {}).get(name)
        if expr is None:
            raise Refused(f"no such condition: {name}")
        conditions[name] = bool(evaluate(expr, values, conditions, template))
    return conditions[name]


def pick(node, values, conditions, template):
    """node with every Fn::If resolved; NO_VALUE where AWS::NoValue was picked."""
    if isinstance(node, dict):
        if len(node) == 1 and "Fn::If" in node:
            name, yes, no = node["Fn::If"]
            branch = yes if condition(name, values, conditions, template) else no
            return pick(branch, values, conditions, template)
        if node == {"Ref": "AWS::NoValue"}:
            return NO_VALUE
        out = {}
        for k, v in node.items():
            v = pick(v, values, conditions, template)
            if v is not NO_VALUE:
                out[k] = v
        return out
    if isinstance(node, list):
        out = [pick(v, values, conditions, template) for v in node]
        return [v for v in out if v is not NO_VALUE]
    return node


def shape(template, given):
    values = parameter_values(template, given)
    conditions = {}
    for name, rule in template.get("Rules", {}).items():
        applies = rule.get("RuleCondition")
        if applies is not None and not evaluate(applies, values, conditions, template):
            continue
        for a in rule.get("Assertions", []):
            if not evaluate(a["Assert"], values, conditions, template):
                raise Refused(f"rule {name}: {a.get('AssertDescription', 'assertion failed')}")
    out = copy.deepcopy(template)
    for section in ("Resources", "Outputs"):
        kept = {}
        for name, r in template.get(section, {}).items():
            c = r.get("Condition")
            if c is not None and not condition(c, values, conditions, template):
                continue
            r = pick({k: v for k, v in r.items() if k != "Condition"}, values, conditions, template)
            kept[name] = r
        out[section] = kept
    for name, p in out.get("Parameters", {}).items():
        if name in given:
            p["Default"] = given[name]
    out.pop("Rules", None)
    out.pop("Conditions", None)
    return out


def self_test():
    t = {
        "Parameters": {"Mode": {"Type": "String", "Default": "a"}, "Name": {"Type": "String", "Default": ""}},
        "Conditions": {"IsB": {"Fn::Equals": [{"Ref": "Mode"}, "b"]},
                       "NotB": {"Fn::Not": [{"Condition": "IsB"}]}},
        "Rules": {"BNeedsName": {"RuleCondition": {"Fn::Equals": [{"Ref": "Mode"}, "b"]},
                                 "Assertions": [{"Assert": {"Fn::Not": [{"Fn::Equals": [{"Ref": "Name"}, ""]}]},
                                                 "AssertDescription": "b needs Name"}]}},
        "Resources": {
            "OnlyB": {"Type": "X", "Condition": "IsB"},
            "Always": {"Type": "Y", "Properties": {
                "List": ["keep", {"Fn::If": ["IsB", "b-item", {"Ref": "AWS::NoValue"}]}],
                "Key": {"Fn::If": ["NotB", {"Ref": "AWS::NoValue"}, "b-key"]}}}},
        "Outputs": {"Out": {"Condition": "IsB", "Value": "x"}},
    }
    a = shape(t, {})
    assert set(a["Resources"]) == {"Always"} and a["Outputs"] == {}, a
    assert a["Resources"]["Always"]["Properties"] == {"List": ["keep"]}, a
    b = shape(t, {"Mode": "b", "Name": "n"})
    assert set(b["Resources"]) == {"OnlyB", "Always"} and "Condition" not in b["Resources"]["OnlyB"], b
    assert b["Resources"]["Always"]["Properties"] == {"List": ["keep", "b-item"], "Key": "b-key"}, b
    try:
        shape(t, {"Mode": "b"})
        raise AssertionError("a shape its rule refuses was accepted")
    except Refused as e:
        assert "b needs Name" in str(e), e
    try:
        shape(t, {"Moed": "b"})
        raise AssertionError("an unknown parameter was accepted")
    except Refused as e:
        assert "Moed" in str(e)
    t["Parameters"]["Mode"]["AllowedValues"] = ["a", "b"]
    t["Parameters"]["Name"]["AllowedPattern"] = "^$|^n[0-9]*$"
    for given, why in (({"Mode": "B", "Name": "n"}, "not one of"), ({"Mode": "b", "Name": "x"}, "does not match")):
        try:
            shape(t, given)
            raise AssertionError(f"{given} was accepted")
        except Refused as e:
            assert why in str(e), e
    assert set(shape(t, {"Mode": "b", "Name": "n1"})["Resources"]) == {"OnlyB", "Always"}
    print("shape.py self-test: 7 cases ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    template = json.load(open(sys.argv[1], encoding="utf-8"))
    given = dict(a.split("=", 1) for a in sys.argv[3:])
    try:
        out = shape(template, given)
    except Refused as e:
        print(f"shape: {e}", file=sys.stderr)
        sys.exit(1)
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), indent=1)
    print(f"shape {' '.join(sys.argv[3:]) or '(defaults)'}: {len(out['Resources'])} resources")


if __name__ == "__main__":
    main()
