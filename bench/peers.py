#!/usr/bin/env python3
"""bench/peers.py: sluice against the loaders users would pick instead, on one
generated checkpoint, one consumer, in one run (issue 26).

    PYTHONPATH=build/py/lib/python3.11/site-packages .venv/bin/python bench/peers.py \\
        [--size 4.2GiB | --checkpoint DIR] [--rows hot,cold,ranks,s3] [--conc 1,2,4,8,16] [--mem 256MiB,1GiB,4GiB] [--rounds 3]

Contenders: runai-model-streamer's SafetensorsStreamer, fastsafetensors
(ParallelLoader, CPU, nogds), safetensors' safe_open (mmap and pread
backends), sluice.iter_weights. Every load runs in a worker process of its own
(`--worker`), feeding each tensor to the same consumer, as an engine's
weight_loader would: a C loop (bench/peers.py's TOUCH_C, compiled into
build/peers/ and called through ctypes) reads one byte per 64-byte cache line
of the tensor's bytes and its last byte, so every cache line is read once.

Rows:
  hot    page cache hot (the files are read right before every load). Every
         contender swept over concurrency x memory x backend in one worker per
         (contender, backend); its best setting is then measured again in a
         fresh process, --rounds times, the order reversing each round, which
         gives the row: the median load (GiB/s, CPU s/GiB, peak RssAnon and
         RssFile sampled every 10 ms from /proc/PID/status by a separate
         process), every round's seconds beside it.
  cold   `echo 3 > /proc/sys/vm/drop_caches` before each load (root), each
         contender at its best hot setting, buffered and O_DIRECT where it offers
         O_DIRECT, and sluice at its defaults; --rounds times, as the hot row.
  ranks  4 ranks on this node, TP1/DP4/EP4-shaped (each rank needs every
         replicated tensor and a quarter of the routed experts, in contiguous
         blocks), hot and cold, each contender at its best hot setting,
         --rounds times with the contenders interleaved: the row is each
         one's median round, every round's time beside it.
         Beside it, what the ranks asked of the kernel, summed: rchar
         (/proc/PID/io: read, pread), io_uring's read results (the
         io_uring_complete tracepoint: rchar leaves io_uring out), the pages an
         mmap reader faulted in (the bytes of the tensors it served), and cold
         block-layer read_bytes.
  s3     runai-model-streamer-s3 against sluice, 16 connections each (sluice's
         fixed pool size), from nginx serving the files path-style (throughput),
         and the same objects from moto with SigV4 checking (correctness: equal
         bytes through both, small checkpoint).
GiB = 2^30 bytes; GiB/s = the checkpoint's tensor bytes (per rank: the bytes it
consumed) over the load's wall time.
"""
import argparse
import compileall
import datetime
import json
import math
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from page_cache import drop_caches, warm  # bench/page_cache.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("SLUICE_BUILD_DIR", os.path.join(ROOT, "build", "release"))
EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
GiB = 1 << 30


# ---------------------------------------------------------------- helpers (no torch)
def parse_size(s):
    m = re.fullmatch(r"([0-9.]+)\s*([KMGT]?)(i?B)?", s.strip())
    if not m:
        raise SystemExit(f"bad size {s!r}")
    unit = m.group(2)
    base = 1000 if m.group(3) == "B" and unit else 1024
    return int(float(m.group(1)) * base ** " KMGT".index(unit or " "))


def fmt_size(n):
    return f"{n / GiB:.0f}GiB" if n >= GiB and n % GiB == 0 else f"{n >> 20}MiB"


def proc_status(pid="self"):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
    return out


def proc_io(pid="self"):
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = int(v)
    return out


def files_of(ck):
    return sorted(os.path.join(ck, f) for f in os.listdir(ck) if f.endswith(".safetensors"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


TRACE = "/sys/kernel/tracing"


def uring_trace(on):
    """io_uring's reads are not in /proc/PID/io's rchar (measured on this
    kernel: a 62 MiB io_uring load left rchar at 126 KiB), so the ranks row adds
    what io_uring returned: the io_uring_complete tracepoint's positive results,
    summed per process (tracefs, root; record-tgid names the process of io-wq
    workers). on=True clears and enables; on=False disables and returns {tgid: bytes}."""
    def w(path, value):
        with open(os.path.join(TRACE, path), "w") as f:
            f.write(value)
    ev = "events/io_uring/io_uring_complete/"
    if not os.path.exists(os.path.join(TRACE, ev)):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACE], check=False)
    if on:
        w(ev + "enable", "0")
        w("trace", "")
        w("options/record-tgid", "1")
        w("buffer_size_kb", "16384")
        w(ev + "filter", "res > 0")
        w(ev + "enable", "1")
        w("tracing_on", "1")
        return None
    w(ev + "enable", "0")
    sums = {}
    with open(os.path.join(TRACE, "trace")) as f:
        for ln in f:
            m = re.search(r"\(\s*(\d+)\)\s.*io_uring_complete: .*result (\d+)", ln)
            if m:
                sums[int(m.group(1))] = sums.get(int(m.group(1)), 0) + int(m.group(2))
    w(ev + "filter", "0")
    w("trace", "")
    return sums


