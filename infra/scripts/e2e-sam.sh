#!/usr/bin/env bash
# make e2e-sam: the deployed shape, locally. Builds the x86_64 bootstraps with `sam build`,
# starts ministack (with the SAM translator) and the provider simulator, `sam deploy`s
# template.yaml onto ministack, and drives the stack through its HTTP API: POSTs (concurrent
# duplicates and retries of each key), the table's stream, the relay, the queue, the processor
# and the provider, checked from the provider's ledger. Then a second load goes straight into
# the queue (the raw-queue path), with payments the provider finishes later (bank debits, a refund
# that fails after pending, a dispute) settled through the simulator's signed events delivered
# to the deployed endpoint; then the event function's scheduled catch-up, invoked as its
# schedule does. Then the EventBridge shape: a second stack deployed with
# ProviderEventsDelivery=eventbridge on a partner event source created as Stripe creates it,
# checked to have no public route, no webhook function and no secret, and the same events
# scenario settled through its partner bus and rule (proving's partner side publishes the
# simulator's events there). Each stack is connected with payctl connect as docs/deploy.md says
# (the webhook's registered at the simulator, its secret written over the placeholder, a test
# event through to the deployed inbox; the partner source, bus and rule checked), then
# preflighted: the webhook stack is ready for traffic, the EventBridge one (no AlarmEmail) is named
# for its alarm topic that reaches no one. Then that stack is deleted with `sam delete`: its tables and the key
# that encrypts them must stay. Stops what it started.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
trap stop_started EXIT
ensure_venv
ensure_deploy_tools
# PACKAGE_READY=x86_64 (make test, where the suite built it): deployed as it is, not built
# again (its `sam build` would rewrite the folder under the bench smoke running beside).
[ "${PACKAGE_READY:-}" = x86_64 ] || bash "$ROOT/infra/scripts/package.sh" x86_64
build --bin payctl --bin proving
start_simulator

start_ministack
export SAM_CLI_TELEMETRY=0

helper() { "$ROOT/.venv-sam/bin/python" "$ROOT/infra/template-checks/deploy_helper.py" "$@"; }
stack="e2e-$(date +%s)"
secret_arn=$(helper secret "payments/$stack/provider-key" "$PAYMENT_API_KEY")
# As docs/deploy.md says: the webhook's secret holds a placeholder until payctl connect.
webhook_arn=$(helper secret "payments/$stack/webhook-secret" "placeholder: payctl connect writes the signing secret")
# The built template, but for GradualDeployment's default (deploy_helper.py, emulator-template):
# the emulator's SAM transform reads defaults, not the values a deploy passes.
template="$(helper emulator-template "$ROOT/.aws-sam/build-x86_64/template.yaml" "$ROOT/.aws-sam/build-x86_64/template.emulator.json")"
deploy_webhook_stack() { # extra parameters...
  "$ROOT/.venv-sam/bin/sam" deploy --template-file "$template" \
    --stack-name "$stack" --resolve-s3 --capabilities CAPABILITY_IAM CAPABILITY_NAMED_IAM \
    --no-confirm-changeset --no-fail-on-empty-changeset --region "$AWS_REGION" \
    --parameter-overrides Architecture=x86_64 "PaymentApiUrl=$PROVIDER_API_URL" "PaymentApiKeySecretArn=$secret_arn" \
    "WebhookSecretArn=$webhook_arn" AlarmEmail=oncall@example.com GradualDeployment=false \
    RetryHorizonSeconds=20 "$@" # the check's flaky payment comes back in seconds, not spread over an hour
  helper fix-stack "$stack"
}
# GradualDeployment=false: the emulator has no CodeDeploy; the aliases and versions are the same.
log "sam deploy $stack"
deploy_webhook_stack
first_versions=$(helper aliases "$stack")
declare -A out
while IFS='=' read -r k v; do out[$k]=$v; done < <(helper outputs "$stack")
check() {
  "$BIN/proving" e2e-check --queue-url "${out[PaymentsQueueUrl]}" --dlq-url "${out[DeadLetterQueueUrl]}" \
    --table "${out[IdempotencyTableName]}" --sim-url "$PROVIDER_API_URL" \
    --refunds-queue-url "${out[RefundsQueueUrl]}" --refunds-dlq-url "${out[RefundsDeadLetterQueueUrl]}" "$@"
}
# The emulator serves a deployed HTTP API under its LocalStack-compatible path (the API's own
# {id}.execute-api.localhost host name needs a resolver that knows *.localhost): the URL Stripe
# is to call is not the API's own, as behind a custom domain. The stack is deployed again with
# it (ProviderEventsPublicUrl), so that its output, the endpoint connect registers and the URL
# the catch-up checks are one.
api_url="$AWS_ENDPOINT_URL/_aws/execute-api/${out[PaymentsApiId]}/\$default"
log "sam deploy $stack again, with ProviderEventsPublicUrl (as for a custom domain)"
deploy_webhook_stack "ProviderEventsPublicUrl=$api_url/v1/provider-events"
while IFS='=' read -r k v; do out[$k]=$v; done < <(helper outputs "$stack")
# versions_moved BEFORE AFTER FUNCTION...: the functions named moved their live alias, the others did not.
versions_moved() {
  local -A before after
  while IFS='=' read -r k v; do before[$k]=$v; done <<<"$1"
  while IFS='=' read -r k v; do after[$k]=$v; done <<<"$2"
  shift 2
  for f in "${!before[@]}"; do
    if [[ " $* " == *" $f "* ]]; then
      [ "${after[$f]}" != "${before[$f]}" ] || { echo "$f's live alias did not move with its changed configuration" >&2; exit 1; }
    else
      [ "${after[$f]}" = "${before[$f]}" ] || { echo "$f was published again though nothing of it changed" >&2; exit 1; }
    fi
  done
}
log "ProviderEventsPublicUrl is not in the event processor's VersionDescription (its length has no bound): the redeploy published nothing, and preflight says its live alias runs the old PROVIDER_EVENTS_URL"
second_versions=$(helper aliases "$stack")
versions_moved "$first_versions" "$second_versions"
set +e
pre=$("$BIN/payctl" preflight --stack-name "$stack"); code=$?
set -e
echo "$pre"
if [ "$code" -ne 2 ] || ! grep -q "^FIX  versions .*event-processor's live alias runs version .*PROVIDER_EVENTS_URL" <<<"$pre" \
  || ! grep -q "deploy again with ConfigRevision=1" <<<"$pre"; then
  echo "payctl preflight did not name the event processor's live alias behind its configuration, with its fix (exit $code)" >&2; exit 1
