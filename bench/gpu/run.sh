#!/usr/bin/env bash
# bench/gpu/run.sh — issue 7's GPU check, for one H200 machine (root, no
# network), in at most ~8 minutes:
#   1. build (Release): the cuda/nccl components, bench-gpu, the CUDA tests;
#   2. the CUDA tests on the device (ctest -L cuda: the device tests must pass —
#      among them a one-rank distributed load through the NCCL device lane;
#      only the no-driver tests skip there, saying a device is present), and
#      sluice-load --device --digest against the generator's digests;
#   2b. the Python package's CUDA tests (load_into), where python3 has torch and pytest;
#   3. bench-gpu: pinned H2D ceiling, storage read (page cache, O_DIRECT),
#      sluice file -> GPU both ways, every tensor copied back and compared by
#      SHA-256, peak pinned memory, ratios vs min(storage, H2D).
# Results: $OUT/gpu-tests.txt, $OUT/bench-gpu.txt (and on stdout).
#
# Dependencies: uses the system's Boost 1.74+, fmt 9, nlohmann-json, liburing,
# OpenSSL and Catch2 2 where present; otherwise the Debian .debs carried in
# .gpudeps/debs (bench/gpu/fetch-deps.sh, run beforehand on a dev machine).
# From a dev session:  device run(carry=[".gpudeps"], timeout_s=580, command="bench/gpu/run.sh")
# (always carry .gpudeps: the machine has no network, and a missing header
# costs the whole run). The defaults are sized for a first pass that leaves
# time for a rerun; SIZE=8GiB REPEAT=3 once the first pass is clean.
# Environment: SIZE (checkpoint, default 4GiB), STAGING (1GiB), REPEAT (2),
# JOBS (build jobs, default nproc), CKPT (checkpoint dir, default /tmp/sluice-gpu-ckpt),
# FORCE_CARRIED_DEPS=1 (use .gpudeps even where the system has the headers).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-out}
mkdir -p "$OUT"
SIZE=${SIZE:-4GiB}
STAGING=${STAGING:-1GiB}
REPEAT=${REPEAT:-2}
JOBS=${JOBS:-$(nproc)}
CKPT=${CKPT:-/tmp/sluice-gpu-ckpt}
BUILD=$ROOT/build/gpu
T0=$(date +%s)
stamp() { echo "[run.sh +$(( $(date +%s) - T0 ))s] $*"; }
export PATH=/usr/local/cuda/bin:$PATH
# shellcheck source=lib.sh
source "$ROOT/bench/gpu/lib.sh"

stamp "machine: $(uname -srm); $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
stamp "tools: cmake $(cmake --version 2>/dev/null | head -1 | awk '{print $3}'), ninja $(ninja --version 2>/dev/null), $(g++ --version 2>/dev/null | head -1), nvcc $(nvcc --version 2>/dev/null | tail -1)"

# ---- 1. dependencies: the system's, or the carried .debs
cmake_args=()
missing=()
for h in boost/asio.hpp fmt/format.h nlohmann/json.hpp liburing.h openssl/evp.h catch2/catch.hpp; do
  [ -e /usr/include/$h ] || [ -e /usr/local/include/$h ] || missing+=("$h")
