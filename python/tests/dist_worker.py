"""One rank of test_distributed.py, started with torchrun's environment.

argv: checkpoint digests out_dir topology offload [fail_rank]
Writes out_dir/rank-N.json: the call sequence, what each call was, and the stats
(or the exception it raised).
"""
import json
import os
import sys

import torch

import sluice
from conftest import sha256

path, digests_path, out_dir, topology, offload = sys.argv[1:6]
fail_rank = int(sys.argv[6]) if len(sys.argv) > 6 else -1
rank = int(os.environ["RANK"])
digests = {}
with open(digests_path) as f:
    for line in f:
        n, d, s, h = line.rstrip("\n").split("\t")
        digests[n] = h

result = {"rank": rank, "calls": [], "kinds": {}, "wrong": [], "shared_ptrs": {}, "parts": {}}
try:
    ck = sluice.open(path)
    rec = sluice.Recorder(lambda name, t: None)  # a loader that cannot decline
    with sluice.iter_weights(ck, topology=topology, offload=offload, staging="64MiB", timeout=300) as it:
        for name, t in it:
            if rank == fail_rank and len(result["calls"]) == 5:
                raise ValueError(f"boom on rank {rank}")
            result["calls"].append(name)
            rec(name, t)
            kind = t.sluice_kind
            result["kinds"][name] = [kind, t.device.type, str(t.dtype), list(t.shape), getattr(t, "sluice_part", None)]
            info = ck[name]
            part = getattr(t, "sluice_part", None)
            shape = sluice.arrival_shape(info.dtype, info.shape)
            if part is not None:  # a TP part: checked by the test against the slice of the whole tensor
                shape[part[0]] //= part[2]
                result["parts"][name] = [list(part), sha256(t)]
            if list(t.shape) != shape or t.dtype != sluice.as_torch_dtype(info.dtype, info.shape):
                result["wrong"].append([name, "dtype or shape"])
            if part is None and kind in ("bytes", "shared"):
                if t.device.type != "cpu" or sha256(t) != digests[name]:
                    result["wrong"].append([name, kind])
                if kind == "shared":
                    result["shared_ptrs"][name] = t.data_ptr()
            if kind == "placeholder":
                if t.device.type != "meta":
                    result["wrong"].append([name, "placeholder not meta"])
    result["stats"] = it.stats
    result["recorded"] = sorted({a[0] for a in rec.applications()})
except BaseException as e:  # noqa: B902  (reported to the test)
    result["error"] = [type(e).__name__, str(e), getattr(e, "failed_rank", None)]
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(result, f)
