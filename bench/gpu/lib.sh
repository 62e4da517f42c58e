# bench/gpu/lib.sh — the pieces of run.sh that can go wrong on a machine we
# cannot try beforehand, as functions (sourced by run.sh and by
# tests/cuda/check_gpu_run.sh, which checks them without a GPU).

# The directory of pip's NCCL (nvidia-nccl-cu*): python3 -c with `nvidia.nccl`.
# The wheel ships it as a namespace package (no __init__.py): its __file__ is
# None, its __path__ lists the directory. Prints nothing when there is none.
#   pip_nccl_dir [PYTHON]
pip_nccl_dir() {
  local py=${1:-python3}
  command -v "$py" >/dev/null 2>&1 || return 0
  "$py" - 2>/dev/null <<'PY' || true
import nvidia.nccl as m
paths = list(getattr(m, "__path__", []) or [])
if paths:
    print(paths[0])
elif getattr(m, "__file__", None):
    import os
    print(os.path.dirname(m.__file__))
PY
}

# Whether two digest listings (one "name dtype shape sha256" line per tensor)
# hold the same lines, in any order. Both sides are sorted in byte order
# (LC_ALL=C): sluice-load --digest prints names in byte order, while `sort`
# under a UTF-8 locale orders "a.b" and "a_b" by collation rules instead.
#   digests_match FILE_A FILE_B
digests_match() {
  cmp -s <(LC_ALL=C sort "$1") <(LC_ALL=C sort "$2")
}

# The Debian packages run.sh carries to a machine that lacks them (fetched by
# bench/gpu/fetch-deps.sh into .gpudeps/debs; bench/gpu/rehearse.sh stages
# exactly these). -dev packages and the runtime libraries they link.
gpu_debs=(libboost1.74-dev libfmt-dev libfmt9 nlohmann-json3-dev liburing-dev liburing2
          libssl-dev libssl3 catch2 libcli11-dev libdlpack-dev libre2-dev libre2-9)
# And for run.sh's node step (sluice-load and sluice-launch with Gloo, no
# CUDA): Gloo and the libraries Debian's libgloo links (hiredis, ibverbs, netlink).
node_debs=(libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200)

# The multiarch folder of include/ and lib/ (Debian's libssl-dev puts
# openssl/opensslconf.h and openssl/configuration.h there, not in include/).
multiarch() { echo "$(uname -m)-linux-gnu"; }

# The headers the build needs that a bare machine may lack, each looked for
# under PREFIX/include and PREFIX/include/<multiarch>; prints the missing ones.
#   missing_headers PREFIX...
missing_headers() {
  local h p found ma
  ma=$(multiarch)
  for h in boost/asio.hpp fmt/format.h nlohmann/json.hpp liburing.h openssl/evp.h openssl/opensslconf.h \
           catch2/catch.hpp CLI/CLI.hpp dlpack/dlpack.h re2/re2.h; do
    found=
    for p in "$@"; do
      [ -e "$p/include/$h" ] || [ -e "$p/include/$ma/$h" ] && { found=1; break; }
    done
    [ -n "$found" ] || echo "$h"
  done
}

# Gloo's header, for the node step: prints it where none of PREFIX... has it.
#   missing_gloo PREFIX...
missing_gloo() {
  local p
  for p in "$@"; do [ -e "$p/include/gloo/rendezvous/file_store.h" ] && return 0; done
  echo gloo/rendezvous/file_store.h
}

# Debian's Gloo CMake package names its library by absolute path
# (/usr/lib/libgloo.so.0.5.0): unpacked under PREFIX, it must name PREFIX's.
#   relocate_gloo PREFIX
relocate_gloo() {
  local f
  for f in "$1"/share/cmake/Gloo/GlooTargets-*.cmake; do
    [ -e "$f" ] && sed -i "s|\"/usr/lib/|\"$1/lib/|g" "$f"
  done
  return 0
}

# Unpacks .deb files into DEST (dpkg-deb where there is one, else ar + tar).
#   unpack_debs DEST DEB...
unpack_debs() {
  local dest=$1 d t
  shift
  mkdir -p "$dest"
  for d in "$@"; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$d" "$dest" || return 1
    else
      t=$(mktemp -d) && (cd "$t" && ar x "$d" && tar -xf data.tar.* -C "$dest") || { rm -rf "$t"; return 1; }
      rm -rf "$t"
    fi
  done
  # Debian 12 is merged-/usr (/lib is /usr/lib), but some packages still ship
  # files under /lib (libnl-3-200): merged here too, so that the linker finds
  # them beside the libraries that need them (libibverbs needs libnl).
  if [ -d "$dest/lib" ] && [ ! -L "$dest/lib" ]; then
    mkdir -p "$dest/usr/lib" && cp -a "$dest/lib/." "$dest/usr/lib/" && rm -rf "$dest/lib"
  fi
}

# Unpacks a pybind11 wheel (a zip) into DEST with PYTHON's zipfile and prints
# the folder of its CMake config (pybind11Config.cmake); nothing on failure.
#   pybind11_from_wheel WHEEL DEST [PYTHON]
pybind11_from_wheel() {
  local whl=$1 dest=$2 py=${3:-python3} cfg
  rm -rf "$dest" && mkdir -p "$dest" || return 0
  "$py" -m zipfile -e "$whl" "$dest" >/dev/null 2>&1 || return 0
  cfg=$(ls "$dest"/pybind11/share/cmake/pybind11/pybind11Config.cmake 2>/dev/null | head -1)
  [ -n "$cfg" ] && dirname "$cfg"
}

# Runs CMD under `timeout -k`, for at most SECONDS and never past the run's
# deadline: DEADLINE seconds after T0 (epoch seconds), less the kill grace, so
# that steps that each overrun still end the run in time. Returns CMD's status
# (124/137: stopped) and says so when it stopped it. BUDGET_SCALE (an
# integer, default 1) multiplies SECONDS, not the deadline.
#   bounded NAME SECONDS CMD...
bounded() {
  local name=$1 budget=$(( $2 * ${BUDGET_SCALE:-1} )) grace=${KILL_GRACE:-3} left rc
  shift 2
  left=$(( ${T0:-$(date +%s)} + ${DEADLINE:-285} - $(date +%s) - grace ))
  (( left < budget )) && budget=$left
  if (( budget <= 0 )); then
    echo "run.sh: $name not run: no time left before the deadline" >&2
    return 124
  fi
  timeout -k "$grace" "$budget" "$@"
  rc=$?
  if (( rc == 124 || rc == 137 )); then echo "run.sh: $name stopped at its limit (${budget}s)" >&2; fi
  return $rc
}
