"""load_into: into preallocated CPU tensors, checked first."""
import pytest
import torch

import sluice

from conftest import sha256


def _empty_like(info):
    return torch.empty(sluice.arrival_shape(info.dtype, info.shape), dtype=sluice.as_torch_dtype(info.dtype, info.shape))


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


def _page_rounded(t):
    import mmap
    lo = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    hi = -(-(t.data_ptr() + t.numel() * t.element_size()) // mmap.PAGESIZE) * mmap.PAGESIZE
    return hi - lo


def test_prefault_faults_fresh_tensors_in_and_writes_nothing():
    import time
    a = torch.empty(48 << 20, dtype=torch.uint8)
    b = torch.empty(24 << 20, dtype=torch.uint8)
    a[0], b[-1] = 7, 9  # markers that must stay
    before = sha256(a), sha256(b)  # every byte (not zero everywhere: an allocator may fill fresh memory)
    whole = _page_rounded(a) + _page_rounded(b)
    pf = sluice.prefault([a, b, a[1:], torch.empty(0)], min_bytes="64MiB")  # a view of `a` is `a` again
    assert pf.started
    deadline = time.monotonic() + 120  # not a speed check: a generous bound for the thread to finish
    while pf._core.bytes < whole and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pf.stop() == whole  # each storage once, in whole pages
    assert pf.stop() == whole  # stopping again changes nothing
    assert int(a[0]) == 7 and int(b[-1]) == 9
    assert (sha256(a), sha256(b)) == before  # nothing written


def test_prefault_under_its_threshold_starts_nothing_and_stops_at_once():
    t = torch.empty(1 << 20, dtype=torch.uint8)
    with sluice.prefault([t]) as pf:  # 1 MiB, under the default 64 MiB
        assert not pf.started
    assert pf.stop() == 0
    big = torch.empty(80 << 20, dtype=torch.uint8)
    with sluice.prefault([big], min_bytes="1GiB") as pf:
        assert not pf.started
    with pytest.raises(sluice.ConfigError, match="size"):
        sluice.prefault([big], min_bytes="lots")


def test_a_prefault_stopped_early_or_dropped_leaves_its_tensors_usable():
    tensors = [torch.empty(64 << 20, dtype=torch.uint8) for _ in range(2)]
    with sluice.prefault(tensors, min_bytes=1) as pf:
        pass  # stopped at once: at most what it had done by then
    assert pf.stop() <= sum(_page_rounded(t) for t in tensors)
    pf = sluice.prefault(tensors, min_bytes=1)
    del pf  # dropped unstopped: its thread is joined before the tensors can go
    del tensors
    again = torch.zeros(64 << 20, dtype=torch.uint8)
    assert int(torch.count_nonzero(again)) == 0
