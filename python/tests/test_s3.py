"""sluice.open / iter_weights from S3 (moto with SigV4 checking, started by scripts/test.sh: SLUICE_S3_ENDPOINT
and the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY pair it generated)."""
import os
import uuid

import pytest

import sluice

from conftest import sha256

ENDPOINT = os.environ.get("SLUICE_S3_ENDPOINT")
pytestmark = pytest.mark.skipif(not ENDPOINT or not sluice._sluice.has_s3,
                                reason="no S3 test server (SLUICE_S3_ENDPOINT) or no s3 component")


@pytest.fixture
def bucket(small, monkeypatch):
    import boto3
    for k, v in {"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": ENDPOINT}.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", endpoint_url=ENDPOINT, region_name="us-east-1")
    name = f"py-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    path, _ = small
    for f in os.listdir(path):
        s3.upload_file(os.path.join(path, f), name, f"ck/{f}")
    return name


def test_an_s3_checkpoint_streams_the_same_bytes(bucket, small):
    _, digests = small
    ck = sluice.open(f"s3://{bucket}/ck/")
    assert ck.location.startswith("s3://") and len(ck) == len(digests)
    it = sluice.iter_weights(ck, staging="16MiB", max_read="1MiB")
    for name, t in it:
        assert sha256(t) == digests[name][2], name
    assert it.stats["tensors"] == len(digests) and it.stats["bytes_read"] >= ck.tensor_bytes


def test_cache_a_second_open_and_stream_reads_from_the_cache_only(bucket, small, tmp_path):
    """cache=: the first load fetches and writes the blocks, the second reads
    them back verified (nothing fetched), the same bytes; the stats say so."""
    _, digests = small
    cache = tmp_path / "cache"

    def stream():
        before = sluice.cache_stats() or {}
        ck = sluice.open(f"s3://{bucket}/ck/", cache=cache)
        it = sluice.iter_weights(ck, staging="16MiB", max_read="1MiB")
        for name, t in it:
            assert sha256(t) == digests[name][2], name
        after = sluice.cache_stats()
        return {k: after[k] - before.get(k, 0) for k in ("hit_bytes", "fetched_bytes", "bad_blocks")}, it.stats

    first, _ = stream()
    assert first["fetched_bytes"] > 0
    assert oct(os.stat(cache).st_mode & 0o777) == "0o700"
    second, stats = stream()
    assert second["fetched_bytes"] == 0 and second["bad_blocks"] == 0 and second["hit_bytes"] > 0
    assert stats["cache"]["fetched_bytes"] == 0 and stats["cache"]["hit_bytes"] >= stats["bytes_read"]
    assert sluice.cache_stats()["dir"] == str(cache)


def test_cache_refuses_a_directory_others_can_reach_and_a_local_path(bucket, small, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(sluice.ConfigError) as e:
        sluice.open(f"s3://{bucket}/ck/", cache=open_dir)
    assert str(open_dir) in str(e.value) and "chmod 700" in str(e.value)
    with pytest.raises(sluice.ConfigError) as e:
        sluice.open(small[0], cache=tmp_path / "c")
    assert "s3://" in str(e.value)


def test_a_missing_s3_prefix_is_a_typed_exception(bucket):
    with pytest.raises(sluice.Error) as e:
        sluice.open(f"s3://{bucket}/nothing-here/")
    assert "nothing-here" in str(e.value)


def test_a_distributed_load_from_s3_reads_each_byte_through_the_s3_catalog(bucket, small, monkeypatch):
    # One rank (no torchrun environment): the distributed driver over comm::local,
    # its slices read by the checkpoint's own S3 catalog (range GETs).
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    _, digests = small
    ck = sluice.open(f"s3://{bucket}/ck/")
    it = sluice.iter_weights(ck, topology="tp1,dp1,ep1", offload="shared-cooperative", staging="16MiB",
                             max_read="1MiB")
    seen = {name: sha256(t) for name, t in it}
    assert seen == {n: d[2] for n, d in digests.items()}
    assert it.stats["bytes_read"] == ck.tensor_bytes  # each byte once
    assert it.stats["requests"] > 0
