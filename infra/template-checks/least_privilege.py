"""Least privilege, checked on the SAM-transformed template: what SAM adds is in it too.

Fails on:
- a managed policy on a role other than the logs and tracing ones (a managed policy's actions
  cannot be read offline; SAM's event sources attach AWSLambdaSQSQueueExecutionRole and
  AWSLambdaDynamoDBExecutionRole, whose SQS and DynamoDB actions apply to every resource), but
  for AWSCodeDeployRoleForLambda on a role only CodeDeploy assumes (the gradual deployment's
  service role: it moves the functions' aliases and reads their alarms, no data);
- an allowed SQS, DynamoDB or KMS action (or `*`) on a wildcard resource in a role's inline
  policies or a stand-alone IAM policy;
- a KMS key policy statement granting an AWS service without a source condition
  (`aws:SourceAccount`, `aws:SourceArn` or a `kms:EncryptionContext:` key): no confused deputy;
- a dead-letter queue (a queue some RedrivePolicy names) without a `byQueue` RedriveAllowPolicy;
- an event source mapping whose function's role cannot poll its source (SQS: receive, delete,
  attributes; a DynamoDB stream: describe, records, iterator, list), on that source itself;
- a queue whose policy does not refuse sqs:SendMessage to every principal but those it names
  (a Deny on `*` unless `aws:PrincipalArn` is one named, or `aws:SourceArn` the rule's), or
  that refuses a role of the stack its inline policy lets send there (the function could not);
- a key policy statement that lets one principal both administer the key and use it
  (`kms:*`, or an administrative action beside an encrypting one).

`--self-test` runs the check on small templates that break each rule, and on one that breaks
none, so that a check that can no longer fail fails here.
"""
import copy
import json
import sys

from shape import function_behind