# ---------------------------------------------------------------- the sampler process
def sampler_main(pid):
    """--sample PID: peaks of RssAnon and RssFile every 10 ms. stdin 'r' resets
    (answers its current values as the base), 'q' answers the peaks since."""
    peak = {}
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.01)
        try:
            now = proc_status(pid)
        except OSError:
            return
        for k, v in now.items():
            peak[k] = max(peak.get(k, 0), v)
        if ready:
            line = sys.stdin.readline()
            if not line:
                return
            if line.startswith("r"):
                peak = dict(now)
            print(json.dumps(peak), flush=True)


class Sampler:
    def __init__(self):
        self.p = subprocess.Popen([sys.executable, __file__, "--sample", str(os.getpid())],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait()


# ---------------------------------------------------------------- the worker (one process per load or sweep)
TOUCH_C = r"""
#include <stddef.h>
#include <stdint.h>
/* One byte per 64-byte cache line, and the last byte: every line of the range is read once. */
uint64_t touch(const unsigned char* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i += 64) s += p[i];
  return n ? s + p[n - 1] : s;
}
"""
_touch = None


def touch_fn():
    """The consumer's C loop, compiled once per checkout (cc -O2) and called
    through ctypes (which releases the GIL): torch's own reductions cost more than
    the loads they would measure here (u8[::64].sum() ran at about 1 GiB/s on
    resident memory on this VM, an int64 sum of every byte at about 3)."""
    global _touch
    if _touch is None:
        import ctypes
        d = os.path.join(ROOT, "build", "peers")
        so = os.path.join(d, "touch.so")
        if not os.path.exists(so):
            os.makedirs(d, exist_ok=True)
            src = os.path.join(d, "touch.c")
            with open(src, "w") as f:
                f.write(TOUCH_C)
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so + ".tmp", src], check=True)
            os.replace(so + ".tmp", so)
        lib = ctypes.CDLL(so)
        lib.touch.restype = ctypes.c_uint64
        lib.touch.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _touch = lib.touch
    return _touch


def touch(t):
    """The consumer: reads one byte per cache line of the tensor's bytes (and its last byte)."""
    n = t.numel() * t.element_size()
    if n:
        touch_fn()(t.data_ptr(), n)
    return n


def needs(name, rank, ranks, experts):
    """Whether a TP1/DPn/EPn rank keeps this tensor: every replicated one, and
    the routed experts of its contiguous block (sluice's and fastsafetensors' assignment)."""
    if ranks == 1:
        return True
    m = EXPERT.search(name)
    return m is None or int(m.group(1)) * ranks // experts == rank


def load(spec, conc, mem, rank, ranks, experts):
    """One load by spec's contender; returns (tensors consumed, bytes consumed)."""
    import torch
    c, files, ck = spec["contender"], spec["files"], spec["ck"]
    n = nbytes = 0

    def consume(name, t):
        nonlocal n, nbytes
        if t.device.type == "meta" or not needs(name, rank, ranks, experts):
            return
        nbytes += touch(t)
        n += 1

    if c == "runai":
        os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(conc)
        os.environ["RUNAI_STREAMER_MEMORY_LIMIT"] = str(mem)
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as s:
            # owned=False: views into the streamer's reused buffers, which this
            # consumer is done with before it asks for the next tensor (Run:ai's fast path).
            s.stream_files(files, device="cpu", is_distributed=ranks > 1, owned=False)
            for name, t in s.get_tensors():
                consume(name, t)
    elif c in ("fastsafetensors", "fastsafetensors-ep"):
        from fastsafetensors import ParallelLoader
        kw = dict(nogds=True, max_threads=conc, use_tqdm_on_load=False, accumulate_resident=False)
        if mem:
            kw["device_memory_budget"] = mem
        if ranks > 1 and c == "fastsafetensors":
            import torch.distributed as dist
            it = ParallelLoader(dist.group.WORLD, files, **kw)  # its process-group loader: broadcasts
        else:
            # borrowed: views the consumer finishes with before the next (no clone per tensor)
            kw["borrowed_tensors"] = True
            if ranks > 1:  # each rank reads the replicated tensors and its own experts
                from fastsafetensors.ep_slice import expert_parallel_filter
                kw.update(all_local=True, tensor_filter=expert_parallel_filter(experts, ranks, rank))
            it = ParallelLoader(None, files, **kw)
        try:
            for name, t in it.iterate_weights():
                consume(name, t)
        finally:
            it.close() if hasattr(it, "close") else None
    elif c == "safetensors":
        from safetensors import safe_open
        for f in files:
            with safe_open(f, framework="pt", backend=spec["backend"]) as h:
                for name in h.offset_keys():
                    if needs(name, rank, ranks, experts):  # an engine asks only for what it keeps
                        consume(name, h.get_tensor(name))
    elif c == "sluice":
        import sluice
        sluice.release_memory()  # a first load: nothing kept from an earlier one in this process
        kw = dict(staging=mem, queue_depth=conc, io=spec["backend"], progress=False)
        if ranks > 1:
            # placeholders=False: the rank asks only for what it keeps, as the
            # safe_open loop above does (the default hands another rank's
            # tensors out as empty placeholders, for loaders that want every name)
            kw.update(topology=f"tp1,dp{ranks},ep{ranks}", timeout=300, placeholders=False)
        with sluice.iter_weights(sluice.open(ck), **kw) as it:
            for name, t in it:
                consume(name, t)
    else:
        raise SystemExit(f"unknown contender {c}")
    return n, nbytes


