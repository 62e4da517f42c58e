"""load_into: into preallocated CPU tensors, checked first."""
import pytest
import torch

import sluice

from conftest import sha256


def _empty_like(info):
    return torch.empty(sluice.arrival_shape(info.dtype, info.shape), dtype=sluice.as_torch_dtype(info.dtype))


def test_load_into_fills_every_destination_exactly(medium):
    path, digests = medium
    ck = sluice.open(path)
    dst = {t.name: _empty_like(t) for t in ck.tensors}
    ptrs = {n: t.data_ptr() for n, t in dst.items()}
    stats = sluice.load_into(ck, dst, staging="8MiB", max_read="1MiB")
    for name, t in dst.items():
        assert t.data_ptr() == ptrs[name]  # in place
        assert sha256(t) == digests[name][2], name
    assert stats["tensors"] == len(dst) and stats["bytes_read"] == ck.tensor_bytes


def test_load_into_a_subset_reads_only_those(medium):
    path, digests = medium
    ck = sluice.open(path)
    some = [t for t in ck.tensors if ".mlp.experts.1." in t.name]
    dst = {t.name: _empty_like(t) for t in some}
    stats = sluice.load_into(ck, dst)
    assert stats["tensors"] == len(some) and stats["tensor_bytes"] == sum(t.nbytes for t in some)
    for name, t in dst.items():
        assert sha256(t) == digests[name][2]


def test_load_into_prefault_is_a_knob_with_a_threshold(medium):
    path, digests = medium
    ck = sluice.open(path)
    for prefault in (True, False):
        dst = {t.name: _empty_like(t) for t in ck.tensors}
        stats = sluice.load_into(ck, dst, staging="8MiB", max_read="1MiB", prefault=prefault)
        # Off, or on below 64 MiB of direct destinations (this checkpoint is 24 MiB): no prefaulter ran.
        assert stats["prefaulted_bytes"] == 0, prefault
        for name, t in dst.items():
            assert sha256(t) == digests[name][2], name


def test_wrong_destinations_are_config_errors_naming_the_tensor(small):
    path, _ = small
    ck = sluice.open(path)
    t = next(x for x in ck.tensors if x.dtype == "BF16" and len(x.shape) == 2)
    good = _empty_like(t)
    with pytest.raises(sluice.ConfigError, match=rf"'{t.name}' has shape .*destination \[1, 2\]"):
        sluice.load_into(ck, {t.name: torch.empty(1, 2, dtype=torch.bfloat16)})
    with pytest.raises(sluice.ConfigError, match=rf"'{t.name}' is BF16 .* destination is torch.float32"):
        sluice.load_into(ck, {t.name: good.float()})
    with pytest.raises(sluice.ConfigError, match="not contiguous"):
        sluice.load_into(ck, {t.name: torch.empty(list(reversed(t.shape)), dtype=torch.bfloat16).t()})
    with pytest.raises(sluice.ConfigError, match="has no tensor 'no.such.tensor'"):
        sluice.load_into(ck, {"no.such.tensor": good})
    with pytest.raises(sluice.ConfigError, match="not a torch.Tensor"):
        sluice.load_into(ck, {t.name: bytearray(t.nbytes)})
    assert torch.count_nonzero(good.view(torch.int16)) >= 0  # untouched and still usable
