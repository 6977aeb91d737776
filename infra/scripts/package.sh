#!/usr/bin/env bash
# make package: `sam build` of the functions (BuildMethod: rust-cargolambda, cargo-lambda and
# zig from PyPI), then checks that each bootstrap is an ELF of the wanted architecture.
# Usage: package.sh [arm64|x86_64]   (default arm64)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
arch="${1:-arm64}"
ensure_deploy_tools
export PATH="$ROOT/.venv-sam/bin:$PATH" SAM_CLI_TELEMETRY=0
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
case "$arch" in
  arm64) target=aarch64-unknown-linux-gnu machine=183 ;;
  x86_64) target=x86_64-unknown-linux-gnu machine=62 ;;
  *) echo "unknown architecture $arch" >&2; exit 2 ;;
esac
# cargo-lambda cross-compiles with zig; the Rust standard library of the target comes from rustup.
if ! rustup target list --installed | grep -qx "$target"; then
  log "adding the Rust target $target"
  rustup target add "$target"
fi
cd "$ROOT"
sam build --template template.yaml --build-dir ".aws-sam/build-$arch" --parameter-overrides "Architecture=$arch"
for function in PaymentProcessorFunction RefundProcessorFunction PaymentsApiFunction OutboxRelayFunction ProviderEventsFunction EventProcessorFunction; do
"$ROOT/.venv-sam/bin/python" - ".aws-sam/build-$arch/$function/bootstrap" "$machine" "$arch" <<'PY'
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
