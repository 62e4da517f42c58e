#!/usr/bin/env bash
# sluice-load smoke tests on a generated checkpoint:
#  - --digest equals the generator's own digests (sorted by name), also with
#    page-cache views mapped in ahead or not (--populate-views on/off);
#  - --json reports bytes_read == the checkpoint's tensor bytes, and a load of a
#    checkpoint 4x the staging budget stays within it (slots_used * slot_size);
#  - --probe reads headers only (bytes_read 0) and --contract-out writes JSON;
#    with --topology it plans every byte to exactly one reader rank;
#  - a bad checkpoint gives a non-zero exit and one `sluice: error:` line;
#  - --device: the digests copied back from the GPU (with one), or one clear
#    error line (without).
# Usage: check_load.sh SLUICE_LOAD CKPT DIGESTS BAD_DIR
set -euo pipefail
load=$1 ck=$2 digests=$3 bad=$4
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

"$load" "$ck" --digest --no-progress > "$work/d.txt" 2>/dev/null
sort "$digests" | cmp -s - "$work/d.txt" || { echo "FAIL: --digest differs from the generator's digests"; diff <(sort "$digests") "$work/d.txt" | head; exit 1; }
echo "ok: $(wc -l < "$work/d.txt") digests equal the generator's"
# Views of the page cache, their pages mapped in ahead or left to the digest's touches: the same bytes.
for p in on off; do
  "$load" "$ck" --buffered --map-above 64KiB --populate-views $p --digest --no-progress > "$work/v.txt" 2>/dev/null
  sort "$digests" | cmp -s - "$work/v.txt" || { echo "FAIL: --populate-views $p --digest differs"; diff <(sort "$digests") "$work/v.txt" | head; exit 1; }
done
if "$load" "$ck" --map-above 64KiB --populate-views sometimes --no-progress > /dev/null 2> "$work/err.txt"; then echo "FAIL: --populate-views sometimes accepted"; exit 1; fi
[[ $(wc -l < "$work/err.txt") -eq 1 ]] && grep -q "^sluice: error: --populate-views 'sometimes': expected auto, on or off" "$work/err.txt" || { echo "FAIL: --populate-views sometimes error output:"; cat "$work/err.txt"; exit 1; }
echo "ok: --populate-views on and off give the generator's digests; $(head -1 "$work/err.txt" | cut -c1-90)"

"$load" "$ck" --json --staging 768KiB --max-read 128KiB > "$work/s.json"
/usr/bin/python3 - "$work/s.json" "$ck" <<'PY'
import json, os, struct, sys
s = json.load(open(sys.argv[1])); d = sys.argv[2]
total = 0
for f in os.listdir(d):
    if f.endswith(".safetensors"):
        b = open(os.path.join(d, f), "rb").read(8); n = struct.unpack("<Q", b)[0]
        total += os.path.getsize(os.path.join(d, f)) - 8 - n
assert s["bytes_read"] == total == s["tensor_bytes"], (s["bytes_read"], total)
assert total >= 4 * s["staging"]["budget"], (total, s["staging"])
st = s["staging"]; assert st["slots_used"] * st["slot_size"] <= st["budget"], st
print("ok: bytes_read", total, "within a", st["budget"], "byte budget,", st["slots_used"], "slots used")
PY

"$load" "$ck" --probe --contract-out "$work/contract.json" --json-out "$work/p.json" > "$work/plan.txt"
grep -q "tensor bytes read 0" "$work/plan.txt" || { echo "FAIL: probe plan:"; cat "$work/plan.txt"; exit 1; }
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); c=json.load(open(sys.argv[2])); assert p['bytes_read']==0 and p['keys']>0, p; assert all(k['source'] for l in c['layers'] for k in l['keys']), 'contract key without a source'; print('ok: probe read', p['header_bytes_read'], 'header bytes, 0 tensor bytes;', p['keys'], 'contract keys')" "$work/p.json" "$work/contract.json"

"$load" "$ck" --probe --topology tp1,dp4,ep4 --offload shared-cooperative --json > "$work/pt.json"
/usr/bin/python3 - "$work/pt.json" "$work/s.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
by_rank = {}
for l in p["layers"]:
    for r, b in l["read_bytes_by_rank"].items(): by_rank[r] = by_rank.get(r, 0) + b
assert sum(by_rank.values()) == s["bytes_read"], (by_rank, s["bytes_read"])
assert p["bytes_read"] == 0 and sorted(by_rank) == ["0", "1", "2", "3"], p
print("ok: probe under tp1,dp4,ep4 plans", sum(by_rank.values()), "bytes over readers", by_rank)
PY

# Round-robin expert placement: reported in the plan's JSON; an unknown placement is one error line naming it.
"$load" "$ck" --probe --topology tp1,dp4,ep4 --expert-placement round_robin --json > "$work/rr.json"
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['expert_placement']=='round_robin', p.get('expert_placement'); print('ok: probe under round_robin placement')" "$work/rr.json"
if "$load" "$ck" --probe --topology tp1,dp4,ep4 --expert-placement random > /dev/null 2> "$work/err.txt"; then echo "FAIL: --expert-placement random accepted"; exit 1; fi
[[ $(wc -l < "$work/err.txt") -eq 1 ]] && grep -q "^sluice: error: expert placement 'random': expected linear or round_robin" "$work/err.txt" \
  || { echo "FAIL: --expert-placement random error output:"; cat "$work/err.txt"; exit 1; }

