#!/usr/bin/env bash
# make package: `sam build` of the functions (BuildMethod: rust-cargolambda, cargo-lambda and
# zig from PyPI), then checks that each bootstrap is an ELF of the wanted architecture.
# Usage: package.sh [arm64|x86_64] [--cross-check]   (default arm64)
#
# --cross-check (make test's arm64 package): the same code, dependencies, features, zig linker
# and sam build packaging, without the release profile's optimisation (opt-level 0: LLVM's passes
# were most of its 21 minutes beside make test's other work on two cores) and whole-program link
# (lto = true, one codegen unit), which takes a core for about a minute a binary. What it cannot
# catch, a failure or size change of the optimised, whole-program build on arm64 alone, `make
# package` (arm64, the template's default) and `make bench` build in full; make test runs the x86_64 package, the one
# it deploys and runs, with the whole-program link. The cross-check's bootstraps are not the
# product: they go to a folder of their own, .aws-sam/cross-check/build-ARCH (with a CROSS-CHECK
# note), never to .aws-sam/build-ARCH that sam deploy takes, and sam build's build.toml there is
# its own (an x86_64 sam build may run beside).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
arch="${1:-arm64}"
cross_check=""
build_dir=".aws-sam/build-$arch"
case "${2:-}" in
  "") ;;
  --cross-check)
    cross_check=1
    build_dir=".aws-sam/cross-check/build-$arch"
    export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
      CARGO_PROFILE_RELEASE_OPT_LEVEL=0
    ;;
  *) echo "package.sh: unknown option ${2}" >&2; exit 2 ;;
esac
ensure_deploy_tools
export PATH="$ROOT/.venv-sam/bin:$PATH" SAM_CLI_TELEMETRY=0
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
case "$arch" in
  arm64) target=aarch64-unknown-linux-gnu machine=183 lambda_arch=(--arm64) ;;
  x86_64) target=x86_64-unknown-linux-gnu machine=62 lambda_arch=() ;;
  *) echo "unknown architecture $arch" >&2; exit 2 ;;
esac
# cargo-lambda cross-compiles with zig; the Rust standard library of the target comes from rustup.
if ! rustup target list --installed | grep -qx "$target"; then
  log "adding the Rust target $target"
  rustup target add "$target"
fi
cd "$ROOT"
# sam build runs `cargo lambda build --release [--arm64] --bin NAME` once per function, one after
# the other, and each final binary's whole-program optimisation (lto, one codegen unit) uses one
# core for about a minute. The same command for every binary at once lets cargo run those in
# parallel; sam build's own per-function commands then find them up to date (the same command,
# flags and target directory, and the features are resolved for the whole workspace either way).
mapfile -t binaries < <(sed -n 's/^ *Binary: *\([a-z0-9_-]*\) *$/\1/p' template.yaml)
methods=$(grep -c '^ *BuildMethod: *rust-cargolambda *$' template.yaml || true)
[ "${#binaries[@]}" -gt 0 ] && [ "${#binaries[@]}" -eq "$methods" ] \
  || { echo "template.yaml: ${#binaries[@]} plain 'Binary: name' lines for $methods rust-cargolambda functions" >&2; exit 1; }
started=$SECONDS
cargo lambda build --release "${lambda_arch[@]}" $(printf -- '--bin %s ' "${binaries[@]}")
log "the ${#binaries[@]} $arch bootstraps built together in $((SECONDS - started)) s${cross_check:+ (cross-check: unoptimised, no whole-program link)}"
built_at() { # each bootstrap's newest build in cargo's folder (cargo-lambda moves the linked copy)
  for b in "${binaries[@]}"; do
    find "$TARGET/$target/release/deps" -maxdepth 1 -type f -name "${b//-/_}-*" ! -name '*.d' -printf '%T@\n' | sort -n | tail -1
  done
}
before=$(built_at)
started=$SECONDS
sam build --template template.yaml --build-dir "$build_dir" --parameter-overrides "Architecture=$arch"
if [ -n "$cross_check" ]; then
  echo "These bootstraps are make test's cross-check (package.sh $arch --cross-check): built unoptimised and without the whole-program link, not the product. make package ARCH=$arch builds the product." >"$build_dir/CROSS-CHECK"
fi
if [ "$(built_at)" = "$before" ]; then
  log "sam build of $arch in $((SECONDS - started)) s: its cargo commands found the bootstraps up to date"
else
  log "sam build of $arch in $((SECONDS - started)) s: its cargo commands built again (they differ from the one above, which saved nothing)"
fi
for function in PaymentProcessorFunction RefundProcessorFunction PaymentsApiFunction OutboxRelayFunction ProviderEventsFunction EventProcessorFunction; do
"$ROOT/.venv-sam/bin/python" - "$build_dir/$function/bootstrap" "$machine" "$arch" <<'PY'
import os, struct, sys
path, machine, arch = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(path, "rb") as f:
    head = f.read(64)
if head[:4] != b"\x7fELF":
    sys.exit(f"{path} is not an ELF file")
(e_machine,) = struct.unpack_from("<H", head, 18)
if e_machine != machine:
    sys.exit(f"{path} is for machine {e_machine}, not {arch} ({machine})")
print(f"{path}: ELF for {arch} (e_machine {e_machine}), {os.path.getsize(path)} bytes")
PY
done
