#!/usr/bin/env python3
"""The hostile inputs of issue 40 through the tools a user runs.

  check_hostile.py files  --load SLUICE_LOAD --launch SLUICE_LAUNCH --work DIR
  check_hostile.py s3     --load SLUICE_LOAD --gen GEN_CHECKPOINT --work DIR
  check_hostile.py launch --load SLUICE_LOAD --launch SLUICE_LAUNCH --gen GEN_CHECKPOINT --work DIR --hook PRELOAD

Each case must end as a user can act on: exit status 1 (2 for a usage
error), no signal, and exactly one stderr line "sluice: error: ..." naming
the rule; nothing is left behind (the launcher's temporary directory, its
ranks). Prints "hostile <mode>: passed" at the end. Standard library only.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAILURES = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def run(argv, env=None, timeout=300):
    t0 = time.monotonic()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"), time.monotonic() - t0


def expect_error(name, argv, rule, env=None, status=1):
    rc, out, err, took = run(argv, env)
    lines = [l for l in err.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("sluice: error: ")]
    ok = rc == status and len(errors) == 1 and (rule in errors[0] if errors else False)
    check(ok, f"{name}: exit {rc} (want {status}), {took:.1f} s: {errors[0][:200] if errors else lines[-3:]}")
    return errors[0] if errors else ""


def files(a):
    d = os.path.join(a.work, "hostile")
    subprocess.run([sys.executable, os.path.join(HERE, "make_hostile.py"), d], check=True, stdout=subprocess.DEVNULL)
    cases = [("deep-shape", "shape: "), ("deep-total-size", "index-depth: "), ("long-digits", "name-length: "),
             ("huge-index", "index-size: "), ("many-tensors", "tensor-count: ")]
    env = dict(os.environ, SLUICE_COMM_TIMEOUT_MS="60000")
    for case, rule in cases:
        path = os.path.join(d, case)
        expect_error(f"sluice-load --probe {case}", [a.load, path, "--probe"], rule)
        expect_error(f"sluice-load {case}", [a.load, path, "--no-progress"], rule)
        # Every rank of a multi-rank load opens it: each fails with the named
        # error (a collective open: rank 0 reads, the others replay), and the
        # launcher names the first rank that failed.
        rc, out, err, took = run([a.launch, "-n", "2", "--", a.load, path, "--topology", "tp1,dp2,ep2",
                                  "--no-progress"], env)
        named = [l for l in err.splitlines() if l.startswith("sluice: error: ") and rule in l]
        check(rc == 1 and len(named) >= 1 and "signal" not in err,
              f"sluice-launch -n 2 {case}: exit {rc}, {len(named)} rank(s) named '{rule.strip()}' in {took:.1f} s")
    # A tab or a newline in a name cannot forge a --digest line.
    rc, out, err, _ = run([a.load, os.path.join(d, "control-names"), "--digest", "--no-progress"])
    lines = out.splitlines()
    check(rc == 0 and len(lines) == 2 and all(len(l.split("\t")) == 4 for l in lines),
          f"--digest of names with a tab and a newline: {len(lines)} lines of 4 fields: {lines}")
    check(any(l.startswith("evil\\tU8\\t[1]\\t" + "0" * 64 + "\\nmodel.norm.weight\t") for l in lines),
          "the forged name is printed escaped")


def s3(a):
    ck = os.path.join(a.work, "s3-ck")
    subprocess.run([a.gen, ck, "--size", "4MiB", "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    lone = os.path.join(a.work, "s3-lone")   # no index and no model.safetensors: opening lists the prefix
    os.makedirs(lone, exist_ok=True)
    first = sorted(x for x in os.listdir(ck) if x.endswith(".safetensors"))[0]
    shutil.copyfile(os.path.join(ck, first), os.path.join(lone, "a.safetensors"))
    cases = [("honest", ck, None), ("content-range-wraps", ck, "BadContentRange"),
             ("content-length-lies", ck, "BadContentLength"), ("honest", lone, None),
             ("listing-repeats-token", lone, "RepeatedContinuationToken"),
             ("listing-outside-prefix", lone, "outside the prefix"), ("listing-too-many-keys", lone, "more than the"),
             ("listing-huge-key", lone, "longer than S3's limit")]
    for scenario, root, rule in cases:
        server = subprocess.Popen([sys.executable, os.path.join(HERE, "hostile_s3.py"), root, scenario],
                                  stdout=subprocess.PIPE, text=True)
        try:
            port = server.stdout.readline().strip()
            env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="hostile",
                       AWS_SECRET_ACCESS_KEY="hostile", AWS_REGION="us-east-1", AWS_CONFIG_FILE="/nonexistent",
                       AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
            argv = [a.load, "s3://b/ck/", "--no-progress", "--digest"]
            name = f"{scenario} ({os.path.basename(root)})"
            if rule is None:
                rc, out, err, _ = run(argv, env)
                check(rc == 0 and len(out.splitlines()) > 0, f"{name}: the control loads ({len(out.splitlines())} tensors)")
            else:
                expect_error(name, argv, rule, env)
        finally:
            server.terminate()
            server.wait()


def launch(a):
    ck = os.path.join(a.work, "launch-ck")
    subprocess.run([a.gen, ck, "--size", "4MiB", "--seed", "2"], check=True, stdout=subprocess.DEVNULL)
    # --nnodes without --host: refused before anything starts.
    rc, out, err, _ = run([a.launch, "-n", "1", "--nnodes", "2", "--store", os.path.join(a.work, "store"), "--", "true"])
    check(rc == 2 and "needs --host" in err, f"--nnodes 2 without --host: exit {rc}: {err.strip()[:160]}")
    # SIGTERM to the launcher mid-load: rank 1 stops itself (SIGSTOP) as its
    # reads begin, so the load cannot end by itself; the launcher passes
    # SIGTERM on, SIGKILLs what is left after --grace, removes its temporary
    # directory and exits 128 + 15.
    tmp = tempfile.mkdtemp(prefix="hostile-launch-", dir=a.work)
    marker = f"sluice-hostile-{os.getpid()}"
    env = dict(os.environ, TMPDIR=tmp, SLUICE_TEST_FAULT="reads:1:STOP", LD_PRELOAD=a.hook, SLUICE_HOSTILE_MARK=marker)
    p = subprocess.Popen([a.launch, "-n", "2", "--grace", "2", "--comm-timeout", "120", "--", a.load, ck,
                          "--topology", "tp1,dp2,ep2", "--no-progress"], env=env, stderr=subprocess.PIPE, text=True)
    err = ""
    t_end = time.monotonic() + 120
    while time.monotonic() < t_end:   # wait for the fault to fire (rank 1 is stopped)
        line = p.stderr.readline()
        err += line
        if "raises signal" in line or not line:
            break
    ranks = [int(x) for x in os.listdir("/proc") if x.isdigit() and _has_mark(int(x), marker)]
    check(len(ranks) >= 2, f"the launcher's ranks are running ({len(ranks)} found)")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rest = p.communicate(timeout=60)[1]
    took = time.monotonic() - t0
    err += rest
    check(p.returncode == 128 + signal.SIGTERM, f"sluice-launch exits {p.returncode} (want 143) {took:.1f} s after SIGTERM")
    check("stopped by SIGTERM" in err, "it names the signal: " + " | ".join(l for l in err.splitlines() if "sluice-launch" in l))
    check(took < 2 + 10, f"every rank ended within the grace period ({took:.1f} s, grace 2 s)")
    time.sleep(0.2)
    left = [r for r in ranks if os.path.exists(f"/proc/{r}") and _state(r) != "Z"]
    check(not left, f"no rank left running: {left}")
    check(os.listdir(tmp) == [], f"the launcher's temporary directory is gone: {os.listdir(tmp)}")


def _has_mark(pid, marker):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker.encode() in f.read() and pid != os.getpid()
    except OSError:
        return False


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["files", "s3", "launch"])
    ap.add_argument("--load")
    ap.add_argument("--launch")
    ap.add_argument("--gen")
    ap.add_argument("--work", required=True)
    ap.add_argument("--hook", default="")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    {"files": files, "s3": s3, "launch": launch}[a.mode](a)
    if FAILURES:
        print(f"hostile {a.mode}: {len(FAILURES)} failed")
        sys.exit(1)
    print(f"hostile {a.mode}: passed")


if __name__ == "__main__":
    main()
