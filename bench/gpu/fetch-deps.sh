#!/usr/bin/env bash
# bench/gpu/fetch-deps.sh — run HERE (a Debian 12 dev machine), not on the GPU
# machine: puts what bench/gpu/run.sh carries to a machine that lacks it (it
# has no network) into .gpudeps/ (git-ignored, ~17 MB):
#   .gpudeps/debs/    the Debian packages of lib.sh's gpu_debs and node_debs (headers, CMake
#                     configs, the runtime libraries they link)
#   .gpudeps/wheels/  pybind11 from PyPI, the version python/requirements.lock
#                     pins (>= 2.11: Debian's 2.10 predates Python 3.12)
# Downloads go through a cache shared by this machine's clones
# (${SLUICE_GPUDEPS_CACHE:-~/.cache/sluice/gpudeps}): a second call fetches nothing.
#   bench/gpu/fetch-deps.sh [DEST]     (DEST: default .gpudeps)
# then the device call in bench/gpu/run.sh's header.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
dest=${1:-$root/.gpudeps}
# shellcheck source=lib.sh
source "$root/bench/gpu/lib.sh"
cache=${SLUICE_GPUDEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/gpudeps}
mkdir -p "$cache/debs" "$cache/wheels" "$dest/debs" "$dest/wheels"
# One fetch at a time into the cache (clones run the rehearsal side by side).
exec 9>"$cache/.lock"
flock 9

for p in "${gpu_debs[@]}" "${node_debs[@]}"; do
  if ! ls "$cache/debs/${p}"_*.deb >/dev/null 2>&1; then
    (cd "$cache/debs" && apt-get download -q "$p" >/dev/null 2>&1) ||
      (apt-get update -qq >/dev/null && cd "$cache/debs" && apt-get download -q "$p" >/dev/null)
  fi
  cp -p "$(ls -t "$cache/debs/${p}"_*.deb | head -1)" "$dest/debs/"
done

pin=$(sed -n 's/^pybind11==\([^ ]*\).*/\1/p' "$root/python/requirements.lock")
[ -n "$pin" ] || { echo "fetch-deps: no pybind11 pin in python/requirements.lock" >&2; exit 1; }
whl=$(ls "$cache/wheels/pybind11-${pin}-"*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  py=$root/.venv/bin/python
  [ -x "$py" ] || py=python3
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$cache/wheels" "pybind11==$pin"
  whl=$(ls "$cache/wheels/pybind11-${pin}-"*.whl | head -1)
fi
cp -p "$whl" "$dest/wheels/"
echo "fetch-deps: $(ls "$dest"/debs/*.deb | wc -l) packages, $(ls "$dest"/wheels/*.whl | wc -l) wheel in $dest ($(du -sh "$dest" | cut -f1))"
