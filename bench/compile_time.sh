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
# min and median of a column of numbers (POSIX tools only: Debian's awk is mawk).
stats() { sort -n | awk '{v[NR] = $1} END {printf "min %.1f s median %.1f s", v[1], v[int((NR + 1) / 2)]}'; }
wall=$(cat "$tmp"/t* | awk '{print $1}' | stats)
cpu=$(cat "$tmp"/t* | awk '{print $2 + $3}' | stats)
echo "consumer compile+link: wall $wall; cpu (user+sys) $cpu"
"$tmp/consumer" "$tmp" >/dev/null 2>&1 || true   # it writes a sample into $tmp and loads it: it must at least link
echo
for log in "$src"/build/*/.ninja_log; do
  [[ -f $log ]] || continue
  echo "slowest units, $(basename "$(dirname "$log")") (ninja log, wall s):"
  # v5 log: start_ms end_ms mtime output hash; the last entry per output counts.
  awk -F'\t' 'NR > 1 && $4 ~ /\.o$/ { t[$4] = ($2 - $1) / 1000 } END { for (o in t) printf "%8.1f  %s\n", t[o], o }' "$log" |
    sort -rn | head -8
done