ALLOWED_MANAGED = {"AWSLambdaBasicExecutionRole", "AWSXrayWriteOnlyAccess"}
CODEDEPLOY_MANAGED = "AWSCodeDeployRoleForLambda"
GUARDED_PREFIXES = ("sqs:", "dynamodb:", "kms:")
SOURCE_CONDITIONS = ("aws:sourceaccount", "aws:sourcearn", "kms:encryptioncontext:")
POLL_ACTIONS = {
    "sqs": {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"},
    "stream": {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator",
               "dynamodb:ListStreams"},
}


def as_list(v):
    if v is None:
        return []
    return v if isinstance(v, list) else [v]


def managed_name(arn):
    """The policy name of a managed policy ARN, plain or built with Fn::Sub / Fn::Join."""
    if isinstance(arn, dict):
        arn = json.dumps(arn)
    return str(arn).rstrip('"]}').rsplit("/", 1)[-1]


def wildcard(resource):
    if resource == "*":
        return True
    if isinstance(resource, str) and resource.startswith("arn:"):
        parts = resource.split(":", 5)
        return len(parts) == 6 and parts[5] in ("*", "*/*")
    return False


def statements(document):
    return as_list((document or {}).get("Statement"))


def role_statements(role):
    props = role.get("Properties", {})
    for policy in as_list(props.get("Policies")):
        yield from statements(policy.get("PolicyDocument"))


def only_codedeploy_assumes(role):
    """True when the role's trust policy lets CodeDeploy, and nothing else, assume it."""
    trusts = statements(role.get("Properties", {}).get("AssumeRolePolicyDocument"))
    principals = [p for st in trusts if st.get("Effect") == "Allow"
                  for p in as_list((st.get("Principal") or {}).get("Service"))]
    other = [st for st in trusts if set(st.get("Principal") or {}) - {"Service"}]
    return principals == ["codedeploy.amazonaws.com"] and not other


KMS_USE = {"kms:encrypt", "kms:decrypt", "kms:reencrypt*", "kms:reencryptfrom", "kms:reencryptto",
           "kms:generatedatakey", "kms:generatedatakey*", "kms:generatedatakeywithoutplaintext"}


def getatts(value):
    """The logical ids a value's Fn::GetAtt name, however nested (Fn::If, Fn::Join, Fn::Split)."""
    if isinstance(value, dict):
        if "Fn::GetAtt" in value:
            return {as_list(value["Fn::GetAtt"])[0].split(".")[0]}
        return set().union(*(getatts(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(getatts(v) for v in value)) if value else set()
    return set()


def queue_of(resource):
    ids = getatts(resource)
    return next(iter(ids)) if len(ids) == 1 else None


def send_guards(resources):
    """Queue logical id → the principals (logical ids) its policy's send Deny lets through, and
    whether that Deny lets a rule (aws:SourceArn) through."""
    guards = {}
    for res in resources.values():
        if res.get("Type") != "AWS::SQS::QueuePolicy":
            continue
        for st in statements(res.get("Properties", {}).get("PolicyDocument")):
            if not isinstance(st, dict) or st.get("Effect") != "Deny" or st.get("Principal") != "*":
                continue
            if "sqs:SendMessage" not in as_list(st.get("Action")):
                continue
            condition = st.get("Condition") or {}
            named = (condition.get("ArnNotLike") or {}).get("aws:PrincipalArn")
            rule = (condition.get("ArnNotEquals") or {}).get("aws:SourceArn")
            if named is None and rule is None:
                continue
            for queue in filter(None, (queue_of(r) for r in as_list(st.get("Resource")))):
                guards[queue] = (getatts(named) if named is not None else set(), rule is not None)
    return guards


def check(template):
    problems = []
    resources = template.get("Resources", {})
    guards = send_guards(resources)
    for name, res in resources.items():
        if res.get("Type") == "AWS::SQS::Queue" and name not in guards:
            problems.append(f"{name}: its policy does not refuse sqs:SendMessage to principals it does not name")
    for name, res in resources.items():
        if res.get("Type") != "AWS::IAM::Role":
            continue
        for st in role_statements(res):
            if st.get("Effect") != "Allow" or "sqs:SendMessage" not in as_list(st.get("Action")):
                continue
            for queue in filter(None, (queue_of(r) for r in as_list(st.get("Resource")))):
                if queue in guards and name not in guards[queue][0]:
                    problems.append(f"{queue}: its policy refuses {name}, which the stack lets send there")
    for name, res in resources.items():
        kind, props = res.get("Type"), res.get("Properties", {})
        if kind == "AWS::IAM::Role":
            for arn in as_list(props.get("ManagedPolicyArns")):
                if managed_name(arn) == CODEDEPLOY_MANAGED and only_codedeploy_assumes(res):
                    continue
                if managed_name(arn) not in ALLOWED_MANAGED:
                    problems.append(f"{name}: managed policy {managed_name(arn)} (its actions cannot be "
                                    "checked here; SAM's event-source policies act on every queue or stream)")
        docs = []
        if kind == "AWS::IAM::Role":
            docs = list(role_statements(res))
        elif kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            docs = statements(props.get("PolicyDocument"))
        for st in docs:
            if st.get("Effect") != "Allow":
                continue
            actions = [a for a in as_list(st.get("Action")) if isinstance(a, str)]
            guarded = [a for a in actions if a == "*" or a.lower().startswith(GUARDED_PREFIXES)]
            if guarded and any(wildcard(r) for r in as_list(st.get("Resource"))):
                problems.append(f"{name}: {', '.join(guarded)} on a wildcard resource ({st.get('Sid', 'no Sid')})")
        if kind == "AWS::KMS::Key":
            for st in statements(props.get("KeyPolicy")):
                if not isinstance(st, dict) or st.get("Effect") != "Allow":
                    continue
                actions = {a.lower() for a in as_list(st.get("Action")) if isinstance(a, str)}
                administers = {a for a in actions if a.split(":")[-1].startswith(
                    ("create", "put", "update", "delete", "disable", "enable", "schedule", "cancel",
                     "revoke", "tag", "untag", "rotate"))} - {"kms:creategrant"}
                if "kms:*" in actions or (administers and actions & KMS_USE):
                    problems.append(f"{name}: one key policy statement both administers and uses the key "
                                    f"({st.get('Sid', 'no Sid')})")
                principal = st.get("Principal")
                if not (isinstance(principal, dict) and "Service" in principal) or st.get("Effect") != "Allow":
                    continue
                keys = [k.lower() for cond in (st.get("Condition") or {}).values() if isinstance(cond, dict)
                        for k in cond]
                if not any(k.startswith(SOURCE_CONDITIONS) for k in keys):
                    problems.append(f"{name}: the key policy grants {json.dumps(principal['Service'])} "
                                    f"without a source condition ({st.get('Sid', 'no Sid')})")
    targets = {}
    for name, res in resources.items():
        policy = res.get("Properties", {}).get("RedrivePolicy")
        if res.get("Type") == "AWS::SQS::Queue" and isinstance(policy, dict):
            target = policy.get("deadLetterTargetArn")
            if isinstance(target, dict) and "Fn::GetAtt" in target:
                targets[as_list(target["Fn::GetAtt"])[0].split(".")[0]] = name
    for dlq, source in sorted(targets.items()):
        allow = resources.get(dlq, {}).get("Properties", {}).get("RedriveAllowPolicy")
        if not (isinstance(allow, dict) and allow.get("redrivePermission") == "byQueue"):
            problems.append(f"{dlq}: a dead-letter queue (of {source}) without a byQueue RedriveAllowPolicy")
    for name, res in resources.items():
        if res.get("Type") != "AWS::Lambda::EventSourceMapping":
            continue
        props = res.get("Properties", {})
        function = function_behind(resources, (props.get("FunctionName") or {}).get("Ref"))
        source = props.get("EventSourceArn")
        getatt = as_list((source or {}).get("Fn::GetAtt")) if isinstance(source, dict) else []
        kind = "stream" if getatt[1:2] == ["StreamArn"] else "sqs"
        role_arn = resources.get(function, {}).get("Properties", {}).get("Role")
        role = (role_arn or {}).get("Fn::GetAtt", [None])[0] if isinstance(role_arn, dict) else None
        granted = set()
        for st in role_statements(resources.get(role, {})):
            if st.get("Effect") == "Allow" and source in as_list(st.get("Resource")):
                granted.update(as_list(st.get("Action")))
        missing = POLL_ACTIONS[kind] - granted
        if missing:
            problems.append(f"{name}: {function}'s role lacks {', '.join(sorted(missing))} on its source")
    return problems


def good_template():
    role = {"Type": "AWS::IAM::Role", "Properties": {
        "ManagedPolicyArns": ["arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
        "Policies": [{"PolicyName": "p", "PolicyDocument": {"Statement": [
            {"Effect": "Allow", "Action": sorted(POLL_ACTIONS["sqs"]), "Resource": {"Fn::GetAtt": ["Q", "Arn"]}}]}}]}}
    return {"Resources": {
        "Dlq": {"Type": "AWS::SQS::Queue", "Properties": {
            "RedriveAllowPolicy": {"redrivePermission": "byQueue", "sourceQueueArns": ["arn:aws:sqs:r:1:q"]}}},
        "Q": {"Type": "AWS::SQS::Queue", "Properties": {
            "RedrivePolicy": {"deadLetterTargetArn": {"Fn::GetAtt": ["Dlq", "Arn"]}, "maxReceiveCount": 5}}},
        "FnRole": role,
        "Fn": {"Type": "AWS::Lambda::Function", "Properties": {"Role": {"Fn::GetAtt": ["FnRole", "Arn"]}}},
        "FnAliaslive": {"Type": "AWS::Lambda::Alias", "Properties": {"FunctionName": {"Ref": "Fn"}, "Name": "live"}},
        "Esm": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {
            "FunctionName": {"Ref": "FnAliaslive"}, "EventSourceArn": {"Fn::GetAtt": ["Q", "Arn"]}}},
        "CodeDeployServiceRole": {"Type": "AWS::IAM::Role", "Properties": {
            "AssumeRolePolicyDocument": {"Statement": [
                {"Effect": "Allow", "Action": ["sts:AssumeRole"], "Principal": {"Service": ["codedeploy.amazonaws.com"]}}]},
            "ManagedPolicyArns": ["arn:aws:iam::aws:policy/service-role/AWSCodeDeployRoleForLambda"]}},
        "Key": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Statement": [
            {"Effect": "Allow", "Principal": {"Service": "cloudwatch.amazonaws.com"}, "Action": "kms:Decrypt",
             "Resource": "*", "Condition": {"StringEquals": {"aws:SourceAccount": "1"}}},
            {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::1:root"},
             "Action": ["kms:Describe*", "kms:Put*", "kms:ScheduleKeyDeletion"], "Resource": "*"}]}}},
        "Policies": {"Type": "AWS::SQS::QueuePolicy", "Properties": {"PolicyDocument": {"Statement": [
            {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": {"Fn::GetAtt": ["Q", "Arn"]},
             "Condition": {"ArnNotLike": {"aws:PrincipalArn": {"Fn::Split": [",", {"Fn::Join": [",", [
                 {"Fn::GetAtt": ["FnRole", "Arn"]},
                 {"Fn::If": ["HasProducers", {"Fn::Join": [",", {"Ref": "Producers"}]},
                             {"Fn::GetAtt": ["FnRole", "Arn"]}]}]]}]}}}},
            {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
             "Resource": {"Fn::GetAtt": ["Dlq", "Arn"]},
             "Condition": {"ArnNotEquals": {"aws:SourceArn": "arn:aws:events:r:1:rule/b/r"}}}]}}},
    }}


