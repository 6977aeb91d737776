#!/usr/bin/env bash
# make bench: the processor's optimised build against ministack and the provider simulator,
# alternating with the Powertools (Python) peer in infra/peer/ on the same stack and backlog.
# Prints a table and writes bench/results/{results.json,results.md,bench.png}.
# PROVING_PROFILE=dev uses the debug build (the smoke run in make test); extra arguments go to
# `proving bench` (--payments, --pollers, --cold-start-runs, --out).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
profile="${PROVING_PROFILE:-perf}"
ensure_venv
ensure_deploy_tools
ensure_tool_venv peer "$ROOT/infra/requirements-peer.txt" "aws_lambda_powertools, awslambdaric, boto3"
bash "$ROOT/infra/scripts/package.sh" arm64
bash "$ROOT/infra/scripts/package.sh" x86_64
build --profile "$profile" --bin proving
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
start_simulator
start_ministack
cd "$ROOT"
pin() { grep -E "^$1==" "$2" | sed 's/==/ /'; }
BENCH_EMULATOR="$(pin ministack "$ROOT/infra/requirements-ministack.txt")" \
BENCH_PEER="Powertools for AWS Lambda (Python): $(pin aws-lambda-powertools "$ROOT/infra/requirements-peer.txt"), $(pin awslambdaric "$ROOT/infra/requirements-peer.txt"), $("$ROOT/.venv-peer/bin/python" --version)" \
"$TARGET/$dir/proving" bench --template "$ROOT/template.yaml" \
  --bootstrap "arm64=$ROOT/.aws-sam/build-arm64/PaymentProcessorFunction/bootstrap" \
  --bootstrap "x86_64=$ROOT/.aws-sam/build-x86_64/PaymentProcessorFunction/bootstrap" \
  --peer-bootstrap "$ROOT/infra/peer/bootstrap" --peer-python "$ROOT/.venv-peer/bin/python" "$@"
