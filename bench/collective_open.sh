#!/usr/bin/env bash
# bench/collective_open: what opening and planning a checkpoint in DeepSeek
# V3's shape costs N ranks of one node, against one process. The checkpoint
# is 163 shards of one-byte tensors, 91,000 in all, named as a MoE's, with an
# 8.4 MB index (bench/header_parse.py's write_sharded): the load's data is
# 91 KB, so what is timed is the metadata. Each row is `sluice-launch -n N --
# sluice-load CKPT --topology tp1,dpN,epN` (N = 1 too: a world of one opens
# alone, through the same timed path), page cache hot; per run it takes the slowest rank's `seconds.open` (the
# collective open, the plan and the failure protocol's exchange after them)
# and the launch's wall clock and CPU (/usr/bin/time); each row prints the
# median of REPEAT runs and every run beside it.
#
#   bench/collective_open.sh [BIN_DIR] [RANKS] [REPEAT]    e.g. bench/collective_open.sh build/release/examples 4 5
#
# BIN_DIR (default build/release/examples) holds sluice-load and
# sluice-launch; point it at another build's for a before/after. RANKS
# (default 4) and REPEAT (default 5). WORK (default build/bench-collective-open)
# keeps the generated checkpoint between runs.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$(cd "${1:-$src/build/release/examples}" && pwd)
ranks=${2:-4}
repeat=${3:-5}
work=${WORK:-$src/build/bench-collective-open}
mkdir -p "$work"
work=$(cd "$work" && pwd)
exec 8>"$work/lock"
flock -n 8 || { echo "bench/collective_open.sh: $work is in use by another run (set WORK=...)" >&2; exit 1; }

ck=$work/ck
if [[ ! -f $ck/model.safetensors.index.json ]]; then
  rm -rf "$ck" && mkdir -p "$ck"
  /usr/bin/python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import header_parse; header_parse.write_sharded(sys.argv[2], 91000, 163)" \
    "$src/bench" "$ck"
fi
cat "$ck"/* > /dev/null   # hot: the timed reads come from the page cache

# One run of N ranks: "open_s wall_s cpu_s".
run() {
  local n=$1 out=$work/run.json
  /usr/bin/time -f "%e %U %S" -o "$work/time" "$bin/sluice-launch" -n "$n" --json-out "$out" -- \
    "$bin/sluice-load" "$ck" --topology "tp1,dp$n,ep$n" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  /usr/bin/python3 - "$out" "$work/time" <<'EOF'
import json, sys
ranks = [r["summary"] for r in json.load(open(sys.argv[1]))["ranks"]]
wall, user, sys_ = (float(x) for x in open(sys.argv[2]).read().split()[-3:])
print("%.3f %.2f %.2f" % (max(r["seconds"]["open"] for r in ranks), wall, user + sys_))
EOF
}

printf '# bench/collective_open.sh %s %s %s  (%s, 163 shards, 91000 tensors, %s cores)\n' \
  "${1:-build/release/examples}" "$ranks" "$repeat" "$(date -u +%F)" "$(nproc)"
printf '%-12s %10s %10s %10s   %s\n' row "open+plan" wall cpu "every run: open+plan/wall/cpu"
for n in 1 "$ranks"; do
  runs=()
  for ((i = 0; i < repeat; i++)); do runs+=("$(run "$n")"); done
  printf '%s\n' "${runs[@]}" | /usr/bin/python3 -c '
import statistics, sys
n = sys.argv[1]
runs = [tuple(float(x) for x in l.split()) for l in sys.stdin if l.strip()]
med = [statistics.median(r[i] for r in runs) for i in range(3)]
label = "1 process" if n == "1" else n + " ranks"
print("%-12s %9.3fs %9.2fs %9.2fs   %s" % (label, med[0], med[1], med[2], "  ".join("%.3f/%.2f/%.2f" % r for r in runs)))' "$n"
done
