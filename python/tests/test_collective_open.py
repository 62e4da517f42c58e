"""sluice.open(..., collective=True): 4 ranks with torchrun's environment open
one checkpoint together, rank 0 reading the index and headers from storage and
the others replaying what it read (checkpoint::open(location, communicator)).

- The other ranks read no metadata bytes (the catalog's count, which a local
  open of the same checkpoint shows to be the index plus every header), and
  the load from the replayed checkpoint gets every tensor bitwise right.
- A shard whose header is cut short fails every rank with the FormatError a
  local open raises, naming that file: rank 0 reads it, the others replay
  what its storage answered.
- A rank that fails alone while opening (here its select callable raises)
  raises its own error, and every other rank raises DistributedError naming it.
"""
import os
import struct

import pytest

import sluice
from conftest import HERE, PYTHON, generate, run_ranks as _run_ranks

WORLD = 4


def run_ranks(out_dir, path, mode, fail_rank=None):
    args = [PYTHON, os.path.join(HERE, "open_worker.py"), str(path), str(out_dir), mode]
    if fail_rank is not None:
        args.append(str(fail_rank))
    return _run_ranks(WORLD, args, out_dir, timeout=600)


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("copen") / "ck"
    digests = generate(d, "--size", "4MiB", "--shard-size", "1MiB")
    return d, digests


def test_only_rank_0_reads_the_headers_and_every_rank_loads_from_the_replayed_checkpoint(ck, tmp_path):
    path, digests = ck
    local = sluice.open(path)
    assert len(local.shards) >= 3 and local.header_bytes_read > 0
    res = run_ranks(tmp_path, path, "load")
    for r in res:
        assert "error" not in r, r
        assert r["tensors"] == [t.name for t in local.tensors], r["rank"]
        assert r["digests"] == {n: d[2] for n, d in digests.items()}, r["rank"]
    assert res[0]["header_bytes_read"] == local.header_bytes_read
    assert [r["header_bytes_read"] for r in res[1:]] == [0] * (WORLD - 1)
    assert [r["stats"]["header_bytes_read"] for r in res[1:]] == [0] * (WORLD - 1)
    assert sum(r["stats"]["bytes_read"] for r in res) == local.tensor_bytes  # read once across the ranks


def test_a_shard_with_a_cut_header_fails_every_rank_naming_the_file(ck, tmp_path):
    import shutil
    path, _ = ck
    bad = tmp_path / "cut"
    shutil.copytree(path, bad)
    victim = bad / sluice.open(bad).shards[1]
    with open(victim, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    os.truncate(victim, 8 + n // 2)  # the header's JSON ends half-way
    with pytest.raises(sluice.FormatError, match="header-length") as local:
        sluice.open(bad)  # what a local open says: the header runs past the end of the file
    assert local.value.file == str(victim)
    res = run_ranks(tmp_path, bad, "open")
    for r in res:  # rank 0 read it, the others replayed its reads: the same typed error everywhere
        assert "error" in r, r["rank"]
        kind, msg, file, _ = r["error"]
        assert (kind, msg, file) == ("FormatError", str(local.value), str(victim)), (r["rank"], r["error"])


def test_a_rank_failing_alone_while_opening_fails_every_rank_naming_it(ck, tmp_path):
    path, _ = ck
    res = run_ranks(tmp_path, path, "open", fail_rank=2)
    assert res[2]["error"][0] == "ValueError" and "select refuses" in res[2]["error"][1]
    for r in (res[0], res[1], res[3]):
        kind, msg, _, failed = r["error"]
        assert kind == "DistributedError" and failed == 2, r
        assert "rank 2" in msg and "select refuses" in msg, r
