#!/usr/bin/env python3
"""Opening a checkpoint from S3: how long `sluice.open("s3://...")` takes
when every request costs a round trip, and how many header GETs were in
flight at once.

  PYTHONPATH=build/release/vllm-package/lib/python3.11/site-packages .venv/bin/python bench/s3_open.py \\
      [--tensors 91000] [--shards 163] [--delay-ms 0,10,25] [--repeat 3]

The checkpoint is DeepSeek V3's shape by default: 163 shards and 91,000
tensors (one byte each: the open reads headers only), with its
model.safetensors.index.json, written by bench/header_parse.py's writer.
It is uploaded to moto (scripts/s3-server.sh, a state directory of its own
under build/bench-s3-open) and opened through tests/support/fault_proxy.js,
which holds every request --delay-ms before it forwards it (`--fault delay
--match all`): a distant endpoint's round trip on loopback. Per delay it
prints the best and median of --repeat opens, and from the proxy's log the
header GETs (range from byte 0 of a shard) and the most requests the proxy
held at once.

Run it with two builds of the package on PYTHONPATH for a before/after.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from header_parse import write_sharded  # noqa: E402


def proxy(upstream, delay_ms, log):
    """The fault proxy holding every request delay_ms; returns (process, endpoint)."""
    args = ["node", os.path.join(ROOT, "tests", "support", "fault_proxy.js"), "--upstream", upstream, "--log", log]
    args += ["--fault", "delay", "--match", "all", "--stall-ms", str(delay_ms)] if delay_ms else ["--fault", "none"]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("PORT "):
        raise SystemExit(f"bench/s3_open.py: the proxy said {line!r}")
    return p, "http://127.0.0.1:" + line.split()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=91_000)
    ap.add_argument("--shards", type=int, default=163)
    ap.add_argument("--delay-ms", default="0,10,25")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-s3-open"))
    a = ap.parse_args()
    import sluice

    os.makedirs(a.work, exist_ok=True)
    state = os.path.join(a.work, "s3-server")
    senv = dict(os.environ, SLUICE_S3_STATE_DIR=state)
    server = os.path.join(ROOT, "scripts", "s3-server.sh")
    started = subprocess.run(["bash", server, "start"], env=senv, check=True, capture_output=True, text=True).stdout
    try:
        e = dict(re.findall(r"export (\w+)=(\S+)", started))  # as bench/peers.py reads them
        os.environ.update(AWS_ACCESS_KEY_ID=e["AWS_ACCESS_KEY_ID"], AWS_SECRET_ACCESS_KEY=e["AWS_SECRET_ACCESS_KEY"],
                          AWS_REGION="us-east-1", AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
            os.environ.pop(k, None)
        bucket, prefix = "bench", f"ck-{a.shards}-{a.tensors}/"
        with tempfile.TemporaryDirectory(prefix="sluice-s3-open-") as d:
            index_bytes = write_sharded(d, a.tensors, a.shards)
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "upload_checkpoint.py"), d, bucket, prefix,
                            e["SLUICE_S3_ENDPOINT"]], check=True)
        print(f"# bench/s3_open.py --tensors {a.tensors} --shards {a.shards} --delay-ms {a.delay_ms} --repeat {a.repeat}")
        print(f"# sluice {getattr(sluice, '__version__', '?')} from {os.path.dirname(sluice.__file__)}")
        print(f"# {a.shards} shards, {a.tensors} tensors, index {index_bytes / 1e6:.1f} MB, moto on loopback behind the proxy")
        print(f"{'delay per request':>18} {'best':>8} {'median':>8} {'header GETs':>12} {'most at once':>13}")
        for delay in [int(x) for x in a.delay_ms.split(",")]:
            log = os.path.join(a.work, f"requests-{delay}.jsonl")
            if os.path.exists(log):
                os.unlink(log)
            p, endpoint = proxy(e["SLUICE_S3_ENDPOINT"], delay, log)
            try:
                os.environ["AWS_ENDPOINT_URL"] = endpoint
                times = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    ck = sluice.open(f"s3://{bucket}/{prefix}")
                    times.append(time.perf_counter() - t0)
                    assert len(ck) == a.tensors, len(ck)
            finally:
                p.stdin.close()
                p.wait(timeout=30)
            gets, most = 0, 0
            with open(log) as f:
                for line in f:
                    r = json.loads(line)
                    if r["path"].split("?")[0].endswith(".safetensors") and r["range"].startswith("bytes=0-"):
                        gets += 1
                        most = max(most, r.get("inflight", 0))
            print(f"{str(delay) + ' ms':>18} {min(times):7.3f}s {statistics.median(times):7.3f}s "
                  f"{gets // a.repeat:>12} {most:>13}")
    finally:
        subprocess.run(["bash", server, "stop"], env=senv, capture_output=True)


if __name__ == "__main__":
    main()
