"""Local-deploy helpers for make e2e-sam, run against the emulator (AWS_ENDPOINT_URL):

  secret NAME VALUE        create (or update) a Secrets Manager secret, print its ARN
  outputs STACK            print the stack's outputs as KEY=VALUE lines
  invoke FUNCTION JSON     invoke a function synchronously as a schedule does, print its answer
                           (non-zero exit on a function error)
  drained QUEUE DLQ SECS   wait until QUEUE is empty (visible and in flight); fail if it is not
                           within SECS or if DLQ holds anything
  partner-source NAME      create the EventBridge partner event source NAME in the caller's
                           account, as Stripe does when its EventBridge destination is created
  resources STACK          print the stack's resources as LOGICAL_ID=TYPE lines
  apart STACK...            the deployed alarms of each STACK that read a metric of the code's
                           (not AWS/) read it by their own stack's name (the Stack dimension)
                           and notify a topic: stacks in one account keep apart
  kept KEY_ARN QUEUE TABLE...
                           after the stack's deletion: each TABLE still there and KEY_ARN still
                           enabled (not pending deletion), while QUEUE (not kept) is gone
  aliases STACK            print each function's live alias as LOGICAL_ID=VERSION lines; fail if
                           an event-source mapping or an API integration of the stack invokes
                           anything but a function's live alias
  alias-to STACK LOGICAL_ID VERSION
                           point the function's live alias at VERSION (docs/deploy.md's manual
                           rollback, `aws lambda update-alias`), print the version it left
  fix-stack STACK          work around ministack 1.5.33 gaps without touching the template:
                           - event-source mapping numbers given by !Ref are stored as strings and
                             stop its SQS polling: write them back as integers;
                           - TimeToLiveSpecification from a template is ignored: enable TTL.
  emulator-template SRC DST
                           SRC with GradualDeployment's default "false": ministack 1.5.33 runs the
                           SAM transform without the stack's parameter values (AWS passes them),
                           so SAM reads the defaults, and the default ("true") would make
                           CodeDeploy resources the emulator does not have whatever the deploy
                           passes. The deploys pass GradualDeployment=false all the same.
"""
import json
import sys
import time

import boto3


def secret(name, value):
    sm = boto3.client("secretsmanager")
    try:
        arn = sm.create_secret(Name=name, SecretString=value)["ARN"]
    except sm.exceptions.ResourceExistsException:
        arn = sm.put_secret_value(SecretId=name, SecretString=value) and sm.describe_secret(SecretId=name)["ARN"]
    print(arn)


def outputs(stack):
    cf = boto3.client("cloudformation")
    for o in cf.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", []):
        print(f"{o['OutputKey']}={o['OutputValue']}")


def fix_stack(stack):
    cf = boto3.client("cloudformation")
    resources = cf.describe_stack_resources(StackName=stack)["StackResources"]
    lam = boto3.client("lambda")
    ddb = boto3.client("dynamodb")
    for r in resources:
        if r["ResourceType"] == "AWS::Lambda::EventSourceMapping":
            m = lam.get_event_source_mapping(UUID=r["PhysicalResourceId"])
            args = {"UUID": m["UUID"], "BatchSize": int(m["BatchSize"])}
            if "MaximumBatchingWindowInSeconds" in m:
                args["MaximumBatchingWindowInSeconds"] = int(m["MaximumBatchingWindowInSeconds"])
            if m.get("ScalingConfig", {}).get("MaximumConcurrency") is not None:
                args["ScalingConfig"] = {"MaximumConcurrency": int(m["ScalingConfig"]["MaximumConcurrency"])}
            lam.update_event_source_mapping(**args)
            print(f"event-source mapping {m['UUID']}: numbers rewritten as integers", file=sys.stderr)
        if r["ResourceType"] == "AWS::DynamoDB::Table":
            table = r["PhysicalResourceId"]
            ttl = ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
            if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
                ddb.update_time_to_live(TableName=table, TimeToLiveSpecification={"AttributeName": "expires_at", "Enabled": True})
                print(f"table {table}: TTL on expires_at enabled", file=sys.stderr)


def stack_functions(stack):
    cf = boto3.client("cloudformation")
    return {r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in cf.describe_stack_resources(StackName=stack)["StackResources"]
            if r["ResourceType"] == "AWS::Lambda::Function"}


def aliases(stack):
    cf, lam = boto3.client("cloudformation"), boto3.client("lambda")
    functions = stack_functions(stack)
    live = {}
    for logical, name in sorted(functions.items()):
        alias = lam.get_alias(FunctionName=name, Name="live")
        live[logical] = alias["FunctionVersion"]
        if alias["FunctionVersion"] == "$LATEST":
            sys.exit(f"{logical}'s live alias points at $LATEST, not a published version")
    invoked = []
    resources = cf.describe_stack_resources(StackName=stack)["StackResources"]
    api = next((o["PhysicalResourceId"] for o in resources if o["ResourceType"] == "AWS::ApiGatewayV2::Api"), None)
    for r in resources:
        if r["ResourceType"] == "AWS::Lambda::EventSourceMapping":
            invoked.append((r["LogicalResourceId"], lam.get_event_source_mapping(UUID=r["PhysicalResourceId"])["FunctionArn"]))
        if r["ResourceType"] == "AWS::ApiGatewayV2::Integration":
            uri = boto3.client("apigatewayv2").get_integration(ApiId=api, IntegrationId=r["PhysicalResourceId"])["IntegrationUri"]
            invoked.append((r["LogicalResourceId"], uri))
    for logical, arn in invoked:
        if not any(arn.endswith(f":function:{name}:live") or f":function:{name}:live/" in arn for name in functions.values()):
            sys.exit(f"{logical} invokes {arn}, not a function's live alias")
    for logical, version in live.items():
        print(f"{logical}={version}")


