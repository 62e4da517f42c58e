"""Fixtures of the Python package's tests (run by ctest: python/tests/CMakeLists.txt).

SLUICE_BUILD_DIR names the build tree (gen-checkpoint, sluice-load); the
package itself comes from PYTHONPATH (the build tree's python/ folder).
"""
import hashlib
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_DIR = os.environ.get("SLUICE_BUILD_DIR", os.path.join(SOURCE_DIR, "build", "release"))
PYTHON = sys.executable


def _torch_pin():
    with open(os.path.join(SOURCE_DIR, "python", "requirements.lock")) as f:
        for line in f:
            if line.startswith("torch=="):
                return line.split("==")[1].split()[0]
    raise RuntimeError("python/requirements.lock pins no torch")


def pytest_sessionstart(session):
    """The tests run under the pinned torch or not at all (never a silent fallback)."""
    pin = os.environ.get("SLUICE_TORCH_PIN") or _torch_pin()
    if torch.__version__.split("+")[0] != pin:
        pytest.exit(f"torch {torch.__version__} at {torch.__file__}, but python/requirements.lock pins {pin}: "
                    "run under the project's environment (.venv, scripts/python-env.sh)", returncode=3)


def tool(name):
    path = os.path.join(BUILD_DIR, "examples", name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built")
    return path


def generate(path, *args):
    """Writes a generated checkpoint at `path`; returns {name: (dtype, shape, sha256)}."""
    digests = str(path) + ".digests"
    subprocess.run([tool("gen-checkpoint"), str(path), "--digests", digests, *args], check=True,
                   stdout=subprocess.DEVNULL)
    out = {}
    with open(digests) as f:
        for line in f:
            name, dtype, shape, sha = line.rstrip("\n").split("\t")
            dims = [int(x) for x in shape.strip("[]").split(",") if x]
            out[name] = (dtype, dims, sha)
    return out


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, argv, out_dir, env=None, drop_env=(), timeout=900):
    """Starts `world` processes of `argv` with torchrun's environment (RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; `env`
    added, `drop_env` removed), waits for them, and returns each rank's result,
    the JSON it wrote to out_dir/rank-N.json (a rank that wrote none fails the
    test with its output). `argv` may be a function of the rank."""
    import json
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env or {}))
        for k in drop_env:
            e.pop(k, None)
        args = argv(r) if callable(argv) else argv
        procs.append(subprocess.Popen(args, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    results = []
    for r in range(world):
        f = os.path.join(str(out_dir), f"rank-{r}.json")
        assert os.path.exists(f), f"rank {r} wrote no result (exit {procs[r].returncode}):\n{outs[r]}"
        with open(f) as fh:
            results.append(json.load(fh))
    return results


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes, whatever its dtype (meta tensors have none)."""
    if t.numel() == 0:
        return b""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(raw_bytes(t)).hexdigest()


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """The generator's small model (every dtype it writes, odd tensors)."""
    d = tmp_path_factory.mktemp("ck") / "small"
    return str(d), generate(d)


@pytest.fixture(scope="session")
def medium(tmp_path_factory):
    """A 24 MiB checkpoint: several staging slots' worth at small slot sizes."""
    d = tmp_path_factory.mktemp("ck") / "medium"
    return str(d), generate(d, "--size", "24MiB")
