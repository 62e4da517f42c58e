"""vLLM's parallel groups as sluice's world, and the ownership its ranks'
models give: where a vLLM rank sits in sluice's order, and, from every
rank's dry run of its own model's load_weights (exchanged once over vLLM's
CPU group), which ranks take each tensor's bytes. No naming rule decides:
a Mixtral's `block_sparse_moe.experts.N`, a DeepSeek V4's `ffn.experts.E`
and another PP stage's layers are placed by what each model does with them."""
from __future__ import annotations

from typing import NamedTuple

import sluice

from . import _vllm, parts

__all__ = ["sluice_rank", "sluice_place", "exchange_ownership", "Ownership", "Peers", "Scope", "engine_scope"]


def sluice_rank(pp_rank, dp_rank, pcp_rank, tp_rank, dp, pcp, tp):
    """A vLLM rank's place in sluice's world. vLLM orders its world DP x PP x
    (PCP x) TP, sluice's plan PP x DP x TP: a PP stage is a contiguous block
    of dp*pcp*tp sluice ranks, and within it a rank's offset is its vLLM EP
    rank (dp_rank*pcp*tp + pcp_rank*tp + tp_rank, as FusedMoEParallelConfig)."""
    return pp_rank * dp * pcp * tp + (dp_rank * pcp + pcp_rank) * tp + tp_rank


def sluice_place(parallel=None, ranks=None):
    """(this rank's place in sluice's order, the world's size, its vLLM ranks
    {"pp", "dp", "tp"}) under vLLM's parallel config (default: the running
    engine's)."""
    if parallel is None:
        parallel = _vllm.current_parallel_config()
    tp, pp, dp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size, parallel.data_parallel_size
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    if ranks is None:
        ranks = _vllm.parallel_ranks(parallel)
    return sluice_rank(*ranks, dp, pcp, tp), pp * dp * pcp * tp, {"pp": ranks[0], "dp": ranks[1], "tp": ranks[3]}


def _named(rank, v, more="") -> str:
    """A sluice rank with its vLLM ranks `v` ({"dp", "pp", "tp"}) and `more`."""
    return f"rank {rank} (vLLM dp {v['dp']}, pp {v['pp']}, tp {v['tp']}{more})"


class Scope(NamedTuple):
    """The ranks one load spans: vLLM's `group` (its cpu_group carries the
    rendezvous), this rank's place in sluice's order and the count, its
    vLLM ranks, and whether it is one DP engine's own (`engine`)."""
    group: object
    rank: int
    size: int
    vllm_ranks: dict
    engine: bool


def engine_scope(parallel):
    """The Scope of this DP engine's own ranks (TP x PP of one DP rank), or
    None where the engine is this process alone."""
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    if tp * pp * pcp == 1:
        return None
    ranks = _vllm.parallel_ranks(parallel)
    group = _vllm.engine_group(parallel)
    rank = sluice_rank(ranks[0], 0, ranks[2], ranks[3], 1, pcp, tp)
    return Scope(group, rank, tp * pp * pcp, {"pp": ranks[0], "dp": ranks[1], "tp": ranks[3]}, engine=True)


class Peers:
    """Every rank of one load: sluice rank -> (vLLM ranks, host, pid),
    gathered once before anything else can fail, so that a failure names
    the rank that left by vLLM's (dp, pp, tp) as well as sluice's."""

    def __init__(self, table, space, me):
        self.table, self.space, self.me = table, space, me

    @classmethod
    def gather(cls, rank, vllm_ranks, group):
        import os
        import socket
        import torch.distributed as dist
        everyone = [None] * dist.get_world_size(group)
        from .._distributed import kernel_key
        space = kernel_key("pid")   # whose process ids this one sees (a host name may be another machine's)
        dist.all_gather_object(everyone, (rank, vllm_ranks, socket.gethostname(), os.getpid(), space), group=group)
        return cls({r: (v, h, p, s) for r, v, h, p, s in everyone}, space, rank)

    def describe(self, rank) -> str:
        v, host, pid, _ = self.table[rank]
        return _named(rank, v, f"; pid {pid} on {host}")

    def gone(self) -> list:
        """The ranks whose process this one can see (same kernel and PID
        namespace) and which has ended (a zombie counts)."""
        out = []
        for rank, (_, _, pid, space) in sorted(self.table.items()):
            if space != self.space or rank == self.me:
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        out.append(rank)
            except (FileNotFoundError, ProcessLookupError, IndexError):
                out.append(rank)
        return out

    def failure(self, e, doing):
        """`e` (raised while `doing`) as the error to raise: sluice's own
        error types keep theirs, with the vLLM ranks of the ranks it names
        (or of those found gone) added; anything else (a torch collective's
        RuntimeError) becomes a DistributedError."""
        import re
        named = sorted({int(m) for m in re.findall(r"\brank (\d+)", str(e)) if int(m) in self.table and int(m) != self.me})
        gone = self.gone()
        said = []
        if gone:
            said.append("gone: " + ", ".join(self.describe(r) for r in gone))
        rest = [r for r in named if r not in gone]
        if rest:
            said.append(", ".join(self.describe(r) for r in rest))
        extra = f" [{'; '.join(said)}]" if said else ""
        if isinstance(e, sluice.Error):
            out = type(e)(f"{e}{extra}")
            for attr in ("detail", "file", "tensor", "range", "failed_rank", "lost_rank", "phase"):
                if hasattr(e, attr):
                    setattr(out, attr, getattr(e, attr))
            return out
        return sluice.DistributedError(f"{doing} failed: {type(e).__name__}: {e}{extra}")