def alias_to(stack, logical, version):
    lam = boto3.client("lambda")
    name = stack_functions(stack)[logical]
    left = lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"]
    lam.update_alias(FunctionName=name, Name="live", FunctionVersion=version)
    print(left)


def emulator_template(src, dst):
    from samtranslator.yaml_helper import yaml_parse
    with open(src) as f:
        template = yaml_parse(f.read())
    template["Parameters"]["GradualDeployment"]["Default"] = "false"
    with open(dst, "w") as f:
        json.dump(template, f, indent=1)
    print(dst)


def partner_source(name):
    account = boto3.client("sts").get_caller_identity()["Account"]
    events = boto3.client("events")
    try:
        print(events.create_partner_event_source(Name=name, Account=account)["EventSourceArn"])
    except events.exceptions.ResourceAlreadyExistsException:
        print(name)


def resources(stack):
    cf = boto3.client("cloudformation")
    for r in cf.describe_stack_resources(StackName=stack)["StackResources"]:
        print(f"{r['LogicalResourceId']}={r['ResourceType']}")


def apart(*stacks):
    cf, cw = boto3.client("cloudformation"), boto3.client("cloudwatch")
    seen = {}
    for stack in stacks:
        names = [r["PhysicalResourceId"] for r in cf.describe_stack_resources(StackName=stack)["StackResources"]
                 if r["ResourceType"] == "AWS::CloudWatch::Alarm"]
        alarms = []
        for i in range(0, len(names), 100):
            alarms += cw.describe_alarms(AlarmNames=names[i:i + 100])["MetricAlarms"]
        if len(alarms) != len(names):
            sys.exit(f"{stack}: {len(names)} alarms in the stack, {len(alarms)} found in CloudWatch")
        for a in alarms:
            metrics = [a] if a.get("MetricName") else [m["MetricStat"]["Metric"] for m in a.get("Metrics", []) if "MetricStat" in m]
            if not a.get("AlarmActions"):
                sys.exit(f"{stack}: {a['AlarmName']} notifies no one")
            for m in metrics:
                if m.get("Namespace", "").startswith("AWS/"):
                    continue
                dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
                if dims.get("Stack") != stack:
                    sys.exit(f"{stack}: {a['AlarmName']} reads {m['Namespace']} {m['MetricName']} by Stack={dims.get('Stack')}, not its own")
                seen.setdefault(stack, set()).add(m["MetricName"])
    print(json.dumps({s: sorted(v) for s, v in seen.items()}))


def kept(key_arn, queue, *tables):
    sqs, ddb, kms = boto3.client("sqs"), boto3.client("dynamodb"), boto3.client("kms")
    deadline = time.time() + 60
    while True:  # the deletion of what is not kept may still be going on
        try:
            sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
        except sqs.exceptions.QueueDoesNotExist:
            break
        except Exception as e:  # noqa: BLE001 - emulators answer a gone queue in more ways
            if "NonExistentQueue" not in str(e) and "does not exist" not in str(e):
                raise
            break
        if time.time() > deadline:
            sys.exit(f"{queue} still exists: the stack was not deleted, so what it keeps proves nothing")
        time.sleep(1)
    for table in tables:
        status = ddb.describe_table(TableName=table)["Table"]["TableStatus"]
        if status != "ACTIVE":
            sys.exit(f"the kept table {table} is {status}")
    state = kms.describe_key(KeyId=key_arn)["KeyMetadata"]["KeyState"]
    if state != "Enabled":
        sys.exit(f"the key of the kept tables is {state}: they could not be read once it is gone")
    print(json.dumps({"gone": queue, "kept_tables": list(tables), "key": state}))


def invoke(function, payload):
    out = boto3.client("lambda").invoke(FunctionName=function, Payload=payload.encode())
    answer = out["Payload"].read().decode()
    if out.get("FunctionError"):
        sys.exit(f"{function} failed: {answer}")
    print(answer)


def drained(queue, dlq, secs):
    sqs = boto3.client("sqs")
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"]
    deadline, empty = time.time() + float(secs), 0
    while empty < 3:
        if time.time() > deadline:
            sys.exit(f"{queue} was not drained within {secs} s")
        a = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=names)["Attributes"]
        empty = empty + 1 if all(int(a.get(n, "0")) == 0 for n in names) else 0
        time.sleep(1)
    left = int(sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=names[:1])["Attributes"][names[0]])
    if left:
        sys.exit(f"{left} messages in {dlq}")
    print(json.dumps({"drained": queue, "dead_letters": 0}))


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"secret": secret, "outputs": outputs, "fix-stack": fix_stack, "invoke": invoke, "drained": drained,
     "partner-source": partner_source, "aliases": aliases, "alias-to": alias_to,
     "emulator-template": emulator_template, "resources": resources, "kept": kept, "apart": apart}[cmd](*args)
