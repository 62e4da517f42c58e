#!/usr/bin/env bash
# bench/gpu/run.sh — the GPU check, for one H200 machine (root, no network),
# ending within 300 s whatever hangs, so that two passes and two machine
# starts fit in a 15-minute lease. The one device call (from a dev session,
# after bench/gpu/fetch-deps.sh):
#
#   run(carry=[".gpudeps"], timeout_s=330, command="bench/gpu/run.sh")
#
# Steps (each under `timeout -k`, at most its budget and never past the
# deadline, DEADLINE=285 s after the start; budgets in seconds):
#   preflight  15  what is unknown about the machine, printed first: compiler,
#                  CMake/ninja, CUDA (nvcc, libcudart), NCCL, OpenSSL, python,
#                  torch, pybind11, memlock, the GPU
#   deps       15  the system's headers, or the .debs and the pybind11 wheel
#                  carried in .gpudeps (unpacked into DEPS_DIR)
#   configure  25  Release, cuda/nccl on, S3/Gloo off, the Python package for
#                  the device's python (PY: /opt/torch/.venv/bin/python3, else python3)
#   build     120  bench-gpu, the CUDA tests, the tools, the extension; `-k 0`:
#                  one run lists every error
#   tests      35  ctest -L cuda, each test at most TEST_TIMEOUT (20) s: the
#                  tests' TIMEOUT property is set at configure
#                  (SLUICE_TEST_TIMEOUT), as `ctest --timeout` does not override it
#   device     15  sluice-load --device --digest against the generator's digests
#   python     20  python/tests/test_cuda.py under the device's python; "not
#                  configured" (no pybind11, headers or dlpack) is told apart
#                  from "no torch"
#   bench      22  bench-gpu (BENCH_ARGS, default --no-cold: the cold rows read
#                  ~24 GiB from disk at REPEAT=2; BENCH_ARGS= for every row)
#   node      not in the default STEPS: a call of its own (STEPS=preflight,deps,node):
#             node-configure 25, node-build 90, node-bench 135: bench/node_copy.sh's
#             8 ranks of one node on this machine's cores, sluice built with the
#             carried Gloo (see the step below); node-copy.txt
# Results: stdout, and under $OUT at most 8 files (what the device returns):
# run.txt (this output), bench-gpu.txt, logs.tar.gz (configure, build, tests,
# device load, python, NCCL's own log: NCCL_DEBUG_FILE, since NCCL writes its
# warnings to stdout, where sluice-load prints its digests).
# Environment: STEPS (comma list, default all of the above), SIZE (checkpoint,
# 4GiB), STAGING (1GiB), REPEAT (2), BENCH_ARGS, JOBS (nproc), PY, CKPT
# (/tmp/sluice-gpu-ckpt), BUILD (build/gpu), BUILD_TYPE (Release), TARGETS
# (instead of the default targets), CMAKE_EXTRA (more configure arguments),
# GPUDEPS (.gpudeps), DEPS_DIR (/tmp/sluice-deps), FORCE_CARRIED_DEPS=1 (use
# .gpudeps even where the system has the headers), BUDGET_SCALE (multiplies
# every step's budget; for rehearsals on slower machines). bench/gpu/rehearse.sh runs
# the steps before the GPU ones here, with the system's packages hidden.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-out}
BUILD=${BUILD:-$ROOT/build/gpu}
LOG=$BUILD/logs
mkdir -p "$OUT" "$LOG"
STEPS=",${STEPS:-preflight,deps,configure,build,tests,device,python,bench},"
SIZE=${SIZE:-4GiB}
STAGING=${STAGING:-1GiB}
REPEAT=${REPEAT:-2}
BENCH_ARGS=${BENCH_ARGS---no-cold}
JOBS=${JOBS:-$(nproc)}
CKPT=${CKPT:-/tmp/sluice-gpu-ckpt}
BUILD_TYPE=${BUILD_TYPE:-Release}
TEST_TIMEOUT=${TEST_TIMEOUT:-20}
GPUDEPS=${GPUDEPS:-$ROOT/.gpudeps}
P=${DEPS_DIR:-/tmp/sluice-deps}
T0=$(date +%s)
export T0 DEADLINE=${DEADLINE:-285} KILL_GRACE=${KILL_GRACE:-3}
# shellcheck source=lib.sh
source "$ROOT/bench/gpu/lib.sh"
MA=$(multiarch)
has() { [[ $STEPS == *",$1,"* ]]; }
stamp() { echo "[run.sh +$(( $(date +%s) - T0 ))s] $*"; }
rc_all=0
fail() { echo "FAIL: $*"; rc_all=1; }