fi
log "its fix, as preflight prints it: deploy again with ConfigRevision=1; every function is published and its live alias moved"
deploy_webhook_stack "ProviderEventsPublicUrl=$api_url/v1/provider-events" ConfigRevision=1
third_versions=$(helper aliases "$stack")
versions_moved "$second_versions" "$third_versions" PaymentsApiFunction OutboxRelayFunction PaymentProcessorFunction \
  RefundProcessorFunction ProviderEventsFunction EventProcessorFunction
log "sam deploy $stack with RetryHorizonSeconds changed: each function whose VersionDescription names it is published again and its live alias moved; the others stay"
deploy_webhook_stack "ProviderEventsPublicUrl=$api_url/v1/provider-events" ConfigRevision=1 RetryHorizonSeconds=21
fourth_versions=$(helper aliases "$stack")
versions_moved "$third_versions" "$fourth_versions" PaymentProcessorFunction RefundProcessorFunction EventProcessorFunction
declare -A v3
while IFS='=' read -r k v; do v3[$k]=$v; done <<<"$third_versions"
[ "${out[ProviderEventsUrl]}" = "$api_url/v1/provider-events" ] \
  || { echo "ProviderEventsUrl is ${out[ProviderEventsUrl]}, not the public URL deployed" >&2; exit 1; }
log "payctl connect: the endpoint registered at the provider (the simulator takes this 127.0.0.1 URL when told to), its secret stored, a test event through to the deployed inbox"
curl -fsS -X POST -H 'Content-Type: application/json' -d '{"allow_private_urls": true}' "$PROVIDER_API_URL/_sim/webhook" >/dev/null
"$BIN/payctl" connect --stack-name "$stack"
again=$("$BIN/payctl" connect --stack-name "$stack")
grep -q "registered already" <<<"$again" || { echo "payctl connect run again changed the endpoint: $again" >&2; exit 1; }
log "payctl preflight: ready for traffic (quota, key and permissions, version, live aliases, alarm topic, endpoint)"
"$BIN/payctl" preflight --stack-name "$stack"
log "the operator's shell from the deployed stack: payctl env, then payctl health reads it"
(eval "$("$BIN/payctl" env --stack-name "$stack")" && "$BIN/payctl" health >/dev/null) || [ $? -eq 2 ] \
  || { echo "payctl health failed in the shell payctl env gives for $stack" >&2; exit 1; }
log "through the API: $api_url"
check --prefix "$stack-api" --api-url "$api_url"
log "straight into the queue, and what the provider finishes later through its events"
check --prefix "$stack" --events-url "$api_url/v1/provider-events" \
  --events-dlq-url "${out[ProviderEventsDeadLetterQueueUrl]}"
log "the scheduled catch-up, invoked as its schedule does: it queues the events since its checkpoint; the deployed inbox takes them again without a dead letter"
report=$(helper invoke "${out[EventProcessorFunctionName]}:live" '{"catch_up": true}')
echo "$report"
"$ROOT/.venv-sam/bin/python" -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["queued"] >= 10, r' "$report" \
  || { echo "the scheduled catch-up queued too few of the run's events: $report" >&2; exit 1; }
