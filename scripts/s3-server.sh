#!/usr/bin/env bash
# The S3 test servers: moto's server with SigV4 checking on (tests/support/moto_server.py,
# in the project's Python environment) on HTTP, and nginx in front of the same moto as
# the HTTPS endpoint (Host passed through unchanged: it is signed). One store, two
# endpoints, loopback only.
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
#   export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...   (an IAM key moto generated)
# Ports are ephemeral unless SLUICE_S3_HTTP_PORT / SLUICE_S3_HTTPS_PORT are set. State,
# logs and nginx's files live in $SLUICE_S3_STATE_DIR (default build/s3-server).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${SLUICE_S3_STATE_DIR:-$here/build/s3-server}
state=$state_dir/state.json
mkdir -p "$state_dir"
exec 9>"$state_dir/lock"
flock 9

field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",}]*\).*/\1/p" "$state"; }
pid_of() { [[ -f $state ]] && field pid; }
nginx_pid() { [[ -f $state_dir/nginx.pid ]] && cat "$state_dir/nginx.pid"; }
running() {
  local p n
  p=$(pid_of) && [[ -n $p ]] && kill -0 "$p" 2>/dev/null && n=$(nginx_pid) && kill -0 "$n" 2>/dev/null
}
print_env() {
  echo "export SLUICE_S3_ENDPOINT=http://127.0.0.1:$(field http_port)"
  echo "export SLUICE_S3_HTTPS_ENDPOINT=https://127.0.0.1:$(cat "$state_dir/https_port")"
  echo "export SLUICE_S3_CA_BUNDLE=$here/.tools/tls/cert.pem"
  echo "export AWS_ACCESS_KEY_ID=$(field access_key_id)"
  echo "export AWS_SECRET_ACCESS_KEY=$(field secret_access_key)"
}
stop_all() {
  local p
  if p=$(pid_of) && [[ -n $p ]]; then kill "$p" 2>/dev/null || true; fi
  if p=$(nginx_pid) && [[ -n $p ]]; then kill "$p" 2>/dev/null || true; fi
  for _ in $(seq 50); do
    { p=$(pid_of) && [[ -n $p ]] && kill -0 "$p" 2>/dev/null; } || { p=$(nginx_pid) && kill -0 "$p" 2>/dev/null; } || break
    sleep 0.1
  done
  rm -f "$state" "$state_dir/nginx.pid" "$state_dir/https_port"
}
free_port() { "$1" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_nginx() {  # $1 = moto's port, $2 = python (for a free port)
  local port attempt
  mkdir -p "$state_dir/nginx"
  for attempt in 1 2 3 4 5; do
    port=${SLUICE_S3_HTTPS_PORT:-$(free_port "$2")}
    cat >"$state_dir/nginx.conf" <<EOF
daemon on;
pid $state_dir/nginx.pid;
error_log $state_dir/nginx.log warn;
worker_processes 1;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $state_dir/nginx/body;
  proxy_temp_path $state_dir/nginx/proxy;
  fastcgi_temp_path $state_dir/nginx/fastcgi;
  uwsgi_temp_path $state_dir/nginx/uwsgi;
  scgi_temp_path $state_dir/nginx/scgi;
  upstream moto { server 127.0.0.1:$1; keepalive 32; }
  server {
    listen 127.0.0.1:$port ssl;
    ssl_certificate $here/.tools/tls/cert.pem;
    ssl_certificate_key $here/.tools/tls/key.pem;
    client_max_body_size 0;
    location / {
      proxy_pass http://moto;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$http_host;   # signed: passed through as the client sent it
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
EOF
    if nginx -c "$state_dir/nginx.conf" -p "$state_dir" -e "$state_dir/nginx.log" 2>>"$state_dir/nginx.log"; then
      for _ in $(seq 50); do [[ -s $state_dir/nginx.pid ]] && break; sleep 0.1; done
      echo "$port" >"$state_dir/https_port"
      return 0
    fi
    [[ -n ${SLUICE_S3_HTTPS_PORT:-} ]] && break
  done
  echo "s3-server: nginx failed to start:" >&2
  tail -5 "$state_dir/nginx.log" >&2
  return 1
}

case ${1:-} in
  start)
    if running; then print_env; exit 0; fi
    stop_all
    [[ -f $here/.tools/tls/cert.pem ]] && command -v nginx >/dev/null || {
      echo "s3-server: nginx or the TLS certificate is missing; run scripts/setup.sh" >&2; exit 1; }
    py=$(bash "$here/scripts/python-env.sh" python)
    port_args=()
    [[ -n ${SLUICE_S3_HTTP_PORT:-} ]] && port_args=(--port "$SLUICE_S3_HTTP_PORT")
    nohup "$py" "$here/tests/support/moto_server.py" --state "$state" "${port_args[@]}" \
      >"$state_dir/log" 2>&1 9>&- &
    moto=$!
    for _ in $(seq 300); do
      [[ -f $state ]] && break
      kill -0 "$moto" 2>/dev/null || { echo "s3-server: moto failed to start:" >&2; tail -20 "$state_dir/log" >&2; exit 1; }
      sleep 0.1
    done
    [[ -f $state ]] || { echo "s3-server: moto not ready after 30 s" >&2; kill "$moto"; exit 1; }
    start_nginx "$(field http_port)" "$py" 9>&- || { stop_all; exit 1; }
    print_env
    ;;
  env)
    running || { echo "s3-server: not running" >&2; exit 1; }
    print_env
    ;;
  stop)
    stop_all
    ;;
  status)
    if running; then echo "running (moto pid $(pid_of), nginx pid $(nginx_pid))"; print_env; else echo "stopped"; exit 1; fi
    ;;
  *)
    echo "usage: $0 start|env|stop|status" >&2; exit 2 ;;
esac
