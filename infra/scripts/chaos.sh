#!/usr/bin/env bash
# make chaos: the seeded chaos checker (default 5,000 payments; pass `proving chaos` flags after --).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
# The checker (proving) runs its processors as `payctl run` processes of the same build.
cargo build --quiet --bin payctl --bin proving
start_aws_endpoint
start_simulator
cd "$ROOT"
"$ROOT/target/debug/proving" chaos --template "$ROOT/template.yaml" "$@"
