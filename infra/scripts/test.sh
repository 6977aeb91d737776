#!/usr/bin/env bash
# make test: the whole suite against its own local AWS endpoint and provider simulator.
# make test-fast (test.sh --fast [cargo test arguments]): the build and the cargo tests alone
# (unit, protocol, integration, doc tests), no template checks, packages or deploys.
#
# Each phase is timed; the table of them prints at the end (phase_table in lib.sh). What waits on
# something other than the cores runs beside what keeps them busy: the virtualenvs' installs (the
# network and the disk) beside the first build; the release packages and the crate checks, niced,
# beside the tests that wait on the emulator (those come first: a test never queues behind a link).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
fast=""
if [ "${1:-}" = --fast ]; then
  fast=1
  shift
fi
finish() {
  local status=$?
  phases_stop
  stop_started
  if [ -n "${PHASES_OWNED:-}" ]; then
    phase_table "make test${fast:+-fast}: where the time went"
    echo "make test${fast:+-fast}: $((SECONDS / 60)) min $((SECONDS % 60)) s in all"
    rm -f "$PHASES_FILE"
  fi
  exit "$status"
}
trap finish EXIT
phases_begin
phase_bg "virtualenvs" ensure_all_venvs ${fast:+--fast}
phase "build (debug: the workspace, all targets)" build --workspace --all-targets
# Every later build of the suite (the LocalStack tier's, the quick start's, e2e-sam's, the
# bench smoke's) resolves over the workspace too, and finds what this one built (lib.sh, build).
export BUILD_OVER_WORKSPACE=1
phase_wait "virtualenvs"
whole=""
[ -n "$fast" ] || [ $# -gt 0 ] || whole=1
# Beside the tests, niced (a test never queues behind a link), each in a target folder of its own
# so that none waits on another's cargo lock:
# - the x86_64 release package, with the whole-program link: the one e2e-sam deploys and the bench
#   smoke runs, so it comes first (nice 10 against the others' 19);
# - the arm64 package as a cross-check, unoptimised and without the whole-program link (package.sh says what
#   that proves and what builds the rest), in target/cross-check: a later make package of the
#   product finds its own build where it left it;
# - the crate checks and payctl resolved alone (crate_checks below), in target/crate-checks: they
#   resolve one package's features, not the workspace's, so most dependencies build again anyway.
x86_64_package() { nice -n 10 bash "$ROOT/infra/scripts/package.sh" x86_64; }
arm64_cross_check() {
  CARGO_TARGET_DIR="$TARGET/cross-check" nice -n 19 bash "$ROOT/infra/scripts/package.sh" arm64 --cross-check
}
# The generic crate as a crate of its own: it packages (metadata, README, licenses, no path
# dependency); the packaged copy, unpacked outside the workspace, checks with the lockfile it
# ships (cargo check: a library has no link step, and its dependencies' metadata is what the docs
# build needs too, where cargo package's own verification would build them in full as well),
# and its docs build there with warnings as errors; it builds with the toolchain of its stated
# MSRV. Then payctl as the README's install resolves it.
crate_checks() {
  export CARGO_TARGET_DIR="$TARGET/crate-checks"
  nice -n 19 cargo package --quiet -p sqs-once --allow-dirty --no-verify
  local crate unpacked msrv active
  crate=$(ls -t "$CARGO_TARGET_DIR"/package/sqs-once-*.crate | head -1)
  unpacked=$(mktemp -d)
  tar -xzf "$crate" -C "$unpacked"
  # Its docs are the packaged copy's too (as docs.rs builds them), on the same dependencies as
  # its check: one resolution of them, where `cargo doc -p sqs-once` in the workspace was a
  # second (the workspace's profile).
  (cd "$unpacked"/sqs-once-* && nice -n 19 cargo check --quiet --locked \
    && RUSTDOCFLAGS="-D warnings" nice -n 19 cargo doc --quiet --locked --no-deps)
  rm -rf "$unpacked"
  echo "sqs-once: $(basename "$crate") packaged; unpacked alone, it checks with its own lockfile and its docs build without a warning"
  msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$ROOT/sqs-once/Cargo.toml")
  active=$(rustc --version | awk '{print $2}')
  if [[ "$active" == "$msrv" || "$active" == "$msrv".* ]]; then
    # The active toolchain is the MSRV: the workspace build above was the MSRV build.
    echo "sqs-once: built with its stated MSRV $msrv (rustc $active)"
  else
    [[ "$msrv" =~ ^[0-9]+\.[0-9]+$ ]] && msrv="$msrv.0" # rustup names toolchains major.minor.patch
    nice -n 19 rustup run "$msrv" cargo check --quiet -p sqs-once --all-targets \
      || { echo "sqs-once does not build with its stated MSRV $msrv (rustup toolchain install $msrv)" >&2; return 1; }
  fi
  # payctl resolved alone, as `make install` (cargo install --locked --path infra/payctl)
  # resolves it: its own features, not the default members' that `build --bin payctl` unifies.
  # Checked, not installed: an install built every dependency a third time (neither the suite's
  # variant nor the quick start's), on the cores the x86_64 package waits for.
  nice -n 19 cargo check --quiet --locked -p payctl
  echo "payctl resolved alone (as make install resolves it) checks with the lockfile"
}
if [ -n "$whole" ]; then
  phase_bg "release package x86_64" x86_64_package
  phase_bg "release package arm64 (cross-check)" arm64_cross_check
fi
[ -n "$fast" ] || phase_bg "sqs-once as a crate, payctl alone" crate_checks
# The offline checks (about a core for 40 s, no endpoint), beside the cargo tests, which leave
# about a core idle: the template's (three shapes), then the house rules of the tree (no module
# circles, no file over 500 lines without a reason, the operator's crates apart from the proving
# ground, and the checker's own cases).
offline_checks() {
  bash "$ROOT/infra/scripts/check-template.sh"
  "$VENV/bin/python" "$ROOT/infra/layout/check_layout.py" --self-test
  "$VENV/bin/python" "$ROOT/infra/layout/check_layout.py" "$ROOT"
}
# The provider simulator refuses what a current Stripe account refuses, as Stripe refuses it;
# the contract checker refuses what Stripe's definitions refuse (each bad case on its own).
self_tests() {
  "$VENV/bin/python" "$ROOT/infra/provider-sim/test_simulator.py"
  "$ROOT/.venv-stripe/bin/python" "$ROOT/infra/contract/check_requests.py" --self-test
}
[ -n "$fast" ] || phase "simulator and contract checker self-tests" self_tests
phase "AWS endpoint (ministack) and its conformance" start_aws_endpoint
# The scripts themselves: CARGO_TARGET_DIR, a missing binary named, nothing extra installed.
[ -n "$fast" ] || phase "the scripts' own check" bash "$ROOT/infra/scripts/check-scripts.sh"
mkdir -p "$RUN_DIR"
export SIM_RECORD="$RUN_DIR/provider-requests.jsonl"
rm -f "$SIM_RECORD"
phase "the provider simulator" start_simulator
cd "$ROOT"
# One closing line over every test binary (plus the script checks that passed).
summary() {
  awk -v extra="$1" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?/) p += $i; if ($(i+1) ~ /^failed;?/) f += $i; if ($(i+1) ~ /^ignored;?/) s += $i } }
       END { printf "Summary: %d passed, %d failed, %d skipped\n", p + extra, f, s }' "$RUN_DIR/test-output.log"
}
# The integration tests wait on the emulator, the simulator and the processes they start, not on
# the cores (about one core busy at 8 at a time): each has its own queues, tables and payment ids,
# so they run RUST_TEST_THREADS at a time (8 unless set; libtest's default is one a core, and at
# two the integration binary took 415 s, at eight 115 s).
cargo_tests() {
  set +e
  RUST_TEST_THREADS="${RUST_TEST_THREADS:-8}" cargo test --workspace "$@" 2>&1 | tee "$RUN_DIR/test-output.log"
  status=${PIPESTATUS[0]}
  set -e
  [ "$status" -eq 0 ] || { summary 0; return "$status"; }
}
[ -n "$fast" ] || phase_bg "template and layout checks" offline_checks
phase "cargo test: unit, protocol, integration, doc tests" cargo_tests "$@"
[ -n "$fast" ] || phase_wait "template and layout checks"
[ -n "$fast" ] || grep -E "template checks passed|^layout:" "$(phase_log "template and layout checks")"
if [ -n "$fast" ]; then # the cargo tests alone
  summary 0
  exit 0
