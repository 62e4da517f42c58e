#!/usr/bin/env python3
"""bench/fresh_destinations.py: what filling freshly allocated parameters costs,
outside vLLM: sluice.load_into against safe_open + copy_, each load in a fresh
process into fresh `torch.empty` destinations (as an engine's parameters are
before its first load), page cache hot.

    PYTHONPATH=build/py/lib/python3.11/site-packages .venv/bin/python bench/fresh_destinations.py \\
        [--checkpoint .samples/vllm-llama-2GiB] [--repeat 2]

`sluice.load_into` faults its destinations in on a second thread while it
reads (its default, `prefault=True`); `prefault=False` leaves the first touch
to the reads alone. The `+ populate` variants first fault the destinations in with
madvise(MADV_POPULATE_WRITE), timed on its own, so that the load that follows
writes into memory already mapped: the two columns split a load into the
first touch of its destinations and the rest.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MADV_POPULATE_WRITE = 23


def worker(spec):
    import torch
    torch.set_num_threads(2)
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(spec["checkpoint"], "*.safetensors")))
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    dst = {}
    for f in files:
        with safe_open(f, framework="pt") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                dst[k] = torch.empty(sl.get_shape(), dtype=dtypes[sl.get_dtype()])
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru.ru_utime + ru.ru_stime  # CPU of every thread of the process, io_uring's workers included
    t0 = time.perf_counter()
    populate = None
    if spec.get("populate"):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        page = os.sysconf("SC_PAGE_SIZE")
        for t in dst.values():
            a, n = t.data_ptr(), t.numel() * t.element_size()
            b, e = a // page * page, (a + n + page - 1) // page * page
            if libc.madvise(b, e - b, MADV_POPULATE_WRITE) != 0:
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
        populate = time.perf_counter() - t0
    t1 = time.perf_counter()
    if spec["how"] == "safetensors":
        for f in files:
            with safe_open(f, framework="pt") as h:
                for k in h.keys():
                    dst[k].copy_(h.get_tensor(k))
    else:
        import sluice
        sluice.load_into(sluice.open(spec["checkpoint"]), dst, **spec.get("kw", {}))
    load = time.perf_counter() - t1
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"populate": populate, "load": load, "minflt": ru.ru_minflt,
                      "cpu": ru.ru_utime + ru.ru_stime - cpu0}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=os.path.join(ROOT, ".samples", "vllm-llama-2GiB"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--worker")
    a = ap.parse_args()
    if a.worker:
        return worker(json.loads(a.worker))
    files = sorted(glob.glob(os.path.join(a.checkpoint, "*.safetensors")))
    if not files:
        raise SystemExit(f"bench/fresh_destinations.py: no .safetensors in {a.checkpoint} "
                         "(bench/vllm_load.py --size 2GiB writes .samples/vllm-llama-2GiB)")
    gib = sum(os.path.getsize(f) for f in files) / 2**30
    variants = [("safe_open + copy_", dict(how="safetensors")),
                ("sluice.load_into", dict(how="sluice")),
                ("sluice.load_into prefault=False", dict(how="sluice", kw={"prefault": False})),
                ("sluice.load_into threads 2, qd 8", dict(how="sluice", kw={"threads": 2, "queue_depth": 8})),
                ("safe_open + copy_ + populate", dict(how="safetensors", populate=True)),
                ("sluice.load_into + populate", dict(how="sluice", populate=True))]
    print(f"# {' '.join(sys.argv)}\n# {a.checkpoint}: {gib:.2f} GiB in {len(files)} files, page cache hot, "
          f"fresh process per load, load average {os.getloadavg()[0]:.1f}")
    rows = {name: [] for name, _ in variants}
    for _ in range(a.repeat):
        for name, spec in variants:  # turns within each repeat
            for f in files:
                with open(f, "rb") as h:
                    while h.read(64 << 20):
                        pass
            p = subprocess.run([sys.executable, __file__, "--worker", json.dumps(dict(spec, checkpoint=a.checkpoint))],
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"{name}: {p.stderr[-2000:]}")
            rows[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(f"\n{'':34} {'populate s':>18} {'load s':>18} {'CPU s':>12} {'minor faults':>12}")
    for name, rs in rows.items():
        pop = [r["populate"] for r in rs if r["populate"] is not None]
        load = [r["load"] for r in rs]
        pcol = f"{min(pop):.2f}-{max(pop):.2f}" if pop else "-"
        lcol = f"{min(load):.2f}-{max(load):.2f}"
        cpu = [r["cpu"] for r in rs]
        ccol = f"{min(cpu):.2f}-{max(cpu):.2f}"
        print(f"{name:34} {pcol:>18} {lcol:>18} {ccol:>12} {rs[0]['minflt']:12d}")


if __name__ == "__main__":
    sys.exit(main())
