"""Expands the SAM template into the plain CloudFormation that `sam deploy` would create, so the
result can be linted and scanned as well (offline: no AWS call).

Usage: transform.py TEMPLATE OUT_JSON [Name=Value ...]: the values of the parameters SAM itself
resolves (GradualDeployment decides whether CodeDeploy resources are made at all)."""
import json
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    """The template uses inline policy statements only, so no managed-policy lookup is needed."""

    def load(self):
        return {}


def main(src, dst, given):
    with open(src) as f:
        template = yaml_parse(f.read())
    # `sam package` replaces local code paths with the uploaded artifact's S3 URI.
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = "s3://artifacts-bucket/payment-processor.zip"
    params = {"PaymentApiKeySecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:payments-key",
              "WebhookSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-secret"}
    params.update(given)
    out = transform(template, params, NoManagedPolicies())
    with open(dst, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:]))