exec > >(tee "$LOG/run.txt") 2>&1
bundle() {
  # NCCL's log (warnings and errors only): its tail here, the whole in the bundle.
  for f in "$LOG"/nccl.*.log; do
    [ -s "$f" ] && { echo "--- tail of $(basename "$f")"; tail -n 8 "$f"; }
  done
  stamp "done: rc $rc_all"
  sleep 0.2  # tee catches up before run.txt is copied
  cp "$LOG/run.txt" "$OUT/run.txt" 2>/dev/null
  [ -f "$LOG/bench-gpu.txt" ] && cp "$LOG/bench-gpu.txt" "$OUT/bench-gpu.txt"
  tar -czf "$OUT/logs.tar.gz" -C "$BUILD" logs 2>/dev/null
}
trap bundle EXIT

# The device's python (torch, maybe pybind11); its bin folder may hold the
# machine's cmake and ninja (pip's).
PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=$(command -v python3 || true); fi
fi
[ -n "$PY" ] && export PATH=$(dirname "$PY"):$PATH
export PATH=$PATH:/usr/local/cuda/bin
# NCCL's log goes to a file, never to a program's stdout.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_DEBUG_FILE=$LOG/nccl.%h.%p.log

# ---- preflight: the unknowns, first
preflight() {
  echo "machine: $(uname -srm), $(nproc) cores, memlock $(ulimit -l)"
  echo "gpu: $(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  echo "compiler: $(command -v c++) = $(c++ --version 2>&1 | head -1); g++: $(g++ -dumpfullversion 2>&1)"
  echo "cmake: $(command -v cmake) $(cmake --version 2>/dev/null | head -1 | awk '{print $3}'); ninja: $(command -v ninja) $(ninja --version 2>/dev/null)"
  echo "nvcc: $(command -v nvcc) $(nvcc --version 2>/dev/null | tail -1)"
  echo "libcudart: $(ls /usr/local/cuda/lib64/libcudart.so* /usr/local/cuda/targets/*/lib/libcudart.so* 2>/dev/null | tr '\n' ' ')"
  echo "  in ld.so.cache: $(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libcudart.so[^ ]*' | tr '\n' ' ')"
  local nh
  for nh in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do
    [ -e "$nh" ] && echo "nccl: $nh $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$nh" | awk '{printf "%s.", $3}')"
  done
  echo "  pip's nccl: $(pip_nccl_dir "$PY")"
  echo "openssl: $(openssl version 2>/dev/null || echo 'no openssl command'); headers: $(grep -h 'define OPENSSL_VERSION_TEXT' /usr/include/openssl/opensslv.h 2>/dev/null | cut -d'"' -f2 || true)"
  echo "  libcrypto in ld.so.cache: $(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libcrypto.so[^ ]*' | tr '\n' ' ')"
  echo "python: $PY $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1)"
  "$PY" - <<'PYEOF' 2>&1
import sysconfig, os
print("  headers:", sysconfig.get_paths()["include"], "(Python.h present)" if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else "(no Python.h)")
for m in ("torch", "pybind11", "pytest", "numpy"):
    try:
        mod = __import__(m)
        if getattr(mod, "__file__", None) is None:
            print(f"  {m}: not installed (an empty namespace package)")
            continue
        extra = f", cuda {mod.version.cuda}, available {mod.cuda.is_available()}" if m == "torch" else ""
        print(f"  {m} {getattr(mod, '__version__', '?')} at {os.path.dirname(mod.__file__)}{extra}")
    except Exception as e:
        print(f"  {m}: not importable ({type(e).__name__}: {e})")
PYEOF
  echo "carried: $(ls "$GPUDEPS"/debs/*.deb 2>/dev/null | wc -l) debs, wheels: $(ls "$GPUDEPS"/wheels/ 2>/dev/null | tr '\n' ' ')"
}
if has preflight; then
  stamp "preflight"
  export -f preflight pip_nccl_dir
  export PY GPUDEPS
  bounded preflight 15 bash -c preflight || echo "(preflight incomplete)"
