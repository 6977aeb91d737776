#!/usr/bin/env bash
# make bench: the processor's optimised build against ministack and the provider simulator.
# Prints a table and writes bench/results/{results.json,results.md,latency-histogram.png}.
# PAYCTL_PROFILE=dev uses the debug build (the smoke run in make test); extra arguments go to
# `payctl bench` (--payments, --pollers, --cold-start-runs, --out).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
profile="${PAYCTL_PROFILE:-perf}"
ensure_venv
ensure_deploy_tools
bash "$ROOT/infra/scripts/package.sh" arm64
bash "$ROOT/infra/scripts/package.sh" x86_64
cargo build --quiet --profile "$profile" --bin payctl
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
start_simulator
start_ministack
cd "$ROOT"
BENCH_EMULATOR="$(grep -E '^ministack==' "$ROOT/infra/requirements-ministack.txt" | sed 's/==/ /')" \
"$ROOT/target/$dir/payctl" bench --template "$ROOT/template.yaml" \
  --bootstrap "arm64=$ROOT/.aws-sam/build-arm64/PaymentProcessorFunction/bootstrap" \
  --bootstrap "x86_64=$ROOT/.aws-sam/build-x86_64/PaymentProcessorFunction/bootstrap" "$@"
