#!/usr/bin/env bash
# Checks the pieces of bench/gpu/run.sh that only the GPU machine would
# otherwise exercise (bench/gpu/lib.sh), without a GPU:
#   1. the digest comparison does not depend on the locale's collation;
#   2. pip's NCCL is found although the wheel makes nvidia.nccl a namespace
#      package (__file__ is None).
# Usage: check_gpu_run.sh SOURCE_DIR [PYTHON]. Exit 77: nothing could be checked.
set -uo pipefail
src=$1
py=${2:-/usr/bin/python3}
# shellcheck source=../../bench/gpu/lib.sh
source "$src/bench/gpu/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
real_sort=$(command -v sort)

# ---- 1. locale. A `sort` that collates as a UTF-8 locale does (punctuation
# ignored, case folded) unless LC_ALL=C — what en_US.UTF-8 does, whether or
# not that locale is installed here.
mkdir -p "$tmp/bin"
cat > "$tmp/bin/sort" <<SH
#!/bin/sh
if [ "\${LC_ALL:-}" = C ]; then exec "$real_sort" "\$@"; fi
exec "$real_sort" -d -f "\$@"
SH
chmod +x "$tmp/bin/sort"
# What sluice-load --digest prints: names in byte order.
printf '%s\n' "A.weight F32 [2] aa" "a.bias F32 [2] bb" "a_b.weight F32 [2] cc" "ab.weight F32 [2] dd" > "$tmp/loaded"
# The generator's digests, in another order.
printf '%s\n' "ab.weight F32 [2] dd" "a_b.weight F32 [2] cc" "A.weight F32 [2] aa" "a.bias F32 [2] bb" > "$tmp/expected"
(
  export PATH="$tmp/bin:$PATH" LC_ALL=C.UTF-8  # a UTF-8 locale (the shim collates for any but C)
  # The shim must order these differently from byte order, or this check proves nothing.
  sort "$tmp/expected" | cmp -s - "$tmp/loaded" && { echo "FAIL: the collating sort shim orders like LC_ALL=C"; exit 1; }
  digests_match "$tmp/expected" "$tmp/loaded" || { echo "FAIL: digests_match depends on the locale"; exit 1; }
  echo "ok: digests_match compares in byte order whatever the locale"
  printf '%s\n' "ab.weight F32 [2] dx" >> "$tmp/loaded"
  digests_match "$tmp/expected" "$tmp/loaded" && { echo "FAIL: digests_match accepts an extra line"; exit 1; }
  exit 0
) || fail=1
grep -q 'digests_match "\$DCK.digests" "\$OUT/device-digests.txt"' "$src/bench/gpu/run.sh" ||
  bad "run.sh does not compare the device digests with digests_match"

# ---- 2. pip's NCCL as the wheel lays it out: nvidia/ and nvidia/nccl/ without __init__.py.
if [ -x "$py" ]; then
  site=$tmp/site
  mkdir -p "$site/nvidia/nccl/include" "$site/nvidia/nccl/lib"
  : > "$site/nvidia/nccl/include/nccl.h"
  : > "$site/nvidia/nccl/lib/libnccl.so.2"
  file=$(PYTHONPATH=$site "$py" -c 'import nvidia.nccl as m; print(m.__file__)' 2>&1)
  [ "$file" = None ] || bad "the fake wheel is not a namespace package (__file__: $file)"
  got=$(PYTHONPATH=$site pip_nccl_dir "$py")
  [ "$got" = "$site/nvidia/nccl" ] && echo "ok: pip's NCCL found at its __path__: $got" ||
    bad "pip_nccl_dir gave '$got', expected $site/nvidia/nccl"
  got=$(PYTHONPATH=$tmp/none pip_nccl_dir "$py")
  [ -z "$got" ] || bad "pip_nccl_dir without the wheel gave '$got'"
  grep -q 'pip_nccl_dir' "$src/bench/gpu/run.sh" || bad "run.sh does not look for pip's NCCL with pip_nccl_dir"
else
  echo "note: no $py: the pip NCCL check did not run"
fi

[ $fail -eq 0 ] && echo "gpu run.sh checks: passed"
exit $fail
