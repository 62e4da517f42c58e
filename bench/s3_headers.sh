#!/usr/bin/env bash
# bench/s3_headers: the metadata requests of an N-rank load from S3, counted
# per object. `sluice-launch -n N -- sluice-load s3://bench/ck/ --topology
# tp1,dpN,epN` reads through tests/support/fault_proxy.js --log in front of
# moto, and the log is counted: per object, GETs from byte 0 (the index, a
# shard header's speculative prefix; no tensor starts there), HEADs, and the
# other GETs (tensor data).
#
#   bench/s3_headers.sh [BIN_DIR] [RANKS]      e.g. bench/s3_headers.sh build/release/examples 8
#
# BIN_DIR (default build/release/examples) holds gen-checkpoint, sluice-load
# and sluice-launch; point it at another build's (or a copy of them) for a
# before/after. SIZE (default 256MiB) and SHARD (default 8MiB) shape the
# generated checkpoint; WORK (default build/bench-s3-headers) keeps it between
# runs. moto (scripts/s3-server.sh, a state dir of its own) and the proxy
# listen on 127.0.0.1 and are stopped on exit.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$(cd "${1:-$src/build/release/examples}" && pwd)
ranks=${2:-8}
work=${WORK:-$src/build/bench-s3-headers}
size=${SIZE:-256MiB} shard=${SHARD:-8MiB}
bucket=bench prefix=ck/
mkdir -p "$work"
work=$(cd "$work" && pwd)
exec 8>"$work/lock"
flock -n 8 || { echo "bench/s3_headers.sh: $work is in use by another run (set WORK=...)" >&2; exit 1; }

export AWS_REGION=us-east-1   # the key pair comes from scripts/s3-server.sh's env lines below
py=${SLUICE_PYTHON:-$src/.venv/bin/python}   # boto3: the project's Python environment
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE

ck=$work/ck
if [[ ! -d $ck || ! -f $work/ck.shape || $(cat "$work/ck.shape") != "$size $shard" ]]; then
  rm -rf "$ck"
  "$bin/gen-checkpoint" "$ck" --size "$size" --shard-size "$shard" >/dev/null
  echo "$size $shard" > "$work/ck.shape"
fi

s3state=$work/s3-server
exec 7> >(:)   # replaced below by the proxy's stdin: closing it stops the proxy
cleanup() {
  exec 7>&- || true
  SLUICE_S3_STATE_DIR=$s3state bash "$src/scripts/s3-server.sh" stop 8>&- || true
}
trap cleanup EXIT
eval "$(SLUICE_S3_STATE_DIR=$s3state bash "$src/scripts/s3-server.sh" start 8>&-)"
"$py" "$src/bench/upload_checkpoint.py" "$ck" "$bucket" "$prefix" "$SLUICE_S3_ENDPOINT"

# The logging proxy: it exits when its stdin (fd 7 here) closes.
log=$work/requests.jsonl
rm -f "$log"
portfile=$work/proxy.port
rm -f "$portfile"
exec 7> >(node "$src/tests/support/fault_proxy.js" --upstream "$SLUICE_S3_ENDPOINT" --fault none --log "$log" \
            > "$portfile" 8>&-)
for _ in $(seq 100); do grep -q '^PORT ' "$portfile" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/^PORT //p' "$portfile")
[[ -n $port ]] || { echo "bench/s3_headers.sh: the proxy did not start" >&2; exit 1; }

echo "reproduce: bench/s3_headers.sh ${bin#"$src/"} $ranks   (SIZE=$size SHARD=$shard)"
AWS_ENDPOINT_URL=http://127.0.0.1:$port "$bin/sluice-launch" -n "$ranks" --json-out "$work/merged.json" -- \
  "$bin/sluice-load" "s3://$bucket/$prefix" --topology "tp1,dp$ranks,ep$ranks" --offload shared-cooperative \
  --json >/dev/null 8>&-

"$py" - "$log" "$bucket" "$prefix" "$work/merged.json" "$ranks" <<'PY'
import collections, json, sys
log, bucket, prefix, merged, ranks = sys.argv[1:6]
head, get0, data = collections.Counter(), collections.Counter(), collections.Counter()
listings = 0
for line in open(log):
    r = json.loads(line)
    path, _, query = r["path"].partition("?")
    key = path[len("/" + bucket + "/"):] if path.startswith("/" + bucket + "/") else None
    if key is None or not key:
        listings += r["method"] == "GET"
        continue
    if r["method"] == "HEAD": head[key] += 1
    elif r["method"] == "GET" and r["range"].startswith("bytes=0-"): get0[key] += 1
    elif r["method"] == "GET": data[key] += 1
shards = sorted(k for k in set(head) | set(get0) | set(data) if k.endswith(".safetensors"))
index = [k for k in set(head) | set(get0) if k.endswith(".index.json")]
def spread(c, keys):
    v = [c[k] for k in keys]
    return f"{min(v)}..{max(v)} (total {sum(v)})" if v else "-"
m = json.load(open(merged))
per_rank = [r["summary"].get("header_bytes_read", "n/a") if r["summary"] else "n/a" for r in m["ranks"]]
print(f"ranks {ranks}, shards {len(shards)}")
print(f"index:  GETs {spread(get0, index)}, HEADs {spread(head, index)}")
print(f"shards: header GETs (from byte 0) per object {spread(get0, shards)}, HEADs per object {spread(head, shards)}")
print(f"metadata requests in all: {sum(get0.values()) + sum(head.values()) + listings} (listings {listings})")
print(f"data GETs: {sum(data.values())}")
print(f"header_bytes_read per rank: {per_rank}")
PY
