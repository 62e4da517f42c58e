#!/usr/bin/env python3
"""bench/stream_memory.py: what iter_weights keeps resident, against its budget.

    PYTHONPATH=build/release/python .venv/bin/python bench/stream_memory.py --checkpoint .samples/deepseek-like-2GiB \\
        [--staging 64MiB,1GiB,4GiB] [--repeat 1]

Each row is a fresh process (so the first touch of fresh memory is in it, as
in an engine's first load): it imports torch and sluice, opens the checkpoint,
reads its files once (page cache hot), takes its resident set as the baseline,
then runs `for name, t in sluice.iter_weights(ck, staging=S): del t` (every
tensor dropped at once) and reports
  peak - baseline   peak RSS (getrusage) minus the baseline, MiB
  bound             max(budget, largest tensor) + 64 MiB, the bound the stream keeps (MiB)
  copied out        tensors copied out of their staging slot
  own               tensors read into a buffer of their own (larger than a slot)
  GiB/s             tensor bytes over the loop's wall time (hot cache, fresh process: noisy)
"""
import argparse
import json
import os
import resource
import subprocess
import sys

MiB = 1 << 20


def child(path, staging):
    import time
    import torch  # noqa: F401  (the baseline is a process with torch loaded)
    import sluice
    ck = sluice.open(path)
    for f in sorted({t.file for t in ck.tensors}):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    with open("/proc/self/statm") as fh:
        baseline = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    t0 = time.perf_counter()
    it = sluice.iter_weights(ck, staging=staging, progress=False)
    for name, t in it:
        del t
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    st = it.stats
    print(json.dumps({"staging": staging, "budget": sluice.parse_size(staging), "baseline": baseline, "peak": peak,
                      "largest": max(t.nbytes for t in ck.tensors), "tensors": len(ck.tensors),
                      "copied_out": st.get("copied_out"), "own": st.get("own_tensors"),
                      "gib_per_s": ck.tensor_bytes / seconds / (1 << 30), "plan": st.get("stream")}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--staging", default="64MiB,1GiB,4GiB")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.checkpoint, a.child)
    print(f"# {' '.join(sys.argv)}")
    print(f"{'staging':>8} {'peak-base MiB':>14} {'bound MiB':>10} {'copied out':>10} {'own':>5} {'GiB/s':>6}")
    for s in a.staging.split(","):
        for _ in range(a.repeat):
            out = subprocess.run([sys.executable, __file__, "--checkpoint", a.checkpoint, "--child", s], check=True,
                                 capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            bound = max(r["budget"], r["largest"]) + 64 * MiB
            print(f"{s:>8} {(r['peak'] - r['baseline']) / MiB:14.0f} {bound / MiB:10.0f} {r['copied_out']!s:>10} "
                  f"{r['own']!s:>5} {r['gib_per_s']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
