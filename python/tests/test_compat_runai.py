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
