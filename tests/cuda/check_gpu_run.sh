#!/usr/bin/env bash
# Checks the pieces of bench/gpu/run.sh that only the GPU machine would
# otherwise exercise (bench/gpu/lib.sh), without a GPU:
#   1. the digest comparison does not depend on the locale's collation;
#   2. pip's NCCL is found although the wheel makes nvidia.nccl a namespace
#      package (__file__ is None);
#   3. run.sh ends in time whatever hangs: `bounded` stops a step at its budget
#      and at the run's deadline, and run.sh's budgets sum to under 300 s;
#   4. the header check looks in the multiarch folder too, and a carried
#      pybind11 wheel gives its CMake folder.
# Usage: check_gpu_run.sh SOURCE_DIR [PYTHON]. Exit 77: nothing could be checked.
set -uo pipefail
src=$1
py=${2:-/usr/bin/python3}
# shellcheck source=../../bench/gpu/lib.sh
source "$src/bench/gpu/lib.sh"
# Run under run.sh (ctest -L cuda), whose settings of `bounded` are exported:
# these checks set their own.
unset T0 DEADLINE KILL_GRACE BUDGET_SCALE
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
grep -q 'digests_match "\$DCK.digests" "\$LOG/device-digests.txt"' "$src/bench/gpu/run.sh" ||
  bad "run.sh does not compare the device digests with digests_match"

# ---- 2. pip's NCCL as the wheel lays it out: nvidia/ and nvidia/nccl/ without __init__.py.
if [ -x "$py" ]; then
  # Without site-packages (-S): the project's environment has pip's NCCL
  # itself (torch's CUDA build); PYTHONPATH alone decides here.
  mkdir -p "$tmp/pybin"
  printf '#!/bin/sh\nexec "%s" -S "$@"\n' "$py" > "$tmp/pybin/python"
  chmod +x "$tmp/pybin/python"
  py_s=$tmp/pybin/python
  site=$tmp/site
  mkdir -p "$site/nvidia/nccl/include" "$site/nvidia/nccl/lib"
  : > "$site/nvidia/nccl/include/nccl.h"
  : > "$site/nvidia/nccl/lib/libnccl.so.2"
  file=$(PYTHONPATH=$site "$py_s" -c 'import nvidia.nccl as m; print(m.__file__)' 2>&1)
  [ "$file" = None ] || bad "the fake wheel is not a namespace package (__file__: $file)"
  got=$(PYTHONPATH=$site pip_nccl_dir "$py_s")
  [ "$got" = "$site/nvidia/nccl" ] && echo "ok: pip's NCCL found at its __path__: $got" ||
    bad "pip_nccl_dir gave '$got', expected $site/nvidia/nccl"
  got=$(PYTHONPATH=$tmp/none pip_nccl_dir "$py_s")
  [ -z "$got" ] || bad "pip_nccl_dir without the wheel gave '$got'"
  grep -q 'pip_nccl_dir' "$src/bench/gpu/run.sh" || bad "run.sh does not look for pip's NCCL with pip_nccl_dir"
else
  echo "note: no $py: the pip NCCL check did not run"
fi

# ---- 3. time bounds
t=$(date +%s)
( T0=$t DEADLINE=100 KILL_GRACE=1 bounded hang 2 sleep 30 ); rc=$?
el=$(( $(date +%s) - t ))
[ $rc -eq 124 ] && [ $el -le 4 ] && echo "ok: bounded stops a hung step at its budget (${el}s, rc $rc)" ||
  bad "bounded: a 2 s budget on sleep 30 gave rc $rc after ${el}s"
t=$(date +%s)
( T0=$((t - 97)) DEADLINE=100 KILL_GRACE=1 bounded late 60 sleep 30 ); rc=$?
el=$(( $(date +%s) - t ))
[ $rc -eq 124 ] && [ $el -le 4 ] && echo "ok: bounded stops a step at the run's deadline (${el}s)" ||
  bad "bounded: 3 s before the deadline a 60 s step gave rc $rc after ${el}s"
