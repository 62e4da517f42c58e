#!/usr/bin/env python3
"""bench/sitting.py: the same benchmarks against two builds of sluice, alternated
in one sitting, with each figure's median and range per build.

    .venv/bin/python bench/sitting.py --before ../wt-before --after . --runs 5

A restructure is judged by this (issue 27): an "after" median outside the
"before" range is flagged, to be fixed or explained. Each tree named by
--before/--after needs `build/release` (bench-local, bench-distributed,
bench-s3, gen-checkpoint and the Python extension in build/release/python) and,
for the vllm and peers benches, the package installed with
`pip install --prefix build/py .`. The benchmark programs themselves (this
tree's bench/*.py and bench/s3.sh) are the same for both builds: only the
library under them differs. Runs go before, after, after, before, ... so that
a drift of the machine during the sitting falls on both sides alike.

Sizes are smaller than each benchmark's recorded run (named below), so that
5 + 5 runs of all six fit in well under an hour on two cores; the figures are
for the comparison, not for the benchmark's own table. Cold rows drop the page
cache (root).
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")
SITE = "build/py/lib/python3.11/site-packages"


def benches(work):
    """name -> (command builder(tree), env builder(tree), [(figure, regex, unit)])"""
    num = r"([0-9]+\.[0-9]+)"
    return {
        "local": (lambda t: [f"{t}/build/release/bench/bench-local", f"{work}/local-ck", "--size", "1GiB", "--repeat", "1"],
                  lambda t: {},
                  [("hot into one buffer", r"sluice \(buffered, io_uring\)\s+" + num, "GiB/s"),
                   ("hot into place", r"sluice \(host sink, caller buffers\)\s+" + num, "GiB/s"),
                   ("cold O_DIRECT", r"sluice \(O_DIRECT, io_uring\)\s+" + num, "GiB/s")]),
        "distributed": (lambda t: [f"{t}/build/release/bench/bench-distributed", "--size", "268435456", "--ranks", "4",
                                   "--window", "128", "--repeat", "1"],
                        lambda t: {},
                        [("4 ranks load", r"\|\s*4\s*\|\s*serial\s*\|\s*" + num, "s"),
                         ("4 ranks reload", r"\|\s*4\s*\|\s*serial(?:\s*\|[^|]*){6}\|\s*" + num, "s")]),
        "s3": (lambda t: ["bash", f"{ROOT}/bench/s3.sh", f"{t}/build/release", "--streams", "16", "--part", "16MiB",
                          "--repeat", "1"],
               lambda t: {"SIZE": "512MiB", "WORK": f"{work}/s3-{os.path.basename(os.path.abspath(t))}"},
               [("nginx 16 streams", r"nginx \(http[^\n]*\n[^\n]*\n\s*16\s+16\.00 MiB\s+" + num, "GiB/s")]),
        "python": (lambda t: [PY, f"{ROOT}/bench/python_load.py", "--size", "1GiB", "--repeat", "3", "--staging", "1GiB"],
                   lambda t: {"PYTHONPATH": f"{t}/build/release/python", "SLUICE_BUILD_DIR": f"{t}/build/release"},
                   [("iter_weights", r"\niter_weights\s+[0-9.]+ s\s+" + num, "GiB/s"),
                    ("load_into", r"\nload_into\s+[0-9.]+ s\s+" + num, "GiB/s")]),
        "vllm": (lambda t: [PY, f"{ROOT}/bench/vllm_load.py", "--size", "2GiB", "--repeat", "1", "--no-cold",
                            "--formats", "sluice"],
                 lambda t: {"PYTHONPATH": f"{t}/{SITE}"},
                 [("hot load_weights", r"\nhot\s+sluice\s+" + num, "s")]),
        "peers": (lambda t: [PY, f"{ROOT}/bench/peers.py", "--rows", "hot", "--contenders", "sluice", "--conc", "4",
                             "--mem", "4GiB", "--results", f"{work}/peers-{os.path.basename(os.path.abspath(t))}.json"],
                  lambda t: {"PYTHONPATH": f"{t}/{SITE}", "SLUICE_BUILD_DIR": f"{t}/build/release"},
                  [("hot, defaults", r"sluice \(defaults\)\s+" + num, "GiB/s")]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=ROOT)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--benches", default="local,distributed,s3,python,vllm,peers")
    ap.add_argument("--work", default="/tmp/sluice-sitting", help="checkpoints and servers' state, kept between runs")
    ap.add_argument("--log", default=None, help="every run's full output (default WORK/sitting.log)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    log = open(a.log or os.path.join(a.work, "sitting.log"), "a")
    table = benches(a.work)
    chosen = a.benches.split(",")
    unknown = [b for b in chosen if b not in table]
    if unknown:
        raise SystemExit(f"bench/sitting.py: unknown bench {unknown}; known: {list(table)}")
    trees = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    for side, t in trees.items():
        commit = subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        print(f"# {side}: {t} at {commit}")
    print(f"# {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()[0]:.1f}, "
          f"{a.runs} runs each, order before/after alternating per run", flush=True)
    got = {}  # (bench, figure, side) -> [values]
    t_start = time.time()
    for run in range(a.runs):
        for b in chosen:
            cmd_of, env_of, figures = table[b]
            order = ("before", "after") if run % 2 == 0 else ("after", "before")
            for side in order:
                t = trees[side]
                env = dict(os.environ, **env_of(t))
                t0 = time.time()
                p = subprocess.run(cmd_of(t), cwd=ROOT, env=env, capture_output=True, text=True)
                out = p.stdout + p.stderr
                log.write(f"\n===== run {run + 1} {b} {side} rc {p.returncode} {time.time() - t0:.0f} s\n{out}")
                log.flush()
                vals = []
                for name, rx, unit in figures:
                    m = re.search(rx, out)
                    v = float(m.group(1)) if m else None
                    if v is not None:
                        got.setdefault((b, name, side), []).append(v)
                    vals.append(f"{name} {v if v is not None else 'MISSING'} {unit}")
                print(f"  run {run + 1} {b:<12} {side:<6} rc {p.returncode}  {time.time() - t0:5.0f} s  " + "; ".join(vals),
                      flush=True)
    print(f"\n## medians [range] over {a.runs} runs, {time.time() - t_start:.0f} s in all, "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"  {'bench':<12} {'figure':<22} {'before':>24} {'after':>24}  after/before")
    for b in chosen:
        for name, rx, unit in table[b][2]:
            cells, meds = [], {}
            for side in ("before", "after"):
                v = got.get((b, name, side), [])
                if v:
                    meds[side] = statistics.median(v)
                    cells.append(f"{meds[side]:.3f} [{min(v):.3f}-{max(v):.3f}]")
                else:
                    cells.append("-")
            flag = ""
            if len(meds) == 2:
                bv = got[(b, name, "before")]
                ratio = meds["after"] / meds["before"] if meds["before"] else float("nan")
                worse = meds["after"] < min(bv) if unit == "GiB/s" else meds["after"] > max(bv)
                better = meds["after"] > max(bv) if unit == "GiB/s" else meds["after"] < min(bv)
                flag = f"{ratio:5.2f}  " + ("OUTSIDE (worse)" if worse else "outside (better)" if better else "within")
            print(f"  {b:<12} {name + ' ' + unit:<22} {cells[0]:>24} {cells[1]:>24}  {flag}")


if __name__ == "__main__":
    sys.exit(main())
