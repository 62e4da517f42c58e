#!/usr/bin/env bash
# bench/gpu/fetch-deps.sh — run HERE (a Debian 12 dev machine), not on the GPU
# machine: downloads the .debs of sluice's build dependencies into .gpudeps/
# (git-ignored through .git/info/exclude, ~15 MB) so that a `device` run can
# carry them to a GPU machine that lacks them (it has no network). run.sh
# unpacks them there only if the system lacks the headers.
#   bench/gpu/fetch-deps.sh   then   run(carry=[".gpudeps"], command="bench/gpu/run.sh")
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >> .git/info/exclude
mkdir -p .gpudeps/debs
cd .gpudeps/debs
apt-get download libboost1.74-dev libfmt-dev libfmt9 nlohmann-json3-dev liburing-dev liburing2 \
  libssl-dev libssl3 catch2
ls -la
du -sh .
