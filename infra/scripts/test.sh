#!/usr/bin/env bash
# make test: the whole suite against its own local AWS endpoint and provider simulator.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
cargo build --quiet --workspace --all-targets
start_aws_endpoint
start_simulator
cd "$ROOT"
cargo test --workspace "$@"
