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
ensure_peer_tools
# The release bootstraps it measures (size; the host's also cold start and the runs): both
# architectures unless BENCH_ARCHS names fewer (make test's smoke run: x86_64, the package it
# has just built; its arm64 package is a cross-check, not the product, so its size is not one to print).
bootstraps=()
# PACKAGE_READY=ARCH (make test, where the suite built it): that package is taken as it is,
# not built again (its `sam build` would rewrite the folder e2e-sam deploys from beside it).
for arch in ${BENCH_ARCHS:-arm64 x86_64}; do
  [ "${PACKAGE_READY:-}" = "$arch" ] || bash "$ROOT/infra/scripts/package.sh" "$arch"
  bootstraps+=(--bootstrap "$arch=$ROOT/.aws-sam/build-$arch/PaymentProcessorFunction/bootstrap")
done
build --profile "$profile" --bin proving
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
start_simulator
start_ministack
cd "$ROOT"
pin() { grep -E "^$1==" "$2" | sed 's/==/ /'; }
BENCH_EMULATOR="$(pin ministack "$ROOT/infra/requirements-ministack.txt")" \
BENCH_PEER="Powertools for AWS Lambda (Python): $(pin aws-lambda-powertools "$ROOT/infra/requirements-peer.txt"), $(pin awslambdaric "$ROOT/infra/requirements-peer.txt"), $("$ROOT/.venv-peer/bin/python" --version)" \
"$TARGET/$dir/proving" bench --template "$ROOT/template.yaml" \
  "${bootstraps[@]}" \
  --peer-bootstrap "$ROOT/infra/peer/bootstrap" --peer-python "$ROOT/.venv-peer/bin/python" "$@"
