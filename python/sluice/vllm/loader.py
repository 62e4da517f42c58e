"""`SluiceModelLoader`: vLLM's model loader for `--load-format sluice`.

What the model gets: `model.load_weights()` receives the checkpoint's names and
full logical tensors, as from vLLM's default loader; each parameter's
`weight_loader` narrows them for TP. The strict check that every parameter was
loaded is vLLM's own (`DefaultModelLoader.track_weights_loading`), and before
it sluice's: a parameter the dry run finds no tensor writes fails the load
(the `strict` key).

One process: a dry run of `model.load_weights` (dry_run.py) finds the tensors
whose bytes land whole in one parameter; sluice reads those straight into
their parameters and streams the rest through `load_weights`.

Multi-rank worlds (TP/DP/PP > 1): one sluice load across vLLM's world group
(a reload: across its DP engine's ranks only), the checkpoint opened once
(rank 0 reads the headers, the others replay them); every rank's dry run of
its own model says which tensors it takes, which it only calls a loader with
(a stand-in comes), and which it ignores, and which rows or columns its
copies read; each byte is read from storage by one rank and sent over Gloo
only to the ranks whose model takes it, cut to each rank's block where the
copies allow (parts.py): a PP stage gets its layers, an EP rank its experts,
a TP rank its rows or columns, whatever their names. Those copies are
replayed outside load_weights; the rest goes through it whole.
"""
from __future__ import annotations

import os
import time

import torch

import sluice

from . import _vllm, config, world
from .._torch import as_torch_dtype
from .dry_run import dry_run, placed, stand_in

__all__ = ["SluiceModelLoader", "LOADS", "last_load"]

#: The stats of this process's loads (`load_weights`, and `get_all_weights`
#: as vLLM's reload_weights consumes it), oldest first (the last 16):
#: bytes read and received, tensors, and for one-process loads how many went
#: straight into their parameters. `llm.collective_rpc(sluice.vllm.last_load)`
#: asks every worker of an engine.
LOADS: list = []


class _LocalLoad:
    """The tensors this rank alone takes, each whole into one parameter
    range (Ownership.local): read by this rank straight into their
    parameters (`sluice.load_into`: from the page cache in one copy, none
    cold with O_DIRECT), on a thread of their own while the stream runs, so
    they never pass through an exchange window; its stats count in the
    load's."""

    def __init__(self, loader, ck, own):
        import threading
        self.stats, self._error, self._thread = {}, None, None
        names = own.mine()
        self.tensors = len(names)
        self.bytes = sum(t.nbytes for t in ck.tensors if t.name in names)
        if not names:
            return
        into = _destinations(ck, {n: own.plan.direct[n] for n in names})
        o = loader.options

        def run():
            try:
                self.stats = sluice.load_into(ck.select(set(into)), into, staging=o["staging"], max_read=o["max_read"],
                                              queue_depth=o["queue_depth"], prefault=o["prefault"])
            except BaseException as e:  # noqa: BLE001 (handed to the loading thread)
                self._error = e
        self._thread = threading.Thread(target=run, name="sluice-local", daemon=True)
        self._thread.start()

    def wait(self, check=True):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if check and self._error is not None:
            raise self._error


def _destinations(ck, dst):
    """{name: destination}, each viewed as its tensor's dtype where the
    loader copied into it as another of the same size (E8M0 scales as
    uint8): load_into takes the tensor's bytes as they are."""
    infos = {t.name: t for t in ck.tensors}
    out = {}
    for name, d in dst.items():
        want = as_torch_dtype(infos[name].dtype, infos[name].shape)
        out[name] = d if d.dtype == want else d.view(want)
    return out


def _merged(stream_stats, counts, local):
    """A multi-rank load's stats: the stream's, what went around
    load_weights, and the tensors this rank read apart (`local`)."""
    out = dict(stream_stats or {}, **counts)
    n, b = local.tensors, local.bytes
    out["local_tensors"], out["local_bytes"] = n, b
    out["bytes_read"] = out.get("bytes_read", 0) + local.stats.get("bytes_read", 0)
    for k, v in (("bytes_kept", b), ("direct_tensors", n), ("direct_bytes", b)):
        out[k] = out.get(k, 0) + v
    return out


