#!/usr/bin/env bash
# sluice-launch -n N -- sluice-load s3://bucket/prefix/ --topology tp1,dpN,epN
# --offload shared-cooperative, against the S3 test server (moto, SigV4 checked): the ranks'
# owned digests together equal the local load's, every tensor byte is read
# from S3 once (summed over ranks), each rank's client has the node's 16
# connections / N (or --connections-per-rank); a rank pointed at a missing
# prefix fails every rank with an error naming the rank and the prefix.
# Usage: check_launch_s3.sh SLUICE_LAUNCH SLUICE_LOAD CKPT SOURCE_DIR
set -euo pipefail
launch=$(realpath "$1") load=$(realpath "$2") ck=$(realpath "$3") src=$4
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [[ -z "${SLUICE_S3_ENDPOINT:-}" ]]; then eval "$(bash "$src/scripts/s3-server.sh" start)"; fi
# The test server's key pair comes with its env lines (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
export AWS_REGION=us-east-1 AWS_ENDPOINT_URL=$SLUICE_S3_ENDPOINT
py=${SLUICE_PYTHON:-$src/.venv/bin/python}   # boto3: the project's Python environment

total=$(/usr/bin/python3 -c "
import os,struct,sys
d=sys.argv[1]; t=0
for f in os.listdir(d):
  if f.endswith('.safetensors'):
    n=struct.unpack('<Q',open(os.path.join(d,f),'rb').read(8))[0]; t+=os.path.getsize(os.path.join(d,f))-8-n
print(t)" "$ck")
bucket="sluice-launch-$$-$RANDOM"
"$py" - "$ck" "$bucket" <<'PY'
import os, sys, boto3
d, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=os.environ["SLUICE_S3_ENDPOINT"], region_name="us-east-1")
s3.create_bucket(Bucket=bucket)
for f in sorted(os.listdir(d)):
    if os.path.isfile(os.path.join(d, f)):
        s3.upload_file(os.path.join(d, f), bucket, "ck/" + f)
PY
"$load" "$ck" --digest --no-progress 2>/dev/null | sort > "$work/local.txt"

# check N PER_RANK [extra sluice-load args...]
check() {
  local n=$1 per_rank=$2; shift 2
  rm -f "$work"/digests.* "$work"/err.*
  if ! (cd "$work" && "$launch" -n "$n" --json-out "$work/s3.json" -- sh -c \
     'exec "$0" "$@" > "'"$work"'/digests.$RANK" 2>"'"$work"'/err.$RANK"' \
     "$load" "s3://$bucket/ck/" --topology "tp1,dp$n,ep$n" --offload shared-cooperative --digest --no-progress "$@"); then
    echo "FAIL: $n ranks over S3 ($*): the launcher failed; the ranks said:"
    for f in "$work"/err.*; do echo "== $f"; cat "$f"; done
    exit 1
  fi
  /usr/bin/python3 - "$work/s3.json" "$total" "$per_rank" <<'PY'
import json, sys
j, total, per_rank = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
t = j["totals"]
assert t["bytes_read"] == total and t["storage_bytes"] == total, f"read {t} over the ranks, the checkpoint holds {total}"
# One node: what a rank keeps but did not read it copies from the node window its readers read
# into; nothing crosses a socket between the ranks.
assert t["bytes_received"] == 0 and t["bytes_sent"] == 0, f"over Gloo within one node: {t}"
assert t["node_copied_bytes"] > 0, f"nothing copied from the node window: {t}"
conns = [r["summary"]["connections"] for r in j["ranks"]]
assert conns == [per_rank] * len(conns), f"connections per rank {conns}, expected {per_rank}"
PY
  sort -u "$work"/digests.* > "$work/s3.txt"
  if ! cmp -s "$work/local.txt" "$work/s3.txt"; then
    echo "FAIL: $n ranks over S3: owned digests differ from the local load"; diff "$work/local.txt" "$work/s3.txt" | head; exit 1
  fi
  echo "ok: $n ranks read $total bytes from S3 in all (each byte once), $per_rank connections each, none over Gloo, $(wc -l < "$work/s3.txt") digests equal the local load"
}
check 2 8
check 4 4
check 2 3 --connections-per-rank 3

