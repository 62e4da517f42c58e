#!/usr/bin/env bash
# One node, one copy: 8 ranks of one node against one process and against 8
# independent processes, in one run, on the demo's sample checkpoint.
#   bench/node_copy.sh [--repeat N] [--cold] [--ranks N] [--holes N] [--offload MODE]
#   SLUICE_SAMPLE_SIZE=8GiB (default); SLUICE_SAMPLES: where the sample is made (default .samples);
#   SLUICE_BIN: a folder with sluice-load, sluice-launch and gen-checkpoint built already
#   (default: build/release/examples, built first)
# Rows (each the best of N runs, wall clock of the whole command, processes included):
#   one process           sluice-load SAMPLE
#   one rank              sluice-load SAMPLE --topology tp1,dp1,ep1 --offload shared-cooperative:
#                         the N ranks' command in a world of one, so one process that keeps
#                         what an engine keeps (the tables in one host segment, or their views);
#                         "one process" drops the tables with the rest (its sink discards)
#   N ranks               sluice-launch -n N -- sluice-load SAMPLE --topology tp1,dpN,epN
#                         --offload shared-cooperative (ranks of the node take what they keep
#                         from its page cache)
#   N ranks, status every window
#                         the same with --status-every 0 (the failure protocol's status
#                         exchange after every window, as before 2026-12-05: 8 processes
#                         meet once per window though no window carries a message)
#   N ranks, Gloo         the same with --exchange-all (every byte a rank keeps but did not
#                         read crosses TCP loopback: the behaviour before the page cache)
#   N processes           N concurrent sluice-load SAMPLE --staging 512MiB, started together,
#                         each reading everything (the baseline)
# each with copies (the default sink path) and with page-cache views (--map-above 1MiB, their
# pages mapped in by the load: --populate-views on), hot
# (the sample in the page cache) and, with --cold, cold (caches dropped before each run: root).
# --offload MODE: the ranks' and the one rank's --offload (default shared-cooperative); with
# none every rank keeps its own copy of the tables (sluice-load's default), which each rank
# reads as it delivers it (--pieces-above's default), in pieces.
# --holes N: hot, every row starts from a page cache that lost N 2 MiB ranges of each shard
# (posix_fadvise DONTNEED at offsets drawn with a fixed seed, the same for every row), as
# reclaim leaves a file that was read a while ago.
# The ranks' start-up is the launcher's wall clock minus the slowest rank's load, printed on
# its own and split by the ranks' summaries (seconds.join, seconds.open): processes and exit
# (the launcher's wall clock minus the longest-lived rank's join, open and load), joining the
# world (the store's rendezvous, the connections), opening the checkpoint (rank 0 reads the
# headers, the others replay its record) and planning it. The header names the system's huge-page policy
# for shared memory (/sys/kernel/mm/transparent_hugepage/shmem_enabled), which sets the
# cost of filling the node's shared table segment (advise: 2 MiB pages, about twice as fast).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
repeat=3 cold=0 ranks=8 holes=0 offload=shared-cooperative
while (($#)); do
  case $1 in
    --repeat) repeat=$2; shift 2 ;;
    --cold) cold=1; shift ;;
    --ranks) ranks=$2; shift 2 ;;
    --holes) holes=$2; shift 2 ;;
    --offload) offload=$2; shift 2 ;;
    *) echo "usage: $0 [--repeat N] [--cold] [--ranks N] [--holes N] [--offload MODE]" >&2; exit 2 ;;
  esac
done
size=${SLUICE_SAMPLE_SIZE:-8GiB}
sample="${SLUICE_SAMPLES:-$here/.samples}/deepseek-like-$size"
if [[ -n ${SLUICE_BIN:-} ]]; then
  B=$SLUICE_BIN  # built already (bench/gpu/run.sh's node step)
else
  B="$here/build/release/examples"
  export CCACHE_BASEDIR="$here" CCACHE_NOHASHDIR=1
  cmake --preset release >/dev/null
  cmake --build --preset release --target sluice-load sluice-launch gen-checkpoint -j "$(nproc)" >/dev/null
fi
py=$(command -v python3 || echo /usr/bin/python3)
# Arithmetic in awk, not bc: a bare machine may lack bc.
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
if [[ ! -f "$sample/.complete" ]]; then
  rm -rf "$sample"
  mkdir -p "$(dirname "$sample")"
  "$B/gen-checkpoint" "$sample" --size "$size" >/dev/null
  touch "$sample/.complete"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
