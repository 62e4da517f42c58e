"""One rank of test_compat_runai.py's distributed case, started with torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no LOCAL_WORLD_SIZE, so
the node's ranks can only come from the process group).

argv: checkpoint out_dir
Streams the checkpoint with is_distributed=True through sluice.compat.runai and
through runai-model-streamer (RUNAI_STREAMER_DIST=1: Run:ai's distributed mode
over Gloo), and writes out_dir/rank-N.json: each one's {name: [dtype, shape,
sha256]}, and what sluice read from storage and its staging budget.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import sluice
from conftest import sha256
from sluice.compat import runai as compat

path, out_dir = sys.argv[1:3]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
files = sorted(compat.list_safetensors(path))
loads = []
_iter_weights = sluice.iter_weights


def recording_iter_weights(ck, **kw):  # what the compat layer asked of sluice, and the load's stats
    it = _iter_weights(ck, **kw)
    loads.append((kw, it))
    return it


sluice.iter_weights = recording_iter_weights
result = {"rank": rank, "seconds": {"start": time.perf_counter()}}
try:
    for name, module in (("ours", compat), ("theirs", __import__("runai_model_streamer"))):
        t0 = time.perf_counter()
        with module.SafetensorsStreamer() as s:
            s.stream_files(files, device="cpu", is_distributed=True)
            result[name] = {n: [str(t.dtype), list(t.shape), sha256(t)] for n, t in s.get_tensors()}
        result["seconds"][name] = time.perf_counter() - t0
    result["bytes_read"] = sum(it.stats["bytes_read"] for _, it in loads)
    result["tensor_bytes"] = sum(it.stats["tensor_bytes"] for _, it in loads)
    result["staging"] = sorted({kw["staging"] for kw, _ in loads})
    result["distributed"] = all("world" in kw for kw, _ in loads)
except BaseException as e:  # noqa: B902  (reported to the test)
    result["error"] = f"{type(e).__name__}: {e}"
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
