#!/usr/bin/env python3
"""bench/python_load.py: the Python package against sluice-load and a
safetensors-style loader, page cache hot, same checkpoint, same run.

    PYTHONPATH=build/release/python .venv/bin/python bench/python_load.py [--checkpoint DIR | --size 1GiB] [--repeat 3]

Rows (best of --repeat; the files are read once more right before every timed
run, so each run starts with the checkpoint in the page cache):
  sluice-load             the C++ tool, its own "seconds" (data path: from the first read to the last tensor)
  iter_weights (first load) the same after sluice.release_memory(): fresh staging pool and tensor buffers
  iter_weights            `for name, t in sluice.iter_weights(ck)`: wall time of the loop (zero-copy tensors),
                          reusing what the previous load kept (its staging pool, dropped tensors' buffers),
                          as an engine's reloads do
  mmap+frombuffer.clone   per file: mmap, parse the header, per tensor torch.frombuffer(...).clone() (owned tensors)
  load_into               sluice.load_into(ck, params): preallocated, pre-faulted CPU tensors
  mmap+copy_ into params  the same destinations, filled from mmap views by Tensor.copy_
GiB/s is tensor bytes over seconds (GiB = 2^30 bytes).
"""
import argparse
import datetime
import json
import mmap
import os
import struct
import subprocess
import sys
import time

import torch

import sluice

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("SLUICE_BUILD_DIR", os.path.join(HERE, "..", "build", "release"))


def warm(ck):
    for f in sorted({t.file for t in ck.tensors}):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def safetensors_style(files, into=None):
    """mmap + torch.frombuffer per tensor: .clone() (owned) or copy_ into `into`."""
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        n = struct.unpack("<Q", mm[:8])[0]
        header = json.loads(mm[8:8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            if end == b:
                continue
            src = torch.frombuffer(mm, dtype=torch.uint8, count=end - b, offset=base + b)
            if into is None:
                out[name] = src.clone()
            else:
                into[name].view(-1).view(torch.uint8).copy_(src)
            del src
        # (mm stays open while tensors reference it; it closes when they go)
    return out


def best(fn, ck, repeat):
    times = []
    for _ in range(repeat):
        warm(ck)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a checkpoint directory (default: generate one under .samples/)")
    p.add_argument("--size", default="1GiB", help="size of the generated checkpoint")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--staging", default="1GiB")
    a = p.parse_args()
    path = a.checkpoint
    if not path:
        path = os.path.join(HERE, "..", ".samples", f"python-bench-{a.size}")
        if not os.path.exists(os.path.join(path, "model.safetensors.index.json")):
            subprocess.run([os.path.join(BUILD, "examples", "gen-checkpoint"), path, "--size", a.size], check=True,
                           stdout=subprocess.DEVNULL)
    ck = sluice.open(path)
    gib = ck.tensor_bytes / 2**30
    files = sorted({t.file for t in ck.tensors})

    rows = []
    # sluice-load: its own data-path seconds, best of repeat.
    secs = []
    for _ in range(a.repeat):
        warm(ck)
        out = subprocess.run([os.path.join(BUILD, "examples", "sluice-load"), path, "--json", "--staging", a.staging],
                             check=True, capture_output=True, text=True).stdout
        secs.append(json.loads(out)["seconds"])
    rows.append(("sluice-load", min(secs)))

    def iterate():
        for _name, _t in sluice.iter_weights(ck, staging=a.staging, progress=False):
            pass

    def first_load():
        sluice.release_memory()  # nothing kept from an earlier load: fresh staging and tensor memory
        iterate()
    rows.append(("iter_weights (first load)", best(first_load, ck, a.repeat)))
    rows.append(("iter_weights", best(iterate, ck, a.repeat)))
    rows.append(("mmap+frombuffer.clone", best(lambda: safetensors_style(files), ck, a.repeat)))

    params = {t.name: torch.zeros(sluice.arrival_shape(t.dtype, t.shape), dtype=sluice.as_torch_dtype(t.dtype))
              for t in ck.tensors}  # pre-faulted: an engine's parameters exist before it loads
    rows.append(("load_into", best(lambda: sluice.load_into(ck, params, staging=a.staging), ck, a.repeat)))
    rows.append(("mmap+copy_ into params", best(lambda: safetensors_style(files, params), ck, a.repeat)))

    print(f"# {datetime.date.today()}  {ck.location}: {len(ck)} tensors, {ck.tensor_bytes} bytes ({gib:.3f} GiB), "
          f"hot page cache, best of {a.repeat}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"# PYTHONPATH=build/release/python .venv/bin/python bench/python_load.py --checkpoint {path} "
          f"--repeat {a.repeat} --staging {a.staging}")
    ref = dict(rows)
    for name, s in rows:
        print(f"{name:<26} {s:8.3f} s {gib / s:7.2f} GiB/s")
    print(f"iter_weights / sluice-load          {ref['sluice-load'] / ref['iter_weights']:.2f}x")
    print(f"iter_weights (first load) / sluice-load {ref['sluice-load'] / ref['iter_weights (first load)']:.2f}x")
    print(f"iter_weights / mmap+frombuffer.clone {ref['mmap+frombuffer.clone'] / ref['iter_weights']:.2f}x")
    print(f"load_into / mmap+copy_ into params  {ref['mmap+copy_ into params'] / ref['load_into']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
