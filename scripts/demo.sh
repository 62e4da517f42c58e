#!/usr/bin/env bash
# The main job: builds the release tools, generates a sample DeepSeek-like
# checkpoint once (default 2 GiB, in .samples/), loads it with sluice-load
# (progress display and summary), then loads it again as 8 local ranks,
# TP1/DP8/EP8 with cooperative offload of the Engram tables (sluice-launch;
# each byte read from storage once, merged per-rank summary).
#   scripts/demo.sh [sluice-load options...]   e.g. --digest, --staging 256MiB
#   SLUICE_SAMPLE_SIZE=4GiB   sample size      SLUICE_DEMO_RANKS=0   skip the distributed part
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
# ccache hits across clones at different paths (CI builds a fresh clone).
export CCACHE_BASEDIR="$here"
size=${SLUICE_SAMPLE_SIZE:-2GiB}
ranks=${SLUICE_DEMO_RANKS:-8}
sample=".samples/deepseek-like-$size"

bash scripts/setup.sh
cmake --preset release >/dev/null
# The tools, and the Python extension where the build has it, so that the
# README's Python example works as written after this (PYTHONPATH=build/release/python).
targets=(sluice-load sluice-launch gen-checkpoint)
if cmake --build --preset release --target help 2>/dev/null | grep -q '^sluice_python:'; then targets+=(sluice_python); fi
cmake --build --preset release --target "${targets[@]}" -j "$(nproc)" >/dev/null
if [[ ! -f "$sample/.complete" ]]; then
  echo "demo: generating a $size sample checkpoint in $sample (once)"
  rm -rf "$sample"
  build/release/examples/gen-checkpoint "$sample" --size "$size"
  touch "$sample/.complete"
fi
echo "demo: build/release/examples/sluice-load $sample $*"
build/release/examples/sluice-load "$sample" "$@"
if ((ranks > 1)); then
  echo
  echo "demo: $ranks ranks, tp1,dp$ranks,ep$ranks, cooperative offload of the shared tables"
  summary=$(mktemp); trap 'rm -f "$summary"' EXIT
  build/release/examples/sluice-launch -n "$ranks" --json-out "$summary" -- \
    "$here/build/release/examples/sluice-load" "$here/$sample" --topology "tp1,dp$ranks,ep$ranks" \
    --offload shared-cooperative --no-progress
  /usr/bin/python3 - "$summary" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["totals"]
gib = 1 << 30
print(f"demo: {t['tensors']} sink calls over all ranks; read from storage {t['bytes_read']/gib:.2f} GiB in all "
      f"(each byte once); exchanged {t['bytes_received']/gib:.2f} GiB; taken from the page cache "
      f"{t.get('page_cache_bytes', 0)/gib:.2f} GiB; written to shared segments "
      f"{t['shared_bytes_written']/gib:.2f} GiB")
PY
fi
