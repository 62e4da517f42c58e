#!/usr/bin/env bash
# The tools' command lines: --help prints a generated help on stdout and exits 0;
# a usage error (an unknown option, a missing value, a missing positional) is
# a non-zero exit and exactly one stderr line "sluice: error: ...".
# Usage: check_usage.sh GEN_CHECKPOINT INSPECT LOAD LAUNCH
set -euo pipefail
gen=$1 inspect=$2 load=$3 launch=$4
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

help_ok() {  # TOOL EXPECTED-TEXT
  local tool=$1 want=$2
  "$tool" --help > "$work/out" 2> "$work/err" || { echo "FAIL: $tool --help exited non-zero"; exit 1; }
  grep -q "^Usage: " "$work/out" && grep -q -- "$want" "$work/out" && [[ ! -s $work/err ]] \
    || { echo "FAIL: $tool --help:"; cat "$work/out" "$work/err"; exit 1; }
  echo "ok: $(basename "$tool") --help shows $want"
}
error_ok() {  # EXPECTED-CODE EXPECTED-LINE-REGEX TOOL ARGS...
  local code=$1 want=$2; shift 2
  local rc=0
  "$@" > "$work/out" 2> "$work/err" || rc=$?
  [[ $rc -eq $code && $(wc -l < "$work/err") -eq 1 ]] && grep -q -- "$want" "$work/err" \
    || { echo "FAIL: $* exited $rc (want $code), stderr:"; cat "$work/err"; exit 1; }
  echo "ok: $(basename "$1") ${*:2} -> $rc: $(cat "$work/err")"
}

help_ok "$gen" "--engram-rows N"
error_ok 2 "^sluice: error: DIR is required" "$gen"
error_ok 2 "^sluice: error: unknown argument '--bogus' (see --help)$" "$gen" "$work/c" --bogus
error_ok 2 "^sluice: error: Could not convert: --layers = x" "$gen" "$work/c" --layers x

help_ok "$inspect" "--json"
error_ok 2 "^sluice: error: PATH is required" "$inspect"
error_ok 2 "^sluice: error: unknown argument 'extra' (see --help)$" "$inspect" "$work" extra

help_ok "$load" "--contract-out FILE"
error_ok 1 "^sluice: error: no SOURCE given (see --help)$" "$load"
error_ok 1 "^sluice: error: unknown argument '--bogus' (see --help)$" "$load" "$work" --bogus
error_ok 1 "^sluice: error: --staging: 1 required SIZE missing" "$load" "$work" --staging
error_ok 1 "^sluice: error: size '12q': unknown unit 'q' " "$load" "$work" --staging 12q
error_ok 1 "^sluice: error: --connections must be at least 1$" "$load" "$work" --connections 0
error_ok 1 "^sluice: error: --contract-out needs --probe$" "$load" "$work" --contract-out f

help_ok "$launch" "-- COMMAND ARGS"
error_ok 2 "^sluice: error: unknown argument 'true' (see --help)$" "$launch" -n 2 true
error_ok 2 "^sluice-launch: no command" "$launch" -n 2 --
error_ok 2 "^sluice-launch: --node-rank 3 is not below --nnodes 2$" "$launch" --nnodes 2 --node-rank 3 -- true
# Options after "--" belong to the command, not to sluice-launch.
"$launch" -n 1 -- sh -c 'test "$1" = --help' sh --help || { echo "FAIL: --help after -- did not reach the command"; exit 1; }
echo "ok: sluice-launch passes everything after -- to the command"
echo "tool usage checks: passed"