# Two simulated nodes (two launchers, --nnodes 2), each with its own node-local
# cache directory, through a proxy that logs every request: the first load
# fills each node's cache with the blocks its ranks read (both hold some, and
# together every block of every tensor), the second sends S3 no GET for
# object bytes, and both give the local load's digests.
two_nodes() {
  local store="$work/store-$1"; mkdir -m 700 "$store"
  rm -f "$work"/digests.* "$work"/err.*
  local pids=()
  for k in 0 1; do
    # Node 0's launcher requires the shared store empty: node 1 starts once
    # node 0's first rank has started (its stderr file exists), past that check.
    if ((k == 1)); then
      for _ in $(seq 1 3000); do [[ -e "$work/err.0" ]] && break; sleep 0.01; done
    fi
    (cd "$work" && SLUICE_CACHE_DIR="$work/cache-node$k" AWS_ENDPOINT_URL="$proxy" \
       "$launch" -n 2 --nnodes 2 --node-rank $k --host 127.0.0.1 --store "$store" -- sh -c \
       'exec "$0" "$@" > "'"$work"'/digests.$RANK" 2>"'"$work"'/err.$RANK"' \
       "$load" "s3://$bucket/ck/" --topology tp1,dp4,ep4 --digest --no-progress) >/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"   # (not %1 %2: the proxy's coprocess is a job too)
  sort -u "$work"/digests.* > "$work/s3.txt"
  cmp -s "$work/local.txt" "$work/s3.txt" || { echo "FAIL: two nodes with caches: digests differ from the local load"; cat "$work"/err.*; exit 1; }
}
log="$work/requests.jsonl"
# The proxy lives while its stdin (our end of the coprocess) is open.
coproc PROXY { exec node "$src/tests/support/fault_proxy.js" --upstream "$SLUICE_S3_ENDPOINT" --fault none --log "$log"; }
read -r _ port <&"${PROXY[0]}"
proxy="http://127.0.0.1:$port"
two_nodes 1
first=$(wc -l < "$log")
two_nodes 2
/usr/bin/python3 - "$log" "$first" "$bucket" "$work" <<'PY'
import json, os, sys
log, first, bucket, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = [json.loads(l) for l in open(log)]
def objects(rs): return [r for r in rs if r["path"].split("?")[0].rstrip("/") != f"/{bucket}"]
blocks = lambda d: sum(f.endswith(".blk") for _, _, fs in os.walk(d) for f in fs)
b0, b1 = blocks(f"{work}/cache-node0"), blocks(f"{work}/cache-node1")
assert b0 > 0 and b1 > 0, f"a node's cache is empty: {b0}, {b1} blocks"
again = objects(lines[first:])
assert not again, f"the second load asked S3 for object bytes: {again[:3]}"
print(f"ok: two nodes, two caches ({b0} and {b1} blocks), the second load sent S3 {len(lines) - first} listing request(s) and no GET for object bytes")
PY
exec {PROXY[1]}>&-

# Rank 1 points at a prefix with no checkpoint: every rank fails, naming rank 1 and the prefix.
# --no-teardown: this checks the library's failure protocol on every rank; the
# launcher's teardown would end rank 0 (SIGTERM) as soon as rank 1 exits,
# sometimes before rank 0 has written its own error.
if (cd "$work" && "$launch" -n 2 --timeout 30 --no-teardown -- sh -c \
     'p=ck/; [ "$RANK" = 1 ] && p=missing/; exec "$0" "s3://$1/$p" --topology tp1,dp2,ep2 --no-progress 2> "'"$work"'/err.$RANK"' \
     "$load" "$bucket" 2>/dev/null); then
  echo "FAIL: a rank with a missing prefix loaded"; exit 1
fi
for r in 0 1; do
  grep -q "rank 1 failed while opening the checkpoint.*s3://$bucket/missing/" "$work/err.$r" || {
    echo "FAIL: rank $r's error does not name rank 1 and the prefix:"; cat "$work/err.$r"; exit 1; }
done
echo "ok: a missing prefix on rank 1 -> $(head -c 300 "$work/err.0")"
echo "sluice-launch s3 checks: passed"
