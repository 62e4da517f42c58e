#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair,
# 4 ranks each (world 8, tp1,dp8,ep8, shared-cooperative offload), Gloo over
# the veth link, rendezvous through Gloo's Redis store (redis-server in host 1,
# reached by host 2 over the link — no directory both see). Checks:
#   - every rank's digests are tensors of the single-process load, byte for byte,
#     and the 8 ranks together hold every tensor;
#   - each host reads its shared tables once (its ranks' slices add up to the
#     segment), and storage bytes over both hosts = tensor bytes + one more copy
#     of the tables (each host has its own segment);
#   - sluice-launch --nnodes 2 --node-rank K runs the same world.
# Exits 77 (skipped) where namespaces or redis-server are not available.
# Usage: two_hosts.sh SLUICE_LOAD SLUICE_LAUNCH GEN_CHECKPOINT
set -euo pipefail
load=$(realpath "$1") launch=$(realpath "$2") gen=$(realpath "$3")
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v redis-server >/dev/null || skip "redis-server not installed (scripts/setup.sh installs it)"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"

tag=$$
ns1=sluice-h1-$tag ns2=sluice-h2-$tag v1=slv1-$tag v2=slv2-$tag
a1=10.213.0.1 a2=10.213.0.2 port=6390
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill -9 "$p" 2>/dev/null || true; done
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$ns2" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns1" 2>"$work/err" || skip "cannot create a network namespace: $(cat "$work/err")"
ip netns add "$ns2"
ip link add "$v1" type veth peer name "$v2" 2>"$work/err" || skip "cannot create a veth pair: $(cat "$work/err")"
ip link set "$v1" netns "$ns1"
ip link set "$v2" netns "$ns2"
ip -n "$ns1" addr add "$a1/24" dev "$v1"
ip -n "$ns2" addr add "$a2/24" dev "$v2"
for ns in "$ns1" "$ns2"; do ip -n "$ns" link set lo up; done
ip -n "$ns1" link set "$v1" up
ip -n "$ns2" link set "$v2" up

ip netns exec "$ns1" redis-server --port "$port" --bind "$a1" --save "" --appendonly no --protected-mode no \
  --loglevel warning >"$work/redis.log" 2>&1 &
pids+=($!)
disown  # killed at exit, quietly
for _ in $(seq 100); do
  ip netns exec "$ns2" bash -c "exec 3<>/dev/tcp/$a1/$port" 2>/dev/null && break
  sleep 0.1
done
ip netns exec "$ns2" bash -c "exec 3<>/dev/tcp/$a1/$port" 2>/dev/null || { cat "$work/redis.log"; echo "FAIL: host 2 cannot reach the store in host 1"; exit 1; }
# Host 2 cannot see host 1's loopback: the link is the only way between them.
if ip netns exec "$ns2" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then echo "FAIL: namespaces are not isolated"; exit 1; fi

ck="$work/ck"
"$gen" "$ck" --size 48MiB --seed 11 >/dev/null
"$load" "$ck" --digest --no-progress 2>/dev/null | sort >"$work/reference.txt"
[[ -s "$work/reference.txt" ]] || { echo "FAIL: no reference digests"; exit 1; }

# The veth pair's byte counters at both ends (rx and tx), as JSON.
link_bytes() {
  { ip -n "$ns1" -s -j link show "$v1"; ip -n "$ns2" -s -j link show "$v2"; } |
    /usr/bin/python3 -c 'import json, sys; d = [json.loads(l)[0]["stats64"] for l in sys.stdin if l.strip()]; print(json.dumps([[x["rx"]["bytes"], x["tx"]["bytes"]] for x in d]))'
}

# 1. Eight ranks started by hand (digests per rank).
common=(--topology tp1,dp8,ep8 --offload shared-cooperative --no-progress)
link_before=$(link_bytes)
rpids=()
for r in 0 1 2 3 4 5 6 7; do
  if ((r < 4)); then ns=$ns1 addr=$a1; else ns=$ns2 addr=$a2; fi
  ip netns exec "$ns" env RANK=$r WORLD_SIZE=8 LOCAL_RANK=$((r % 4)) LOCAL_WORLD_SIZE=4 \
    SLUICE_STORE="redis://$a1:$port/digests-$tag" SLUICE_GLOO_HOST=$addr SLUICE_COMM_TIMEOUT_MS=60000 \
    "$load" "$ck" "${common[@]}" --digest --json-out "$work/rank$r.json" >"$work/rank$r.txt" 2>"$work/rank$r.err" &
  rpids+=($!)
done
failed=0
for r in 0 1 2 3 4 5 6 7; do
  wait "${rpids[$r]}" || { echo "FAIL: rank $r exited non-zero:"; cat "$work/rank$r.err"; failed=1; }
done
((failed == 0)) || exit 1
link_after=$(link_bytes)
/usr/bin/python3 - "$work" "$link_before" "$link_after" <<'PY'
import json, sys
w = sys.argv[1]
before, after = json.loads(sys.argv[2]), json.loads(sys.argv[3])
ref = set(open(f"{w}/reference.txt").read().splitlines())
held = set()
for r in range(8):
    mine = set(open(f"{w}/rank{r}.txt").read().splitlines())
    bad = mine - ref
    if bad:
        sys.exit(f"FAIL: rank {r} holds {len(bad)} tensors unlike the single-process load, e.g. {sorted(bad)[0]}")
    held |= mine