def self_test():
    assert check(good_template()) == [], check(good_template())
    breaks = {
        "SAM's SQS policy": lambda t: t["Resources"]["FnRole"]["Properties"]["ManagedPolicyArns"].append(
            "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole"),
        "dynamodb on *": lambda t: t["Resources"]["FnRole"]["Properties"]["Policies"][0]["PolicyDocument"][
            "Statement"].append({"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*"}),
        "kms on an arn wildcard": lambda t: t["Resources"]["FnRole"]["Properties"]["Policies"][0]["PolicyDocument"][
            "Statement"].append({"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": "arn:aws:kms:r:1:*"}),
        "a service grant without a source condition": lambda t: t["Resources"]["Key"]["Properties"]["KeyPolicy"][
            "Statement"][0].pop("Condition"),
        "a DLQ anyone may use": lambda t: t["Resources"]["Dlq"]["Properties"].pop("RedriveAllowPolicy"),
        "CodeDeploy's policy on a role Lambda assumes too": lambda t: t["Resources"]["CodeDeployServiceRole"][
            "Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"].append(
            "lambda.amazonaws.com"),
        "a mapping its role cannot poll": lambda t: t["Resources"]["FnRole"]["Properties"]["Policies"][0][
            "PolicyDocument"]["Statement"][0]["Action"].remove("sqs:ReceiveMessage"),
        "a queue anyone of the account may send to": lambda t: t["Resources"]["Policies"]["Properties"][
            "PolicyDocument"]["Statement"].pop(1),
        "a role the stack lets send that the queue refuses": lambda t: t["Resources"]["FnRole"]["Properties"][
            "Policies"][0]["PolicyDocument"]["Statement"].append(
            {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": {"Fn::GetAtt": ["Dlq", "Arn"]}}),
        "a key its administrators may use": lambda t: t["Resources"]["Key"]["Properties"]["KeyPolicy"][
            "Statement"][1]["Action"].append("kms:Decrypt"),
        "the account's kms:*": lambda t: t["Resources"]["Key"]["Properties"]["KeyPolicy"]["Statement"][1].update(
            Action="kms:*"),
    }
    for what, breaking in breaks.items():
        t = copy.deepcopy(good_template())
        breaking(t)
        assert len(check(t)) == 1, f"{what}: {check(t)}"
    print(f"least privilege self-test: {len(breaks)} broken templates refused, the good one accepted")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    with open(sys.argv[1]) as f:
        template = json.load(f)
    problems = check(template)
    for p in problems:
        print(f"least privilege: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    roles = sum(1 for r in template.get("Resources", {}).values() if r.get("Type") == "AWS::IAM::Role")
    queues = sum(1 for r in template.get("Resources", {}).values() if r.get("Type") == "AWS::SQS::Queue")
    print(f"least privilege: {roles} roles, no managed policy beyond logs and tracing, no SQS, DynamoDB "
          f"or KMS action on a wildcard resource, every service grant conditioned, every DLQ byQueue, "
          f"each of {queues} queues refusing sends but from those it names (every role the stack lets "
          "send among them), the key's administrators apart from its users")


if __name__ == "__main__":
    main()
