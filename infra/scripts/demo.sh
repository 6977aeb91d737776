#!/usr/bin/env bash
# make demo: the local end-to-end run. Starts what it needs, runs `proving demo`, stops it all.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
build --bin payctl --bin proving
start_aws_endpoint
start_simulator
"$BIN/proving" demo --template "$ROOT/template.yaml" "$@"
