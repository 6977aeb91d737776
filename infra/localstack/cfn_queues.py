#!/usr/bin/env python3
"""The template's queues through a CloudFormation endpoint (LocalStack's, in make
test-localstack): every AWS::SQS::Queue of template.yaml with what it depends on (the KMS key,
the dead-letter queues), the parameters at their defaults unless given, as one stack; then
each queue's attributes read back: its visibility timeout, retention, KMS key or SQS's own
encryption and redrive-allow policy as the template sets them, and each source queue's redrive
policy naming its dead-letter queue with the template's MaxReceiveCount. A queue the template
has that the stack did not create (its condition false under the parameters) is an error: give
the parameters that create every queue. Deletes the stack after.

Usage: cfn_queues.py TEMPLATE [--param NAME=VALUE ...]
       (the endpoint from AWS_ENDPOINT_URL_CLOUDFORMATION / _SQS)
"""
import argparse
import json
import os
import sys
import time
import uuid

import boto3
from botocore.exceptions import WaiterError
import yaml


class Loader(yaml.SafeLoader):
    pass


def tag(name):
    def construct(loader, node):
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
            if name == "Fn::GetAtt":
                value = value.split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)
        return {name: value}
    return construct


for short in ["Ref", "GetAtt", "Sub", "If", "Equals", "Not", "And", "Or", "Join", "Select", "Split",
              "FindInMap", "GetAZs", "ImportValue", "Condition", "Base64", "Cidr"]:
    Loader.add_constructor(f"!{short}", tag("Ref" if short == "Ref" else
                                            "Condition" if short == "Condition" else f"Fn::{short}"))


def refs(value):
    """The resources a value names (Ref, GetAtt, ${X} in Sub)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref" and isinstance(v, str):
                yield v
            elif k == "Fn::GetAtt":
                yield v[0]
            elif k == "Fn::Sub":
                text = v if isinstance(v, str) else v[0]
                import re
                for m in re.findall(r"\$\{([A-Za-z0-9]+)", text):
                    yield m
                if not isinstance(v, str):
                    yield from refs(v[1])
            else:
                yield from refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from refs(v)


def condition_names(value):
    """The conditions a value names (a resource's Condition, Fn::If, Condition in a condition)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Condition" and isinstance(v, str):
                yield v
            elif k == "Fn::If":
                yield v[0]
                yield from condition_names(v[1:])
            else:
                yield from condition_names(v)
    elif isinstance(value, list):
        for v in value:
            yield from condition_names(v)


def substitute(value, arn, stack):
    """A value with each Fn::Sub of pseudo parameters written out (partition, region and
    account from a queue ARN of the stack)."""
    if isinstance(value, dict):
        if list(value) == ["Fn::Sub"] and isinstance(value["Fn::Sub"], str):
            _, partition, _, region, account, _ = arn.split(":", 5)
            text = value["Fn::Sub"]
            for k, v in {"AWS::Partition": partition, "AWS::Region": region,
                         "AWS::AccountId": account, "AWS::StackName": stack}.items():
                text = text.replace("${" + k + "}", v)
            return text
        return {k: substitute(v, arn, stack) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, arn, stack) for v in value]
    return value


