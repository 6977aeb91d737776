# Shared by demo.sh and test.sh: install the local tools into a project-local virtualenv, start
# a local AWS endpoint and the provider simulator on free ports, and stop what was started.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Where cargo builds: CARGO_TARGET_DIR when set (a relative one is the root's), else target/.
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
export CARGO_TARGET_DIR="$TARGET"
BIN="$TARGET/debug"
VENV="$ROOT/.venv"
RUN_DIR="$ROOT/.local/run"
STARTED_PIDS=()

# Each line with the time of day, so that a slow step shows in a CI log.
log() { echo "[local-stack $(date +%T)] $*" >&2; }

# The project's virtualenv: the provider simulator and the checks need only the standard
# library; moto is installed only for LOCAL_AWS=moto. uv (infra/requirements-uv.txt) goes
# into it, and makes and fills the tools' virtualenvs: pip took about four minutes of a core in
# a cold CI run for them (its resolver and unpacking, beside the first build), uv about one.
ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating the virtualenv $VENV"
    python3 -m venv "$VENV"
  fi
  if ! cmp -s "$ROOT/infra/requirements-uv.txt" "$VENV/.requirements-uv"; then
    log "installing $(grep -v '^#' "$ROOT/infra/requirements-uv.txt" | tr '\n' ' ')into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/infra/requirements-uv.txt"
    cp "$ROOT/infra/requirements-uv.txt" "$VENV/.requirements-uv"
  fi
  if [ "${LOCAL_AWS:-ministack}" = moto ] && ! "$VENV/bin/python" -c 'import moto' 2>/dev/null; then
    log "installing moto[server] into $VENV (LOCAL_AWS=moto)"
    uv_install "$VENV" "$ROOT/infra/requirements.txt"
  fi
}

# cargo build ARGS, saying what it builds and how long it took; on a terminal cargo shows its
# progress bar, elsewhere (CI) one line before and one after. A first build compiles the AWS
# SDK: about ten minutes on two cores; later ones take seconds.
# BUILD_OVER_WORKSPACE=1 (make test exports it after its build of the workspace, all targets):
# the build is that one again (ARGS and --workspace --all-targets), which finds everything built,
# the binaries asked for among it. Without it a build at the root resolves the default members'
# features alone: tokio without the simulator's `test-util`, sqs-once without the feature its
# tests turn on (`sim-mutations`, whose switches only the simulator throws), so a second build
# of every dependency on tokio: about 155 s of a cold CI run's foreground, in the LocalStack
# tier where it came first.
build() {
  local started=$SECONDS scope=()
  [ -z "${BUILD_OVER_WORKSPACE:-}" ] || scope=(--workspace --all-targets)
  if [ -t 2 ]; then
    log "building (${scope[*]:+${scope[*]} }$*) into $TARGET"
    cargo build "${scope[@]}" "$@"
  else
    log "building (${scope[*]:+${scope[*]} }$*) into $TARGET: a first build takes about ten minutes on two cores"
    cargo build --quiet "${scope[@]}" "$@"
  fi
  log "built in $((SECONDS - started)) s"
}

# The deployment tools live in their own virtualenvs: aws-sam-cli and checkov pin conflicting
# versions of boto3.
ensure_tool_venv() { # name requirements-file probe-module
  local venv="$ROOT/.venv-$1"
  ensure_venv # (uv)
  if [ ! -x "$venv/bin/python" ]; then
    log "creating the virtualenv $venv"
    uv_venv python3 "$venv"
  fi
  if ! "$venv/bin/python" -c "import $3" 2>/dev/null || ! cmp -s "$2" "$venv/.requirements"; then
    log "installing $(grep -v '^#' "$2" | tr '\n' ' ')into $venv"
    uv_install "$venv" "$2"
    cp "$2" "$venv/.requirements"
  fi
}
# A virtualenv made by uv (ensure_venv installs it): python venv.
uv_venv() { "$VENV/bin/uv" venv --quiet --python "$1" "$2"; }
# The requirements file's packages into the virtualenv, compiled to bytecode as pip compiles
# them (a tool's every start would otherwise compile what it imports: checkov's took 5.7 s, not
# 2.6), copied from uv's cache rather than linked (the cache may be on another file system).
uv_install() { # venv requirements-file
  "$VENV/bin/uv" pip install --quiet --python "$1/bin/python" --compile-bytecode --link-mode copy -r "$2"
}