# A TP that does not divide the tensors it splits is an error naming them, or an explicit choice.
if "$load" "$ck" --probe --topology tp5,dp1,ep1 > /dev/null 2> "$work/err.txt"; then echo "FAIL: tp5 planned silently"; exit 1; fi
[[ $(wc -l < "$work/err.txt") -eq 1 ]] && grep -q "^sluice: error: plan: TP=5 does not divide the split dimension of [0-9]* tensors* ('model\." "$work/err.txt" \
  || { echo "FAIL: tp5 error output:"; cat "$work/err.txt"; exit 1; }
"$load" "$ck" --probe --topology tp5,dp1,ep1 --uneven keep-whole > /dev/null || { echo "FAIL: --uneven keep-whole refused"; exit 1; }
echo "ok: tp5 refused ($(cut -c1-80 "$work/err.txt")...), accepted with --uneven keep-whole"

if "$load" "$bad/truncated-after-header.safetensors" --no-progress 2> "$work/err.txt"; then echo "FAIL: bad input loaded"; exit 1; fi
[[ $(wc -l < "$work/err.txt") -eq 1 ]] && grep -q "^sluice: error: data-end: .*truncated-after-header.safetensors" "$work/err.txt" \
  || { echo "FAIL: error output:"; cat "$work/err.txt"; exit 1; }
echo "ok: $(cat "$work/err.txt")"
# --device: one GPU per rank, device tensors through the NCCL lane into device
# memory. With a GPU, --digest (copied back) equals the generator's digests;
# without one, every rank fails at once with one error line naming the call.
if "$load" "$ck" --device --no-progress 2> "$work/err.txt"; then echo "FAIL: --device without --topology loaded"; exit 1; fi
grep -q "^sluice: error: --device needs --topology" "$work/err.txt" || { echo "FAIL: error output:"; cat "$work/err.txt"; exit 1; }
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  "$load" "$ck" --topology tp1,dp1,ep1 --offload per-rank --device --digest --no-progress > "$work/dd.txt" 2>"$work/err.txt" \
    || { echo "FAIL: --device load:"; cat "$work/err.txt"; exit 1; }
  sort "$digests" | cmp -s - "$work/dd.txt" || { echo "FAIL: --device --digest differs"; diff <(sort "$digests") "$work/dd.txt" | head; exit 1; }
  echo "ok: --device: $(wc -l < "$work/dd.txt") tensors copied back from the GPU equal the generator's"
else
  if "$load" "$ck" --topology tp1,dp1,ep1 --device --no-progress 2> "$work/err.txt"; then echo "FAIL: --device loaded without a GPU"; exit 1; fi
  [[ $(wc -l < "$work/err.txt") -eq 1 ]] && grep -q "^sluice: error: .*\(cudaSetDevice failed\|without the nccl component\)" "$work/err.txt" \
    || { echo "FAIL: --device error output:"; cat "$work/err.txt"; exit 1; }
  echo "ok: no GPU: $(cat "$work/err.txt")"
fi
# --index FILE: a local index opens the checkpoint through it (here: the tensors
# of the index's last shard only); a shard the location lacks is one error line.
/usr/bin/python3 - "$ck" "$work" <<'PY'
import json, os, sys
ck, work = sys.argv[1:3]
ix = json.load(open(os.path.join(ck, "model.safetensors.index.json")))
last = sorted(set(ix["weight_map"].values()))[-1]
sub = {t: s for t, s in ix["weight_map"].items() if s == last}
json.dump({"weight_map": sub}, open(os.path.join(work, "sub.index.json"), "w"))
json.dump({"weight_map": {next(iter(sub)): "model-99999-of-99999.safetensors"}}, open(os.path.join(work, "gone.index.json"), "w"))
open(os.path.join(work, "sub.count"), "w").write(str(len(sub)))
PY
"$load" "$ck" --index "$work/sub.index.json" --digest --no-progress > "$work/sub.txt" || { echo "FAIL: --index load"; exit 1; }
[[ $(wc -l < "$work/sub.txt") -eq $(cat "$work/sub.count") ]] || { echo "FAIL: --index loaded $(wc -l < "$work/sub.txt") tensors, want $(cat "$work/sub.count")"; exit 1; }
if "$load" "$ck" --index "$work/gone.index.json" --no-progress 2> "$work/err.txt"; then echo "FAIL: --index with a missing shard loaded"; exit 1; fi
[[ $(wc -l < "$work/err.txt") -eq 1 ]] && grep -q "^sluice: error: missing-shard: .*model-99999-of-99999.safetensors" "$work/err.txt" \
  || { echo "FAIL: --index error output:"; cat "$work/err.txt"; exit 1; }
echo "ok: --index: $(cat "$work/sub.count") tensors of one shard; $(cut -c1-90 "$work/err.txt")..."
echo "sluice-load checks: passed"
