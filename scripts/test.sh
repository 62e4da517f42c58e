#!/usr/bin/env bash
# The test command: installs what is missing, builds the ASan+UBSan preset,
# starts the S3 test servers, runs every test, stops the servers.
#   scripts/test.sh [extra ctest args...]     (SLUICE_TEST_PRESET=tsan for the TSan subset)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
# ccache hits across clones at different paths (CI builds a fresh clone): paths
# relative to the clone, and, since the presets compile with -g, the build
# directory kept out of the hash (ccache hashes it by default when -g is on;
# 1 % hits across clones were measured without this).
export CCACHE_BASEDIR="$here" CCACHE_NOHASHDIR=1
preset=${SLUICE_TEST_PRESET:-asan-ubsan}
jobs=${SLUICE_JOBS:-$(nproc)}

bash scripts/setup.sh
echo "test: configuring and building preset '$preset'"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"

servers_started=0
stop_servers() { if ((servers_started)) && [[ -x scripts/s3-server.sh ]]; then bash scripts/s3-server.sh stop >/dev/null 2>&1 || true; fi; }
trap stop_servers EXIT
if [[ -f scripts/s3-server.sh ]]; then
  # Exports SLUICE_S3_ENDPOINT / SLUICE_S3_HTTPS_ENDPOINT for the S3 tests.
  eval "$(bash scripts/s3-server.sh start)"
  servers_started=1
fi

ctest --preset "$preset" -j "$jobs" "$@"
