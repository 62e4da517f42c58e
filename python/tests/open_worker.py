"""One rank of test_collective_open.py, started with torchrun's environment.

argv: checkpoint out_dir mode [fail_rank]
  mode "load":  a collective sluice.open, then a distributed load of its
                tensors (topology tp1,dpN), each checked against the digests;
  mode "open":  the collective open only (a bad checkpoint);
  fail_rank:    that rank's select callable raises while it opens.
Writes out_dir/rank-N.json: header_bytes_read, the tensors it was sent and
their digests, or the exception it raised (type, message, file, failed_rank).
"""
import json
import os
import sys

import sluice
from conftest import sha256

path, out_dir, mode = sys.argv[1:4]
fail_rank = int(sys.argv[4]) if len(sys.argv) > 4 else -1
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def select(name):
    if rank == fail_rank:
        raise ValueError(f"select refuses {name} on rank {rank}")
    return True


result = {"rank": rank}
try:
    ck = sluice.open(path, select=select, collective=True, timeout=120)
    result["header_bytes_read"] = ck.header_bytes_read
    result["tensors"] = [t.name for t in ck.tensors]
    if mode == "load":
        result["digests"] = {}
        with sluice.iter_weights(ck, topology=f"tp1,dp{world}", staging="16MiB", max_read="1MiB", timeout=120) as it:
            for name, t in it:
                result["digests"][name] = sha256(t)
        result["stats"] = it.stats
except BaseException as e:  # noqa: B902  (reported to the test)
    result["error"] = [type(e).__name__, str(e), getattr(e, "file", None), getattr(e, "failed_rank", None)]
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(result, f)
