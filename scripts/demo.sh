#!/usr/bin/env bash
# The main job: builds the release tools, generates a sample DeepSeek-like
# checkpoint once (default 2 GiB, in .samples/), then loads it with sluice-load
# (progress display and summary). Extra arguments go to sluice-load.
#   scripts/demo.sh [--digest] [--staging 256MiB] ...     SLUICE_SAMPLE_SIZE=4GiB to change the size
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
size=${SLUICE_SAMPLE_SIZE:-2GiB}
sample=".samples/deepseek-like-$size"

bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target sluice-load gen-checkpoint -j "$(nproc)" >/dev/null
if [[ ! -f "$sample/.complete" ]]; then
  echo "demo: generating a $size sample checkpoint in $sample (once)"
  rm -rf "$sample"
  build/release/examples/gen-checkpoint "$sample" --size "$size"
  touch "$sample/.complete"
fi
echo "demo: build/release/examples/sluice-load $sample $*"
build/release/examples/sluice-load "$sample" "$@"
