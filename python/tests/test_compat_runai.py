"""sluice.compat.runai against runai-model-streamer itself (0.17, in the project's
environment): the same checkpoint through both gives equal names, dtypes,
shapes and bytes; a truncated file gets the same error type from both."""
import os

import pytest
import torch

import sluice
from sluice.compat import runai as compat

from conftest import raw_bytes

runai = pytest.importorskip("runai_model_streamer")


def _stream(module, paths, **kw):
    with module.SafetensorsStreamer() as s:
        s.stream_files(paths, **kw)
        return {name: t.clone() for name, t in s.get_tensors()}


def test_every_file_streams_the_same_tensors_through_both(small):
    path, digests = small
    files = sorted(compat.list_safetensors(path))
    assert files == sorted(runai.list_safetensors(path)) and len(files) > 1
    ours, theirs = _stream(compat, files), _stream(runai, files)
    assert sorted(ours) == sorted(theirs) == sorted(digests)
    for name, t in ours.items():
        ref = theirs[name]
        assert t.dtype == ref.dtype and list(t.shape) == list(ref.shape), name
        assert raw_bytes(t) == raw_bytes(ref), name


def test_one_file_with_tensor_names_gives_just_those(small):
    path, _ = small
    f = sorted(compat.list_safetensors(path))[0]
    with runai.SafetensorsStreamer() as s:
        s.stream_file(f)
        names = sorted(n for n, _ in s.get_tensors())[:3]
    ours = _stream(compat, [f], tensor_names=names)
    theirs = _stream(runai, [f], tensor_names=names)
    assert sorted(ours) == sorted(theirs) == names
    with pytest.raises(ValueError, match="not found"):
        _stream(compat, [f], tensor_names=names + ["no.such.tensor"])
    with pytest.raises(ValueError, match="single str"):
        _stream(compat, [f], tensor_names=names[0])


def test_tensors_kept_by_the_caller_keep_their_bytes(small):
    path, digests = small
    from conftest import sha256
    with compat.SafetensorsStreamer() as s:
        s.stream_files(sorted(compat.list_safetensors(path)))
        kept = dict(s.get_tensors())  # every tensor kept: no clone needed
    assert {n: sha256(t) for n, t in kept.items()} == {n: d[2] for n, d in digests.items()}


def test_a_truncated_file_raises_the_same_error_type_as_runai(tmp_path, small):
    path, _ = small
    f = sorted(compat.list_safetensors(path))[0]
    data = open(f, "rb").read()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError) as theirs:
        _stream(runai, [str(bad)])
    with pytest.raises(ValueError) as ours:
        _stream(compat, [str(bad)])
    assert isinstance(ours.value, sluice.Error), type(ours.value).__mro__
    assert "truncated.safetensors" in str(ours.value)
    assert type(theirs.value) is ValueError


def test_is_distributed_gives_every_rank_every_tensor_read_once_across_the_ranks(small, tmp_path):
    """Two ranks (torchrun's environment, a Gloo group, no LOCAL_WORLD_SIZE):
    each gets every tensor with Run:ai's own distributed mode's names, dtypes,
    shapes and bytes; sluice reads each byte from storage once across the
    ranks, and divides the node's memory limit by the group's ranks on this host."""
    import sys
    from conftest import HERE, run_ranks
    path, digests = small
    world, limit = 2, 64 << 20
    # Without LOCAL_WORLD_SIZE / LOCAL_RANK: the share is counted from the group's hosts, as Run:ai counts it.
    res = run_ranks(world, [sys.executable, os.path.join(HERE, "compat_runai_worker.py"), path, str(tmp_path)], tmp_path,
                    env={"RUNAI_STREAMER_DIST": "1", "RUNAI_STREAMER_MEMORY_LIMIT": str(limit),
                         "RUNAI_STREAMER_LOG_LEVEL": "WARNING", "RUNAI_STREAMER_DIST_BUFFER_MIN_BYTESIZE": str(8 << 20)},
                    drop_env=("LOCAL_WORLD_SIZE", "LOCAL_RANK"), timeout=300)
    for r in res:
        assert "error" not in r, r["error"]
        assert r["distributed"]
        assert r["ours"] == r["theirs"], r["rank"]
        assert {n: v[2] for n, v in r["ours"].items()} == {n: d[2] for n, d in digests.items()}
        assert r["staging"] == [limit // world]
    assert sum(r["bytes_read"] for r in res) == res[0]["tensor_bytes"] > 0


def test_is_distributed_without_a_process_group_loads_locally_as_runai_does(small):
    path, digests = small
    files = sorted(compat.list_safetensors(path))
    ours = _stream(compat, files, is_distributed=True)
    theirs = _stream(runai, files, is_distributed=True)
    assert sorted(ours) == sorted(theirs) == sorted(digests)


def test_the_memory_limit_is_a_node_total_divided_by_the_local_ranks(monkeypatch):
    monkeypatch.setenv("RUNAI_STREAMER_MEMORY_LIMIT", str(8 << 30))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert compat._staging() == 2 << 30            # torchrun's count of the ranks on this node
    assert compat._staging(local_ranks=8) == 1 << 30  # a distributed load: the group's ranks on this host
    monkeypatch.setenv("RUNAI_STREAMER_MEMORY_LIMIT", "-1")  # Run:ai's "unlimited": sluice's default per node
    assert compat._staging() == compat._DEFAULT_NODE_LIMIT // 4
    monkeypatch.setenv("RUNAI_STREAMER_MEMORY_LIMIT", "1000")
    assert compat._staging() == 1 << 20               # the floor: one MiB
    monkeypatch.delenv("RUNAI_STREAMER_MEMORY_LIMIT")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert compat._staging() == 40_000_000_000        # Run:ai's default, 40 GB, one rank