def worker_main():
    spec = json.loads(sys.stdin.read())
    import resource
    import torch
    rank, ranks = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    experts = spec["experts"]
    sampler = Sampler()
    for conc, mem in spec["grid"]:
        rec = {"contender": spec["contender"], "backend": spec["backend"], "conc": conc, "mem": mem, "rank": rank}
        if rank == 0:
            drop_caches() if spec["mode"] == "cold" else warm(spec["files"])
        if ranks > 1:
            dist.barrier()
        r0, io0, st0 = resource.getrusage(resource.RUSAGE_SELF), proc_io(), sampler.ask("r")
        t0 = time.perf_counter()
        try:
            rec["tensors"], rec["bytes"] = load(spec, conc, mem, rank, ranks, experts)
        except Exception as e:  # noqa: BLE001  (reported as the row's failure)
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rec["seconds"] = time.perf_counter() - t0
        r1, io1, st1 = resource.getrusage(resource.RUSAGE_SELF), proc_io(), sampler.ask("q")
        rec["cpu"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        rec["faults"] = (r1.ru_minflt - r0.ru_minflt) + (r1.ru_majflt - r0.ru_majflt)
        rec["rchar"] = io1["rchar"] - io0["rchar"]
        rec["read_bytes"] = io1["read_bytes"] - io0["read_bytes"]
        rec["rss_anon"], rec["rss_file"] = st1.get("RssAnon", 0), st1.get("RssFile", 0)
        rec["rss_file_growth"] = max(0, st1.get("RssFile", 0) - st0.get("RssFile", 0))
        print("RESULT " + json.dumps(rec), flush=True)
        if ranks > 1:
            dist.barrier()
    sampler.close()
    if ranks > 1:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the orchestrator
def contender_env(contender, backend):
    env = dict(os.environ, RUNAI_STREAMER_LOG_LEVEL="WARNING", PYTHONDONTWRITEBYTECODE="1")
    if contender == "runai":
        if backend != "default":
            env["RUNAI_STREAMER_FS_STRATEGY"] = backend
        env["RUNAI_STREAMER_DIST"] = "1"  # its distributed mode over Gloo (auto mode enables it for NCCL only)
    if contender.startswith("fastsafetensors"):
        env["FASTSAFETENSORS_ODIRECT"] = "1" if backend == "odirect" else "0"
    return env


def run_worker(spec, ranks=1, timeout=1800, trace=False):
    """Runs one worker (or `ranks` of them, torchrun's environment); returns its RESULT records
    (with trace: each with "uring", the bytes its io_uring reads returned)."""
    env = contender_env(spec["contender"], spec["backend"])
    if trace:
        uring_trace(True)
    port = free_port()
    procs = []
    for r in range(ranks):
        e = dict(env)
        if ranks > 1:
            e.update(RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        p = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=e)
        p.stdin.write(json.dumps(spec))
        p.stdin.close()
        p.stdin = None  # written: communicate() must not flush it again
        procs.append(p)
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            stdout, stderr = p.communicate()
        recs = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 and not recs:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            recs = [{"contender": spec["contender"], "backend": spec["backend"], "error": f"exit {p.returncode}: {tail}",
                     "conc": c, "mem": m} for c, m in spec["grid"]]
        out.append(recs)
    if trace:
        sums = uring_trace(False)
        for p, recs in zip(procs, out):
            for r in recs:
                r["uring"] = sums.get(p.pid, 0)  # the worker's whole life: only its loader uses io_uring
    if ranks == 1:
        return out[0]
    return [list(rs) for rs in zip(*out)]  # per grid point: the ranks' records


def rate(rec, total):
    return total / rec["seconds"] / GiB if "error" not in rec else 0.0


def settings_of(c):
    """Whose best hot settings contender `c` runs at (fastsafetensors-ep at fastsafetensors')."""
    return "fastsafetensors" if c == "fastsafetensors-ep" else c


def median_interval(xs, level=0.90):
    """A distribution-free interval for the median of xs (order statistics:
    the median lies below the k-th smallest of n draws with the binomial
    probability P(Bin(n, 1/2) < k)), at least `level` sure; None when n is
    too small for it (n < 5 at 90 %). Used on the paired per-round ratios:
    whether 1.0x lies inside says whether the rounds tell the contenders
    apart at all on this noisy VM. By hand: SciPy's quantile_test gives the
    same interval, but SciPy is not in the project's environment, and ten
    lines do not justify a dependency."""
    xs, n = sorted(xs), len(xs)
    cdf, k = 0.0, 0  # cdf = P(Bin(n, 1/2) <= k - 1)
    while True:
        nxt = cdf + math.comb(n, k) / 2 ** n
        if 2 * nxt > 1 - level:
            break
        cdf, k = nxt, k + 1
    return None if k == 0 else (xs[k - 1], xs[n - k])


def lower_median(items, key):
    """The median of items by key; of an even count, the faster middle one."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def slowest(recs):
    """A multi-rank load's time: its slowest rank's."""
    return max(r["seconds"] for r in recs)


def settings(rec):
    s = f"{rec['backend']}"
    if rec["contender"] in ("safetensors",):
        return s
    return f"{s}, conc {rec['conc']}, mem {fmt_size(rec['mem']) if rec['mem'] else '-'}"


def line(label, rec, total, best_peer, extra=""):
    if "error" in rec:
        return f"  {label:<26} failed: {rec['error']}"
    g = rate(rec, total)
    ratio = f"{g / best_peer:5.2f}x" if best_peer else "    -"
    return (f"  {label:<26} {g:6.2f}  {rec['cpu'] / (total / GiB):6.2f}  {rec['rss_anon'] / 2**20:8.0f}  "
            f"{rec['rss_file'] / 2**20:8.0f}  {ratio}  {settings(rec)}{extra}")


HEADER = f"  {'contender':<26} {'GiB/s':>6}  {'CPU s/GiB':>6}  {'RssAnon':>8}  {'RssFile':>8}  {'/best peer':>6}  settings"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint")
    ap.add_argument("--size", default="4.2GiB", help="generated checkpoint (gen-checkpoint --size)")
    ap.add_argument("--rows", default="hot,cold,ranks,s3")
    ap.add_argument("--conc", default="1,2,4,8,16")
    ap.add_argument("--mem", default="256MiB,1GiB,4GiB")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3,
                    help="the hot, cold and ranks rows: rounds of every contender, the order reversing each round; "
                         "each row is the contender's median round")
    ap.add_argument("--cold-sweep", action="store_true",
                    help="the cold row also runs each contender at every --mem, buffered and O_DIRECT (its hot best "
                         "concurrency): a setting that wins hot is not always the one that wins cold")
    ap.add_argument("--contenders", default="runai,fastsafetensors,safetensors,sluice",
                    help="who runs (a subset, for example sluice alone for a before/after sitting)")
    ap.add_argument("--s3-check-size", default="64MiB", help="checkpoint for the moto correctness check")
    ap.add_argument("--results", default=os.path.join(tempfile.gettempdir(), "peers-results.json"),
                    help="where to write every record as JSON")
    ap.add_argument("--settings-from", help="take the best hot settings from an earlier run's results JSON "
                    "(its sweep) instead of sweeping again")
    a = ap.parse_args()
    rows = a.rows.split(",")
    if ("cold" in rows or "ranks" in rows) and os.geteuid() != 0:
        raise SystemExit("bench/peers.py: the cold rows drop the page cache: run as root (or --rows hot,s3)")
    ck = a.checkpoint or os.path.join(ROOT, ".samples", f"peers-{a.size}")
    if a.checkpoint:  # the caller's: read as it is, never written into (it needs no index)
        if not os.path.isdir(ck) or not files_of(ck):
            raise SystemExit(f"bench/peers.py: --checkpoint {ck}: not a directory of .safetensors files")
    elif not os.path.exists(os.path.join(ck, "model.safetensors.index.json")):
        print(f"# generating {ck}", flush=True)
        subprocess.run([os.path.join(BUILD, "examples", "gen-checkpoint"), ck, "--size", a.size], check=True,
                       stdout=subprocess.DEVNULL)
    files = files_of(ck)
    import torch
    import importlib.metadata as md
    from safetensors import safe_open
    total, dtypes, names = 0, {}, []
    for f in files:
        with safe_open(f, framework="pt") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                shape, dt = sl.get_shape(), sl.get_dtype()
                names.append(k)
                dtypes[dt] = dtypes.get(dt, 0) + 1
    import sluice
    # Every contender as pip installs it, its bytecode compiled: torch and the
    # peers come from site-packages with their .pyc files, but a sluice run
    # from a build tree (PYTHONPATH=build/release/python) has none, and each
    # worker (PYTHONDONTWRITEBYTECODE) would compile its sources again inside
    # the timed load: about 5 ms of CPU per rank (bench/HISTORY.md).
    compileall.compile_dir(os.path.dirname(sluice.__file__), quiet=1)
    sck = sluice.open(ck)
    total = sck.tensor_bytes
    experts = 1 + max((int(m.group(1)) for n in names if (m := EXPERT.search(n))), default=0)
    conc = [int(x) for x in a.conc.split(",")]
    mem = [parse_size(x) for x in a.mem.split(",")]
    grid = [(c, m) for c in conc for m in mem]
    versions = {p: md.version(p) for p in ("runai-model-streamer", "runai-model-streamer-s3", "fastsafetensors",
                                           "safetensors", "torch")}
    start_load = loadavg()
    t_start = time.time()
    print(f"# bench/peers.py, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"load average at start {start_load}")
    print(f"# {' '.join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable] + sys.argv)}")
    print(f"# checkpoint {ck}: {len(names)} tensors in {len(files)} files, {total} tensor bytes ({total / GiB:.2f} GiB), "
          f"{experts} routed experts per MoE layer; dtypes (all read by every contender): "
          + ", ".join(f"{k} x{v}" for k, v in sorted(dtypes.items())))
    print("# versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f", sluice {sluice.__file__}")
    print("# consumer: per tensor, a C loop (ctypes, GIL released) reads one byte per 64-byte cache line and the last byte",
          flush=True)

    # The consumer's own ceiling: the same calls on tensors already in memory.
    resident = []
    for f in files:
        with safe_open(f, framework="pt", backend="pread") as h:
            resident += [h.get_tensor(k).clone() for k in h.offset_keys()]
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for t in resident:
            touch(t)
        s = time.perf_counter() - t0
        best = s if best is None else min(best, s)
    del resident
    print(f"\nconsumer ceiling on resident memory: {total / best / GiB:.2f} GiB/s ({best:.3f} s, best of 3)", flush=True)

    wanted = a.contenders.split(",")
    peers = [p for p in ("runai", "fastsafetensors", "safetensors") if p in wanted]
    ours = ["sluice"] if "sluice" in wanted else []
    hot_backends = {"runai": ["io_uring_buffered", "sync_buffered"], "fastsafetensors": ["buffered"],
                    "safetensors": ["mmap", "pread"], "sluice": ["auto", "buffered"]}
    direct_backend = {"runai": "io_uring_direct", "fastsafetensors": "odirect", "sluice": "direct"}
    base = {"files": files, "ck": ck, "experts": experts}
    best_hot = {}
    results = {"checkpoint": ck, "total": total, "versions": versions}

    if a.settings_from:
        with open(a.settings_from) as f:
            for r in json.load(f)["sweep"]:
                if "error" not in r and (r["contender"] not in best_hot or r["seconds"] < best_hot[r["contender"]]["seconds"]):
                    best_hot[r["contender"]] = r
        print(f"\n## best hot settings from the sweep in {a.settings_from}: "
              + "; ".join(f"{c}: {settings(r)}" for c, r in best_hot.items()))
    elif "hot" in rows or "cold" in rows or "ranks" in rows:
        print(f"\n## hot: sweep (one worker per contender and backend; conc x mem = {len(grid)} loads each; "
              f"best of the sweep, then re-measured in a fresh process)", flush=True)
        sweep = []
        for c in peers + ours:
            for b in hot_backends[c]:
                g = [(1, 0)] if c == "safetensors" else grid
                recs = run_worker(dict(base, contender=c, backend=b, mode="hot", grid=g))
                sweep += recs
                ok = [r for r in recs if "error" not in r]
                fails = [r for r in recs if "error" in r]
                msg = f"  {c:<16} {b:<18} " + " ".join(f"{rate(r, total):.2f}" if "error" not in r else "  -  "
                                                          for r in recs)
                if fails:
                    msg += f"   ({len(fails)} failed: {fails[0]['error'][:160]})"
                print(msg, flush=True)
                for r in ok:
                    if c not in best_hot or rate(r, total) > rate(best_hot[c], total):
                        best_hot[c] = r
        results["sweep"] = sweep
        print(f"  (GiB/s per load, in grid order: conc {conc} x mem {[fmt_size(m) for m in mem]})")

    def fresh(c, rec, mode, backend=None):
        spec = dict(base, contender=c, backend=backend or rec["backend"], mode=mode, grid=[(rec["conc"], rec["mem"])])
        return run_worker(spec)[0]

    def in_rounds(entries, mode):
        """Each entry (label, contender, settings record, backend) loaded --rounds
        times, each load in a fresh process, the order reversing every round
        (A B C, C B A, ...): on this VM a load's speed depended on what the
        load before it left in memory (bench/HISTORY.md, the cold trap), and a
        fixed order gave each contender the same predecessor every time.
        Returns {label: its median record, with "rounds": every load's seconds}."""
        got = {label: [] for label, *_ in entries}
        for i in range(a.rounds):
            for label, c, rec, backend in (entries if i % 2 == 0 else entries[::-1]):
                got[label].append(fresh(c, rec, mode, backend))
        out = {}
        for label, recs in got.items():
            ok = [r for r in recs if "error" not in r]
            med = dict(lower_median(ok, key=lambda r: r["seconds"]) if ok else recs[0])
            med["rounds"] = [r["seconds"] if "error" not in r else None for r in recs]
            out[label] = med
        return out

    def spread(rec):
        if a.rounds < 2 or "rounds" not in rec:
            return ""
        return "   s: " + " ".join("fail" if x is None else f"{x:.2f}" for x in rec["rounds"])

    rounds_note = (f" (median of {a.rounds} rounds, the order reversing each round; every round's seconds beside it)"
                   if a.rounds > 1 else "")
    default_sluice = {"contender": "sluice", "backend": "auto", "conc": 4, "mem": 4 << 30}
    if "hot" in rows:
        print(f"\n## hot (page cache), each contender's best setting, each load in a fresh process{rounds_note}")
        print(HEADER)
        entries = [(c, c, best_hot[c], None) for c in best_hot]
        if ours:
            entries.append(("sluice (defaults)", "sluice", default_sluice, None))
        final = in_rounds(entries, "hot")
        bp = max((rate(final[c], total) for c in peers if c in final and "error" not in final[c]), default=None)
        for c, r in final.items():
            print(line(c, r, total, bp, spread(r)))
        results["hot"] = final

    if "cold" in rows:
        print(f"\n## cold (drop_caches before each load), at the best hot settings; O_DIRECT where offered{rounds_note}")
        print(HEADER)
        entries = []
        for c in peers + ours:
            if c not in best_hot:
                continue
            entries.append((c, c, best_hot[c], None))
            if c in direct_backend:
                entries.append((f"{c} O_DIRECT", c, best_hot[c], direct_backend[c]))
            if c == "safetensors":
                other = "pread" if best_hot[c]["backend"] == "mmap" else "mmap"
                entries.append((f"safetensors {other}", c, best_hot[c], other))
        if ours:
            entries.append(("sluice (defaults)", "sluice", default_sluice, None))
        cold = in_rounds(entries, "cold")
        if a.cold_sweep:
            for c in peers + ours:
                if c not in best_hot or c == "safetensors":
                    continue
                for m in mem:
                    for b in dict.fromkeys([best_hot[c]["backend"], direct_backend.get(c, best_hot[c]["backend"])]):
                        cold[f"{c} {b} {fmt_size(m)}"] = fresh(c, dict(best_hot[c], mem=m), "cold", b)
        bp = max((rate(r, total) for k, r in cold.items() if not k.startswith("sluice") and "error" not in r), default=None)
        for k, r in cold.items():
            print(line(k, r, total, bp, spread(r)))
        results["cold"] = cold

    if "ranks" in rows:
        n = a.ranks
        print(f"\n## {n} ranks on this node (TP1/DP{n}/EP{n}: replicated tensors + 1/{n} of the experts each; "
              f"{n} ranks share {os.cpu_count()} cores), at the best hot settings")
        contenders = [("runai", "Run:ai is_distributed=True (Gloo)"),
                      ("fastsafetensors", "fastsafetensors ParallelLoader(pg)"),
                      ("fastsafetensors-ep", "fastsafetensors all_local + EP filter"),
                      ("safetensors", "safe_open per rank (own tensors)"),
                      ("sluice", f"sluice iter_weights tp1,dp{n},ep{n}")]
        ranks_res = {}
        prev = None
        for mode in ("hot", "cold"):
            runs = [(c, label) for c, label in contenders if settings_of(c) in best_hot]
            by = {c: [] for c, _ in runs}
            after = {c: [] for c, _ in runs}  # per round, the contender whose load ran just before
            # Rounds, the contenders interleaved within each: a 4-rank load on 2
            # cores is CPU-bound and the host's other tenants move it by 20-30 %
            # from one run to the next, so one run each decided the ratio by
            # who drew the quieter moment. The row is each contender's median
            # round (by its slowest rank), the range beside it. The order
            # reverses every round (A B, B A, A B, ...), so that each contender
            # follows each other one and itself about equally often: on this
            # VM a cold load's speed depended on what the previous load left
            # in memory (bench/HISTORY.md, the cold trap), and a fixed order
            # gave one contender the same predecessor every round.
            for i in range(a.rounds):
                for c, label in (runs if i % 2 == 0 else runs[::-1]):
                    b = best_hot[settings_of(c)]
                    m = b["mem"]
                    if c == "fastsafetensors":  # its broadcast loader cannot fit a shard's group in a 1 GiB budget
                        m = 0                   # (BudgetInfeasibleError): whole-file batches, its default
                    spec = dict(base, contender=c, backend=b["backend"], mode=mode, grid=[(b["conc"], m)])
                    by[c].append(run_worker(spec, ranks=n, trace=True)[0])
                    after[c].append(prev)
                    prev = c
            print(f"  {mode}: {'contender':<40} {'max s':>6} {'GiB/s sum':>9} {'CPU s sum':>9} {'RssAnon max/sum MiB':>19} "
                  f"{'RssFile max':>11} {'consumed GiB/rank':>17} {'asked GiB':>9} {'read_bytes GiB':>14}"
                  + (f"  max s of each round (median of {a.rounds})" if a.rounds > 1 else ""))
            medians = {}
            for c, label in runs:
                rounds = by[c]
                ranks_res[f"{mode} {c}"] = rounds[0] if a.rounds == 1 else rounds
                errs = [r for recs in rounds for r in recs if "error" in r]
                if errs:
                    print(f"  {mode}: {label:<40} failed: {errs[0]['error']}")
                    continue
                recs = lower_median(rounds, key=slowest)  # the median round
                mx = slowest(recs)
                medians[c] = mx
                consumed = sum(r["bytes"] for r in recs)
                # mmap: every byte it served is a page of the mapping the consumer faulted in (safe_open's
                # tensors are views of it); RssFile's growth would count only the peak, as it unmaps each file
                mmap = c == "safetensors" and best_hot[settings_of(c)]["backend"] == "mmap"
                mapped = [r["bytes"] if mmap else r["rss_file_growth"] for r in recs]
                asked = sum(r["rchar"] + r.get("uring", 0) + m for r, m in zip(recs, mapped))
                each_round = ("  " + " ".join(f"{slowest(rs):.2f}" for rs in rounds)) if a.rounds > 1 else ""
                print(f"  {mode}: {label:<40} {mx:6.2f} {consumed / mx / GiB:9.2f} {sum(r['cpu'] for r in recs):9.2f} "
                      f"{max(r['rss_anon'] for r in recs) / 2**20:9.0f}/{sum(r['rss_anon'] for r in recs) / 2**20:<9.0f} "
                      f"{max(r['rss_file'] for r in recs) / 2**20:11.0f} "
                      f"{consumed / n / GiB:17.2f} {asked / GiB:9.2f} {sum(r['read_bytes'] for r in recs) / GiB:14.2f}{each_round}",
                      flush=True)
            if "sluice" in medians and "safetensors" in medians:
                # Each round's two runs are minutes apart at most: their ratio
                # drifts less with the host than either time does.
                paired = sorted(slowest(s_) / slowest(o_) for s_, o_ in zip(by["safetensors"], by["sluice"]))
                ci = median_interval(paired)
                print(f"  {mode}: sluice against safe_open per rank: {medians['safetensors'] / medians['sluice']:.2f}x of the "
                      f"median rounds; round by round {' '.join(f'{x:.2f}' for x in paired)}x, median "
                      f"{statistics.median(paired):.2f}x"
                      + (f" (90 % interval of the median {ci[0]:.2f}-{ci[1]:.2f}x)" if ci else "")
                      + f"; sluice faster in {sum(x > 1 for x in paired)} of {len(paired)} rounds")
            if a.rounds > 1 and len(runs) > 1:
                # Each contender's median by the load that ran before it (see the order above).
                parts = []
                for c, label in runs:
                    for p_ in dict.fromkeys(x for x in after[c] if x is not None):
                        t = [slowest(rs) for rs, q in zip(by[c], after[c]) if q == p_ and not any("error" in r for r in rs)]
                        if t:
                            parts.append(f"{c} after {p_} {statistics.median(t):.2f} s ({len(t)})")
                print(f"  {mode}: median by the load before: " + "; ".join(parts))
        print("  asked = sum over ranks of rchar (/proc/PID/io: read, pread) + io_uring's read results (tracepoint "
              "io_uring_complete: rchar leaves io_uring out) + for mmap the bytes of the tensors it served (pages of the "
              "mapping faulted in; fault-around maps up to 16 pages per fault, so faults x 4 KiB would undercount), "
              "else the growth of RssFile; "
              "read_bytes = block-layer reads (/proc/PID/io), meaningful cold")
        results["ranks"] = ranks_res

    if "s3" in rows:
        results["s3"] = s3_rows(a, ck, files, total, base)

    end_load = loadavg()
    print(f"\n# load average at start {start_load}, at end {end_load}; wall {time.time() - t_start:.0f} s")
    with open(a.results, "w") as f:
        json.dump(results, f, indent=1)


# ---------------------------------------------------------------- S3
NGINX_CONF = """worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
daemon on;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{port};
    root {d}/www;
  }}
}}
"""


def s3_load(url_files, endpoint, contender, conns, env_extra, ck_prefix, check=False):
    spec_env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                    RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", RUNAI_STREAMER_LOG_LEVEL="WARNING",
                    RUNAI_STREAMER_CONCURRENCY=str(conns), AWS_CONFIG_FILE="/dev/null",
                    AWS_SHARED_CREDENTIALS_FILE="/dev/null", **env_extra)
    code = S3_CHILD
    p = subprocess.run([sys.executable, "-c", code, contender, json.dumps(url_files), ck_prefix, "check" if check else "-"],
                       env=spec_env, capture_output=True, text=True, timeout=900)
    for ln in p.stdout.splitlines():
        if ln.startswith("RESULT "):
            return json.loads(ln[7:])
    return {"error": f"exit {p.returncode}: " + " | ".join(p.stderr.strip().splitlines()[-3:])}


S3_CHILD = r"""
import hashlib, json, resource, sys, time
sys.path.insert(0, %r)
from peers import touch
contender, urls, prefix, check = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] == "check"
digest = hashlib.sha256()
def consume(name, t, out):
    out[name] = touch(t)
    if check and t.numel():  # the correctness run only: a digest of every tensor
        out[name] = hashlib.sha256(t.reshape(-1).view(__import__('torch').uint8).numpy().tobytes()).hexdigest()
out = {}
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
try:
    if contender == "runai":
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as s:
            s.stream_files(urls, owned=False)
            for n, t in s.get_tensors():
                consume(n, t, out)
    else:
        import sluice
        for n, t in sluice.iter_weights(sluice.open(prefix), staging="4GiB", progress=False):
            consume(n, t, out)
    err = None
except Exception as e:
    err = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
s = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
rec = {"seconds": s, "cpu": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, "tensors": len(out),
       "digests": out if check else None}
if err: rec["error"] = err
print("RESULT " + json.dumps(rec))
""" % HERE


def s3_rows(a, ck, files, total, base):
    conns = 16
    print(f"\n## S3: runai-model-streamer-s3 vs sluice, {conns} connections each (sluice's pool size; Run:ai "
          f"RUNAI_STREAMER_CONCURRENCY={conns}); Run:ai given explicit object URIs")
    work = tempfile.mkdtemp(prefix="peers-nginx-")
    os.chmod(work, 0o755)  # nginx's workers run as nobody
    os.makedirs(os.path.join(work, "www", "bench"))
    os.makedirs(os.path.join(work, "tmp"))
    os.symlink(os.path.abspath(ck), os.path.join(work, "www", "bench", "ck"))
    port = free_port()
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(NGINX_CONF.format(d=work, port=port))
    subprocess.run(["/usr/sbin/nginx", "-c", os.path.join(work, "nginx.conf"), "-p", work, "-e",
                    os.path.join(work, "error.log")], check=True)
    out = {}
    try:
        time.sleep(0.3)
        endpoint = f"http://127.0.0.1:{port}"
        urls = [f"s3://bench/ck/{os.path.basename(f)}" for f in files]
        creds = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}  # nginx ignores Authorization
        print(f"  nginx (path-style, range GETs), page cache hot; {'contender':<12} {'GiB/s':>6} {'CPU s/GiB':>9} "
              f"{'/runai':>7}")
        for c in ("runai", "sluice"):
            warm(files)
            out[f"nginx {c}"] = s3_load(urls, endpoint, c, conns, creds, "s3://bench/ck/")
        g = {c: total / out[f"nginx {c}"]["seconds"] / GiB for c in ("runai", "sluice") if "error" not in out[f"nginx {c}"]}
        for c in ("runai", "sluice"):
            r = out[f"nginx {c}"]
            if "error" in r:
                print(f"  {'':<48}{c:<12} failed: {r['error']}")
                continue
            ratio = f"{g[c] / g['runai']:.2f}x" if "runai" in g else "-"
            print(f"  {'':<48}{c:<12} {g[c]:6.2f} {r['cpu'] / (total / GiB):9.2f} {ratio:>7}")
    finally:
        with open(os.path.join(work, "nginx.pid")) as f:
            os.kill(int(f.read()), signal.SIGTERM)
    # Correctness against moto (SigV4 checked): a small checkpoint through both, digests compared.
    small = os.path.join(ROOT, ".samples", f"peers-{a.s3_check_size}")
    if not os.path.exists(os.path.join(small, "model.safetensors.index.json")):
        subprocess.run([os.path.join(BUILD, "examples", "gen-checkpoint"), small, "--size", a.s3_check_size],
                       check=True, stdout=subprocess.DEVNULL)
    env = subprocess.run(["bash", os.path.join(ROOT, "scripts", "s3-server.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout
    kv = dict(re.findall(r"export (\w+)=(\S+)", env))
    endpoint = kv["SLUICE_S3_ENDPOINT"]
    bucket = f"peers-{os.getpid()}"
    up_env = dict(os.environ, AWS_ACCESS_KEY_ID=kv["AWS_ACCESS_KEY_ID"], AWS_SECRET_ACCESS_KEY=kv["AWS_SECRET_ACCESS_KEY"],
                  AWS_REGION="us-east-1", AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")
    subprocess.run([sys.executable, os.path.join(HERE, "upload_checkpoint.py"), small, bucket, "ck/", endpoint],
                   check=True, env=up_env)
    creds = {"AWS_ACCESS_KEY_ID": kv["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": kv["AWS_SECRET_ACCESS_KEY"]}
    urls = [f"s3://{bucket}/ck/{f}" for f in sorted(os.listdir(small)) if f.endswith(".safetensors")]
    m = {c: s3_load(urls, endpoint, c, conns, creds, f"s3://{bucket}/ck/", check=True) for c in ("runai", "sluice")}
    ok = all("error" not in r for r in m.values()) and m["runai"]["digests"] == m["sluice"]["digests"]
    print(f"  moto (SigV4 checked), {small}: " + ", ".join(
        f"{c} {'failed: ' + r['error'] if 'error' in r else str(r['tensors']) + ' tensors'}" for c, r in m.items())
        + f"; bytes equal through both: {'yes' if ok else 'NO'}")
    out["moto"] = {c: {k: v for k, v in r.items() if k != "digests"} for c, r in m.items()}
    out["moto_equal"] = ok
    return out


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--sample":
        sampler_main(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main()
    else:
        main()