if held != ref:
    sys.exit(f"FAIL: {len(ref - held)} tensors held by no rank, e.g. {sorted(ref - held)[0]}")
js = [json.load(open(f"{w}/rank{r}.json")) for r in range(8)]
seg = js[0]["shared_bytes"]
tables = []
for host, ranks in ((1, range(0, 4)), (2, range(4, 8))):
    written = sum(js[r]["shared_bytes_written"] for r in ranks)
    if not 0 < written <= seg:
        sys.exit(f"FAIL: host {host}'s ranks wrote {written} bytes into a {seg}-byte segment")
    tables.append(written)
if tables[0] != tables[1]:
    sys.exit(f"FAIL: the hosts wrote {tables[0]} and {tables[1]} table bytes (each host reads every table once)")
import os, struct
ck = f"{w}/ck"
tensor_bytes = 0
for f in os.listdir(ck):
    if f.endswith(".safetensors"):
        p = os.path.join(ck, f)
        n = struct.unpack("<Q", open(p, "rb").read(8))[0]
        tensor_bytes += os.path.getsize(p) - 8 - n
total = sum(j["bytes_read"] for j in js)
if total != tensor_bytes + tables[1]:
    sys.exit(f"FAIL: {total} bytes read in all; expected {tensor_bytes} tensor bytes + {tables[1]} (host 2's copy of the tables)")
print(f"ok: 8 ranks on 2 hosts hold {len(held)} tensors, digests equal the single-process load; "
      f"each host read its {tables[0]} table bytes once; {total} bytes read in all = tensors + one more copy of the tables")
# The link carries what crosses between the hosts and nothing a host's ranks share: within a host
# they read what they keep from its page cache (local files), so every byte a rank received came
# over the veth pair. Both ends must count the same bytes (host 1's tx is host 2's rx).
(rx1, tx1), (rx2, tx2) = [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]
if abs(tx1 - rx2) > 64 << 10 or abs(tx2 - rx1) > 64 << 10:
    sys.exit(f"FAIL: the veth ends disagree: host 1 sent {tx1}, host 2 got {rx2}; host 2 sent {tx2}, host 1 got {rx1}")
link = tx1 + tx2
received = sum(j["bytes_received"] for j in js)
taken = sum(j["page_cache_bytes"] for j in js)
if received == 0 or taken == 0:
    sys.exit(f"FAIL: received {received}, taken from the page cache {taken}: expected both across 2 hosts of 4 ranks")
# Each byte crosses to a host at most once (to one relay rank there, whose host's other ranks
# copy it from their node window): with two hosts, what crossed is at most the tensor bytes.
relayed = sum(j["node_copied_bytes"] for j in js)
if received > tensor_bytes or relayed == 0:
    sys.exit(f"FAIL: {received} bytes received across the hosts for {tensor_bytes} tensor bytes "
             f"(each at most once per host), {relayed} copied from the node windows")
# Overhead: TCP/IP and Ethernet headers (at most ~5 % at the veth's 1500-byte MTU), the store
# (Redis), the peer watch and the status exchanges (bounded by a few MiB for this load).
if not received <= link <= received * 1.10 + (8 << 20):
    sys.exit(f"FAIL: {link} bytes crossed the link for {received} tensor bytes received across the hosts")
print(f"ok: the link carried {link} bytes for {received} tensor bytes received across the hosts "
      f"({link / received:.3f}x; at most once per host: {tensor_bytes} tensor bytes); {taken} bytes a host's ranks "
      f"took from its page cache and {relayed} they copied from their node window never crossed it")
PY

# 2. The same world through sluice-launch --nnodes 2 --node-rank K (one launcher per host).
for k in 0 1; do
  if ((k == 0)); then ns=$ns1 addr=$a1; else ns=$ns2 addr=$a2; fi
  ip netns exec "$ns" "$launch" -n 4 --nnodes 2 --node-rank $k --store "redis://$a1:$port/launch-$tag" --host $addr \
    --timeout 60 --json-out "$work/launch$k.json" -- "$load" "$ck" "${common[@]}" >"$work/launch$k.out" 2>&1 &
  rpids[$k]=$!
done
for k in 0 1; do
  wait "${rpids[$k]}" || { echo "FAIL: sluice-launch on host $((k + 1)) failed:"; cat "$work/launch$k.out"; exit 1; }
done
/usr/bin/python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
ranks = []
for k in (0, 1):
    j = json.load(open(f"{w}/launch{k}.json"))
    if j["world_size"] != 8:
        sys.exit(f"FAIL: host {k + 1}'s launcher reports a world of {j['world_size']}")
    ranks += [r["rank"] for r in j["ranks"]]
    for r in j["ranks"]:
        if r["exit"] != 0 or r["summary"]["world_size"] != 8:
            sys.exit(f"FAIL: rank {r['rank']}: exit {r['exit']}")
if sorted(ranks) != list(range(8)):
    sys.exit(f"FAIL: launchers ran ranks {sorted(ranks)}")
print("ok: sluice-launch --nnodes 2 ran ranks 0-3 on host 1 and 4-7 on host 2")
PY
echo "two hosts: passed"
