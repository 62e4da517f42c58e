#!/usr/bin/env bash
# Installs everything sluice needs to build and test, from Debian's packages and
# the npm registry. Idempotent and quiet when everything is already there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

apt_pkgs=(build-essential cmake ninja-build ccache pkg-config
          liburing-dev libboost-dev libssl-dev libfmt-dev catch2 nlohmann-json3-dev
          libgloo-dev libhiredis-dev redis-server iproute2 nodejs npm openssl fio nginx-light python3-boto3 python3-botocore
          libpugixml-dev libcli11-dev clang-14 libclang-rt-14-dev curl procps
          python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-torch python3-numpy python3-pytest python3-tqdm)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs from another origin may already provide npm; do not fight it.
if command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == npm || $p == nodejs ]] || tmp+=("$p"); done; missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) == 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# s3rver (the S3 test server) into a project-local folder.
tools="$here/.tools"
if [[ ! -f "$tools/node_modules/s3rver/bin/s3rver.js" ]]; then
  echo "setup: installing s3rver into .tools/"
  mkdir -p "$tools"
  (cd "$tools" && npm install --silent --no-audit --no-fund --prefix . s3rver@3.7.1 >/dev/null)
fi

# A self-signed certificate for the HTTPS S3 test endpoint (SAN IP:127.0.0.1).
if [[ ! -f "$tools/tls/cert.pem" ]]; then
  mkdir -p "$tools/tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$tools/tls/key.pem" -out "$tools/tls/cert.pem" >/dev/null 2>&1
fi
