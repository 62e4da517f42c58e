#!/usr/bin/env python3
"""A toy DeepSeek-like engine over sluice: build the model from the checkpoint's
metadata, load it through iter_weights with an expert-parallel weight loader
(it declines the routed experts it does not own), record the load contract,
then reload an updated checkpoint layer by layer through a ReloadSession.

    PYTHONPATH=build/release/python .venv/bin/python examples/python/engine.py CKPT [--update CKPT2] [--ep-size 2 --ep-rank 0]
"""
import argparse
import re
import sys

import torch
from torch import nn

import sluice

EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(.*)$")
QKV = re.compile(r"^(.*\.self_attn)\.([qkv])_proj\.weight$")


def _param(info):
    return nn.Parameter(torch.empty(sluice.arrival_shape(info.dtype, info.shape), dtype=sluice.as_torch_dtype(info.dtype)),
                        requires_grad=False)


class ToyDeepSeek(nn.Module):
    """Fused q/k/v attention, shared and routed experts (EP), Engram-like tables,
    everything else a parameter of its own name."""

    def __init__(self, ck, ep_size=1, ep_rank=0):
        super().__init__()
        self.ep_size, self.ep_rank = ep_size, ep_rank
        self.params = nn.ParameterDict()
        self.qkv_rows = {}   # fused destination -> {shard: (row offset, rows)}
        qkv = {}
        for t in ck.tensors:
            m, q = EXPERT.match(t.name), QKV.match(t.name)
            if m and int(m.group(2)) % ep_size != ep_rank:
                continue  # another EP rank's expert: no memory here
            if q and len(t.shape) == 2:
                qkv.setdefault(q.group(1) + ".qkv_proj.weight", []).append((q.group(2), t))
                continue
            self.params[self.key(t.name)] = _param(t)
        for dest, parts in qkv.items():
            rows, off = {}, 0
            for shard, t in sorted(parts, key=lambda p: "qkv".index(p[0])):
                rows[shard] = (off, t.shape[0])
                off += t.shape[0]
            t0 = parts[0][1]
            self.params[self.key(dest)] = nn.Parameter(
                torch.empty(off, t0.shape[1], dtype=sluice.as_torch_dtype(t0.dtype)), requires_grad=False)
            self.qkv_rows[dest] = rows

    @staticmethod
    def key(name):
        return name.replace(".", "__")

    def load_weight(self, name, tensor, log):
        """The engine's weight loader: returns False for a tensor this rank does not keep."""
        m, q = EXPERT.match(name), QKV.match(name)
        if m and int(m.group(2)) % self.ep_size != self.ep_rank:
            return False
        if tensor.device.type == "meta":  # a probe (Recorder never offers another rank's placeholder): record what would be applied
            pass
        if q and q.group(1) + ".qkv_proj.weight" in self.qkv_rows:
            dest = q.group(1) + ".qkv_proj.weight"
            off, rows = self.qkv_rows[dest][q.group(2)]
            if tensor.device.type != "meta":
                self.params[self.key(dest)].data[off:off + rows].copy_(tensor)
            log.record(dest, shard=q.group(2))
            return True
        if tensor.device.type != "meta":
            self.params[self.key(name)].data.copy_(tensor)
        log.record(name, **({"expert": int(m.group(2))} if m else {}))
        return True

    def engram_lookup(self, table, ids):
        """An Engram-like table lookup (F8 bytes scaled per 128 columns), as a forward would do."""
        t = self.params[self.key(f"model.engram.{table}.table")].data[ids].float()
        s = self.params[self.key(f"model.engram.{table}.scale")].data[ids]
        return t * s.repeat_interleave(128, dim=1)[:, : t.shape[1]]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--update", help="an updated checkpoint to reload layer by layer")
    p.add_argument("--drop", help="reload the update without this tensor (the reload must fail naming it)")
    p.add_argument("--ep-size", type=int, default=2)
    p.add_argument("--ep-rank", type=int, default=0)
    p.add_argument("--staging", default="1GiB")
    p.add_argument("--contract-out", help="write the load contract's JSON here")
    a = p.parse_args()

    ck = sluice.open(a.checkpoint)
    model = ToyDeepSeek(ck, a.ep_size, a.ep_rank)
    rec = sluice.Recorder(model.load_weight)
    with sluice.iter_weights(ck, staging=a.staging) as it:
        for name, tensor in it:
            rec(name, tensor)
    contract = rec.freeze()
    print(f"loaded {it.stats['tensors']} tensors ({it.stats['bytes_read']} bytes read), "
          f"{len(contract)} applications in {len(contract.layers())} layer groups", file=sys.stderr)
    if a.contract_out:
        with open(a.contract_out, "w") as f:
            f.write(contract.to_json(2))
    if a.update:
        update = sluice.open(a.update, select=(lambda n: n != a.drop) if a.drop else None)
        published, warnings = [], []
        session = sluice.ReloadSession(contract, model.load_weight, on_publish=lambda layer, keys: published.append(layer),
                                       warn=warnings.append)  # e.g. experts of other EP ranks arriving late: dropped
        session.reload(update, staging=a.staging)  # raises sluice.ContractError naming missing keys
        print(f"reloaded: {len(published)} layer groups published, {len(warnings)} extras dropped", file=sys.stderr)
    return model


if __name__ == "__main__":
    try:
        main()
    except sluice.Error as e:
        print(f"engine: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