# The official stripe package: the authority of the contract test.
ensure_contract_tools() {
  ensure_tool_venv stripe "$ROOT/infra/contract/requirements.txt" stripe
}

ensure_deploy_tools() {
  ensure_tool_venv sam "$ROOT/infra/requirements-sam.txt" samcli
  ensure_tool_venv checkov "$ROOT/infra/requirements-checkov.txt" checkov
}

# LocalStack's runtime (make test-localstack) in its own virtualenv, with Python 3.13 or newer.
LS_VENV="$ROOT/.venv-localstack"
# Python 3.13 or newer: on the PATH, else pyenv's.
find_python313() {
  local candidate
  for candidate in python3.14 python3.13 python3 "$HOME"/.pyenv/versions/3.1[3-9]*/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}
ensure_localstack_venv() {
  local python
  ensure_venv # (uv)
  if [ ! -x "$LS_VENV/bin/python" ]; then
    python=$(find_python313) || {
      log "LocalStack's runtime needs Python 3.13 or newer (localstack 2026.3 imports warnings.deprecated); none was found on the PATH or under ~/.pyenv/versions: install one (pyenv install 3.13) and run again"
      return 1
    }
    log "creating $LS_VENV with $python"
    uv_venv "$python" "$LS_VENV"
  fi
  if ! cmp -s "$ROOT/infra/requirements-localstack.txt" "$LS_VENV/.requirements"; then
    log "installing localstack-core and its pinned dependencies into $LS_VENV"
    uv_install "$LS_VENV" "$ROOT/infra/requirements-localstack.txt"
    cp "$ROOT/infra/requirements-localstack.txt" "$LS_VENV/.requirements"
  fi
}

# Every virtualenv a CI run uses, installed side by side (pip waits on the network and the disk,
# so this runs beside the first build): the suite's, the deployment tools', the stripe package,
# ministack, the Powertools peer; LocalStack's too with --localstack; with --fast, the suite's,
# ministack's and the stripe package's (make test-fast: its cargo tests hold the webhook receiver
# to the official verifier) alone.
ensure_all_venvs() {
  ensure_venv
  local pids=() pid status=0
  if [ "${1:-}" = --fast ]; then # make test-fast: the emulator and the stripe package
    ensure_ministack_venv
    ensure_contract_tools
    return 0
  fi
  (ensure_deploy_tools) & pids+=($!)
  # (one command after another, not joined by &&: errexit must hold inside each)
  (
    ensure_contract_tools
    ensure_ministack_venv
    ensure_peer_tools
  ) &
  pids+=($!)
  if [ "${1:-}" = --localstack ]; then (ensure_localstack_venv) & pids+=($!); fi
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return "$status"
}

ensure_ministack_venv() {
  ensure_tool_venv ministack "$ROOT/infra/requirements-ministack.txt" "ministack, samtranslator"
}