fi
if [ $# -gt 0 ]; then # a filtered run (cargo test arguments): the checks before and the cargo tests
  phase_wait "sqs-once as a crate, payctl alone"
  summary 7 # the template and layout checks, the crate checks, the two self-tests, the install, the scripts' check
  exit 0
fi
# The smoke run of the README's "Use it with Stripe", against the simulator (its requests are
# in the contract test too).
STRIPE_TEST_KEY="$PAYMENT_API_KEY" phase "payctl smoke" "$BIN/payctl" smoke
# The demo, small: money totals per currency, and every count adding up (a delivery, refund or
# provider event not in exactly one bucket is a violation: RESULT would say FAILED).
small_demo() {
  "$BIN/proving" demo --template "$ROOT/template.yaml" --payments 40 >"$RUN_DIR/demo.log" 2>&1 \
    || { cat "$RUN_DIR/demo.log" >&2; echo "the small demo failed" >&2; return 1; }
  grep -E "^(payments charged once|refund messages sent|refund processor|provider events|  at the inbox|local event source|RESULT)" "$RUN_DIR/demo.log"
  grep -qE "^payments charged once: +[0-9]+ \([0-9.]+ [a-z]{3}( \+ [0-9.]+ [a-z]{3})+\)$" "$RUN_DIR/demo.log" \
    || { echo "the demo's charged total is not per currency" >&2; return 1; }
  grep -q "^RESULT: OK" "$RUN_DIR/demo.log" || { echo "the demo's counts do not add up" >&2; return 1; }
  # Its traces: a local OTLP receiver took them, and one payment's reads from the API's request
  # to the charge's answer (docs/operate.md, "Traces").
  grep -E "^traces: +[1-9][0-9]* spans in [1-9][0-9]* traces" "$RUN_DIR/demo.log" \
    || { echo "the demo exported no traces" >&2; return 1; }
  sed -n '/^one payment.s trace/,/^[^ o]/p' "$RUN_DIR/demo.log" | grep -q "POST /v1/payment_intents (client, demo): .*http.response.status_code=200" \
    || { echo "the demo's payment trace has no charge under it" >&2; return 1; }
}
phase "the small demo (40 payments)" small_demo
# The contract test: every request the processors sent in the run above, checked against the
# official stripe package's parameter definitions and pinned version.
phase "the Stripe contract test" "$ROOT/.venv-stripe/bin/python" "$ROOT/infra/contract/check_requests.py" "$SIM_RECORD" \
  --rust-source "$ROOT/shared/src/stripe/client.rs" --rust-limits "$ROOT/shared/src/domain/limits.rs"
# The public events route under a flood: four clients send worst-case forged requests for 8 s
# while a genuine signed delivery arrives every second; each must be answered 200 within 1 s
# (make chaos runs it for 20 s on its own).
flood() { "$BIN/proving" webhook-flood --seconds 8 --clients 4 --deadline-ms 1000 | grep -v '^{'; }
phase "the events route under a flood (8 s)" flood
unset SIM_RECORD # the simulators of the runs below keep no record
stop_started
# TEST_LOCALSTACK=1 (.ci/run): the LocalStack tier (make test-localstack, its own endpoints and
# simulator) runs here, where the suite would otherwise wait for the x86_64 package's links.
if [ -n "${TEST_LOCALSTACK:-}" ]; then
  phase "make test-localstack (while the x86_64 package builds)" bash "$ROOT/infra/scripts/test-localstack.sh"
fi
# The README's quick start, run as written in a fresh shell with its own stack, here too where
# the suite would wait for the x86_64 package (its `build --bin payctl` is the suite's build
# again, BUILD_OVER_WORKSPACE: it finds payctl built).
phase "the README's quick start" bash "$ROOT/infra/scripts/check-quick-start.sh"
# The deployed shape: sam deploy onto ministack with the x86_64 package built beside the tests.
phase_wait "release package x86_64"
grep -E "bootstraps built together|ELF for" "$(phase_log "release package x86_64")"
# The package is built: e2e-sam and the bench smoke take it as it is (neither rebuilds it under
# the other), each with its own ministack and simulator on ports of its own, side by side: both
# mostly wait (deploys, visibility timeouts, the provider's latency), and one after the other
# they were the last nine minutes of a cold run on a machine otherwise idle by then.
export PACKAGE_READY=x86_64
# A smoke run of the benchmark (tiny N, debug build): every measurement must still work.
# At the provider's latency too: a small drain and open loop per contender, the retry rows with
# a 20 s visibility timeout (the peer's retry waits it out).
# The provider-rate rows drain 30 payments per account and contender (60 before: each row still
# runs, on half the backlog). The backlog stays 40: at 20, four concurrent batches of the peer
# held a batch of nothing but copies in progress elsewhere, which Powertools fails as a whole
# (BatchProcessingError), and the bench refuses a failed invocation.
bench_smoke() {
  BENCH_ARCHS=x86_64 PROVING_PROFILE=dev bash "$ROOT/infra/scripts/bench.sh" --payments 40 --cold-start-runs 3 \
    --latency-payments 20 --open-loop-payments 20 --retry-visibility-timeout 20 --rate-payments 30 \
    --out "$RUN_DIR/bench-smoke"
}
phase_bg "bench smoke" bench_smoke
phase "sam deploy onto ministack, both event shapes (e2e-sam)" bash "$ROOT/infra/scripts/e2e-sam.sh"
phase_wait "bench smoke"
phase_wait "sqs-once as a crate, payctl alone"
grep -E "^sqs-once:|^payctl " "$(phase_log "sqs-once as a crate, payctl alone")"
phase_wait "release package arm64 (cross-check)"
grep -E "bootstraps built together|ELF for" "$(phase_log "release package arm64 (cross-check)")"
bench_results() {
  # results_have WHAT PATTERN...: each pattern (grep -E) is a line of the smoke run's results.md.
  results_have() {
    local what=$1 line
    shift
    for line in "$@"; do
      grep -qE "$line" "$RUN_DIR/bench-smoke/results.md" \
        || { echo "bench results lack $what ($line)" >&2; return 1; }
    done
  }
  # Its results say when, at which commit, on what machine and emulator, with how many payments.
  grep -qE "^Run 20[0-9-]+T.* at commit [0-9a-f]+ on .* cores, .* against ministack [0-9.]+: 40 payments" "$RUN_DIR/bench-smoke/results.md" \
    || { echo "bench results lack their date, commit, machine, emulator or sizes" >&2; return 1; }
  # ... the retry rows: one transient failure charged once with no dead letter, an outage as long as
  # the horizon dead-letters nothing;
  results_have "the retry rows" "^\| one transient provider failure .*\| [0-9.]+ s, [0-9]+ deliveries, 1 charge, 0 dead letters" \
    "^\| an outage as long as the retry horizon .*\| 0 \([0-9]+ deliveries, 1 charge"
  # ... and the peer path: the comparison with the Powertools peer, the concurrent-duplicate case
  # (each charged once), the rows at the provider's latency (per batch, billed, send -> charged,
  # the cost there, one transient failure), both cost tables, the API's write units and the
  # goals line, in the Markdown and the PNG.
  results_have "the peer comparison" "^### Against the Powertools peer" "^\| this \| [0-9.]+ s \| 1 \| 1 \|$" "^\| peer \| [0-9.]+ s \| 1 \| 1 \|$" \
    "^\| \*\*total\*\* \| [0-9.]+ \| [0-9.]+ \|$" \
    "^\| at the provider's latency \(log-normal, p50 350 ms, p99 1500 ms\): 20 payments drained" \
    "^\| at the provider's latency: an open loop of 4 payments/s \(20 payments" \
    "^\| payments/s per concurrent batch, at the provider's latency \(p50 350 ms, p99 1500 ms\) \| [0-9.]+ \| [0-9.]+ \|" \
    "^\| billed duration per payment, at the provider's latency .* \| [0-9.]+ ms \| [0-9.]+ ms \|" \
    "^\| send → charged p99, an open loop of 4 payments/s arriving, 4 batches, at the provider's latency .* \| [0-9]+ ms \| [0-9]+ ms \|" \
    "^\| cost of a million payments on AWS, at the provider's latency .* \| \\\$[0-9.]+ \| \\\$[0-9.]+ \|" \
    "^\| one transient provider failure \(every call of the first delivery answers 429\) → charged after, queue visibility timeout 20 s \| [0-9.]+ s \| [0-9.]+ s \|" \
    "^Cost of a million payments on AWS, the provider answering at its latency" \
    "^\| DynamoDB write units per payment accepted through the API .* \| [0-9.]+ \(" \
    "^Goals: .*billed duration per payment ≤ 1/8 .*(met|NOT met).*API write units per payment ≤ 3 .*(met|NOT met)"
  [ "$(head -c 24 "$RUN_DIR/bench-smoke/bench.png" | tail -c 8 | od -An -tu1 | awk '{print $3 * 256 + $4}')" = 1800 ] \
    || { echo "bench.png lacks the comparison panel" >&2; return 1; }
  # ... the provider-rate rows: each account, both contenders, every payment charged once or
  # dead-lettered (the run fails otherwise), and the goals;
  results_have "the provider-rate rows" "^\| the provider's rate: 30 payments queued at once" \
    "^\| rate, this project, sandbox: 25/s in all, 25/s an endpoint; .* \| [0-9.]+ payments/s sustained.* [0-9]+ dead letters" \
    "^\| rate, the peer, sandbox: 25/s in all" "^\| rate, this project, live: 100/s in all, 25/s an endpoint" \
    "^\| rate, the peer, live: " "^\| rate, this project, raised: 300/s in all, 200/s an endpoint; .* over 20 instances" \
    "^\| rate, the peer, raised: " "^\| rate goals \(this project\) \| drain ≤ 1.1× the floor"
  # ... the traces rows: export off and on, every figure measured;
  results_have "the traces rows" "^\| traces off / on \(OTLP/HTTP to a local receiver.*: 40 payments drained by one process, [1-9][0-9.]* spans a payment" \
    "^\| traces off / on: CPU per payment \| [0-9.]+ ms / [0-9.]+ ms" "^\| traces off / on: billed duration per payment \| [0-9.]+ ms / [0-9.]+ ms" \
    "^\| traces off / on: cold start to first Runtime API request \| [0-9.]+ ms / [0-9.]+ ms"
  # ... and the events route's rows: the worst forged request beside a genuine delivery.
  results_have "the events route's rows" "^\| events route, genuine delivery .* \| p50 [0-9.]+ ms, max [0-9.]+ ms; the verifier alone p50 [0-9]+ µs; 2 MACs per request \|$" \
    "^\| events route, forged: full header within the caps .* 2 MACs per request \|$" \
    "^\| events route, a body declared over 256 KiB .* \| 413 after [0-9.]+ ms \|$" \
    "^\| events function, one invocation on one core .*the largest body Lambda accepts"
}
phase "the bench smoke's results checked" bench_results
# The crate checks, the template checks, the layout check, the simulator's and the checker's
# self-tests, the install, the smoke run, the contract test, the flood, the package check, the
# e2e run, the bench smoke run, the small demo, the scripts' check and the quick start count as
# fifteen more passed checks.
summary 15
