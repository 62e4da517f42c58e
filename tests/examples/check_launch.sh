#!/usr/bin/env bash
# sluice-launch -n 4 -- sluice-load --topology tp1,dp4,ep4: every byte is read
# from storage once (summed over ranks == the checkpoint's tensor bytes), for
# each offload mode. Usage: check_launch.sh SLUICE_LAUNCH SLUICE_LOAD CKPT
set -euo pipefail
launch=$(realpath "$1") load=$(realpath "$2") ck=$(realpath "$3")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
total=$(/usr/bin/python3 -c "
import os,struct,sys
d=sys.argv[1]; t=0
for f in os.listdir(d):
  if f.endswith('.safetensors'):
    n=struct.unpack('<Q',open(os.path.join(d,f),'rb').read(8))[0]; t+=os.path.getsize(os.path.join(d,f))-8-n
print(t)" "$ck")
for mode in none per-rank shared-single shared-cooperative; do
  (cd "$work" && "$launch" -n 4 --json-out "$work/$mode.json" -- "$load" "$ck" --topology tp1,dp4,ep4 --offload "$mode" --no-progress 2>/dev/null)
  got=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['totals']['bytes_read'])" "$work/$mode.json")
  [[ "$got" == "$total" ]] || { echo "FAIL: offload $mode read $got bytes over 4 ranks, the checkpoint holds $total"; exit 1; }
  echo "ok: offload $mode: 4 ranks read $got bytes in all (each byte once)"
done
echo "sluice-launch checks: passed"
