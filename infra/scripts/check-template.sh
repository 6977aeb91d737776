#!/usr/bin/env bash
# Offline checks of template.yaml: cfn-lint, sam validate --lint, then each shape the template
# takes (the provider's events by webhook, by EventBridge, or both) resolved from the
# SAM-transformed template and linted, checked for least privilege, by checkov (skips are
# justified beside them in the template), and by the project's own checks.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_deploy_tools
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}" AWS_REGION="${AWS_REGION:-us-east-1}"
export SAM_CLI_TELEMETRY=0
cd "$ROOT"
out="$ROOT/.local/template-checks"
mkdir -p "$out"
log "cfn-lint template.yaml"
"$ROOT/.venv-sam/bin/cfn-lint" template.yaml
log "sam validate --lint"
"$ROOT/.venv-sam/bin/sam" validate --template template.yaml --region "$AWS_REGION" --lint
log "SAM transform"
"$ROOT/.venv-sam/bin/python" infra/template-checks/transform.py template.yaml "$out/transformed.json"
for c in shape least_privilege route_throttle provider_pace dashboard eventbridge retention alarms deployment; do
  "$ROOT/.venv-sam/bin/python" "infra/template-checks/$c.py" --self-test
done
# Each way the provider's events can arrive is a shape of its own: every check reads each one.
account="arn:aws:secretsmanager:$AWS_REGION:111111111111:secret"
key="PaymentApiKeySecretArn=$account:provider-key"
webhook="WebhookSecretArn=$account:webhook-secret"
source="StripeEventSourceName=aws.partner/stripe.com/ed_test_check"
shape_params() {
  case "$1" in
    webhook) echo "$key ProviderEventsDelivery=webhook $webhook" ;;
    eventbridge) echo "$key ProviderEventsDelivery=eventbridge $source" ;;
    both) echo "$key ProviderEventsDelivery=both $webhook $source" ;;
  esac
}
for delivery in webhook eventbridge both; do
  # shellcheck disable=SC2046
  set -- $(shape_params "$delivery")
  log "[$delivery] cfn-lint on the template and on its transform, with this shape's parameters"
  "$ROOT/.venv-sam/bin/cfn-lint" --parameters "$@" -- template.yaml
  # W2001 (a parameter not used) is the template's own check above: SAM's transform consumes
  # the parameters it resolves itself (GradualDeployment, DeploymentType), which is their use.
  # W3011 (UpdateReplacePolicy without DeletionPolicy) too: SAM passes the functions'
  # UpdateReplacePolicy on to their roles and aliases, which the stack deletes with it;
  # retention.py holds what is kept to both policies.
  "$ROOT/.venv-sam/bin/cfn-lint" --ignore-checks W2001 W3011 --parameters "$@" -- "$out/transformed.json"
  shape="$out/shape-$delivery.json"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/shape.py "$out/transformed.json" "$shape" "$@"
  log "[$delivery] least privilege (what SAM adds included)"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/least_privilege.py "$shape"
  log "[$delivery] checkov"
  "$ROOT/.venv-checkov/bin/checkov" -f "$shape" --framework cloudformation --skip-download --quiet --compact
  log "[$delivery] the public route's throttle against the function behind it and the measured cost docs/events.md states"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/route_throttle.py "$shape" docs/events.md
  log "[$delivery] the provider's pace: one stack rate, the shares, a batch within its timeout"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/provider_pace.py "$shape"
  log "[$delivery] the operations dashboard: outcomes, dead letters, oldest ages, the provider's errors, every alarm"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/dashboard.py "$shape" "$ROOT"
  log "[$delivery] what is kept on delete is kept on replacement, and so is the key that encrypts it"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/retention.py "$shape"
  log "[$delivery] the alarms: each reaches a topic; the key, throttles and the catch-up's lag watched; this stack's metrics only"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/alarms.py "$shape" "$ROOT"
  log "[$delivery] how the events arrive, and only that way"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/eventbridge.py "$shape" "$ROOT" "$delivery"
  log "[$delivery] every function behind its alias, shifted gradually and rolled back on its alarms"
  "$ROOT/.venv-sam/bin/python" infra/template-checks/deployment.py "$shape" gradual
done
log "GradualDeployment=false (no CodeDeploy): the aliases stay, nothing of CodeDeploy is made"
"$ROOT/.venv-sam/bin/python" infra/template-checks/transform.py template.yaml "$out/transformed-at-once.json" GradualDeployment=false
# shellcheck disable=SC2046
set -- $(shape_params webhook)
"$ROOT/.venv-sam/bin/cfn-lint" --ignore-checks W2001 W3011 --parameters "$@" GradualDeployment=false -- "$out/transformed-at-once.json"
"$ROOT/.venv-sam/bin/python" infra/template-checks/shape.py "$out/transformed-at-once.json" "$out/shape-at-once.json" "$@" GradualDeployment=false
"$ROOT/.venv-sam/bin/python" infra/template-checks/deployment.py "$out/shape-at-once.json" at-once
log "a shape whose parameters the template's Rules refuse is refused"
if "$ROOT/.venv-sam/bin/python" infra/template-checks/shape.py "$out/transformed.json" "$out/refused.json" \
    "$key" ProviderEventsDelivery=eventbridge 2>"$out/refused.txt"; then
  echo "the template accepts eventbridge delivery without StripeEventSourceName" >&2; exit 1
fi
grep -q "needs StripeEventSourceName" "$out/refused.txt"
if "$ROOT/.venv-sam/bin/python" infra/template-checks/shape.py "$out/transformed.json" "$out/refused.json" \
    "$key" ProviderEventsDelivery=both "$source" 2>"$out/refused.txt"; then
  echo "the template accepts webhook delivery without WebhookSecretArn" >&2; exit 1
fi
grep -q "needs WebhookSecretArn" "$out/refused.txt"
log "checkov template.yaml"
"$ROOT/.venv-checkov/bin/checkov" -f template.yaml --framework cloudformation --skip-download --quiet --compact
log "the README and docs/ against the template: the alarm runbook, the counts, the sqs-once example"
"$ROOT/.venv-sam/bin/python" infra/template-checks/docs_match.py --self-test
"$ROOT/.venv-sam/bin/python" infra/template-checks/docs_match.py "$ROOT"
log "template checks passed"
