"""HF safetensors, the format's reference library, as an independent oracle.

1. The same checkpoints read through `safetensors.safe_open` and through sluice
   give the same names, and every tensor the same dtype, shape and bytes.
2. The bad-input corpus (tests/data/bad) through both: "rejects" means, for
   sluice, that `sluice.open` or the load raises; for HF, that `safe_open` or any
   `get_tensor` raises (for a checkpoint directory: those of every shard its
   index names, each name from the shard the index names, the way an engine's
   HF loader reads one). Both verdicts are
   printed for every case; a difference fails unless DELIBERATE lists it with
   its reason, and a listed difference that no longer differs fails too.
"""
import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import sluice

from conftest import SOURCE_DIR, raw_bytes

BAD = os.path.join(SOURCE_DIR, "tests", "data", "bad")

# Cases where sluice rejects what HF accepts, on purpose (never the other way).
DELIBERATE = {
    # Header rules stricter than HF safetensors 0.8's.
    "header-leading-space": "sluice requires the header JSON to start at its first byte ('{')",
    "padding-newline": "sluice allows only trailing spaces as header padding (the format's rule), HF any whitespace",
    "tensor-unknown-field": "sluice rejects tensor entries with fields the format does not define",
    # Index rules: HF reads tensors by name through the weight_map and checks nothing else of the index.
    "index-tensor-not-in-index": "sluice requires every shard tensor to be in the weight_map (a stale index)",
    "index-tensor-in-other-shard": "sluice requires every shard tensor to be indexed to that shard (a stale index)",
    "index-total-size-mismatch": "sluice checks metadata.total_size against the shards' tensor bytes",
    "index-total-size-not-number": "sluice requires metadata.total_size to be a number",
    "index-duplicate-tensor": "sluice rejects an index that lists a name twice (JSON keeps the last one)",
}


def _tensors_hf(path):
    out = {}
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out


def _tensors_sluice(path):
    # The bytes as they arrive (a clone would normalise BOOL bytes other than 0 and 1).
    return {name: (t.dtype, list(t.shape), raw_bytes(t))
            for name, t in sluice.iter_weights(path, staging="16MiB", max_read="1MiB")}


def _shards(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return [os.path.join(directory, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".safetensors"))


@pytest.mark.parametrize("which", ["small", "medium"])
def test_every_generated_tensor_equals_hf_safetensors_in_dtype_shape_and_bytes(which, request):
    path, digests = request.getfixturevalue(which)
    ref = {}
    for shard in _shards(path):
        ref.update(_tensors_hf(shard))
    ours = _tensors_sluice(path)
    assert sorted(ours) == sorted(ref) == sorted(digests)
    for name, (dtype, shape, data) in ours.items():
        assert dtype == ref[name].dtype, name
        assert shape == list(ref[name].shape), name
        assert data == raw_bytes(ref[name]), name


def test_a_file_hf_writes_with_every_torch_dtype_reads_back_identically(tmp_path):
    g = torch.Generator().manual_seed(7)
    bits = torch.randint(0, 256, (6 * 5 * 8,), dtype=torch.uint8, generator=g)
    tensors = {}
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
               torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64,
               torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu):
        size = torch.empty((), dtype=dt).element_size()
        raw = bits[: 6 * 5 * size].clone()
        if dt == torch.bool:
            raw = raw % 2
        tensors[f"t.{str(dt).removeprefix('torch.')}"] = raw.view(dt).reshape(6, 5)
    # FP4 in pairs (NVFP4/MXFP4 weights): HF writes "F4" with the last dimension
    # doubled and reads it back as float4_e2m1fn_x2 [6, 5]; sluice gives the same.
    tensors["t.float4_e2m1fn_x2"] = bits[:30].clone().view(torch.float4_e2m1fn_x2).reshape(6, 5)
    tensors["t.scalar"] = torch.tensor(3.5)
    tensors["t.empty"] = torch.empty(0, 4, dtype=torch.bfloat16)
    path = str(tmp_path / "all.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    ref, ours = _tensors_hf(path), _tensors_sluice(path)
    assert sorted(ours) == sorted(ref) == sorted(tensors)
    for name in tensors:
        dtype, shape, data = ours[name]
        assert (dtype, shape, data) == (ref[name].dtype, list(ref[name].shape), raw_bytes(ref[name])), name


def _cases():
    with open(os.path.join(BAD, "cases.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    return [(r[0], os.path.join(BAD, r[2])) for r in rows]


def _verdict_hf(path):
    try:
        index = os.path.join(path, "model.safetensors.index.json") if os.path.isdir(path) else None
        if index and os.path.exists(index):
            # As an engine's HF loader reads a sharded checkpoint: each name of the
            # weight_map from the shard it names.
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            for name, shard in weight_map.items():
                with safe_open(os.path.join(path, shard), framework="pt") as st:
                    st.get_tensor(name)
        else:
            for shard in (_shards(path) if os.path.isdir(path) else [path]):
                _tensors_hf(shard)
        return "accepts"
    except Exception as e:  # noqa: BLE001 - any failure is a rejection
        return f"rejects ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"


def _verdict_sluice(path):
    try:
        ck = sluice.open(path)
        for _ in sluice.iter_weights(ck, staging="16MiB"):
            pass
        return "accepts"
    except sluice.Error as e:
        return f"rejects ({type(e).__name__}: {str(e).splitlines()[0][:80]})"


def test_the_bad_corpus_gets_the_same_verdicts_from_sluice_and_hf_safetensors_but_for_the_listed_ones(capsys):
    cases = _cases()
    assert len(cases) >= 50
    unexpected, stale = [], []
    with capsys.disabled():
        print(f"\n{'case':34} {'sluice':50} hf safetensors")
        for case, path in cases:
            ours, ref = _verdict_sluice(path), _verdict_hf(path)
            differ = ours.split()[0] != ref.split()[0]
            print(f"{case:34} {ours[:50]:50} {ref[:60]}" + (f"   [deliberate: {DELIBERATE[case]}]" if differ and case in DELIBERATE else ""))
            if differ and case not in DELIBERATE:
                unexpected.append((case, ours, ref))
            if not differ and case in DELIBERATE:
                stale.append(case)
            if ours.startswith("accepts"):
                unexpected.append((case, "sluice accepts a file of the bad corpus", ref))
    assert not unexpected, unexpected
    assert not stale, f"listed as deliberate differences but the verdicts agree: {stale}"