def _say_what_goes_whole(own, ck, rank, size, parallel, log):
    """Never silent: the tensors this rank's model takes that arrive whole
    and go through load_weights (its loader converts or computes from them),
    named with the dry run's reason; and, with expert parallelism on, a
    warning when no tensor went to fewer than every rank, nor in parts: no
    rank's dry run found an expert it does not hold, so every rank
    receives every expert. Returns the warning said, or None."""
    infos = {t.name: t for t in ck.tensors}
    whole = [n for n, ranks in own.owners.items() if rank in ranks and n not in own.direct]
    if whole:
        why = own.plan.streamed if own.plan is not None else {}
        log.info("sluice: %d tensor(s) (%.3f GiB) this rank's model takes go whole through load_weights: %s%s",
                 len(whole), sum(infos[n].nbytes for n in whole) / 2**30,
                 "; ".join(f"{n} ({why.get(n, 'converted')})" for n in whole[:4]),
                 f"; and {len(whole) - 4} more" if len(whole) > 4 else "")
    if not getattr(parallel, "enable_expert_parallel", False) or size < 2:
        return None
    if any(0 < len(r) < size for r in own.owners.values()) or own.splits:
        return None
    msg = (f"sluice: expert parallelism is on, but every rank's model takes every tensor of '{ck.location}' whole: "
           "no rank's dry run found an expert another rank holds, so each rank receives all of them "
           f"({ck.tensor_bytes / 2**30:.3f} GiB); its loader may convert expert weights before copying them")
    log.warning(msg)
    return msg


def _record(stats, cache_before=None):
    """Keeps a load's stats; with the node-local cache, adds what it did in
    this load (the process's counters since `cache_before`) and logs it."""
    stats = dict(stats or {})
    after = sluice.cache_stats()
    before = cache_before if cache_before and after and cache_before["dir"] == after["dir"] else {}
    did = {k: after[k] - before.get(k, 0) for k in ("hit_bytes", "fetched_bytes", "refetched_bytes", "bad_blocks")} \
        if after is not None else {}
    if any(did.values()):   # this load read through the cache
        stats["cache"] = dict(did, dir=after["dir"])
        _vllm.logger().info("sluice: cache %s: %.3f GiB from the cache, %.3f GiB from S3 (%.3f GiB fetched again: %d bad blocks)",
                 after["dir"], did["hit_bytes"] / 2**30, did["fetched_bytes"] / 2**30, did["refetched_bytes"] / 2**30,
                 did["bad_blocks"])
    LOADS.append(stats)
    del LOADS[:-16]


def last_load(worker=None) -> dict:
    """The stats of this process's last `--load-format sluice` load ({} before
    any); `worker` is there so that vLLM's `collective_rpc` can call it."""
    return LOADS[-1] if LOADS else {}