( T0=$(( $(date +%s) - 200 )) DEADLINE=100 bounded over 60 true ) 2>/dev/null && bad "bounded ran a step past the deadline"
( T0=$(date +%s) DEADLINE=100 bounded fine 10 sh -c 'exit 5' ); rc=$?
[ $rc -eq 5 ] || bad "bounded did not return the step's status (5): $rc"
# Every step of run.sh is bounded, and the budgets (plus the kill grace each)
# leave a run under 300 s even if every step hangs: the default steps, and
# the node step's call (preflight, deps and its own node-* steps).
budgets=$(grep -o 'bounded [a-z-]* [0-9]*' "$src/bench/gpu/run.sh" | awk '$2 !~ /^node-/ {s += $3 + 3} END {print s}')
[ -n "$budgets" ] && [ "$budgets" -lt 300 ] && echo "ok: run.sh's step budgets with kill grace: ${budgets}s" ||
  bad "run.sh's step budgets with kill grace sum to ${budgets}s, not under 300"
node=$(grep -o 'bounded [a-z-]* [0-9]*' "$src/bench/gpu/run.sh" |
  awk '$2 ~ /^(node-|preflight$|deps$)/ {s += $3 + 3; n += ($2 ~ /^node-/)} END {print s, n}')
[ "${node#* }" -ge 3 ] 2>/dev/null && [ "${node% *}" -lt 300 ] && echo "ok: the node call's budgets with kill grace: ${node% *}s" ||
  bad "the node call's budgets (preflight, deps, node-*) with kill grace: '${node}' (sum, node steps), not under 300 s with 3 steps"
for step in preflight deps configure build tests device python bench node-configure node-build node-bench; do
  grep -q "bounded $step [0-9]" "$src/bench/gpu/run.sh" || bad "run.sh's $step step is not bounded"
done

# ---- 4. headers and the pybind11 wheel
pre=$tmp/prefix
mkdir -p "$pre/include/boost" "$pre/include/$(multiarch)/openssl" "$pre/include/openssl"
: > "$pre/include/boost/asio.hpp"; : > "$pre/include/openssl/evp.h"; : > "$pre/include/$(multiarch)/openssl/opensslconf.h"
got=$(missing_headers "$pre" | tr '\n' ' ')
want="fmt/format.h nlohmann/json.hpp liburing.h catch2/catch.hpp CLI/CLI.hpp dlpack/dlpack.h re2/re2.h "
[ "$got" = "$want" ] && echo "ok: missing_headers finds the multiarch opensslconf.h and lists CLI11, dlpack and RE2" ||
  bad "missing_headers gave '$got', expected '$want'"
# Debian's Gloo package names its library by absolute path: relocated under the prefix it is unpacked in.
mkdir -p "$pre/usr/share/cmake/Gloo"
printf '%s\n' '  IMPORTED_LOCATION_RELWITHDEBINFO "/usr/lib/libgloo.so.0.5.0"' > "$pre/usr/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake"
relocate_gloo "$pre/usr"
grep -q "\"$pre/usr/lib/libgloo.so.0.5.0\"" "$pre/usr/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake" &&
  echo "ok: Gloo's CMake package names the unpacked library" || bad "relocate_gloo left: $(cat "$pre/usr/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake")"
[ "$(missing_gloo "$pre")" = gloo/rendezvous/file_store.h ] || bad "missing_gloo did not name Gloo's header"
mkdir -p "$pre/usr/include/gloo/rendezvous" && : > "$pre/usr/include/gloo/rendezvous/file_store.h"
[ -z "$(missing_gloo "$pre" "$pre/usr")" ] || bad "missing_gloo named Gloo's header, present under $pre/usr"
if [ -x "$py" ]; then
  mkdir -p "$tmp/whl/pybind11/share/cmake/pybind11"
  : > "$tmp/whl/pybind11/share/cmake/pybind11/pybind11Config.cmake"
  (cd "$tmp/whl" && "$py" -m zipfile -c "$tmp/pybind11-9.9-py3-none-any.whl" pybind11)
  got=$(pybind11_from_wheel "$tmp/pybind11-9.9-py3-none-any.whl" "$tmp/unpacked" "$py")
  [ "$got" = "$tmp/unpacked/pybind11/share/cmake/pybind11" ] && echo "ok: pybind11's CMake folder from the wheel" ||
    bad "pybind11_from_wheel gave '$got'"
fi

[ $fail -eq 0 ] && echo "gpu run.sh checks: passed"
exit $fail