# The Powertools (Python) peer the benchmark compares with.
ensure_peer_tools() {
  ensure_tool_venv peer "$ROOT/infra/requirements-peer.txt" "aws_lambda_powertools, awslambdaric, boto3"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# True when anything answers HTTP at the URL (any status).
answers() {
  python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass
except Exception:
    sys.exit(1)
PY
}

wait_for_url() { # url, seconds
  local url=$1 deadline=$((SECONDS + $2))
  until answers "$url"; do
    if [ $SECONDS -ge $deadline ]; then log "timed out waiting for $url"; return 1; fi
    sleep 0.2
  done
}

# Uses AWS_ENDPOINT_URL if something answers there (LocalStack, a running ministack); else
# starts ministack on a free port (LOCAL_AWS=moto starts moto server instead) and exports
# AWS_ENDPOINT_URL for it. Then `payctl conformance` must pass: an endpoint that breaks what the
# protocol relies on (moto 5.2's conditional UpdateItem is not atomic) is refused, naming the
# failed check. Needs payctl built ($BIN/payctl).
start_aws_endpoint() {
  export AWS_REGION="${AWS_REGION:-us-east-1}" AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
  export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
  if [ -n "${AWS_ENDPOINT_URL:-}" ] && answers "$AWS_ENDPOINT_URL"; then
    log "using the AWS endpoint already answering at $AWS_ENDPOINT_URL"
  elif [ "${LOCAL_AWS:-ministack}" = moto ]; then
    mkdir -p "$RUN_DIR"
    local port; port=$(free_port)
    log "starting moto server on 127.0.0.1:$port (LOCAL_AWS=moto)"
    "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$RUN_DIR/moto.log" 2>&1 &
    STARTED_PIDS+=($!)
    export AWS_ENDPOINT_URL="http://127.0.0.1:$port"
    wait_for_url "$AWS_ENDPOINT_URL/moto-api/" 60
  else
    start_ministack
  fi
  check_conformance
  write_env_file
}

# Writes the local stack's variables to .local/env (`source .local/env` in a second shell);
# `payctl env --stack-name N` adds a provisioned stack's tables and queues.
ENV_FILE="$ROOT/.local/env"
write_env_file() {
  mkdir -p "$(dirname "$ENV_FILE")"
  : >"$ENV_FILE"
  local v
  for v in AWS_ENDPOINT_URL AWS_REGION AWS_DEFAULT_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY PROVIDER_API_URL PAYMENT_API_KEY WEBHOOK_SECRET; do
    if [ -n "${!v:-}" ]; then printf 'export %s=%q\n' "$v" "${!v}" >>"$ENV_FILE"; fi
  done
  ENV_WRITTEN="$(cat "$ENV_FILE")"
}

# Refuses the endpoint unless it keeps the protocol's semantics (payctl conformance).
check_conformance() {
  mkdir -p "$RUN_DIR"
  if [ ! -x "$BIN/payctl" ]; then
    log "payctl is not built at $BIN/payctl (CARGO_TARGET_DIR=$TARGET): build it first (cargo build --bin payctl)"
    return 1
  fi
  log "checking $AWS_ENDPOINT_URL with payctl conformance (9 checks, a few seconds)"
  if ! "$BIN/payctl" conformance >"$RUN_DIR/conformance.log" 2>&1; then
    cat "$RUN_DIR/conformance.log" >&2
    if grep -q "^  FAIL " "$RUN_DIR/conformance.log"; then
      log "refusing $AWS_ENDPOINT_URL: it fails the conformance checks above; use ministack (the default) or LocalStack"
    else
      log "payctl conformance could not check $AWS_ENDPOINT_URL: the error above says why"
    fi
    return 1
  fi
  grep -E "^all " "$RUN_DIR/conformance.log" | sed 's/^/[local-stack] /' >&2
}

# Starts the provider simulator on a free port; exports PROVIDER_API_URL and PAYMENT_API_KEY, and
# WEBHOOK_SECRET: the secret the events route verifies with (`payctl api serve`) and the
# simulator signs its deliveries with once told where to deliver (POST /_sim/webhook).
start_simulator() {
  mkdir -p "$RUN_DIR"
  local portfile="$RUN_DIR/sim.port.$$"
  rm -f "$portfile"
  export PAYMENT_API_KEY="${PAYMENT_API_KEY:-sk_test_local}"
  export WEBHOOK_SECRET="${WEBHOOK_SECRET:-whsec_local_$(python3 -c 'import secrets; print(secrets.token_hex(16))')}"
  local record=()
  # SIM_RECORD=FILE: every request the simulator receives is appended there (the contract test).
  if [ -n "${SIM_RECORD:-}" ]; then record=(--record "$SIM_RECORD"); fi
  "$VENV/bin/python" "$ROOT/infra/provider-sim/simulator.py" --port 0 --port-file "$portfile" \
    --api-key "$PAYMENT_API_KEY" --seed "${SIM_SEED:-0}" "${record[@]}" >"$RUN_DIR/simulator.log" 2>&1 &
  STARTED_PIDS+=($!)
  local deadline=$((SECONDS + 30))
  until [ -s "$portfile" ]; do
    if [ $SECONDS -ge $deadline ]; then log "the provider simulator did not start"; cat "$RUN_DIR/simulator.log" >&2; return 1; fi
    sleep 0.1
  done
  export PROVIDER_API_URL="http://127.0.0.1:$(cat "$portfile")"
  rm -f "$portfile"
  wait_for_url "$PROVIDER_API_URL/_sim/health" 30
  log "provider simulator at $PROVIDER_API_URL"
  write_env_file
}

# Starts ministack (with the SAM translator) on a free port and exports AWS_ENDPOINT_URL for it.
# AWS_ENDPOINT_URL is in ministack's own environment too, so the functions it runs reach it.
start_ministack() {
  ensure_ministack_venv
  local port; port=$(free_port)
  export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
  export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
  mkdir -p "$RUN_DIR"
  log "starting ministack on 127.0.0.1:$port (waiting up to 60 s for it to answer)"
  (cd "$RUN_DIR" && BIND_HOST=127.0.0.1 GATEWAY_PORT=$port exec "$ROOT/.venv-ministack/bin/ministack") >"$RUN_DIR/ministack.log" 2>&1 &
  STARTED_PIDS+=($!)
  wait_for_url "$AWS_ENDPOINT_URL/_ministack/health" 60
}

stop_started() {
  # What this shell started is gone: the variables it wrote would point nowhere (a file that
  # another shell has written since is left alone).
  if [ -n "${ENV_WRITTEN:-}" ] && [ "$(cat "$ENV_FILE" 2>/dev/null)" = "$ENV_WRITTEN" ]; then
    rm -f "$ENV_FILE"
  fi
  # All asked to stop at once (they shut down side by side), then each waited for.
  for pid in "${STARTED_PIDS[@]:-}"; do
    [ -n "$pid" ] && our_child "$pid" && kill "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED_PIDS[@]:-}"; do
    [ -n "$pid" ] && stop_process "$pid" 30
  done
  STARTED_PIDS=()
}

# Whether pid is still a process this script started (its parent is this shell): the number of
# one that ended long ago may belong to another process by now.
our_child() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) } # after the command's name: state, parent, ...
  # shellcheck disable=SC2086
  set -- $stat
  [ "${2:-}" = "$$" ]
}

