#!/usr/bin/env bash
# make demo: the local end-to-end run. Starts what it needs, runs `payctl demo`, stops it all.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
cargo build --quiet --bin payctl
start_aws_endpoint
start_simulator
"$ROOT/target/debug/payctl" demo --template "$ROOT/template.yaml" "$@"
