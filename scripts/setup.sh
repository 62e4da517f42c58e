#!/usr/bin/env bash
# Installs everything sluice needs to build and test: Debian's packages, then the
# project's Python environment from PyPI (scripts/python-env.sh: torch, moto,
# safetensors, vLLM, the peers). Idempotent and quiet when everything is there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

apt_pkgs=(build-essential cmake ninja-build ccache pkg-config
          liburing-dev libboost-dev libssl-dev libfmt-dev catch2 nlohmann-json3-dev
          libgloo-dev libhiredis-dev redis-server iproute2 nodejs openssl fio nginx-light
          libpugixml-dev libcli11-dev clang-14 libclang-rt-14-dev curl procps util-linux
          python3-dev python3-venv libdlpack-dev libre2-dev libxxhash-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) == 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

tools="$here/.tools"
# A self-signed certificate for the HTTPS S3 test endpoint (SAN IP:127.0.0.1).
if [[ ! -f "$tools/tls/cert.pem" ]]; then
  mkdir -p "$tools/tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$tools/tls/key.pem" -out "$tools/tls/cert.pem" >/dev/null 2>&1
fi

# The Python environment (shared by this machine's clones; .venv links to it).
bash "$here/scripts/python-env.sh"
