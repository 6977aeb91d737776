#!/usr/bin/env bash
# make chaos: the seeded chaos checker (default 5,000 payments; pass `proving chaos` flags after --).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
# The checker (proving) runs its processors as `payctl run` processes of the same build.
build --bin payctl --bin proving
start_aws_endpoint
start_simulator
cd "$ROOT"
"$BIN/proving" chaos --template "$ROOT/template.yaml" "$@"
# The public events route under a 20 s flood of worst-case forged requests (four clients), a
# genuine signed delivery every second: each answered 200 within 1 s.
"$BIN/proving" webhook-flood --seconds 20 --clients 4 --deadline-ms 1000 | grep -v '^{'
