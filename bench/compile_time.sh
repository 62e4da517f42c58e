#!/usr/bin/env bash
# bench/compile_time: what including sluice costs an engine, and which of
# sluice's own units are slowest to build.
#
#   bench/compile_time.sh [BUILD_DIR] [RUNS]      e.g. bench/compile_time.sh build/release 3
#
# 1. The one-file consumer (tests/package/minimal/main.cpp: <sluice/sluice.hpp>,
#    open a checkpoint, load() it into a digest_sink), compiled and linked
#    against BUILD_DIR's libsluice.a with -O2, RUNS times (default 3): min and
#    median of wall and user+sys seconds. No compiler cache is involved.
# 2. The slowest units of every build directory under build/ (ninja's log of
#    its last build: wall seconds per output, so units built side by side
#    with -jN share the cores; the log shows the last build only, and a unit
#    served by ccache shows as fast).
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$src/build/release}
runs=${2:-3}
[[ -f $build/libsluice.a ]] || { echo "bench/compile_time.sh: no $build/libsluice.a (cmake --build --preset release first)" >&2; exit 1; }
cxx=${CXX:-g++}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "consumer: $cxx -std=c++20 -O2, tests/package/minimal/main.cpp + $build/libsluice.a, $runs runs, $(nproc) cores"
for ((i = 0; i < runs; i++)); do
  /usr/bin/time -f "%e %U %S" -o "$tmp/t$i" "$cxx" -std=c++20 -O2 -I"$src/include" "$src/tests/package/minimal/main.cpp" \
    "$build/libsluice.a" -luring -lfmt -lcrypto -pthread -o "$tmp/consumer" 2> >(grep -v "^$" >&2 || true)
done
cat "$tmp"/t* | awk '{w[NR]=$1; c[NR]=$2+$3} END {
  n=asort(w); asort(c);
  printf "consumer compile+link: wall min %.1f s median %.1f s; cpu (user+sys) min %.1f s median %.1f s\n", w[1], w[int((n+1)/2)], c[1], c[int((n+1)/2)] }'
"$tmp/consumer" "$tmp" >/dev/null 2>&1 || true   # it writes a sample into $tmp and loads it: it must at least link
echo
for log in "$src"/build/*/.ninja_log; do
  [[ -f $log ]] || continue
  echo "slowest units, $(basename "$(dirname "$log")") (ninja log, wall s):"
  # v5 log: start_ms end_ms mtime output hash; the last entry per output counts.
  awk -F'\t' 'NR > 1 && $4 ~ /\.o$/ { t[$4] = ($2 - $1) / 1000 } END { for (o in t) printf "%8.1f  %s\n", t[o], o }' "$log" |
    sort -rn | head -8
done