stop_process() { # pid, seconds: SIGTERM, then SIGKILL if it has not exited within the seconds
  # A server that hangs on its way out must not hold the run until CI's deadline.
  local pid=$1 seconds=$2 deadline
  if ! our_child "$pid"; then
    wait "$pid" 2>/dev/null || true
    return 0
  fi
  deadline=$((SECONDS + seconds))
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "process $pid ($(ps -o comm= -p "$pid" 2>/dev/null || echo '?')) did not stop within ${seconds} s of SIGTERM: killed"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# Where the time goes: each phase of a run is timed and appended to PHASES_FILE (name, seconds,
# how it ran); phase_table prints them as a table at the end of make test and of .ci/run, so a
# change that makes the suite slower says so in its own run. The phase under way is in
# PHASES_FILE.current (name, start): one that fails or is stopped is the table's last row.
PHASES_FILE="${PHASES_FILE:-}"
phases_begin() { # starts a table of this run's own unless one is already being written
  if [ -z "$PHASES_FILE" ]; then
    mkdir -p "$RUN_DIR"
    PHASES_FILE="$RUN_DIR/phases.$$.tsv"
    PHASES_OWNED=1
    : >"$PHASES_FILE"
  fi
  export PHASES_FILE
}
# The machine's cores, busy and idle, in clock ticks since boot (/proc/stat's first line: user,
# nice, system, irq and softirq are busy; idle and iowait are not): a phase's row says how busy
# the machine was while it ran, so that the table shows whether the run waits on the cores.
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $5 + $6; exit }' /proc/stat 2>/dev/null || echo "0 0"; }
busy_since() { # "busy idle" at the start: the machine's busy share since then, in per cent
  local now
  now=$(machine_ticks)
  awk -v a="$1" -v b="$now" 'BEGIN { split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2]
    if (busy + idle > 0) printf "%d%%", 100 * busy / (busy + idle); else printf "-" }'
}
# The CPU time of what a subshell ran and waited for (bash's times, its children's user + system),
# in whole seconds, into the variable named: a phase beside the foreground runs in a subshell, so
# its row says what it cost the cores. (times in this shell, into a file: in a pipe or a command
# substitution it would be a fork's, which has no children.)
children_cpu_into() { # variable
  local file
  file=$(mktemp)
  times >"$file"
  printf -v "$1" '%s' "$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, m, "m"); sub("s", "", m[2]); s += m[1] * 60 + m[2] } printf "%d", s }' "$file")"
  rm -f "$file"
}
phase_started() { # name [start, epoch seconds]
  [ -z "$PHASES_FILE" ] || printf '%s\t%s\n' "$1" "${2:-$(date +%s)}" >"$PHASES_FILE.current"
}
phase() { # name command...: runs the command in the foreground (errexit applies inside it)
  local name=$1 started=$SECONDS ticks
  shift
  ticks=$(machine_ticks)
  phase_started "$name"
  "$@"
  [ -z "$PHASES_FILE" ] || {
    printf '%s\t%d\tforeground\t-\t%s\n' "$name" "$((SECONDS - started))" "$(busy_since "$ticks")" >>"$PHASES_FILE"
    rm -f "$PHASES_FILE.current"
  }
}
# A phase beside the foreground: its output goes to the file phase_log NAME prints, shown when it
# fails; phase_wait NAME waits for it and fails the run if it failed.
declare -A PHASE_PIDS=() PHASE_STARTS=()
phase_log() { # name: its log, $RUN_DIR/phase-<the name's letters and digits, the rest as ->.log
  local slug
  slug=$(tr -cs 'a-zA-Z0-9' '-' <<<"$1")
  echo "$RUN_DIR/phase-${slug%-}.log"
}
phase_bg() { # name command...
  local name=$1 log
  shift
  mkdir -p "$RUN_DIR"
  log=$(phase_log "$name")
  (
    started=$SECONDS
    ticks=$(machine_ticks)
    "$@"
    children_cpu_into cpu
    [ -z "$PHASES_FILE" ] || printf '%s\t%d\tbeside the foreground\t%s\t%s\n' "$name" "$((SECONDS - started))" \
      "$cpu" "$(busy_since "$ticks")" >>"$PHASES_FILE"
  ) >"$log" 2>&1 &
  PHASE_PIDS[$name]=$!
  PHASE_STARTS[$name]=$(date +%s)
  log "$name: started beside the run (its output: $log)"
}
phase_wait() { # name
  local name=$1 pid=${PHASE_PIDS[$1]} started=$SECONDS status=0 ticks
  ticks=$(machine_ticks)
  phase_started "waiting for $name"
  wait "$pid" || status=$?
  # (quoted whole: a name with a quote in it must not leave the key behind)
  unset -v 'PHASE_PIDS[$name]'
  if [ "$status" -ne 0 ]; then
    cat "$(phase_log "$name")" >&2
    log "$name failed (exit $status): its output is above"
    phase_started "$name (beside the run, from its start)" "${PHASE_STARTS[$name]}"
    return "$status"
  fi
  [ -z "$PHASES_FILE" ] || rm -f "$PHASES_FILE.current"
  if [ $((SECONDS - started)) -gt 0 ] && [ -n "$PHASES_FILE" ]; then
    printf '%s\t%d\tforeground\t-\t%s\n' "waiting for $name" "$((SECONDS - started))" "$(busy_since "$ticks")" >>"$PHASES_FILE"
  fi
}
# Stops the phases still running beside (an early failure must not leave a build running).
phases_stop() {
  local name
  for name in "${!PHASE_PIDS[@]}"; do
    kill_tree "${PHASE_PIDS[$name]}"
    wait "${PHASE_PIDS[$name]}" 2>/dev/null || true
  done
  PHASE_PIDS=()
}
kill_tree() { # pid: SIGTERM to it (first: it must not go on to its next command) and all below it
  local child children
  children=$(pgrep -P "$1" 2>/dev/null || true)
  kill "$1" 2>/dev/null || true
  for child in $children; do kill_tree "$child"; done
}
phase_table() { # [title]: the table of every phase so far; one that failed or was stopped last
  [ -n "$PHASES_FILE" ] && [ -f "$PHASES_FILE" ] || return 0
  if [ -f "$PHASES_FILE.current" ]; then
    awk -F '\t' -v now="$(date +%s)" '{ printf "%s\t%d\tFAILED or stopped\n", $1, now - $2 }' \
      "$PHASES_FILE.current" >>"$PHASES_FILE"
    rm -f "$PHASES_FILE.current"
  fi
  echo
  echo "${1:-Where the time went} (wall time; phases beside the foreground overlap it; CPU: what a phase"
  echo "beside cost the cores, in minutes of one core; busy: the share of the machine's cores busy while it ran):"
  echo
  awk -F '\t' '
    function t(s) { return sprintf("%d:%02d", int(s / 60), s % 60) }
    { cpu = ($4 == "" || $4 == "-") ? "" : t($4); busy = ($5 == "") ? "" : $5
      printf "| %-62s | %7s | %-21s | %7s | %5s |\n", $1, t($2), $3, cpu, busy; if ($3 != "beside the foreground") sum += $2 }
    END { printf "| %-62s | %7s |\n", "foreground in all", t(sum) }' "$PHASES_FILE"
  echo
}
