"""Memory kept between loads: a reload reuses the staging pool and the buffers
of large tensors the caller dropped, and never anything a caller still holds."""
import sluice

from conftest import sha256

MiB = 1 << 20
OPTS = dict(staging="8MiB", max_read="1MiB", queue_depth=2, map_cached=False)  # buffers of their own, not page-cache views


def large(t):
    return t.numel() * t.element_size() > MiB  # read straight into a buffer of its own


def test_a_reload_reuses_the_staging_pool_and_the_dropped_tensors_buffers(medium):
    path, digests = medium
    sluice.release_memory()
    before = sluice.memory_stats()
    it = sluice.iter_weights(path, **OPTS)
    n_large = sum(1 for _, t in it if large(t))  # every tensor dropped at once
    assert n_large > 0
    pool_bytes = it.staging_region()[1]  # the budget's staging part (the rest holds the tensors larger than a slot)
    assert pool_bytes == it.stats["stream"]["pool_bytes"] and pool_bytes >= 8 * MiB // 2 - 2 * MiB
    del it  # the stream goes: its pool is kept for the next load
    kept = sluice.memory_stats()
    assert kept["idle_pool_bytes"] == pool_bytes and kept["idle_buffer_bytes"] > 0
    for name, t in sluice.iter_weights(path, **OPTS):
        assert sha256(t) == digests[name][2], name
    after = sluice.memory_stats()
    assert after["reused_pools"] == before["reused_pools"] + 1
    assert after["reused_buffers"] >= before["reused_buffers"] + 1
    sluice.release_memory()
    assert sluice.memory_stats()["idle_buffer_bytes"] == 0 and sluice.memory_stats()["idle_pool_bytes"] == 0


def test_tensors_held_across_loads_are_never_handed_out_again(medium):
    path, digests = medium
    sluice.release_memory()
    held = {name: t for name, t in sluice.iter_weights(path, **OPTS)}  # copies out once the pool runs dry
    ptrs = {t.data_ptr() for t in held.values() if t.numel()}
    reused = sluice.memory_stats()["reused_pools"]
    second = {}
    for name, t in sluice.iter_weights(path, **OPTS):
        if t.numel():
            assert t.data_ptr() not in ptrs, name  # not a buffer or slot the first load's tensors still use
        second[name] = sha256(t)
    # Slots still held by the first load's tensors: the pool was not reused.
    assert sluice.memory_stats()["reused_pools"] == reused
    for name, t in held.items():
        assert sha256(t) == digests[name][2], name
        assert second[name] == digests[name][2], name
