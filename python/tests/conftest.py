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