class Ownership:
    """What every rank's model does with each tensor of a checkpoint:
    `owners` {name: [sluice ranks whose model takes its bytes]}, `splits`
    {name: (dim, parts, {rank: part}, runs)} (the tensors the owners' copies
    let be cut: each owner gets only its block of every run, parts.choose), `stand_ins` (the names this
    rank's model calls a loader with but writes nothing from: they come as
    byte-less stand-ins, so that the call happens, at the same place in
    every rank's sequence), `direct` (the names whose copies this rank
    replays itself, outside load_weights), `unwritten` {sluice rank:
    {parameter: (bytes, of)}}, and this rank's dry run (`plan`) and place
    (`rank`)."""

    def __init__(self, owners, stand_ins, unwritten, splits=None, direct=None, plan=None, rank=None, local=None):
        self.owners, self.stand_ins, self.unwritten = owners, stand_ins, unwritten
        self.splits, self.direct = splits or {}, direct or set()
        self.plan, self.rank = plan, rank
        # name -> the one rank that takes it whole into one parameter range:
        # that rank reads it itself, straight into the parameter
        # (sluice.load_into), and the stream carries only its stand-in
        self.local = local or {}

    def mine(self) -> set:
        """The tensors this rank reads itself, straight into its parameters."""
        return {n for n, r in self.local.items() if r == self.rank}

    def bytes_unowned(self, ck) -> int:
        return sum(t.nbytes for t in ck.tensors if not self.owners.get(t.name))

    def model_owners(self, split=True) -> dict:
        """The plan's model_owners: {name: [ranks]}, or ([ranks], dim,
        parts, [part of each], runs) for a split tensor (`split`: False keeps every
        tensor whole, for a stream that goes through load_weights, and
        streams the local ones too). With `split`, a local tensor has no
        owner in the stream: its rank reads it apart."""
        out = {}
        for name, ranks in self.owners.items():
            cut = self.splits.get(name) if split else None
            if split and name in self.local:
                out[name] = []
            else:
                out[name] = (ranks, cut[0], cut[1], [cut[2][r] for r in ranks], cut[3]) if cut else ranks
        return out


def _wait(store, keys, seconds, peers):
    """Waits up to `seconds` for `keys` in `store`, half a second at a time,
    failing at once when `peers` (a Peers) finds one of this host's ranks
    gone; False on the timeout."""
    import datetime
    import time
    deadline = time.monotonic() + seconds
    while True:
        try:
            store.wait(keys, datetime.timedelta(seconds=min(0.5, max(deadline - time.monotonic(), 0.01))))
            return True
        except Exception:   # the store's timeout: its type differs across torch versions
            pass
        gone = peers.gone() if peers is not None else []
        if gone:
            raise sluice.DistributedError(f"rank(s) {', '.join(map(str, gone))} left during the dry runs")
        if time.monotonic() >= deadline:
            return False


