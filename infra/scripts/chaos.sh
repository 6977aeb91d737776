#!/usr/bin/env bash
# make chaos: the seeded chaos checker (default 5,000 payments; pass payctl chaos flags after --).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
cargo build --quiet --bin payctl
start_aws_endpoint
start_simulator
cd "$ROOT"
"$ROOT/target/debug/payctl" chaos --template "$ROOT/template.yaml" "$@"
