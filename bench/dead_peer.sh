#!/usr/bin/env bash
# The time from a rank's death to the last survivor's exit, per phase of a
# distributed load (issue 24). Four ranks load a generated checkpoint under
# sluice-launch; the test fault hook (SLUICE_TEST_FAULT, preloaded from the
# build's tests/libsluice_test_faults.so: no installed library has it) SIGKILLs RANK when
# the load enters each phase. The launcher's tear-down is off (--no-teardown)
# where it has one, so what is timed is the library's own detection; an older
# launcher kills the survivors --timeout seconds after the first failure, so
# there the figure is at most that timeout.
#
#   bench/dead_peer.sh [BUILD_DIR] [RANK] [COMM_TIMEOUT_S] [SIZE]
#   e.g. bench/dead_peer.sh build/release 0 60 1GiB
set -euo pipefail
build=${1:-build/release}
victim=${2:-0}
timeout=${3:-60}
size=${4:-1GiB}
bin=$build/examples
hook=$build/tests/libsluice_test_faults.so
[ -f "$hook" ] || { echo "$0: no $hook (build the tests of $build)" >&2; exit 1; }
work=$(mktemp -d /tmp/sluice-dead-peer-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/gen-checkpoint" "$work/ck" --size "$size" >/dev/null
if "$bin/sluice-launch" --help 2>&1 | grep -q -- --no-teardown; then
  launch=("$bin/sluice-launch" -n 4 --comm-timeout "$timeout" --no-teardown)
else
  launch=("$bin/sluice-launch" -n 4 --timeout "$timeout")
fi
echo "# $0 $build $victim $timeout $size: rank $victim SIGKILLed entering each phase; 4 ranks, comm timeout ${timeout} s"
echo "# phase      kill -> last survivor's exit (s)   survivors' errors (first line of each)"
for phase in open plan tables reads exchange delivery; do
  log=$work/$phase.log
  SLUICE_TEST_FAULT=$phase:$victim:KILL LD_PRELOAD=$hook "${launch[@]}" -- "$bin/sluice-load" "$work/ck" --topology tp1,dp4,ep4 \
    --offload shared-cooperative >/dev/null 2>"$log" || true
  end=$(date +%s.%N)
  t=$(grep -o 'entering phase [a-z]* at [0-9.]*' "$log" | awk '{print $5}' | head -1)
  if [ -z "$t" ]; then
    printf "%-10s %8s   (the fault did not fire: no such phase in this load)\n" "$phase" "-"
    continue
  fi
  why=$(grep -m1 'sluice: error' "$log" | cut -c1-140 || true)
  printf "%-10s %8.2f   %s\n" "$phase" "$(echo "$end - $t" | bc -l)" "$why"
done
