"""The load contract from Python: Recorder, freeze + JSON, probe, ReloadSession."""
import pytest
import torch

import sluice

from conftest import generate, sha256


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("contract")
    a, b = d / "v1", d / "v2"
    return str(a), generate(a), str(b), generate(b, "--seed", "2")


def expert_loader(store, owned={0, 1}):
    """An EP rank's loader: declines the routed experts it does not own; fused q/k/v are logged."""
    def load(name, tensor, log):
        if ".mlp.experts." in name:
            e = int(name.split(".mlp.experts.")[1].split(".")[0])
            if e not in owned:
                return False
            log.record(name.replace(f".experts.{e}.", ".experts."), expert=e)
        elif any(f"self_attn.{p}_proj" in name for p in "qkv"):
            shard = name.split("self_attn.")[1][0]
            log.record(name.replace(f"{shard}_proj", "qkv_proj"), shard=shard)
        else:
            log.record(name)
        if tensor.device.type != "meta":
            # (the generator's BOOL bytes are not all 0/1: a bool clone would normalise them)
            store[name] = (tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor).clone()
    return load


def test_recorder_freezes_a_contract_that_round_trips_through_json(pair):
    a, digests, _, _ = pair
    store = {}
    rec = sluice.Recorder(expert_loader(store))
    for name, t in sluice.iter_weights(a):
        rec(name, t)
    c = rec.freeze()
    assert len(c) > 0 and c.bytes > 0
    assert sluice.Contract.from_json(c.to_json()) == c
    layers = c.layers()
    assert None in layers and 0 in layers  # non-layer tensors and layer 0
    keys = [k for ks in layers.values() for k in ks]
    assert any(sel == {"expert": 1} for _, _, sel in keys)
    assert not any(sel.get("expert") == 2 for _, _, sel in keys)  # declined: not recorded
    assert any(dest.endswith("qkv_proj.weight") and sel == {"shard": "k"} for _, dest, sel in keys)
    for name, t in store.items():
        assert sha256(t) == digests[name][2]
    with pytest.raises(sluice.ContractError):
        sluice.Contract.from_json('{"version": 2}')


def test_probe_reads_headers_only_and_gives_the_same_contract(pair):
    a, _, _, _ = pair
    store = {}
    rec = sluice.Recorder(expert_loader(store))
    for name, t in sluice.iter_weights(a):
        rec(name, t)
    r = sluice.probe(a, expert_loader({}))
    assert r["bytes_read"] == 0 and r["header_bytes_read"] > 0
    assert r["contract"] == rec.freeze()
    assert r["accepted"] < r["tensors"]


def test_reload_session_publishes_every_layer_with_the_new_bytes(pair):
    a, _, b, digests_b = pair
    rec = sluice.Recorder(expert_loader({}))
    for name, t in sluice.iter_weights(a):
        rec(name, t)
    contract = rec.freeze()
    store, published = {}, []
    s = sluice.ReloadSession(contract, expert_loader(store), on_publish=lambda layer, keys: published.append(layer))
    s.reload(b)
    assert sorted(published, key=lambda x: -1 if x is None else x) == sorted(contract.layers(), key=lambda x: -1 if x is None else x)
    assert store and all(sha256(t) == digests_b[n][2] for n, t in store.items())
    assert s.stats["layers_published"] == len(contract.layers())


def test_a_reload_missing_a_key_raises_naming_it(pair):
    a, _, b, _ = pair
    rec = sluice.Recorder(expert_loader({}))
    for name, t in sluice.iter_weights(a):
        rec(name, t)
    victim = "model.layers.1.self_attn.k_proj.weight"
    partial = sluice.open(b, select=lambda n: n != victim)
    s = sluice.ReloadSession(rec.freeze(), expert_loader({}), warn=lambda w: None)
    with pytest.raises(sluice.ContractError, match=victim.replace(".", r"\.")) as e:
        s.reload(partial)
    assert "layer 1" in str(e.value)


def test_push_feeds_a_session_tensor_by_tensor(pair):
    a, digests, _, _ = pair
    names = [n for n in digests if n.startswith("model.layers.0.")]
    rec = sluice.Recorder(lambda name, t: None)
    for n in names:
        rec(n, torch.zeros(1))
    got = {}
    s = sluice.ReloadSession(rec.freeze(), lambda name, t: got.setdefault(name, t.clone()))
    for n in names:
        s.push(n, torch.full((3,), 7.0))
    assert s.finish() is True
    assert sorted(got) == sorted(names) and all(torch.equal(t, torch.full((3,), 7.0)) for t in got.values())