def _dry_run_outcomes(plan, rank, vllm_ranks, size, store, grace, peers):
    """Every rank's dry-run outcome through the load's `store`, before any
    collective: a model's load_weights may itself run collectives (V4.1's
    DP-shared Engram table barriers once per call), so a rank whose dry run
    raised leaves its peers blocked in one it never reaches, and a
    collective exchange would never begin. Each rank posts its outcome; a
    rank whose dry run failed waits `grace` seconds for the others' and
    then fails, naming the ranks still in their dry runs (they fail when
    this process leaves: Gloo then closes their collective, and the store
    tells them why). A dry run that failed anywhere fails every rank that
    hears of it, naming the ranks (sluice's and vLLM's) and why."""
    import json   # not pickle: what another process wrote is data, never code
    store.set(f"dry-run/{rank}", json.dumps([vllm_ranks, plan.failure]))
    keys = [f"dry-run/{r}" for r in range(size)]
    if not _wait(store, keys, grace, peers):
        missing = ", ".join(str(r) for r, k in enumerate(keys) if not store.check([k]))
        if plan.failure is not None:
            raise sluice.DistributedError(
                f"the dry run of load_weights failed on {_named(rank, vllm_ranks)}: {plan.failure}; rank(s) {missing} "
                f"have not finished theirs after {grace:g} s (the 'timeout' key): their models wait in a collective "
                "of load_weights that this rank's dry run never reached, and fail when this process leaves")
        raise sluice.DistributedError(f"rank(s) {missing} did not finish the dry run of load_weights within "
                                      f"{grace:g} s (the 'timeout' key)")
    outcomes = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
    failed = [(r, v, f) for r, (v, f) in sorted(outcomes.items()) if f]
    if failed:
        said = "; ".join(f"{_named(r, v)}: {f}" for r, v, f in failed)
        raise sluice.DistributedError(f"the dry run of load_weights failed on {len(failed)} rank(s), so no rank "
                                      f"knows what its model takes: {said}")


def exchange_ownership(plan, names, rank, vllm_ranks, group, store=None, grace=60.0, peers=None) -> Ownership:
    """This rank's dry run (`plan`, over the checkpoint's `names`) against
    every other's, over vLLM's CPU `group`. A dry run that raised on any
    rank fails every rank, naming the ranks (sluice's and vLLM's) and why
    (through `store` first, see _dry_run_outcomes; `grace`: the load's
    timeout; `peers`: the load's Peers, whose local ranks that leave fail
    the wait at once)."""
    import torch.distributed as dist
    if store is not None:
        _dry_run_outcomes(plan, rank, vllm_ranks, dist.get_world_size(group), store, grace, peers)
    codes = bytes(2 if n in plan.takes else 1 if n in plan.calls else 0 for n in names)
    # What this rank's copies of each taken tensor read (rows, columns):
    # the owners' together decide whether the tensor is cut (parts.choose).
    needs = {}
    for i, n in enumerate(names):
        if n in plan.takes and n in plan.copies:
            copies = plan.copies[n]
            shape = plan.shapes.get(n)
            needs[i] = parts.needs(shape, copies) if shape is not None else None
    # A parameter left unwritten here and called for tensors another rank
    # takes is that rank's to write: memory they share (V4.1's DP-shared
    # Engram table: the leader copies, the others barrier).
    unwritten = sorted((p, (*u, sorted(plan.called_for.get(p, ())))) for p, u in plan.unwritten.items())
    # The tensors this rank could read itself, straight into one parameter
    # range: one whole unconverted copy, and nothing of the loader's reads
    # the bytes afterwards (they land while the stream runs, not before
    # their loader call).
    whole = [i for i, n in enumerate(names) if n in plan.direct and n not in plan.read_after]
    mine = (rank, vllm_ranks, plan.failure, codes, unwritten, needs, whole)
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    failed = [(r, v, f) for r, v, f, *_ in everyone if f]
    if failed:
        said = "; ".join(f"{_named(r, v)}: {f}" for r, v, f in sorted(failed))
        raise sluice.DistributedError(f"the dry run of load_weights failed on {len(failed)} rank(s), so no rank "
                                      f"knows what its model takes: {said}")
    by_rank = {r: c for r, _, _, c, _, _, _ in everyone}
    needs_of = {r: nd for r, _, _, _, _, nd, _ in everyone}
    whole_of = {r: set(w) for r, *_, w in everyone}
    owners = {n: [r for r in sorted(by_rank) if by_rank[r][i] == 2] for i, n in enumerate(names)}
    splits = {}
    for i, n in enumerate(names):
        if len(owners[n]) > 1 and plan.shapes.get(n) is not None:
            cut = parts.choose(plan.shapes[n], {r: needs_of[r].get(i) for r in owners[n]})
            if cut is not None:
                splits[n] = cut
    stand_ins = {n for i, n in enumerate(names) if codes[i] == 1}
    local = {n: owners[n][0] for i, n in enumerate(names)
             if len(owners[n]) == 1 and n not in splits and i in whole_of[owners[n][0]]}
    unwritten = {}
    for r, _, _, _, u, _, _ in everyone:
        mine = {p: (gap, size) for p, (gap, size, called) in u
                if not any(owners.get(n) and r not in owners[n] for n in called)}
        if mine:
            unwritten[r] = mine
    direct = {n for n in plan.copies if n in plan.takes}
    return Ownership(owners, stand_ins, unwritten, splits, direct, plan=plan, rank=rank, local=local)
