#!/usr/bin/env bash
# bench/s3: sluice vs N parallel curl vs boto3 reading the same checkpoint over
# HTTP range GETs, from nginx (the throughput reference) and from moto (the
# SigV4-checking correctness server, CPU-bound), at the same concurrency and part size.
#
#   bench/s3.sh [BUILD_DIR] [bench-s3 options...]      e.g. bench/s3.sh build/release --streams 8,16 --part 8MiB,16MiB
#
# BUILD_DIR (default build/release) holds examples/gen-checkpoint and bench/bench-s3.
# SIZE (default 1GiB) sizes the generated checkpoint; WORK (default BUILD_DIR/bench-s3)
# keeps it between runs. Everything listens on 127.0.0.1 only; nginx (Debian's,
# path-style /bucket/prefix/file from a symlink to the checkpoint, ranges,
# Authorization ignored) and moto (scripts/s3-server.sh, its own state dir)
# are stopped on exit. SERVE_ONLY=SECONDS starts both servers, prints their
# URLs and keeps them up that long instead of running the benchmark (profiling).
# RATE (e.g. 24m) limits nginx's bytes per second on each connection (its
# limit_rate), as a remote store's per-connection throughput bounds a GET, so
# that reads wait on the network rather than on this machine's cores.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build/release}
[[ $# -gt 0 ]] && shift
build=$(cd "$build" && pwd)
work=${WORK:-$build/bench-s3}
size=${SIZE:-1GiB}
bucket=bench prefix=ck/
mkdir -p "$work"
work=$(cd "$work" && pwd)
exec 8>"$work/lock"   # one run per WORK: a second would replace the first one's servers
flock -n 8 || { echo "bench/s3.sh: $work is in use by another run (set WORK=...)" >&2; exit 1; }

export AWS_REGION=us-east-1   # the key pair comes from scripts/s3-server.sh's env lines below
py=${SLUICE_PYTHON:-$src/.venv/bin/python}   # boto3: the project's Python environment
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE

ck=$work/ck
if [[ ! -d $ck || ! -f $work/ck.size || $(cat "$work/ck.size") != "$size" ]]; then
  rm -rf "$ck"
  "$build/examples/gen-checkpoint" "$ck" --size "$size" >/dev/null
  echo "$size" > "$work/ck.size"
fi

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# nginx: /bucket/prefix/<file> -> the checkpoint directory.
ng=$work/nginx
rm -rf "$ng" && mkdir -p "$ng/www/$bucket" "$ng/tmp"
ln -s "$ck" "$ng/www/$bucket/${prefix%/}"
nginx_port=$(free_port)
cat > "$ng/nginx.conf" <<EOF
worker_processes auto;
pid $ng/nginx.pid;
error_log $ng/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  client_body_temp_path $ng/tmp; proxy_temp_path $ng/tmp; fastcgi_temp_path $ng/tmp;
  uwsgi_temp_path $ng/tmp; scgi_temp_path $ng/tmp;
  default_type application/octet-stream;
  server {
    listen 127.0.0.1:$nginx_port;
    root $ng/www;
    ${RATE:+limit_rate $RATE;}
  }
}
EOF
s3state=$work/s3-server
cleanup() {
  [[ -f $ng/nginx.pid ]] && kill "$(cat "$ng/nginx.pid")" 2>/dev/null || true
  SLUICE_S3_STATE_DIR=$s3state bash "$src/scripts/s3-server.sh" stop 8>&- || true
}
trap cleanup EXIT
/usr/sbin/nginx -c "$ng/nginx.conf" -p "$ng" -e "$ng/error.log" 8>&-
wait_port "$nginx_port" || { echo "bench/s3.sh: nginx did not start" >&2; cat "$ng/error.log" >&2; exit 1; }

# moto: upload the same files (single PUTs) with boto3.
eval "$(SLUICE_S3_STATE_DIR=$s3state bash "$src/scripts/s3-server.sh" start 8>&-)"
"$py" "$src/bench/upload_checkpoint.py" "$ck" "$bucket" "$prefix" "$SLUICE_S3_ENDPOINT"
if [[ -n ${SERVE_ONLY:-} ]]; then   # for profiling by hand: keep both servers up until interrupted
  echo "nginx=http://127.0.0.1:$nginx_port moto=$SLUICE_S3_ENDPOINT bucket=$bucket prefix=$prefix ck=$ck"
  sleep "$SERVE_ONLY"
  exit 0
fi
echo "reproduce: bench/s3.sh ${build#"$src/"} $*"
"$build/bench/bench-s3" "$ck" \
  --server "nginx=http://127.0.0.1:$nginx_port,$ck" \
  --server "moto=$SLUICE_S3_ENDPOINT" --python "$py" \
  --bucket "$bucket" --prefix "$prefix" "$@"
