#!/usr/bin/env python3
"""Load a checkpoint through sluice into torch tensors and print the load's summary.

    PYTHONPATH=build/release/python .venv/bin/python examples/python/load.py .samples/deepseek-2GiB --staging 1GiB
    # as one of N ranks (torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...):
    ... load.py CKPT --topology tp1,dp8,ep8 --offload shared-cooperative
"""
import argparse
import json
import sys

import sluice


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", help="checkpoint directory, .safetensors file or s3://bucket/prefix/")
    p.add_argument("--staging", default="4GiB", help="staging budget (default 4GiB)")
    p.add_argument("--max-read", default="32MiB")
    p.add_argument("--select", help="regular expression: load the tensors whose names it matches")
    p.add_argument("--topology", help="distributed: e.g. tp1,dp8,ep8 (ranks from torchrun's environment)")
    p.add_argument("--offload", default="none", help="none|per-rank|shared-single|shared-cooperative")
    p.add_argument("--json", action="store_true", help="print the stats as JSON (the names of sluice-load --json)")
    a = p.parse_args()

    ck = sluice.open(a.source, select=a.select)
    by_kind = {}
    with sluice.iter_weights(ck, staging=a.staging, max_read=a.max_read, topology=a.topology, offload=a.offload) as it:
        for name, tensor in it:  # a zero-copy torch.Tensor that owns its bytes (a meta tensor if another rank owns it)
            by_kind[tensor.sluice_kind] = by_kind.get(tensor.sluice_kind, 0) + 1
    st = it.stats
    if a.json:
        print(json.dumps(st, indent=2))
    else:
        print(f"{ck.location}: {st['tensors']} tensors {by_kind}, {st['bytes_read'] / 2**30:.3f} GiB read "
              f"in {st['seconds']:.3f} s ({st['gib_per_s']:.2f} GiB/s)", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except sluice.Error as e:
        print(f"sluice: error: {e}", file=sys.stderr)
        sys.exit(1)
