#!/usr/bin/env python3
"""Opening a checkpoint whose one header lists many tensors: sluice against HF
safetensors, side by side (issue 40: "a header of a million tensors parses
in seconds in Release").

  PYTHONPATH=build/release/python .venv/bin/python bench/header_parse.py [--tensors 1000000] [--repeat 3]
  ... bench/header_parse.py --tensors 91000 --shards 163    (a sharded checkpoint: the index too)

Writes one file whose header lists N one-byte tensors (about 70 bytes of JSON
each), hot in the page cache, then times, best of --repeat, in this process:
  sluice.open(path)                      header read, parsed, validated (layout, sizes,
                                         duplicates, caps), tensor list built
  safetensors.safe_open(path, "pt").keys()   HF's reference reader (Rust), the same work
and prints both and the ratio. A count above sluice's default cap (2**20)
is opened with limits={"max_tensors": N, "max_header_bytes": ...} (past
the reference's 100 MB, which HF safetensors enforces too: its row fails).

With --shards S the N tensors are spread over S shard files, named as a
DeepSeek-class MoE's (model.layers.L.mlp.experts.E.down_proj.weight), with a
model.safetensors.index.json listing them all, and the rows are:
  sluice.open(dir)                       the index and every header read, parsed and
                                         validated against each other
  json.load(index) + safe_open(shard).keys() per shard   what a transformers-style
                                         reader does to list a sharded checkpoint (no
                                         cross-check)
"""
import argparse
import json
import os
import struct
import tempfile
import time


def write(path, n):
    parts = ['"t%07d":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}' % (i, i, i + 1) for i in range(n)]
    raw = ("{" + ",".join(parts) + "}").encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(b"\0" * n)
    return len(raw)


def write_sharded(d, n, shards):
    """S shards of n tensors in all (one byte each) and their index; returns the index's bytes."""
    names = [f"model.layers.{i // 256}.mlp.experts.{i % 256}.down_proj.weight" for i in range(n)]
    weight_map = {}
    for k in range(shards):
        part = names[k * n // shards:(k + 1) * n // shards]
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        hdr = {name: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, name in enumerate(part)}
        raw = json.dumps(hdr, separators=(",", ":")).encode()
        with open(os.path.join(d, shard), "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.write(b"\0" * len(part))
        weight_map.update((name, shard) for name in part)
    index = json.dumps({"metadata": {"total_size": n}, "weight_map": weight_map}, indent=2).encode()
    with open(os.path.join(d, "model.safetensors.index.json"), "wb") as f:
        f.write(index)
    return len(index)


def sharded(a, d):
    import safetensors
    import sluice
    index_bytes = write_sharded(d, a.tensors, a.shards)
    files = sorted(os.listdir(d))
    for name in files:   # hot: the timed reads come from the page cache
        with open(os.path.join(d, name), "rb") as f:
            f.read()

    def with_sluice():
        assert len(sluice.open(d)) == a.tensors

    def with_hf():
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            wm = json.load(f)["weight_map"]
        n = 0
        for shard in sorted(set(wm.values())):
            with safetensors.safe_open(os.path.join(d, shard), "pt") as f:
                n += len(f.keys())
        assert n == a.tensors

    s, st = best(with_sluice, a.repeat)
    h, ht = best(with_hf, a.repeat)
    print(f"# bench/header_parse.py --tensors {a.tensors} --shards {a.shards} --repeat {a.repeat}")
    print(f"# {a.shards} shards, {a.tensors} tensors, index {index_bytes / 1e6:.1f} MB; best of {a.repeat}, hot")
    print(f"sluice.open(dir)                    {s:8.3f} s   (runs: {' '.join(f'{x:.3f}' for x in st)})")
    print(f"json.load(index) + safe_open keys   {h:8.3f} s   (runs: {' '.join(f'{x:.3f}' for x in ht)})")
    print(f"ratio (HF time / sluice time)       {h / s:8.2f}x")
    for name in files:
        os.unlink(os.path.join(d, name))


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shards", type=int, default=1, help="spread the tensors over this many shards, with an index")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    import safetensors
    import sluice
    d = a.dir or tempfile.mkdtemp(prefix="sluice-header-")
    if a.shards > 1:
        sharded(a, d)
        if not a.dir:
            os.rmdir(d)
        return
    path = os.path.join(d, "model.safetensors")
    json_bytes = write(path, a.tensors)
    with open(path, "rb") as f:   # hot: the timed reads come from the page cache
        while f.read(1 << 24):
            pass
    limits = {"max_tensors": a.tensors, "max_header_bytes": json_bytes} if a.tensors > 1 << 20 else None

    def with_sluice():
        ck = sluice.open(path, limits=limits)
        assert len(ck) == a.tensors, len(ck)

    def with_hf():
        with safetensors.safe_open(path, "pt") as f:
            assert len(f.keys()) == a.tensors

    s, st = best(with_sluice, a.repeat)
    try:
        h, ht = best(with_hf, a.repeat)
    except Exception as e:   # HF's own limit (100 MB of header)
        h, ht = float("nan"), []
        print(f"# safetensors: {type(e).__name__}: {str(e)[:160]}")
    print(f"# {' '.join(['bench/header_parse.py', '--tensors', str(a.tensors), '--repeat', str(a.repeat)])}")
    print(f"# one header: {a.tensors} tensors, {json_bytes / 1e6:.1f} MB of JSON; best of {a.repeat}, hot")
    print(f"sluice.open                         {s:8.3f} s   (runs: {' '.join(f'{x:.3f}' for x in st)})")
    print(f"safetensors.safe_open(...).keys()   {h:8.3f} s   (runs: {' '.join(f'{x:.3f}' for x in ht)})")
    print(f"ratio (HF time / sluice time)       {h / s:8.2f}x")
    os.unlink(path)
    if not a.dir:
        os.rmdir(d)


if __name__ == "__main__":
    main()
