#!/usr/bin/env bash
# Offline checks of template.yaml: cfn-lint, sam validate --lint, the SAM-transformed template
# linted again and checked for least privilege, and checkov on both (skips are justified beside them in the template).
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
log "SAM transform, then cfn-lint on the result"
"$ROOT/.venv-sam/bin/python" infra/template-checks/transform.py template.yaml "$out/transformed.json"
"$ROOT/.venv-sam/bin/cfn-lint" "$out/transformed.json"
log "least privilege on the transformed template (what SAM adds included)"
"$ROOT/.venv-sam/bin/python" infra/template-checks/least_privilege.py --self-test
"$ROOT/.venv-sam/bin/python" infra/template-checks/least_privilege.py "$out/transformed.json"
for t in template.yaml "$out/transformed.json"; do
  log "checkov $t"
  "$ROOT/.venv-checkov/bin/checkov" -f "$t" --framework cloudformation --skip-download --quiet --compact
done
log "the public route's throttle against the function behind it and the measured cost docs/events.md states"
"$ROOT/.venv-sam/bin/python" infra/template-checks/route_throttle.py --self-test
"$ROOT/.venv-sam/bin/python" infra/template-checks/route_throttle.py "$out/transformed.json" docs/events.md
log "the provider's pace: one stack rate, the shares, a batch within its timeout"
"$ROOT/.venv-sam/bin/python" infra/template-checks/provider_pace.py --self-test
"$ROOT/.venv-sam/bin/python" infra/template-checks/provider_pace.py "$out/transformed.json"
log "the operations dashboard: outcomes, dead letters, oldest ages, the provider's errors, every alarm"
"$ROOT/.venv-sam/bin/python" infra/template-checks/dashboard.py --self-test
"$ROOT/.venv-sam/bin/python" infra/template-checks/dashboard.py "$out/transformed.json" "$ROOT"
log "the README and docs/ against the template: the alarm runbook, the counts, the sqs-once example"
"$ROOT/.venv-sam/bin/python" infra/template-checks/docs_match.py --self-test
"$ROOT/.venv-sam/bin/python" infra/template-checks/docs_match.py "$ROOT"
log "template checks passed"
