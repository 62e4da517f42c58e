#!/usr/bin/env bash
# bench/gpu/rehearse.sh — runs bench/gpu/run.sh here as a bare GPU machine
# would: in a private mount namespace where every file of every package in
# scripts/setup.sh's apt_pkgs list is hidden (read from that list, so a new
# dependency is hidden too), with the -dev packages they depend on and
# Debian's pybind11 and torch where installed. run.sh then has only what it
# carries (.gpudeps, as bench/gpu/fetch-deps.sh makes it), and torch only
# through the project's Python environment (.venv), whose own pybind11 is
# hidden too: the carried wheel must be the one the extension builds with.
#
#   bench/gpu/rehearse.sh [--quick | --node] [--build DIR] [--python PY] [--jobs N]
#
# Full (default): run.sh's preflight, deps, configure and build (Release,
# run.sh's targets), then its CPU-runnable steps: ctest -L cuda (the device
# tests skip) and the Python CUDA tests. Several minutes on 2 cores.
# --quick (the ctest entry, label rehearsal): preflight, deps, configure, and
# at -O0 the units that a missing header or package breaks: examples/load.cpp,
# bench/gpu.cpp, one cuda and one nccl unit, the Python extension's DLPack unit
# (pybind11 and dlpack.h).
# --node: the node step's call (preflight, deps, node) on a 1 GiB sample, with
# Gloo's runtime libraries (node_debs) hidden too: the GPU machine has none,
# so the programs must find the carried ones.
#
# Not hidden, as the GPU machine brings its own: the compiler
# (build-essential), CMake, and a python with its headers (python3-dev,
# python3-venv: the project's environment is made from /usr/bin/python3).
# ninja is hidden: the project's environment has pip's, as the machine's
# python does. Runtime libraries (libssl3, libfmt9, liburing2) stay visible.
# Needs root (unshare -m, an overlay on /usr). Exit 77: cannot rehearse here
# (not root, no mount namespace or overlay, no CUDA toolkit).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
quick=""
node=""
build=""
py=""
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --node) node=1 ;;
    --build) build=$2; shift ;;
    --python) py=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    *) echo "usage: $0 [--quick] [--build DIR] [--python PY] [--jobs N]" >&2; exit 2 ;;
  esac
  shift
done
build=${build:-$here/build/rehearsal${quick:+-quick}${node:+-node}}
py=${py:-$here/.venv/bin/python}
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root (a mount namespace and an overlay on /usr need it)"
command -v unshare >/dev/null || skip "no unshare"
[ -e /usr/local/cuda/include/cuda_runtime.h ] || skip "no CUDA toolkit in /usr/local/cuda"
[ -x "$py" ] || { echo "FAIL: no project python at $py (scripts/python-env.sh)"; exit 1; }
T0=$(date +%s)

# A fresh tree every time: a bare machine has no earlier build to fall back on.
if [ -e "$build" ] && [ ! -e "$build/.sluice-rehearsal" ]; then
  echo "FAIL: $build exists and is not a rehearsal's folder: not removing it" >&2
  exit 2
fi
rm -rf "$build"
mkdir -p "$build/layer" "$build/empty" "$build/out"
: > "$build/.sluice-rehearsal"
work=$build

# ---- what run.sh carries: exactly what fetch-deps.sh puts in .gpudeps today
bash "$here/bench/gpu/fetch-deps.sh" "$work/gpudeps" > "$work/fetch-deps.txt" 2>&1 ||
  { cat "$work/fetch-deps.txt"; echo "FAIL: bench/gpu/fetch-deps.sh"; exit 1; }

