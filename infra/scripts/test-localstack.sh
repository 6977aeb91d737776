#!/usr/bin/env bash
# make test-localstack: the processors on LocalStack's own SQS, and the template's queues through
# LocalStack's CloudFormation, with no Docker and no account. LocalStack's runtime
# (localstack-core, pinned in infra/requirements-localstack.txt) runs in host mode in
# .venv-localstack with Python 3.13, on a free port with a folder of its own; its DynamoDB (DynamoDB
# Local, whose licence rules it out here), Lambda (Docker) and HTTP APIs (its paid tier) are not
# used: DynamoDB and its streams are ministack's. It stops what it started and removes its folder.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
LS_DIR="$RUN_DIR/localstack"
LS_PID=""
stop_localstack() {
  # Its shutdown has been seen to hang (a CloudFormation deletion still running): bounded.
  if [ -n "$LS_PID" ]; then stop_process "$LS_PID" 30; fi
  rm -rf "$LS_DIR"
  stop_started
}
trap stop_localstack EXIT

ensure_localstack_venv
ensure_venv
build --bin payctl --bin proving
# DynamoDB, its streams and the rest: ministack (started on a free port unless AWS_ENDPOINT_URL
# answers already).
unset AWS_ENDPOINT_URL_SQS AWS_ENDPOINT_URL_CLOUDFORMATION
start_aws_endpoint
start_simulator

# LocalStack in host mode: its own folder (the machine may look like a container: without
# OVERRIDE_IN_DOCKER it would write /var/lib/localstack), path-style queue URLs on its port.
port=$(free_port)
mkdir -p "$LS_DIR"
log "starting LocalStack's runtime on 127.0.0.1:$port (host mode, folder $LS_DIR; waiting up to 90 s)"
(cd "$LS_DIR" && exec env OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$LS_DIR/fs" GATEWAY_SERVER=hypercorn \
  GATEWAY_LISTEN="127.0.0.1:$port" LOCALSTACK_HOST="127.0.0.1:$port" SQS_ENDPOINT_STRATEGY=path \
  EAGER_SERVICE_LOADING=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 DNS_ADDRESS=0 \
  "$LS_VENV/bin/python" -m localstack.runtime.main) >"$RUN_DIR/localstack.log" 2>&1 &
LS_PID=$!
LS_URL="http://127.0.0.1:$port"
wait_for_url "$LS_URL/_localstack/health" 90 || { tail -30 "$RUN_DIR/localstack.log" >&2; exit 1; }
version=$("$LS_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("localstack-core"))')

# SQS and CloudFormation are LocalStack's, through the SDK's standard per-service variables.
export AWS_ENDPOINT_URL_SQS="$LS_URL" AWS_ENDPOINT_URL_CLOUDFORMATION="$LS_URL"
log "SQS at $LS_URL (LocalStack $version), DynamoDB and its streams at $AWS_ENDPOINT_URL (ministack)"

# 1. The conformance check, its SQS checks on LocalStack's SQS.
"$BIN/payctl" conformance

# 2. The processors end to end, SQS on LocalStack: payments, copies, a decline, bad input dead-
#    lettered with its code, a worker killed after the charge and taken over by another process,
#    a crash after the charge, a redrive after a fix, refunds (whole, partial, racing).
cd "$ROOT"
cargo test --quiet --test integration -- --test-threads 8 \
  t01_ t02_ t03_ t05_ t08_ t09_ \
  a_killed_workers_charged_payment_is_finished_by_another_process \
  redrive_after_a_fix_charges_once_even_when_redriven_twice \
  a_redrive_goes_back_to_the_queue_that_dead_letters_to_the_dlq \
  concurrent_refunds_of_one_payment_never_exceed_its_charge \
  only_a_charged_payment_is_refunded_and_the_rest_is_the_default \
  a_refund_of_an_unknown_payment_is_dead_lettered_at_once 2>&1 | tee "$RUN_DIR/localstack-tests.log" | grep -E "^test |^test result"
grep -qE "^test result: ok\. (1[0-9]|[2-9][0-9]) passed" "$RUN_DIR/localstack-tests.log" \
  || { echo "test-localstack: the processors' tests did not all pass on LocalStack's SQS" >&2; exit 1; }

# 3. The template's queues through LocalStack's CloudFormation, then their attributes.
# With both ways of delivering events: every queue of the template, EventBridge's DLQ too.
"$LS_VENV/bin/python" "$ROOT/infra/localstack/cfn_queues.py" "$ROOT/template.yaml" \
  --param ProviderEventsDelivery=both

echo "test-localstack: LocalStack $version served SQS (the conformance check, the processors' tests) and CloudFormation (the template's queues); DynamoDB and its streams were ministack's"
