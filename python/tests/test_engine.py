"""examples/python/engine.py: the toy engine loads, reloads, and fails a reload missing a key."""
import os
import subprocess
import sys

import pytest

from conftest import PYTHON, SOURCE_DIR, generate, sha256

ENGINE = os.path.join(SOURCE_DIR, "examples", "python", "engine.py")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine")
    return str(d / "v1"), generate(d / "v1", "--size", "8MiB"), str(d / "v2"), generate(d / "v2", "--size", "8MiB", "--seed", "2")


def run_engine(monkeypatch, *argv):
    sys.path.insert(0, os.path.dirname(ENGINE))
    try:
        import engine
        monkeypatch.setattr(sys, "argv", ["engine.py", *argv])
        return engine, engine.main()
    finally:
        sys.path.pop(0)


def test_the_toy_engine_loads_then_reloads_the_update(pair, monkeypatch):
    v1, d1, v2, d2 = pair
    engine, model = run_engine(monkeypatch, v1)
    # (BOOL excluded: the generator's BOOL bytes are not 0/1, and a bool copy_ normalises them)
    plain = [n for n in d1 if engine.ToyDeepSeek.key(n) in model.params and d1[n][0] != "BOOL"]
    assert plain and all(sha256(model.params[engine.ToyDeepSeek.key(n)]) == d1[n][2] for n in plain)
    assert not any(".mlp.experts.1." in n for n in plain)  # EP rank 0 of 2 keeps even experts only
    _, model = run_engine(monkeypatch, v1, "--update", v2)
    assert all(sha256(model.params[engine.ToyDeepSeek.key(n)]) == d2[n][2] for n in plain)


def test_a_reload_missing_a_key_fails_naming_it(pair):
    v1, _, v2, _ = pair
    victim = "model.layers.1.self_attn.v_proj.weight"
    r = subprocess.run([PYTHON, ENGINE, v1, "--update", v2, "--drop", victim], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr
    assert "ContractError" in r.stderr and victim in r.stderr and "layer 1" in r.stderr


def test_the_load_example_prints_the_stats(pair):
    import json
    v1, d1, _, _ = pair
    r = subprocess.run([PYTHON, os.path.join(SOURCE_DIR, "examples", "python", "load.py"), v1, "--json", "--staging", "64MiB"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["tensors"] == len(d1) and st["bytes_read"] >= st["tensor_bytes"] > 0
    r = subprocess.run([PYTHON, os.path.join(SOURCE_DIR, "examples", "python", "load.py"), v1 + "-missing"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and r.stderr.startswith("sluice: error:")