done
[ -n "${FORCE_CARRIED_DEPS:-}" ] && missing+=("(FORCE_CARRIED_DEPS set)")
if [ ${#missing[@]} -gt 0 ]; then
  stamp "missing on this machine: ${missing[*]}"
  if ! ls "$ROOT"/.gpudeps/debs/*.deb >/dev/null 2>&1; then
    echo "run.sh: no .gpudeps/debs to fall back on: run bench/gpu/fetch-deps.sh on a dev machine and carry .gpudeps" >&2
    exit 2
  fi
  P=/tmp/sluice-deps
  rm -rf $P && mkdir -p $P
  for d in "$ROOT"/.gpudeps/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$d" $P
    else (t=$(mktemp -d) && cd "$t" && ar x "$d" && tar -xf data.tar.* -C $P && rm -rf "$t"); fi
  done
  stamp "unpacked $(ls "$ROOT"/.gpudeps/debs/*.deb | wc -l) carried packages into $P"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$P/usr" -DOPENSSL_ROOT_DIR="$P/usr" -DCMAKE_INCLUDE_PATH="$P/usr/include")
  export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$P/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
fi
# NCCL: the toolkit's, or the one pip's nvidia-nccl-cu13 ships (libnccl.so.2 only).
if [ ! -e /usr/local/cuda/include/nccl.h ] && [ ! -e /usr/include/nccl.h ]; then
  nd=$(pip_nccl_dir python3)  # a namespace package: its __path__, not its __file__
  if [ -n "$nd" ] && [ -e "$nd/include/nccl.h" ]; then
    lib=$(ls "$nd"/lib/libnccl.so* 2>/dev/null | head -1)
    cmake_args+=(-DNCCL_INCLUDE_DIR="$nd/include" -DNCCL_LIBRARY="$lib")
    export LD_LIBRARY_PATH=$nd/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    stamp "NCCL from pip: $lib"
  else
    stamp "no NCCL found: the nccl component and its tests are not built"
  fi
fi

# ---- 2. configure + build (Release; no S3/Gloo: not needed here)
stamp "configure"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_BENCH=ON \
  -DSLUICE_BUILD_TESTS=ON -DSLUICE_BUILD_EXAMPLES=ON -DSLUICE_ENABLE_CUDA=ON -DSLUICE_ENABLE_S3=OFF \
  -DSLUICE_ENABLE_GLOO=OFF -DSLUICE_ENABLE_FUZZ=OFF -DCMAKE_CUDA_ARCHITECTURES=90 "${cmake_args[@]}" \
  > "$OUT/configure.txt" 2>&1 || { tail -40 "$OUT/configure.txt"; exit 3; }
grep "sluice components" "$OUT/configure.txt"
targets=(bench-gpu sluice_tests_cuda sluice-load gen-checkpoint sluice-inspect)
grep -q "components:.*nccl" "$OUT/configure.txt" && targets+=(sluice_tests_nccl)
stamp "build ${targets[*]} with $JOBS jobs"
B0=$(date +%s)
cmake --build "$BUILD" --target "${targets[@]}" -j "$JOBS" > "$OUT/build.txt" 2>&1 || { grep -B2 -A12 "error" "$OUT/build.txt" | head -80; exit 4; }
stamp "built in $(( $(date +%s) - B0 ))s (budget: the whole run in 8 minutes; over 240s here, lower SIZE/REPEAT)"

# ---- 3. the CUDA tests, on the device
stamp "ctest -L cuda"
(cd "$BUILD" && ctest -L cuda --output-on-failure --timeout 120) > "$OUT/gpu-tests.txt" 2>&1
tests_rc=$?
stamp "sluice-load --device --digest vs the generator's digests"
DCK=/tmp/sluice-gpu-device-ckpt
rm -rf "$DCK"
"$BUILD/examples/gen-checkpoint" "$DCK" --size 64MiB --seed 7 --digests "$DCK.digests" > /dev/null &&
  "$BUILD/examples/sluice-load" "$DCK" --topology tp1,dp1,ep1 --offload per-rank --device --digest --json-out "$OUT/device-load.json" \
    --no-progress > "$OUT/device-digests.txt" 2> "$OUT/device-load.err"
device_rc=$?
if [ $device_rc -eq 0 ] && digests_match "$DCK.digests" "$OUT/device-digests.txt"; then
  echo "ok: sluice-load --device: $(wc -l < "$OUT/device-digests.txt") tensors copied back from the GPU equal the generator's"
else
  echo "FAIL: sluice-load --device (rc $device_rc):"; tail -5 "$OUT/device-load.err"; tests_rc=1
fi
rm -rf "$DCK" "$DCK.digests"
# The Python package's CUDA destinations (load_into), where this machine has
# pybind11, torch and pytest for its python3: device memory through ctypes, or
# CUDA torch tensors when its torch has CUDA.
PY=$(command -v python3)
if [ -n "$PY" ] && "$PY" -c "import torch, pytest" 2>/dev/null &&
   cmake --build "$BUILD" --target sluice_python -j "$JOBS" >> "$OUT/build.txt" 2>&1; then
  stamp "pytest python/tests/test_cuda.py"
  (cd "$ROOT/python/tests" && SLUICE_BUILD_DIR=$BUILD PYTHONPATH=$BUILD/python "$PY" -m pytest -q -rs -p no:cacheprovider test_cuda.py) \
    > "$OUT/python-cuda.txt" 2>&1 || { echo "FAIL: python CUDA tests"; tests_rc=1; }
  tail -5 "$OUT/python-cuda.txt"
else
  echo "skipped: the Python package's CUDA tests (no python3 with torch and pytest, or no pybind11)"
fi
tail -25 "$OUT/gpu-tests.txt"

# ---- 4. the bench
stamp "bench-gpu $CKPT --size $SIZE --staging $STAGING --repeat $REPEAT"
"$BUILD/bench/bench-gpu" "$CKPT" --size "$SIZE" --staging "$STAGING" --repeat "$REPEAT" 2>&1 | tee "$OUT/bench-gpu.txt"
bench_rc=${PIPESTATUS[0]}
stamp "done: tests rc $tests_rc, bench rc $bench_rc"
[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
