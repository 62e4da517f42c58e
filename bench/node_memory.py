#!/usr/bin/env python3
"""Peak node memory of N ranks of one node that hold every tensor they own.

    bench/node_memory.py [--ranks 8] [--repeat 1] [--sample PATH]
    (SLUICE_SAMPLE_SIZE=2GiB by default; the sample is the demo's, made if missing)

Each row runs `sluice-launch -n N -- sluice-load SAMPLE --topology tp1,dpN,epN
--offload shared-cooperative --keep` (every rank holds each tensor it owns
until its load ends: its view, or a copy) and samples, every 20 ms, the Pss of
every rank (/proc/PID/smaps_rollup: a page mapped by k ranks counts 1/k to
each), summing over the ranks; the row's figure is the largest sum seen, the
node's peak. Rows, same checkpoint and options, one run:

  page cache, views   --map-above 1MiB --populate-views on: what a rank keeps and reads or takes
                      itself is a view of the file (shared pages)
  page cache, copies  the default: each rank copies its bytes from the page cache
  node window         --direct: O_DIRECT reads, so local ranks copy through
                      the node window (what an S3 load does)
  Gloo loopback       --exchange-all: every byte a rank keeps but did not read
                      crosses TCP loopback (the behaviour before the node's copy)

Also printed: the bytes the ranks own in all (the sum of their tensors, the
shared tables once), against which each peak is a ratio.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
B = HERE / "build/release/examples"


def children(pid):
    """Every descendant of `pid` (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    for c in f.read().split():
                        out.append(int(c))
                        todo.append(int(c))
        except OSError:
            pass
    return out


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(sample, ranks, extra, work):
    out = Path(work) / "launch.json"
    cmd = [str(B / "sluice-launch"), "-n", str(ranks), "--json-out", str(out), "--",
           str(B / "sluice-load"), str(sample), "--topology", f"tp1,dp{ranks},ep{ranks}",
           "--offload", "shared-cooperative", "--keep", "--no-progress", *extra]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while p.poll() is None:
        loads = [c for c in children(p.pid) if "sluice-load" in _comm(c)]
        peak = max(peak, sum(pss_kib(c) for c in loads))
        time.sleep(0.02)
    err = p.stderr.read()
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    seconds = time.monotonic() - t0
    ranks_json = json.loads(out.read_text())["ranks"]
    return peak * 1024, seconds, [r["summary"] for r in ranks_json]


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="runs per row; the lowest peak is printed")
    ap.add_argument("--sample", type=Path)
    ap.add_argument("--window", help="sluice-load --window SIZE on every row (default: the load's own)")
    a = ap.parse_args()
    size = os.environ.get("SLUICE_SAMPLE_SIZE", "2GiB")
    env = dict(os.environ, CCACHE_BASEDIR=str(HERE), CCACHE_NOHASHDIR="1")
    subprocess.run(["cmake", "--preset", "release"], cwd=HERE, check=True, stdout=subprocess.DEVNULL, env=env)
    subprocess.run(["cmake", "--build", "--preset", "release", "--target", "sluice-load", "sluice-launch", "gen-checkpoint"],
                   cwd=HERE, check=True, stdout=subprocess.DEVNULL, env=env)
    sample = a.sample or HERE / f".samples/deepseek-like-{size}"
    if not (sample / ".complete").exists():
        subprocess.run([str(B / "gen-checkpoint"), str(sample), "--size", size], check=True, stdout=subprocess.DEVNULL)
        (sample / ".complete").touch()
    for f in sample.glob("*.safetensors"):  # hot: the page cache holds the sample for every row
        with open(f, "rb") as h:
            while h.read(64 << 20):
                pass
    # Views mapped in by the load (--populate-views on): the sink keeps them
    # untouched, and a view left to its consumer would hold no page yet.
    rows = [("page cache, views", ["--map-above", "1MiB", "--populate-views", "on"]), ("page cache, copies", []),
            ("node window", ["--direct"]), ("Gloo loopback", ["--exchange-all"])]
    gib = float(1 << 30)
    print(f"# bench/node_memory.py --ranks {a.ranks} --repeat {a.repeat}{' --window ' + a.window if a.window else ''}  ({time.strftime('%Y-%m-%d', time.gmtime())}, "
          f"sample {size}, {os.cpu_count()} cores); Pss summed over the ranks, sampled every 20 ms")
    print(f"{'row':<20} {'peak Pss':>10} {'vs owned':>9} {'vs Gloo':>8} {'seconds':>8}  per rank: received, page cache, node window, views")
    results = []
    with tempfile.TemporaryDirectory() as work:
        for name, extra in rows:
            best = None
            for _ in range(a.repeat):
                r = run(sample, a.ranks, extra + (["--window", a.window] if a.window else []), work)
                if best is None or r[0] < best[0]:
                    best = r
            results.append((name, *best))
    owned = 0
    for s in results[0][3]:
        owned += s["bytes_kept"]
    shared = max(x.get("shared_bytes", 0) for r in results for x in r[3])
    gloo = results[-1][1]
    for name, peak, seconds, s in results:
        per = (f"{max(x['bytes_received'] for x in s) / gib:.2f}, {max(x['page_cache_bytes'] for x in s) / gib:.2f}, "
               f"{max(x['node_copied_bytes'] for x in s) / gib:.2f}, {max(x['mapped_bytes'] for x in s) / gib:.2f} GiB")
        print(f"{name:<20} {peak / gib:>8.2f} G {peak / owned:>8.2f}x {peak / gloo:>7.2f}x {seconds:>8.2f}  {per}")
    print(f"owned by the ranks: {owned / gib:.2f} GiB (each rank's tensors; shared tables {shared / gib:.2f} GiB, once for the "
          f"node: the segment, or views)")


if __name__ == "__main__":
    main()