class SluiceModelLoader(_vllm.base_loader()):
    """vLLM's model loader for `--load-format sluice` (see the module docstring)."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.options = config.options(load_config.model_loader_extra_config)
        self.last_stats = None

    # ---- where the weights are
    def _location(self, model_config, model=None):
        """(where, index): the `weights` key (else vLLM's model_weights, else
        the model path) and the `index` key. The model remembers the path of
        its first load; when vLLM later points model_config.model elsewhere
        (`reload_weights(weights_path=...)` does, on a fresh loader), that
        path wins over `weights`, and `index` (which described the first
        weights) is dropped."""
        path = model_config.model
        first = getattr(model, "_sluice_model_path", None) if model is not None else None
        if model is not None and first is None:
            model._sluice_model_path = path
        elif first is not None and path != first:
            return path, None
        return (self.options["weights"] or getattr(model_config, "model_weights", None) or path), self.options["index"]

    def download_model(self, model_config) -> None:
        """Nothing to download: checks that the weights location opens (headers only)."""
        self._open(model_config)

    def _open(self, model_config, select=None, world=None, store=None, model=None):
        """Opens the weights (through the `index` extra-config key's index if
        set); with `world` and `store`, collectively: rank 0 reads the
        metadata, the other ranks replay it."""
        where, index = self._location(model_config, model)
        if not where.startswith("s3://") and not os.path.exists(where):
            raise sluice.ConfigError(f"--load-format sluice: the weights location '{where}' does not exist")
        if index is not None and not os.path.isfile(index):
            raise sluice.ConfigError(f"--model-loader-extra-config: index '{index}' is not a file "
                                     "(a local model.safetensors.index.json)")
        cache = {}
        if where.startswith("s3://") and (self.options["cache"] or self.options["cache_max"]):
            cache = {"cache": self.options["cache"], "cache_max": self.options["cache_max"]}
        return sluice.open(where, select=select, index=index, world=world, store=store, timeout=self.options["timeout"],
                           **cache)

    # ---- which tensors this rank needs
    @staticmethod
    def _world():
        import torch.distributed as dist
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    # ---- the loader API
    def get_all_weights(self, model_config, model):
        """(name, tensor) for every tensor this rank needs: what
        `reload_weights(weights_path=...)` and sleep level 2 call (a load
        through `load_weights` plans first, see there). Across ranks, the
        ownership is the one the model's first load found; a tensor it did
        not know goes to every rank."""
        before = sluice.cache_stats()
        yield from self._all_weights(model_config, model)
        _record(self.last_stats, before)

    def _all_weights(self, model_config, model):
        scope = self._scope(model)
        if scope is not None:
            ck, options = self._distributed(model_config, model, dry=False, scope=scope)
            yield from self._stream(ck, options)
            return
        ck = self._open(model_config, model=model)
        own = getattr(model, "_sluice_ownership", None)
        if own is None or own.rank is None:
            yield from self._stream(ck, {})
            return
        # One process of a multi-rank model (a TP1 engine reloading alone):
        # what its model took in the first load is read, what it only called
        # a loader with (another engine's experts) comes as stand-ins, what it
        # ignored is skipped; a tensor the first load did not know is read.
        take = {t.name for t in ck.tensors if own.rank in own.owners.get(t.name, [own.rank])}
        calls = [t for t in ck.tensors if t.name not in take and t.name in own.stand_ins]
        for t in calls:
            yield t.name, stand_in(t)
        if take:
            yield from self._stream(ck.select(take), {})

    def _scope(self, model):
        """The ranks a load of `model` spans: None (this process alone), or
        world.Scope. The first load spans vLLM's world group, every DP
        engine (each byte read once across them all). A later one
        (reload_weights, which vLLM runs on one engine while the others
        serve) spans only this engine's ranks, or this process alone where
        the engine is one rank: it never waits for engines that do not
        join."""
        if self._world() <= 1:
            return None
        parallel = _vllm.current_parallel_config()
        first = getattr(model, "_sluice_ownership", None) is None
        if first or parallel.data_parallel_size <= 1:
            rank, size, vllm_ranks = world.sluice_place(parallel)
            return world.Scope(_vllm.world_group(), rank, size, vllm_ranks, engine=False)
        return world.engine_scope(parallel)

    def _distributed(self, model_config, model, dry, scope):
        """See _distributed_load; a peer that leaves on the way is named by
        vLLM's ranks as well as sluice's (world.Peers)."""
        try:
            self._peers = world.Peers.gather(scope.rank, scope.vllm_ranks, scope.group.cpu_group)
        except RuntimeError as e:
            raise sluice.DistributedError(f"a rank of vLLM's world group left before the sluice load began: {e}") from e
        try:
            return self._distributed_load(model_config, model, dry, scope)
        except (RuntimeError, sluice.DistributedError, sluice.CommError) as e:
            raise self._peers.failure(e, "the sluice load's rendezvous and dry-run exchange") from e

    def _distributed_load(self, model_config, model, dry, scope):
        """A load across `scope`'s ranks: the checkpoint opened
        collectively (rank 0 reads the index and the headers, the others
        replay them), then, with `dry`, every rank's dry run of its own
        model's load_weights over the checkpoint's tensors (metadata only),
        exchanged once: each tensor is read by one of the ranks whose model
        takes its bytes and sent only to those (no name decides: a Mixtral's
        experts, another PP stage's layers, a draft's tensors). Returns
        (checkpoint, _stream's options)."""
        from .._distributed import torch_world
        from .dry_run import dry_run as run   # looked up per load (the tests' fault hook replaces it)
        group, rank, size, vllm_ranks, engine = scope
        # One key prefix per load, agreed over the world's CPU group (a per-process
        # counter diverges when only some ranks load, e.g. a draft model).
        t_open = time.perf_counter()
        ranks, store = torch_world(group.cpu_group, prefix="sluice/vllm/engine" if engine else "sluice/vllm", rank=rank)
        ck = self._open(model_config, world=ranks, store=store, model=model)
        names = [t.name for t in ck.tensors]
        log = _vllm.logger()
        log.info("sluice: rendezvous and collective open %.2f s", time.perf_counter() - t_open)
        if dry:
            t0 = time.perf_counter()
            plan = run(model, ck.tensors, default_weight_loader=_vllm.default_weight_loader())
            own = world.exchange_ownership(plan, names, rank, vllm_ranks, group.cpu_group, store=store,
                                           grace=self.options["timeout"], peers=self._peers)
            if own.unwritten:
                r = min(own.unwritten)
                self._missing(ck, own.unwritten[r], log, where=f" (rank {r}'s model; {len(own.unwritten)} rank(s) in all)")
            model._sluice_ownership = own
            _say_what_goes_whole(own, ck, rank, size, _vllm.current_parallel_config(), log)
            log.info("sluice: the models' dry runs (%.2f s): %d of %d tensors to this rank (%d cut into parts, "
                     "%d copied straight into their parameters), %d as stand-ins, %d tensors (%.3f GiB) no rank's "
                     "model takes", time.perf_counter() - t0,
                     sum(1 for n in names if rank in own.owners[n]), len(names),
                     sum(1 for n in own.splits if rank in own.owners[n]), len(own.direct), len(own.stand_ins),
                     sum(1 for n in names if not own.owners[n]), own.bytes_unowned(ck) / 2**30)
        else:
            # An engine's own load knows no ownership of its ranks (the first
            # one's spanned every engine): every tensor to each of them.
            own = getattr(model, "_sluice_ownership", None) if not engine else None
            owners = dict(own.owners) if own is not None else {}
            for n in names:
                owners.setdefault(n, list(range(size)))
            own = world.Ownership(owners, own.stand_ins if own is not None else set(), {})
        return ck, {"topology": f"tp1,dp{size},ep1", "offload": self.options["offload"], "store": store,
                    "world": ranks, "timeout": self.options["timeout"],
                    "plan": {"model_owners": own.model_owners(split=dry),
                             "stand_ins": own.stand_ins | (own.mine() if dry else set())}}

    def _bar(self, total):
        return _vllm.progress_bar(self.load_config, total)

    @staticmethod
    def _advance(bar, base, off):
        """A load's progress callable that moves `bar` to `base` + its bytes
        done, or `off` (what the call takes for none) without a bar."""
        return (lambda done, total: bar.update(base + done - bar.n)) if bar is not None else off

    @staticmethod
    def _log():
        return _vllm.logger()

    def _stream(self, ck, distributed, bar=None, base=0, log=True):
        """Yields the load's tensors; `bar` (made here when None and log is
        True) advances from `base`; `log` prints the one-line summary."""
        own = bar is None and log
        if own:
            bar = self._bar(ck.tensor_bytes)
        t0 = time.perf_counter()
        # Placeholders of other ranks' experts and PP stages stay in C++: neither
        # read nor received here, and never handed to load_weights.
        it = sluice.iter_weights(ck, staging=self.options["staging"], max_read=self.options["max_read"],
                                 queue_depth=self.options["queue_depth"], placeholders=False,
                                 progress=self._advance(bar, base, False),
                                 **{k: v for k, v in distributed.items() if k != "plan"},
                                 **distributed.get("plan", {}))
        try:
            with it:
                yield from it
        finally:
            if own and bar is not None:
                bar.close()
        self.last_stats = dict(it.stats or {})
        if not log:
            return
        seconds = max(time.perf_counter() - t0, 1e-9)
        read = self.last_stats.get("bytes_read", 0)
        received = self.last_stats.get("bytes_received", 0)
        taken = self.last_stats.get("page_cache_bytes", 0) + self.last_stats.get("node_copied_bytes", 0)
        self._log().info(
            "sluice: %s%s: %d tensors, %.3f GiB read, %.3f GiB received, %.3f GiB from the node (page cache or node window), "
            "%.2f GiB/s (%.2f s)", ck.location,
            f" (rank {distributed['world'].rank} of {distributed['world'].size} in sluice's order, {distributed['topology']})"
            if distributed else "", self.last_stats.get("tensors", 0), read / 2**30, received / 2**30, taken / 2**30,
            (read + received + taken) / 2**30 / seconds, seconds)

    def load_weights(self, model, model_config) -> None:
        cache_before = sluice.cache_stats()
        scope = self._scope(model)
        if scope is not None:
            # The dry run and the ownership exchange come before load_weights
            # runs for real (not inside its weight generator).
            ck, options = self._distributed(model_config, model, dry=True, scope=scope)
            own = model._sluice_ownership
            counts = {"direct_tensors": 0, "direct_bytes": 0, "whole_fallback_bytes": 0}
            local = _LocalLoad(self, ck, own)
            try:
                with placed():
                    got = model.load_weights(self._replay(self._stream(ck, options), own, counts, ck, local))
            except (sluice.DistributedError, sluice.CommError) as e:
                raise self._peers.failure(e, "the sluice load") from e
            finally:
                local.wait(check=False)   # never left writing into the parameters
            self.last_stats = _merged(self.last_stats, counts, local)
            loaded = set(own.plan.loaded) | set(got or ()) if own.plan.loaded is not None else got
        elif self.options["direct"]:
            loaded = self._load_direct(model, model_config)
        else:
            loaded = model.load_weights(self.get_all_weights(model_config, model))
        _record(self.last_stats, cache_before)
        if model_config.quantization is None and loaded is not None:
            _vllm.track_weights_loading(self, model, loaded)

    @staticmethod
    def _replay(stream, own, counts, ck, local=None):
        """The stream of a multi-rank load, for load_weights under
        dry_run.placed: what this rank's model only copies (or this rank's
        part of it) goes into its parameters here, by the copies its dry run
        recorded, and passes on as a stand-in (the loader's calls and what
        follows them, a barrier, the finalization at the end, happen as in
        the engine's own load, without a second copy); the rest (what
        load_weights converts or computes from, and the stand-ins of what
        other ranks write) passes on whole (`counts`: what went which way)."""
        from .parts import view_in_part
        plan = own.plan
        infos = {t.name: t for t in ck.tensors}
        mine = own.mine()
        for name, t in stream:
            if name in mine:   # its stand-in: this rank reads it apart (_LocalLoad)
                yield name, t
                continue
            if name not in own.direct:
                if getattr(t, "sluice_kind", None) != "placeholder":
                    counts["whole_fallback_bytes"] += t.numel() * t.element_size()
                yield name, t
                continue
            cut = own.splits.get(name)
            split, said = None, None
            if cut:
                dim, parts, part_of, runs = cut
                count = len(runs) if isinstance(runs, tuple) else runs   # unequal runs arrive counted
                split = (dim, part_of[own.rank], parts) + ((runs,) if count != 1 else ())
                said = split[:3] + ((count,) if count != 1 else ())
            if getattr(t, "sluice_part", None) != said or not t.is_contiguous():
                raise sluice.DistributedError(f"tensor '{name}' arrived as part {getattr(t, 'sluice_part', None)} "
                                              f"of shape {tuple(t.shape)}; the plan cut it as {said}")
            full = plan.shapes.get(name, tuple(t.shape))
            with torch.no_grad():
                for copy in plan.copies[name]:
                    offset, shape, strides = view_in_part(full, split, copy)
                    src = t if t.dtype == copy[4] else t.view(copy[4])   # E8M0 scales copied as uint8
                    copy[3].copy_(src.as_strided(shape, strides, src.storage_offset() + offset))
            counts["direct_tensors"] += 1
            counts["direct_bytes"] += t.numel() * t.element_size()
            del t
            yield name, stand_in(infos[name])
        if local is not None:
            local.wait()   # before load_weights' end (what follows its copies)

    def _map_parameters(self, model, ck, plan, bar) -> dict:
        """The `map` extra-config key: each direct tensor that fills a whole
        CPU parameter becomes that parameter's memory as a private mapping of
        its file (sluice's page-cache views, io="buffered": mapped in on the
        ring's workers, read from storage where not cached): no fresh memory
        and no copy; a write copies the page, never the file. Returns the
        stream's stats (its "mapped" counts are the parameters mapped) and
        the names it loaded: a tensor the stream hands out in staging (too
        small to map) is copied in."""
        if ck.location.startswith("s3://"):
            self._log().info("sluice: map applies to local files; %s is read into the parameters", ck.location)
            return {}
        whole = {}
        for p in model.parameters():
            if p.device.type == "cpu" and p.is_contiguous() and p.numel() > 0:
                whole[(p.data_ptr(), p.numel() * p.element_size())] = p
        targets = {}
        for name, dst in plan.direct.items():
            p = whole.get((dst.data_ptr(), dst.numel() * dst.element_size()))
            if p is not None and p.untyped_storage().nbytes() == dst.numel() * dst.element_size():
                targets[name] = p
        if not targets:
            return {}
        base = bar.n if bar else 0
        it = sluice.iter_weights(ck.select(set(targets)), staging=self.options["staging"],
                                 max_read=self.options["max_read"], queue_depth=self.options["queue_depth"],
                                 io="buffered", map_cached=True,
                                 progress=self._advance(bar, base, False))
        with it, torch.no_grad():
            for name, t in it:
                p = targets[name]
                if t.sluice_holds_staging:
                    plan.direct[name].copy_(t.view(p.shape))
                else:
                    p.data = t.view(p.shape)
        return dict(it.stats or {}, names=set(targets))

    def _missing(self, ck, unwritten, log, where=""):
        """Parameters the checkpoint has nothing for (the dry run's coverage):
        an error naming them (the `strict` key), or a warning."""
        names = sorted(unwritten)
        shown = ", ".join(f"{n} ({unwritten[n][0]} of {unwritten[n][1]} bytes)" for n in names[:8])
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        msg = (f"missing-tensor: the checkpoint at '{ck.location}' has nothing for {len(names)} parameter(s) of the "
               f"model{where}, which its load_weights would leave unwritten: {shown}{more}")
        if self.options["strict"]:
            raise sluice.FormatError(msg + ' (set {"strict": false} in --model-loader-extra-config to load anyway)')
        log.warning("sluice: %s", msg)

    def _load_direct(self, model, model_config):
        """One process: a dry run of `model.load_weights` (dry_run.py) finds
        the tensors whose bytes land whole in one parameter; sluice reads those
        straight into their parameters, and streams the rest through
        `model.load_weights` as usual. Returns the parameters loaded."""
        t0 = time.perf_counter()
        # The fresh parameters' first touch is most of a page-cache-hot load;
        # it starts now, on another core, rather than after the open and the
        # dry run (which touch no parameter memory), and load_into's own
        # prefaulter takes over from it.
        # (Not when parameters are to be mapped: most would be replaced.)
        early = sluice.prefault(model.parameters()) if self.options["prefault"] and not self.options["map"] else None
        try:
            ck = self._open(model_config, model=model)
            t1 = time.perf_counter()
            plan = dry_run(model, ck.tensors)
            dry = time.perf_counter() - t1
        finally:
            early_bytes = early.stop() if early is not None else 0
        log = self._log()
        if plan.unwritten and not plan.failure:
            self._missing(ck, plan.unwritten, log)
        if plan.failure:
            log.info("sluice: the dry run of load_weights failed (%s); streaming every tensor", plan.failure)
        else:
            for name, why in plan.streamed.items():
                log.debug("sluice: %s goes through load_weights: %s", name, why)
        bar = self._bar(ck.tensor_bytes)
        stats, mapped = {}, {}
        if self.options["map"] and plan.direct:
            mapped = self._map_parameters(model, ck, plan, bar)
        infos = {t.name: t for t in ck.tensors}
        into = _destinations(ck, {name: dst for name, dst in plan.direct.items() if name not in mapped.get("names", ())})
        if into:
            base = bar.n if bar else 0
            stats = sluice.load_into(ck, into, staging=self.options["staging"], max_read=self.options["max_read"],
                                     queue_depth=self.options["queue_depth"], prefault=self.options["prefault"],
                                     progress=self._advance(bar, base, None))
        loaded = set(plan.loaded or ())
        streamed_stats = {}
        # load_weights runs for real once more, after the direct bytes are in
        # place: over the streamed tensors, and stand-ins of the direct ones
        # (dry_run.placed), so that what it does after its copies (V4.1
        # finalizes its weights at the end of load_weights, which the dry
        # run did on empty parameters) sees the loaded bytes.
        # A tensor the model neither copies anywhere nor calls a loader with
        # (a draft's mtp.* for the main model, the main model's for the
        # draft) is not read, as across ranks.
        ignored = set() if plan.failure else {n for n in plan.streamed if n not in plan.takes and n not in plan.calls}
        streamed = set(plan.streamed) - ignored
        rest = ck.select(streamed) if streamed else None  # the same opened checkpoint
        base = bar.n if bar else 0
        placed_ones = ((t.name, stand_in(t)) for t in ck.tensors if t.name in plan.direct)

        def stream():
            yield from placed_ones
            if rest is not None:
                yield from self._stream(rest, {}, bar=bar, base=base, log=False)
        with placed():
            got = model.load_weights(stream())
        loaded |= set(got or ())
        if rest is not None:
            streamed_stats = self.last_stats or {}
        if bar is not None:
            bar.close()
        self.last_stats = {k: stats.get(k, 0) + streamed_stats.get(k, 0) + mapped.get(k, 0)
                           for k in ("bytes_read", "tensors")}
        self.last_stats.update(direct_tensors=len(plan.direct), streamed_tensors=len(streamed),
                               ignored_tensors=len(ignored), ignored_bytes=sum(infos[n].nbytes for n in ignored),
                               mapped_parameters=mapped.get("mapped", {}).get("tensors", 0),
                               mapped_bytes=mapped.get("mapped", {}).get("bytes", 0),
                               dry_run_seconds=dry, prefaulted_bytes=early_bytes + stats.get("prefaulted_bytes", 0))
        seconds = max(time.perf_counter() - t0, 1e-9)
        read = self.last_stats["bytes_read"]
        log.info("sluice: %s: %d tensors (%d straight into their parameters%s, %d through load_weights, %d the model "
                 "does not take, not read), %.3f GiB read, %.2f GiB/s (%.2f s, dry run %.2f s, %.3f GiB faulted in ahead)",
                 ck.location, len(plan.direct) + len(plan.streamed), len(plan.direct),
                 f", {self.last_stats['mapped_parameters']} of them page-cache mappings" if mapped else "", len(streamed),
                 len(ignored),
                 read / 2**30, read / 2**30 / seconds, seconds, dry, self.last_stats["prefaulted_bytes"] / 2**30)
        return loaded if plan.loaded is not None else None  # None: the model does not say (no strict check)
