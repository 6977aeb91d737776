#!/usr/bin/env python3
"""Nothing the stack keeps is left unreadable, checked on one shape of the transformed template
(shape.py):

- a resource kept when the stack is deleted (DeletionPolicy Retain, Snapshot or
  RetainExceptOnCreate) is kept when an update replaces it too (UpdateReplacePolicy Retain or
  Snapshot): the ledger is not lost to a changed property either, nor a function's version (a
  rollback's target) to a parameter change that replaces it;
- every KMS key a kept resource names (by Ref, GetAtt or Sub, directly or through a KMS alias)
  is itself kept on delete and on replacement: a deleted stack would otherwise schedule the
  deletion of the key its kept tables are encrypted with, and after the waiting period (7 to 30
  days) they could never be read again.

Usage: retention.py SHAPE_JSON; retention.py --self-test
"""
import json
import re
import sys

KEPT = {"Retain", "Snapshot", "RetainExceptOnCreate"}
KEY_TYPES = {"AWS::KMS::Key", "AWS::KMS::ReplicaKey"}


def names(value):
    """Every resource or parameter name a value refers to (Ref, GetAtt, Sub)."""
    found = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref" and isinstance(v, str):
                found.add(v)
            elif k == "Fn::GetAtt":
                target = v[0] if isinstance(v, list) else str(v).split(".")[0]
                found.add(target)
            elif k == "Fn::Sub":
                text = v[0] if isinstance(v, list) else v
                if isinstance(text, str):
                    found |= {m.split(".")[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", text)}
                found |= names(v[1] if isinstance(v, list) and len(v) > 1 else None)
            else:
                found |= names(v)
    elif isinstance(value, list):
        for v in value:
            found |= names(v)
    return found


def keys_named(resources, value):
    """The stack's KMS keys a value names, directly or through an alias of the stack."""
    out = set()
    for n in names(value):
        kind = resources.get(n, {}).get("Type")
        if kind in KEY_TYPES:
            out.add(n)
        elif kind == "AWS::KMS::Alias":
            out |= {k for k in names(resources[n].get("Properties", {}).get("TargetKeyId"))
                    if resources.get(k, {}).get("Type") in KEY_TYPES}
    return out


def check(template):
    problems = []
    resources = template.get("Resources", {})
    kept = {n: r for n, r in resources.items() if r.get("DeletionPolicy") in KEPT}
    for name, r in sorted(kept.items()):
        if r.get("UpdateReplacePolicy") not in ("Retain", "Snapshot"):
            problems.append(f"{name} is kept when the stack is deleted but not when an update replaces it (UpdateReplacePolicy: Retain)")
        for key in sorted(keys_named(resources, r.get("Properties", {}))):
            k = resources[key]
            if k.get("DeletionPolicy") != "Retain" or k.get("UpdateReplacePolicy") != "Retain":
                problems.append(
                    f"{name} is kept when the stack is deleted, but {key}, the key that encrypts it, is not "
                    f"(DeletionPolicy {k.get('DeletionPolicy', 'Delete')}, UpdateReplacePolicy "
                    f"{k.get('UpdateReplacePolicy', 'Delete')}; both must be Retain): deleting the stack "
                    f"would schedule the key's deletion and leave {name} unreadable")
    if not kept:
        problems.append("no resource is kept when the stack is deleted: the tables hold the ledger")
    return problems


def self_test():
    def template(key_policy="Retain", key_replace="Retain", table_replace="Retain", via_alias=False):
        key = {"Type": "AWS::KMS::Key", "Properties": {}}
        if key_policy:
            key["DeletionPolicy"] = key_policy
        if key_replace:
            key["UpdateReplacePolicy"] = key_replace
        ref = {"Ref": "Alias"} if via_alias else {"Ref": "Key"}
        table = {"Type": "AWS::DynamoDB::Table", "DeletionPolicy": "Retain",
                 "Properties": {"SSESpecification": {"SSEEnabled": True, "SSEType": "KMS", "KMSMasterKeyId": ref}}}
        if table_replace:
            table["UpdateReplacePolicy"] = table_replace
        return {"Resources": {
            "Key": key, "Alias": {"Type": "AWS::KMS::Alias", "Properties": {"TargetKeyId": {"Fn::GetAtt": ["Key", "Arn"]}}},
            "Table": table,
            # A queue deleted with the stack may use a key that goes with it.
            "Queue": {"Type": "AWS::SQS::Queue", "Properties": {"KmsMasterKeyId": {"Ref": "Other"}}},
            "Other": {"Type": "AWS::KMS::Key", "Properties": {}}}}
    assert check(template()) == [], check(template())
    assert check(template(via_alias=True)) == []
    assert len(check(template(key_policy=None))) == 1  # the key deleted with the stack
    assert len(check(template(key_replace=None))) == 2  # the key deleted when replaced (and a kept resource)
    assert len(check(template(key_policy=None, via_alias=True))) == 1  # through an alias
    assert len(check(template(table_replace=None))) == 1  # the table lost to a replacement
    sub = template(key_policy=None)
    sub["Resources"]["Table"]["Properties"]["SSESpecification"]["KMSMasterKeyId"] = {"Fn::Sub": "${Key.Arn}"}
    assert len(check(sub)) == 1  # named by Sub
    assert len(check({"Resources": {}})) == 1  # nothing kept at all
    versioned = template()
    versioned["Resources"]["Version"] = {"Type": "AWS::Lambda::Version", "DeletionPolicy": "Retain",
                                         "Properties": {"FunctionName": {"Ref": "Fn"}}}
    assert len(check(versioned)) == 1  # a version a parameter change replaces, then deleted
    versioned["Resources"]["Version"]["UpdateReplacePolicy"] = "Retain"
    assert check(versioned) == [], check(versioned)
    print("retention self-test: 10 cases ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    found = check(json.load(open(sys.argv[1], encoding="utf-8")))
    for p in found:
        print(p, file=sys.stderr)
    if found:
        sys.exit(1)
    print("what the stack keeps on delete it keeps on replacement, and so are the keys that encrypt it")
