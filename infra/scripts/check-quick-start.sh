#!/usr/bin/env bash
# The README's quick start, run as written: the fenced block between <!-- quick-start --> and
# <!-- /quick-start --> in a fresh bash (no AWS or provider variables inherited; cargo's own
# settings are, and make test's BUILD_OVER_WORKSPACE, so that its build of payctl is the
# suite's, not another), from the repository's root, stopping at the first failing command;
# then what it must have shown.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Whatever happens, what it started is stopped (its own teardown is the block's last line).
echo 'trap '"'"'kill ${API_PID:-} ${RELAY_PID:-} 2>/dev/null || true; declare -F stop_started >/dev/null && stop_started'"'"' EXIT' >"$work/quick-start.sh"
# Each of the block's commands timed (the trap runs before each command of the block, not of the
# functions it calls): the slowest print when it passes.
echo 'trap '"'"'printf "%s\t%s\n" "$EPOCHREALTIME" "${BASH_COMMAND//$'"'"'\n'"'"'/ }" >>"'"$work"'/times.tsv"'"'"' DEBUG' >>"$work/quick-start.sh"
awk '/<!-- quick-start -->/{on=1; next} /<!-- \/quick-start -->/{on=0} on' "$ROOT/README.md" \
  | sed -e '/^```/d' >>"$work/quick-start.sh"
[ "$(wc -l <"$work/quick-start.sh")" -gt 1 ] || { echo "check-quick-start: no quick start in README.md" >&2; exit 1; }
status=0
(cd "$ROOT" && env -i PATH="$PATH" HOME="$HOME" ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} \
  ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} ${CARGO_TARGET_DIR:+CARGO_TARGET_DIR="$CARGO_TARGET_DIR"} \
  ${CARGO_INCREMENTAL:+CARGO_INCREMENTAL="$CARGO_INCREMENTAL"} \
  ${BUILD_OVER_WORKSPACE:+BUILD_OVER_WORKSPACE="$BUILD_OVER_WORKSPACE"} \
  bash -e "$work/quick-start.sh") >"$work/out.log" 2>&1 || status=$?
fail() { cat "$work/out.log" >&2; echo "check-quick-start: $*" >&2; exit 1; }
[ "$status" -eq 0 ] || fail "the quick start failed (exit $status) at the command above"
for want in '"status": "succeeded"' 'refunded         500 in 1 refund(s)' 'events applied' \
  'invalid_payment' 'payctl health: exit 2' 'stopped: every request was answered' \
  'stopped; payments relayed to the queue: 1'; do
  grep -qF "$want" "$work/out.log" || fail "the quick start did not show: $want"
done
# The slowest commands: each line's time is until the next command starts.
echo "check-quick-start: its slowest commands: $(awk -F'\t' 'NR > 1 { printf "%.1f s\t%s\n", $1 - t, c } { t = $1; c = substr($2, 1, 60) }' "$work/times.tsv" \
  | sort -rn | head -4 | awk -F'\t' '{ printf "%s%s (%s)", (NR > 1 ? "; " : ""), $2, $1 }')"
echo "check-quick-start: the README's quick start ran as written ($(($(grep -c . "$work/quick-start.sh") - 2)) lines): a payment, a refund, the provider's events, a dead letter, the health view, the teardown"
