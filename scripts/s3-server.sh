#!/usr/bin/env bash
# The S3 test servers: s3rver 3.7.1 with SigV4 verification
# (tests/support/s3rver_verify.js), HTTP and HTTPS on 127.0.0.1, one process.
#
#   scripts/s3-server.sh start    start unless running (idempotent); prints the env lines
#   scripts/s3-server.sh env      print the env lines of the running servers (exit 1 if none)
#   scripts/s3-server.sh stop     stop them (idempotent)
#   scripts/s3-server.sh status
#
# The env lines (for `eval "$(scripts/s3-server.sh start)"`):
#   export SLUICE_S3_ENDPOINT=http://127.0.0.1:PORT
#   export SLUICE_S3_HTTPS_ENDPOINT=https://127.0.0.1:PORT
#   export SLUICE_S3_CA_BUNDLE=.../.tools/tls/cert.pem
# Credentials: access key S3RVER, secret S3RVER. Ports are ephemeral unless
# SLUICE_S3_HTTP_PORT / SLUICE_S3_HTTPS_PORT are set. State, data and log live in
# $SLUICE_S3_STATE_DIR (default build/s3-server).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${SLUICE_S3_STATE_DIR:-$here/build/s3-server}
state=$state_dir/state.json
mkdir -p "$state_dir"
exec 9>"$state_dir/lock"
flock 9

pid_of() { [[ -f $state ]] && sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$state"; }
running() { local p; p=$(pid_of) && [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }
port_of() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$state"; }
print_env() {
  echo "export SLUICE_S3_ENDPOINT=http://127.0.0.1:$(port_of http_port)"
  echo "export SLUICE_S3_HTTPS_ENDPOINT=https://127.0.0.1:$(port_of https_port)"
  echo "export SLUICE_S3_CA_BUNDLE=$here/.tools/tls/cert.pem"
}

case ${1:-} in
  start)
    if running; then print_env; exit 0; fi
    [[ -f $here/.tools/node_modules/s3rver/bin/s3rver.js && -f $here/.tools/tls/cert.pem ]] || {
      echo "s3-server: s3rver or the TLS certificate is missing; run scripts/setup.sh" >&2; exit 1; }
    rm -f "$state"
    rm -rf "$state_dir/data"
    mkdir -p "$state_dir/data"
    nohup node --openssl-legacy-provider "$here/tests/support/s3rver_verify.js" \
      --dir "$state_dir/data" --state "$state" \
      --cert "$here/.tools/tls/cert.pem" --key "$here/.tools/tls/key.pem" \
      --http-port "${SLUICE_S3_HTTP_PORT:-0}" --https-port "${SLUICE_S3_HTTPS_PORT:-0}" \
      >"$state_dir/log" 2>&1 9>&- &
    for _ in $(seq 100); do
      [[ -f $state ]] && break
      kill -0 $! 2>/dev/null || { echo "s3-server: failed to start:" >&2; cat "$state_dir/log" >&2; exit 1; }
      sleep 0.1
    done
    [[ -f $state ]] || { echo "s3-server: not listening after 10 s" >&2; exit 1; }
    print_env
    ;;
  env)
    running || { echo "s3-server: not running" >&2; exit 1; }
    print_env
    ;;
  stop)
    if running; then
      p=$(pid_of)
      kill "$p"
      for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$state"
    ;;
  status)
    if running; then echo "running (pid $(pid_of))"; print_env; else echo "stopped"; exit 1; fi
    ;;
  *)
    echo "usage: $0 start|env|stop|status" >&2; exit 2 ;;
esac
