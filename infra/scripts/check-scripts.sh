#!/usr/bin/env bash
# The local scripts' own behaviour (run by make test once the AWS endpoint is up): they build and
# look for binaries where CARGO_TARGET_DIR says, name a missing binary instead of blaming the
# emulator, and install nothing the default path does not use.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "check-scripts: $*" >&2; exit 1; }
real_target="${CARGO_TARGET_DIR:-$(cd "$here/../.." && pwd)/target}"

# 1. A target folder without payctl: the missing binary is named, the emulator is not blamed.
out=$( (CARGO_TARGET_DIR="$work/empty" && source "$here/lib.sh" && check_conformance) 2>&1 ) \
  && fail "check_conformance passed with no payctl built"
grep -q "payctl is not built at $work/empty/debug/payctl" <<<"$out" || fail "the missing payctl is not named: $out"
grep -q "refusing" <<<"$out" && fail "the emulator is blamed for a missing binary: $out"

# 2. Another CARGO_TARGET_DIR (here a link to the build): the scripts use its binaries.
ln -s "$real_target" "$work/elsewhere"
out=$( (CARGO_TARGET_DIR="$work/elsewhere" && source "$here/lib.sh" && echo "BIN=$BIN" && check_conformance) 2>&1 ) \
  || fail "check_conformance failed with CARGO_TARGET_DIR=$work/elsewhere: $out"
grep -q "^BIN=$work/elsewhere/debug$" <<<"$out" || fail "CARGO_TARGET_DIR is not honoured: $out"

# 3. The default path (ministack) installs nothing into the project's virtualenv but uv (which
#    makes the tools' virtualenvs): moto is for LOCAL_AWS=moto alone.
(unset LOCAL_AWS && source "$here/lib.sh" && VENV="$work/venv" && ensure_venv >/dev/null 2>&1 \
  && ! "$VENV/bin/python" -c 'import moto' 2>/dev/null) || fail "the default path installed moto"
echo "check-scripts: CARGO_TARGET_DIR honoured, a missing binary named, nothing installed that the path does not use"