fi

# ---- deps: the system's headers, or the carried .debs; pybind11 from the carried wheel
cmake_args=()
deps_lib=""  # library folders for sluice's own programs only (never for python or cmake)
if has deps; then
  stamp "deps"
  mapfile -t missing < <(missing_headers /usr /usr/local)
  has node && missing+=($(missing_gloo /usr /usr/local))
  [ -n "${FORCE_CARRIED_DEPS:-}" ] && missing+=("(FORCE_CARRIED_DEPS set)")
  if [ ${#missing[@]} -gt 0 ]; then
    stamp "missing on this machine: ${missing[*]}"
    if ! ls "$GPUDEPS"/debs/*.deb >/dev/null 2>&1; then
      fail "no $GPUDEPS/debs to fall back on: run bench/gpu/fetch-deps.sh on a dev machine and carry .gpudeps"
      exit 2
    fi
    rm -rf "$P"
    export -f unpack_debs
    bounded deps 15 bash -c 'unpack_debs "$0" "$@"' "$P" "$GPUDEPS"/debs/*.deb || { fail "unpacking the carried packages"; exit 2; }
    relocate_gloo "$P/usr"
    still=$(missing_headers /usr /usr/local "$P/usr" | tr '\n' ' ')
    has node && still+=$(missing_gloo /usr /usr/local "$P/usr")
    [ -n "$still" ] && stamp "missing even with the carried packages: $still"
    stamp "unpacked $(ls "$GPUDEPS"/debs/*.deb | wc -l) carried packages into $P"
    cmake_args+=(-DCMAKE_PREFIX_PATH="$P/usr" -DOPENSSL_ROOT_DIR="$P/usr" -DCMAKE_INCLUDE_PATH="$P/usr/include"
                 -DCMAKE_LIBRARY_PATH="$P/usr/lib/$MA")
    # Debian's libssl-dev keeps openssl/opensslconf.h and configuration.h in
    # the multiarch folder, which the compiler searches only under /usr.
    [ -d "$P/usr/include/$MA" ] && cmake_args+=(-DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES="$P/usr/include/$MA")
    export PKG_CONFIG_PATH=$P/usr/lib/$MA/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    deps_lib=$P/usr/lib/$MA:$P/usr/lib  # Debian's libgloo0 is in lib/, not the multiarch folder
  fi
  whl=$(ls "$GPUDEPS"/wheels/pybind11-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ] && [ -n "$PY" ]; then
    pyb=$(pybind11_from_wheel "$whl" "$P/pybind11" "$PY")
    if [ -n "$pyb" ]; then cmake_args+=(-Dpybind11_DIR="$pyb"); stamp "pybind11 from $(basename "$whl")"
    else stamp "could not unpack $whl"; fi
  else
    stamp "no carried pybind11 wheel: the python's own, if it has one"
  fi
fi
# NCCL: the toolkit's, or the one pip's nvidia-nccl-cu13 ships (libnccl.so.2 only).
if [ ! -e /usr/local/cuda/include/nccl.h ] && [ ! -e /usr/include/nccl.h ]; then
  nd=$(pip_nccl_dir "$PY")  # a namespace package: its __path__, not its __file__
  if [ -n "$nd" ] && [ -e "$nd/include/nccl.h" ]; then
    lib=$(ls "$nd"/lib/libnccl.so* 2>/dev/null | head -1)
    cmake_args+=(-DNCCL_INCLUDE_DIR="$nd/include" -DNCCL_LIBRARY="$lib")
    deps_lib=$nd/lib${deps_lib:+:$deps_lib}
    stamp "NCCL from pip: $lib"
  else
    stamp "no NCCL found: the nccl component and its tests are not built"
  fi
fi
# sluice's programs (and ctest, which runs them) see the carried libraries;
# python and cmake do not: a carried libssl3 could be older than the one the
# image's python was built against. The build tree's RUNPATH finds them too.
with_deps() { LD_LIBRARY_PATH=$deps_lib${deps_lib:+${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-} "$@"; }

# ---- configure (no S3/Gloo: not needed here)
py_configured=""
if has configure; then
  stamp "configure ($BUILD_TYPE)"
  # shellcheck disable=SC2206
  extra=(${CMAKE_EXTRA:-})
  bounded configure 25 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DSLUICE_BUILD_BENCH=ON \
    -DSLUICE_BUILD_TESTS=ON -DSLUICE_BUILD_EXAMPLES=ON -DSLUICE_ENABLE_CUDA=ON -DSLUICE_ENABLE_S3=OFF \
    -DSLUICE_ENABLE_GLOO=OFF -DSLUICE_ENABLE_FUZZ=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    ${PY:+-DPython3_EXECUTABLE="$PY"} -DSLUICE_PYTHON_TESTS=OFF -DSLUICE_TEST_TIMEOUT="$TEST_TIMEOUT" \
    "${cmake_args[@]}" "${extra[@]}" > "$LOG/configure.txt" 2>&1 || { tail -40 "$LOG/configure.txt"; fail "configure"; exit 3; }
  grep -E "sluice components|Found OpenSSL|sluice: (no )?Python package" "$LOG/configure.txt"
  grep -h "^CUDA_cudart_LIBRARY\|^CUDAToolkit_LIBRARY_DIR\|^CMAKE_CXX_COMPILER:" "$BUILD/CMakeCache.txt"
fi
grep -q "sluice: Python package for" "$LOG/configure.txt" 2>/dev/null && py_configured=1

# ---- build
if has build; then
  if [ -n "${TARGETS:-}" ]; then
    read -r -d '' -a targets <<< "$TARGETS"
  else
    targets=(bench-gpu sluice_tests_cuda sluice-load gen-checkpoint sluice-inspect)
    grep -q "components:.*nccl" "$LOG/configure.txt" && targets+=(sluice_tests_nccl)
    [ -n "$py_configured" ] && targets+=(sluice_python)
  fi
  stamp "build ${targets[*]} with $JOBS jobs"
  B0=$(date +%s)
  if ! bounded build 120 cmake --build "$BUILD" --target "${targets[@]}" -j "$JOBS" -- -k 0 > "$LOG/build.txt" 2>&1; then
    grep -E -A6 "error|FAILED" "$LOG/build.txt" | head -60
    fail "build (every error: build.txt in logs.tar.gz)"
  fi
  stamp "built in $(( $(date +%s) - B0 ))s"
fi

# ---- tests: the CUDA tests on the device
if has tests; then
  stamp "ctest -L cuda (each test at most ${TEST_TIMEOUT}s)"
  (cd "$BUILD" && with_deps bounded tests 35 ctest -L cuda -j 4 --output-on-failure --timeout "$TEST_TIMEOUT") \
    > "$LOG/gpu-tests.txt" 2>&1 || fail "ctest -L cuda"
  tail -15 "$LOG/gpu-tests.txt"
fi

# ---- device: sluice-load --device, digests against the generator's
if has device; then
  stamp "sluice-load --device --digest vs the generator's digests"
  DCK=/tmp/sluice-gpu-device-ckpt
  rm -rf "$DCK"
  with_deps bounded gen 5 "$BUILD/examples/gen-checkpoint" "$DCK" --size 64MiB --seed 7 --digests "$DCK.digests" > /dev/null &&
    with_deps bounded device 10 "$BUILD/examples/sluice-load" "$DCK" --topology tp1,dp1,ep1 --offload per-rank --device --digest \
      --json-out "$LOG/device-load.json" --no-progress > "$LOG/device-digests.txt" 2> "$LOG/device-load.err"
  device_rc=$?
  if [ $device_rc -eq 0 ] && digests_match "$DCK.digests" "$LOG/device-digests.txt"; then
    echo "ok: sluice-load --device: $(wc -l < "$LOG/device-digests.txt") tensors copied back from the GPU equal the generator's"
  else
    fail "sluice-load --device (rc $device_rc):"; tail -5 "$LOG/device-load.err"
  fi
  rm -rf "$DCK" "$DCK.digests"
fi

# ---- python: load_into with CUDA destinations, under the device's python
if has python; then
  if [ -z "$py_configured" ]; then
    echo "python: not configured: $(grep -h "sluice: no Python package" "$LOG/configure.txt" 2>/dev/null | head -1)"
  elif ! "$PY" -c "import torch" 2>/dev/null; then
    echo "python: no torch in $PY (the extension is built; its CUDA tests need torch)"
  elif ! "$PY" -c "import pytest" 2>/dev/null; then
    echo "python: no pytest in $PY"
  elif [ ! -e "$BUILD/python/sluice" ] || ! ls "$BUILD"/python/sluice/_sluice*.so >/dev/null 2>&1; then
    fail "python: the extension was not built (build.txt)"
  else
    stamp "pytest python/tests/test_cuda.py under $PY"
    # The device's torch is not the lock's pin: conftest checks SLUICE_TORCH_PIN.
    pin=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
    (cd "$ROOT/python/tests" && SLUICE_TORCH_PIN=$pin SLUICE_BUILD_DIR=$BUILD PYTHONPATH=$BUILD/python PYTHONDONTWRITEBYTECODE=1 \
       bounded python 20 "$PY" -m pytest -q -rs -p no:cacheprovider test_cuda.py) > "$LOG/python-cuda.txt" 2>&1 ||
      fail "python CUDA tests"
    tail -5 "$LOG/python-cuda.txt"
  fi
fi

# ---- bench
if has bench; then
  stamp "bench-gpu $CKPT --size $SIZE --staging $STAGING --repeat $REPEAT $BENCH_ARGS"
  # shellcheck disable=SC2086
  with_deps bounded bench 22 "$BUILD/bench/bench-gpu" "$CKPT" --size "$SIZE" --staging "$STAGING" --repeat "$REPEAT" $BENCH_ARGS \
    > "$LOG/bench-gpu.txt" 2>&1 || fail "bench-gpu (rc $?)"
  cat "$LOG/bench-gpu.txt"
fi
# ---- node: one node's ranks against one process (bench/node_copy.sh) on this
# machine's cores, 8 ranks with 2 cores each on a 16-core machine: not in the
# default STEPS (it needs a call of its own, within the same deadline):
#   run(carry=[".gpudeps"], timeout_s=330, command="STEPS=preflight,deps,node bench/gpu/run.sh")
# sluice-load and sluice-launch built with Gloo (carried, node_debs), CUDA and
# S3 off, in NODE_BUILD; the sample (NODE_SIZE, 8GiB) generated in
# NODE_SAMPLES; NODE_ARGS for node_copy.sh (default --repeat 2 --ranks 8: hot;
# add --cold where drop_caches is writable).
if has node; then
  NB=${NODE_BUILD:-$ROOT/build/node}
  stamp "node: configure and build sluice-load, sluice-launch, gen-checkpoint with Gloo in $NB"
  bounded node-configure 25 cmake -S "$ROOT" -B "$NB" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_EXAMPLES=ON \
    -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF -DSLUICE_ENABLE_CUDA=OFF -DSLUICE_ENABLE_S3=OFF -DSLUICE_ENABLE_GLOO=ON \
    -DSLUICE_ENABLE_FUZZ=OFF -DSLUICE_BUILD_PYTHON=OFF "${cmake_args[@]}" > "$LOG/node-configure.txt" 2>&1 ||
    { tail -30 "$LOG/node-configure.txt"; fail "node: configure"; exit 4; }
  grep -E "sluice components" "$LOG/node-configure.txt"
  bounded node-build 90 cmake --build "$NB" --target sluice-load sluice-launch gen-checkpoint -j "$JOBS" > "$LOG/node-build.txt" 2>&1 ||
    { grep -E -A6 "error|FAILED" "$LOG/node-build.txt" | head -40; fail "node: build"; exit 4; }
  echo "gloo: $(with_deps ldd "$NB/examples/sluice-load" | grep -o 'libgloo[^ ]* => [^ ]*')"
  stamp "node: bench/node_copy.sh ${NODE_ARGS:---repeat 2 --ranks 8} on a ${NODE_SIZE:-8GiB} sample"
  # shellcheck disable=SC2086
  with_deps bounded node-bench 135 env SLUICE_BIN="$NB/examples" SLUICE_SAMPLES="${NODE_SAMPLES:-/tmp/sluice-node-samples}" \
    SLUICE_SAMPLE_SIZE="${NODE_SIZE:-8GiB}" bash "$ROOT/bench/node_copy.sh" ${NODE_ARGS:---repeat 2 --ranks 8} \
    > "$LOG/node-copy.txt" 2>&1 || fail "node: bench/node_copy.sh (rc $?)"
  cat "$LOG/node-copy.txt"
  cp "$LOG/node-copy.txt" "$OUT/node-copy.txt"
fi
exit $rc_all