helper drained "${out[ProviderEventsQueueUrl]}" "${out[ProviderEventsDeadLetterQueueUrl]}" 120
log "docs/deploy.md's manual rollback: the event processor's live alias back to the version before, the scheduled catch-up through the alias on it, then forward again; nothing dead-lettered"
left=$(helper alias-to "$stack" EventProcessorFunction "${v3[EventProcessorFunction]}")
helper invoke "${out[EventProcessorFunctionName]}:live" '{"catch_up": true}'
set +e
pre=$("$BIN/payctl" preflight --stack-name "$stack"); code=$?
set -e
if [ "$code" -ne 2 ] || ! grep -q "^FIX  versions .*event-processor's live alias runs version ${v3[EventProcessorFunction]}, the stack deployed $left" <<<"$pre" \
  || ! grep -q "move it back (aws lambda update-alias --function-name ${out[EventProcessorFunctionName]} --name live --function-version $left)" <<<"$pre"; then
  echo "$pre"; echo "payctl preflight did not name the event processor's alias moved outside CloudFormation, with the command that moves it back (exit $code)" >&2; exit 1
fi
log "moved back as preflight's fix says (the helper makes the same UpdateAlias call)"
helper alias-to "$stack" EventProcessorFunction "$left" >/dev/null
# (The other checks may ask for fixes by now: the e2e checks above changed the simulator's
# account, its endpoints and its events. The aliases are what this step moved.)
pre=$("$BIN/payctl" preflight --stack-name "$stack") || true
grep -q "^ok   versions" <<<"$pre" || { echo "$pre"; echo "the event processor's alias moved forward is still named by preflight" >&2; exit 1; }
helper drained "${out[ProviderEventsQueueUrl]}" "${out[ProviderEventsDeadLetterQueueUrl]}" 120

log "the EventBridge shape: no public route, no secret; Stripe's events through the partner bus"
eb="$stack-eb"
source_name="local.partner/stripe.com/ed_${eb//-/_}"
helper partner-source "$source_name"
"$ROOT/.venv-sam/bin/sam" deploy --template-file "$template" \
  --stack-name "$eb" --resolve-s3 --capabilities CAPABILITY_IAM CAPABILITY_NAMED_IAM \
  --no-confirm-changeset --no-fail-on-empty-changeset --region "$AWS_REGION" \
  --parameter-overrides Architecture=x86_64 "PaymentApiUrl=$PROVIDER_API_URL" "PaymentApiKeySecretArn=$secret_arn" \
  ProviderEventsDelivery=eventbridge "StripeEventSourceName=$source_name" RetryHorizonSeconds=20 GradualDeployment=false
helper fix-stack "$eb"
"$BIN/payctl" connect --stack-name "$eb"
log "payctl preflight of the EventBridge stack, deployed without AlarmEmail: its alarm topic reaches no one, and says so"
set +e
pre=$("$BIN/payctl" preflight --stack-name "$eb"); code=$?
set -e
echo "$pre"
if [ "$code" -ne 2 ] || [ "$(grep -c '^FIX' <<<"$pre")" -ne 1 ] || ! grep -q '^FIX  alarms .*reaches no one' <<<"$pre"; then
  echo "payctl preflight did not name the EventBridge stack's unsubscribed alarm topic alone (exit $code)" >&2; exit 1
fi
declare -A ebout
while IFS='=' read -r k v; do ebout[$k]=$v; done < <(helper outputs "$eb")
resources=$(helper resources "$eb")
for gone in ProviderEventsFunction ProviderEventsRoute SignatureFailuresAlarm; do
  if grep -q "^$gone=" <<<"$resources"; then echo "the EventBridge shape has $gone" >&2; exit 1; fi
done
for here in StripeEventBus StripeEventsRule StripeEventsDeadLetterQueue StripeEventsUndeliveredAlarm; do
  grep -q "^$here=" <<<"$resources" || { echo "the EventBridge shape lacks $here" >&2; exit 1; }
done
[ -z "${ebout[ProviderEventsUrl]:-}" ] || { echo "the EventBridge shape has a ProviderEventsUrl" >&2; exit 1; }
"$BIN/proving" e2e-check --queue-url "${ebout[PaymentsQueueUrl]}" --dlq-url "${ebout[DeadLetterQueueUrl]}" \
  --table "${ebout[IdempotencyTableName]}" --sim-url "$PROVIDER_API_URL" \
  --refunds-queue-url "${ebout[RefundsQueueUrl]}" --refunds-dlq-url "${ebout[RefundsDeadLetterQueueUrl]}" \
  --prefix "$eb" --events-bus "${ebout[StripeEventBusName]}" --events-source "$source_name" \
  --events-dlq-url "${ebout[ProviderEventsDeadLetterQueueUrl]}"
helper drained "${ebout[ProviderEventsQueueUrl]}" "${ebout[StripeEventsDeadLetterQueueUrl]}" 120
log "two stacks in one account: each one's alarms read its own metrics (the Stack dimension) and notify a topic"
helper apart "$stack" "$eb"
log "sam delete $eb: its tables and their key are kept, what is not kept goes"
"$ROOT/.venv-sam/bin/sam" delete --stack-name "$eb" --no-prompts --region "$AWS_REGION"
helper kept "${ebout[PaymentsKeyArn]}" "${ebout[PaymentsQueueUrl]}" "${ebout[IdempotencyTableName]}" "${ebout[PaymentsTableName]}"
log "e2e-sam: the webhook shape and the EventBridge shape both deployed and settled; a deleted stack kept its ledger and its key"