# ---- what to hide
apt_pkgs=()
eval "$(sed -n '/^apt_pkgs=(/,/)/p' "$here/scripts/setup.sh")"
[ ${#apt_pkgs[@]} -gt 5 ] || { echo "FAIL: could not read apt_pkgs from scripts/setup.sh"; exit 1; }
keep=" build-essential cmake python3-dev python3-venv "
toolchain_dev='^(libc6-dev|linux-libc-dev|libcrypt-dev|libnsl-dev|libtirpc-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libpython.*|python3.*-dev)$'
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
declare -A hide=()
queue=()
runtime=()
if [ -n "$node" ]; then
  eval "$(sed -n '/^node_debs=(/,/)/p' "$here/bench/gpu/lib.sh")"
  for p in "${node_debs[@]}"; do [[ $p == *-dev ]] || runtime+=("$p"); done
fi
for p in "${apt_pkgs[@]}" pybind11-dev python3-pybind11 python3-torch "${runtime[@]}"; do
  [[ $keep == *" $p "* ]] && continue
  installed "$p" && queue+=("$p")
done
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${hide[$p]:-}" ] && continue
  hide[$p]=1
  # The -dev packages it depends on (libboost-dev's headers are libboost1.74-dev's).
  for d in $(dpkg-query -W -f='${Depends}' "$p" 2>/dev/null | tr ',|' '\n\n' | sed 's/(.*)//; s/:any//' | awk '{print $1}'); do
    [[ $d == *-dev ]] && ! [[ $d =~ $toolchain_dev ]] && installed "$d" && [ -z "${hide[$d]:-}" ] && queue+=("$d")
  done
done
# shellcheck disable=SC2046
dpkg -L "${!hide[@]}" 2>/dev/null > "$work/hidden-files.txt"
# Whiteouts (character devices 0/0) at each file's place under /usr, in a
# layer laid over /usr: the files vanish, directories stay.
/usr/bin/python3 - "$work/hidden-files.txt" "$work/layer" <<'PY' || { echo "FAIL: making the whiteouts"; exit 1; }
import os, stat, sys
listing, layer = sys.argv[1], sys.argv[2]
n = 0
for line in open(listing):
    f = line.rstrip("\n")
    if not f.startswith("/") or not os.path.lexists(f) or (os.path.isdir(f) and not os.path.islink(f)):
        continue
    # Through the real parent: /lib is /usr/lib on Debian 12, and a file under
    # a linked folder must be hidden where it really is (a folder in the layer
    # would shadow the link).
    real = os.path.join(os.path.realpath(os.path.dirname(f)), os.path.basename(f))
    if not real.startswith("/usr/"):
        continue
    dst = os.path.join(layer, real[len("/usr/"):])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.lexists(dst):
        os.mknod(dst, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        n += 1
print(n)
PY
nfiles=$(find "$work/layer" -type c | wc -l)
echo "rehearse: hiding ${#hide[@]} packages (${nfiles} files): $(echo "${!hide[@]}" | tr ' ' '\n' | sort | tr '\n' ' ')"
pybind11_dir=$("$py" -c 'import os, pybind11; print(os.path.dirname(pybind11.__file__))' 2>/dev/null || true)
venv_bin=$(dirname "$py")

node_env=""
if [ -n "$node" ]; then
  steps=preflight,deps,node
  build_type=Release
  extra=""
  targets=""
  deadline=1800
  node_env="NODE_SIZE=1GiB NODE_ARGS=--repeat\ 1\ --ranks\ 8 NODE_SAMPLES=$work/samples NODE_BUILD=$work/node"
elif [ -n "$quick" ]; then
  steps=preflight,deps,configure,build
  build_type=None
  extra="-DCMAKE_CXX_FLAGS=-O0"
  targets="examples/CMakeFiles/sluice-load.dir/load.cpp.o bench/CMakeFiles/bench-gpu.dir/gpu.cpp.o
           CMakeFiles/sluice_cuda.dir/src/cuda/device_sink.cpp.o CMakeFiles/sluice_nccl.dir/src/nccl/nccl_lane.cpp.o
           python/CMakeFiles/sluice_python.dir/src/dlpack.cpp.o"
  deadline=600
else
  steps=preflight,deps,configure,build,tests,python
  build_type=Release
  extra=""
  targets=""
  deadline=7200
fi

# ---- inside: hide, check that it took, run run.sh
cat > "$work/inside.sh" <<'SH'
set -uo pipefail
mount -t overlay overlay -o "lowerdir=$work/layer:/usr" /usr || { echo "SKIPPED: no overlay on /usr here"; exit 77; }
[ -n "$pybind11_dir" ] && mount --bind "$work/empty" "$pybind11_dir"
bad=""
for f in /usr/include/boost/asio.hpp /usr/include/CLI/CLI.hpp /usr/include/x86_64-linux-gnu/openssl/opensslconf.h \
         /usr/include/dlpack/dlpack.h /usr/include/catch2/catch.hpp /usr/bin/ninja /usr/bin/ccache; do
  [ -e "$f" ] && bad+=" $f"
done
"$py" -c 'import pybind11.commands' 2>/dev/null && bad+=" (the project python's pybind11)"
[ -z "$bad" ] || { echo "FAIL: still visible after hiding:$bad"; exit 1; }
export PATH=$venv_bin:$PATH PY=$py STEPS=$steps BUILD=$work/gpu GPUDEPS=$work/gpudeps DEPS_DIR=$work/deps \
       OUT=$work/out JOBS=$jobs BUILD_TYPE=$build_type CMAKE_EXTRA=$extra TARGETS=$targets DEADLINE=$deadline \
       BUDGET_SCALE=10
unset CMAKE_PREFIX_PATH CPATH CPLUS_INCLUDE_PATH LIBRARY_PATH
if [ -n "$node_env" ]; then
  [ -e /usr/lib/libgloo.so.0 ] && { echo "FAIL: still visible after hiding: /usr/lib/libgloo.so.0"; exit 1; }
  eval "export $node_env"
fi
bash "$here/bench/gpu/run.sh"
rc=$?
# The extension must be configured (the node step builds none): the GPU machine's python may have no pybind11.
[ -n "$node_env" ] || grep -q "sluice: Python package for $py" "$work/gpu/logs/configure.txt" 2>/dev/null ||
  { echo "FAIL: the Python package was not configured with only what run.sh carries"; rc=1; }
exit $rc
SH
export work py pybind11_dir venv_bin steps jobs build_type extra targets deadline here node_env
unshare -m --propagation private bash "$work/inside.sh"
rc=$?
echo "rehearse: rc $rc in $(( $(date +%s) - T0 ))s (logs: $work/gpu/logs)"
exit $rc
