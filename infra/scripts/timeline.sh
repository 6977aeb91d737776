#!/usr/bin/env bash
# make timeline: the provider's timeline compressed into one run (a year of late events, the
# processes' clock moved through the clock seam, DynamoDB's TTL applied at each step), against
# its own local AWS endpoint and provider simulator; prints the calendar.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
cd "$ROOT"
build --workspace --all-targets
start_aws_endpoint
start_simulator
cargo test --quiet --test integration -- timeline --nocapture