def delete(cfn, name):
    """Deletes the stack and waits for it to be gone (boto3's waiter: a stack that no longer
    exists counts as deleted, DELETE_FAILED as an error): LocalStack's runtime, stopped while a
    deletion is still running, may never exit (seen with localstack-core 2026.3)."""
    cfn.delete_stack(StackName=name)
    try:
        cfn.get_waiter("stack_delete_complete").wait(
            StackName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    except WaiterError as e:
        sys.exit(f"cfn_queues: deleting {name}: {e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("template")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a parameter's value for the stack (repeatable)")
    args = parser.parse_args()
    template = yaml.load(open(args.template), Loader=Loader)
    given = {}
    for p in args.param:
        key, sep, value = p.partition("=")
        if not sep or not key:
            sys.exit(f"cfn_queues: --param {p!r} is not NAME=VALUE")
        given[key] = value
    resources = template["Resources"]
    keep = {n for n, r in resources.items() if r["Type"] == "AWS::SQS::Queue"}
    todo = list(keep)
    while todo:
        for dep in refs(resources[todo.pop()]):
            if dep in resources and dep not in keep:
                keep.add(dep)
                todo.append(dep)
    params = template.get("Parameters", {})
    conditions = template.get("Conditions", {})
    # The conditions and parameters those resources use, and those the conditions use.
    used_conditions = set()
    todo = [resources[n] for n in keep]
    while todo:
        value = todo.pop()
        for c in condition_names(value):
            if c in conditions and c not in used_conditions:
                used_conditions.add(c)
                todo.append(conditions[c])
    named = set()
    for v in [resources[n] for n in keep] + [conditions[c] for c in used_conditions]:
        named.update(refs(v))
    body = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": {p: params[p] for p in sorted(named) if p in params},
        "Conditions": {c: conditions[c] for c in sorted(used_conditions)},
        "Resources": {n: resources[n] for n in sorted(keep)},
    }
    if not body["Conditions"]:
        del body["Conditions"]
    unknown = sorted(set(given) - set(params))
    if unknown:
        sys.exit(f"cfn_queues: the template has no parameter {', '.join(unknown)}")
    # A value for a parameter the queues do not use changes nothing: leave it out.
    values = {p: given[p] for p in given if p in body["Parameters"]}
    for p, value in values.items():
        if "AllowedValues" in params[p] and value not in [str(v) for v in params[p]["AllowedValues"]]:
            sys.exit(f"cfn_queues: {p}={value} is not among {params[p]['AllowedValues']}")

    def value_of(v):
        """A property's value: a Ref to a parameter is the value given, else its default."""
        if isinstance(v, dict) and "Ref" in v:
            return values.get(v["Ref"], params[v["Ref"]]["Default"])
        return v
    cfn = boto3.client("cloudformation")
    sqs = boto3.client("sqs")
    name = f"lsq-{uuid.uuid4().hex[:8]}"
    cfn.create_stack(StackName=name, TemplateBody=json.dumps(body),
                     Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in sorted(values.items())])
    deadline = time.time() + 120
    while True:
        status = cfn.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
        if status.endswith("_COMPLETE") or status.endswith("_FAILED"):
            break
        if time.time() > deadline:
            sys.exit(f"cfn_queues: {name} still {status} after 120 s")
        time.sleep(1)
    if status != "CREATE_COMPLETE":
        events = cfn.describe_stack_events(StackName=name)["StackEvents"]
        reasons = [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events
                   if e.get("ResourceStatus", "").endswith("FAILED")]
        sys.exit(f"cfn_queues: {name} ended {status}: {reasons}")
    physical = {r["LogicalResourceId"]: r["PhysicalResourceId"]
                for r in cfn.describe_stack_resources(StackName=name)["StackResources"]}
    problems, checked = [], 0
    queues = sorted(n for n in keep if resources[n]["Type"] == "AWS::SQS::Queue")
    arns = {}
    missing = [q for q in queues if q not in physical]
    if missing:
        # Said before the deletion, which could fail on its own.
        print("cfn_queues: the stack did not create " + ", ".join(
            f"{q} (condition {resources[q].get('Condition')})" for q in missing)
            + f" under {values or 'the defaults'}: give the parameters (--param) that create every queue",
            file=sys.stderr)
        delete(cfn, name)
        sys.exit(1)
    for q in queues:
        url = physical[q]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        arns[q] = attrs["QueueArn"]
    for q in queues:
        props = resources[q].get("Properties", {})
        attrs = sqs.get_queue_attributes(QueueUrl=physical[q], AttributeNames=["All"])["Attributes"]
        want_visibility = value_of(props.get("VisibilityTimeout"))
        if want_visibility is not None and int(attrs.get("VisibilityTimeout", -1)) != int(want_visibility):
            problems.append(f"{q}: VisibilityTimeout {attrs.get('VisibilityTimeout')}, the template sets {want_visibility}")
        if "MessageRetentionPeriod" in props and int(attrs["MessageRetentionPeriod"]) != int(props["MessageRetentionPeriod"]):
            problems.append(f"{q}: MessageRetentionPeriod {attrs['MessageRetentionPeriod']}, the template sets {props['MessageRetentionPeriod']}")
        if "KmsMasterKeyId" in props and not attrs.get("KmsMasterKeyId"):
            problems.append(f"{q}: no KmsMasterKeyId, the template sets one")
        if props.get("SqsManagedSseEnabled") is True and attrs.get("SqsManagedSseEnabled") != "true":
            problems.append(f"{q}: SqsManagedSseEnabled {attrs.get('SqsManagedSseEnabled')}, the template sets true")
        allow = substitute(props.get("RedriveAllowPolicy"), arns[q], name)
        if allow is not None and json.loads(attrs.get("RedriveAllowPolicy", "{}")) != allow:
            problems.append(f"{q}: RedriveAllowPolicy {attrs.get('RedriveAllowPolicy')}, the template sets {allow}")
        redrive = props.get("RedrivePolicy")
        if redrive:
            dlq = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
            count = value_of(redrive["maxReceiveCount"])
            got = json.loads(attrs.get("RedrivePolicy", "{}"))
            if got.get("deadLetterTargetArn") != arns[dlq] or int(got.get("maxReceiveCount", -1)) != int(count):
                problems.append(f"{q}: RedrivePolicy {got}, the template names {dlq} ({arns[dlq]}) after {count}")
        checked += 1
    delete(cfn, name)
    for p in problems:
        print(f"cfn_queues: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"cfn_queues: CloudFormation created the template's {checked} queues ({', '.join(queues)}) "
          f"with {len(keep) - checked} resource(s) they depend on, under {values or 'the defaults'}; "
          "each queue's attributes and redrive policy are the template's")


if __name__ == "__main__":
    main()