warm() {
  cat "$sample"/*.safetensors > /dev/null
  ((holes)) || return 0
  "$py" - "$holes" "$sample"/*.safetensors <<'PY'
import os, random, sys
rng, n = random.Random(42), int(sys.argv[1])
for path in sys.argv[2:]:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    for _ in range(n):
        os.posix_fadvise(fd, rng.randrange(size) // (2 << 20) * (2 << 20), 2 << 20, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

# run KIND TEMP OPTS...: prints the wall seconds of one run
run() {
  local kind=$1 temp=$2; shift 2
  if [[ $temp == cold ]]; then drop; else warm; fi
  local t0 t1
  t0=$(now)
  local rc=0
  case $kind in
    one) "$B/sluice-load" "$sample" --no-progress "$@" > /dev/null 2>&1 || rc=$? ;;
    solo) "$B/sluice-load" "$sample" --no-progress --topology tp1,dp1,ep1 --offload "$offload" "$@" \
            > /dev/null 2>&1 || rc=$? ;;
    ranks|gloo|every)
      local extra=()
      [[ $kind == gloo ]] && extra=(--exchange-all)
      [[ $kind == every ]] && extra=(--status-every 0)
      "$B/sluice-launch" -n "$ranks" --json-out "$work/$kind.json" -- "$B/sluice-load" "$sample" \
        --topology "tp1,dp$ranks,ep$ranks" --offload "$offload" --no-progress "${extra[@]}" "$@" > /dev/null 2>&1 || rc=$? ;;
    procs)
      local pids=()
      for ((r = 0; r < ranks; r++)); do "$B/sluice-load" "$sample" --no-progress --staging 512MiB "$@" > /dev/null 2>&1 & pids+=($!); done
      for p in "${pids[@]}"; do wait "$p" || rc=$?; done ;;
  esac
  if ((rc)); then echo "bench/node_copy.sh: the $kind run failed (exit $rc): $*" >&2; return 1; fi
  t1=$(now)
  calc "$t1 - $t0"
}

best() {  # best KIND TEMP OPTS...
  local b="" t
  for ((i = 0; i < repeat; i++)); do
    t=$(run "$@") || exit 1
    if [[ -z $b ]] || (( $(awk "BEGIN { print ($t < $b) }") )); then
      b=$t
      if [[ $1 == ranks ]]; then cp "$work/ranks.json" "$work/best-ranks.json"; fi  # the best run's own summary
    fi
  done
  echo "$b"
}

temps=(hot)
((cold)) && temps+=(cold)
shmem=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null || true)
echo "# bench/node_copy.sh --repeat $repeat$( ((cold)) && echo ' --cold') --ranks $ranks$( ((holes)) && echo " --holes $holes")$([[ $offload != shared-cooperative ]] && echo " --offload $offload")  ($(date -u +%F), sample $size: $(du -sh "$sample" | cut -f1), $(nproc) cores, shmem THP: ${shmem:-unknown})"
printf "%-6s %-7s %-28s %9s %14s %12s %14s\n" temp sink row seconds "vs 1 process" "vs 1 rank" "vs N procs"
for temp in "${temps[@]}"; do
  # Hot starts from the page cache a sluice load of the sample leaves: its
  # folio sizes (2 MiB, or 4-128 KiB where cat or small reads filled it) set
  # the cost of every view, 0.07-0.64 s for the one process on this VM
  # before this line. warm() then only fills what a row dropped.
  [[ $temp == hot ]] && { drop 2>/dev/null || echo "# (could not drop the page cache: the hot rows start from what it holds)"; "$B/sluice-load" "$sample" --no-progress --map-above 1MiB > /dev/null 2>&1; }
  for sink in copies views; do
    opts=()
    # Views mapped in ahead on every row: the discard sink never touches a
    # view, so a view left to its consumer (--populate-views auto with fewer
    # than two hardware threads per rank) would cost its row nothing.
    [[ $sink == views ]] && opts=(--map-above 1MiB --populate-views on)
    one=$(best one "$temp" "${opts[@]}")
    solo=$(best solo "$temp" "${opts[@]}")
    rk=$(best ranks "$temp" "${opts[@]}")
    ev=$(best every "$temp" "${opts[@]}")
    gl=$(best gloo "$temp" "${opts[@]}")
    pr=$(best procs "$temp" "${opts[@]}")
    for row in "one process:$one" "one rank, tables kept:$solo" "$ranks ranks:$rk" "$ranks ranks, status each window:$ev" "$ranks ranks, Gloo loopback:$gl" "$ranks processes (baseline):$pr"; do
      name=${row%:*} t=${row##*:}
      printf "%-6s %-7s %-28s %9.2f %13.2fx %11.2fx %13.2fx\n" "$temp" "$sink" "$name" "$t" "$(calc "$t / $one")" \
        "$(calc "$t / $solo")" "$(calc "$t / $pr")"
    done
    "$py" - "$work/best-ranks.json" "$rk" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
s = [r["summary"] for r in t["ranks"]]
sec = [x["seconds"] for x in s]
lived = max(x["join"] + x["open"] + x["total"] for x in sec)
gib = 1 << 30
print(f"       {'':7} start-up of the ranks {float(sys.argv[2]) - max(x['total'] for x in sec):.2f} s: processes and exit "
      f"{float(sys.argv[2]) - lived:.2f} s, joining {max(x['join'] for x in sec):.2f} s, opening {max(x['open'] for x in sec):.2f} s; in the load: setup "
      f"{max(x['setup'] for x in sec):.2f} s, shared tables {max(x['tables'] for x in sec):.2f} s, "
      f"windows {max(x['read'] - x['tables'] for x in sec):.2f} s, delivery {max(x['deliver'] for x in sec):.2f} s, freeing the segment {max(x.get('release', 0) for x in sec):.2f} s; per rank: received "
      f"{max(x['bytes_received'] for x in s) / gib:.2f} GiB, from the page cache {max(x['page_cache_bytes'] for x in s) / gib:.2f} GiB, "
      f"as views {max(x['mapped_bytes'] for x in s) / gib:.2f} GiB, read at delivery {max(x.get('delivered_read_bytes', 0) for x in s) / gib:.2f} GiB, "
      f"peak RSS {max(x['peak_rss_bytes'] for x in s) / gib:.2f} GiB; status exchanges {s[0]['status_exchanges']} of {s[0]['windows']} windows")
PY
  done
done
