"""sluice inside vLLM: `--load-format sluice`.

    pip install .            # from sluice's source tree, into vLLM's environment
    vllm serve /models/m --load-format sluice \\
        --model-loader-extra-config '{"staging": "4GiB"}'
    vllm serve /models/m-config --load-format sluice \\
        --model-loader-extra-config '{"weights": "s3://bucket/m/"}'

The package's entry point (group `vllm.general_plugins`, see pyproject.toml)
runs `register()` in every vLLM process; it registers `SluiceModelLoader` under
the load format "sluice", is idempotent and touches no CUDA.

Extra-config keys (`--model-loader-extra-config '{json}'`); any other key is an
error naming it, raised before anything is read:

    weights      where the weights are: a directory, a .safetensors file or
                 s3://bucket/prefix/ (default: the model path). vLLM accepts
                 s3:// models only for its own object-storage loaders, so the
                 model argument stays a local directory with the config.
    index        a local model.safetensors.index.json to open `weights` through
                 (its shards are checked against the listing first)
    staging      the staging budget, e.g. "4GiB" (sluice's size grammar)
    max_read     the largest single read, e.g. "32MiB"
    queue_depth  reads in flight per reader
    offload      none | per-rank | shared-single | shared-cooperative (shared
                 tables, distributed loads)
    direct       true (default) | false: in a one-process load, read each tensor
                 that a dry run of the model's load_weights proves lands whole
                 and unconverted in one parameter straight into it (see
                 sluice._direct); false streams every tensor through load_weights
    map          false (default) | true: in a one-process load, each tensor that
                 fills a whole CPU parameter becomes that parameter's memory
                 as a private mapping of its file (page cache shared by every
                 engine process on the node; no copy, no fresh memory; writes
                 copy the page, never the file). For CPU engines only; never
                 rewrite the checkpoint's files in place while the engine
                 runs (a truncated file kills it with SIGBUS: write updates to
                 a new directory), and under memory pressure weight pages may
                 be dropped and read again from storage
    prefault     true (default) | false: in a one-process load, fault the model's
                 fresh CPU parameters in on a thread of sluice's own, from the
                 start of load_weights (during the dry run) and then from the
                 last destination backwards while the reads fill from the first

S3 endpoints and credentials come from the usual AWS environment and profile
chain (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws, ...), never from here.

What the model gets: `model.load_weights()` receives the checkpoint's names and
full logical tensors, as from vLLM's default loader; each parameter's
`weight_loader` narrows them for TP. With expert parallelism on (and vLLM's EP
weight filter, no EPLB), a rank's routed-expert weights of other ranks' experts
are not read: the same rule as vLLM's own filter (`.experts.N.*.weight`; every
expert's scales are still yielded). The strict check that every parameter was
loaded is vLLM's own (`DefaultModelLoader.track_weights_loading`).

Multi-rank worlds (TP/DP/PP > 1): one sluice load across vLLM's world group,
the checkpoint opened once (rank 0 reads the headers, the others replay them),
each byte read from storage by one rank and sent over Gloo to the ranks that
keep it: a PP stage gets its layers only, an EP rank its experts only (see
`placement()` for the mapping).
"""
from __future__ import annotations

import os
import re
import time

import torch

import sluice

__all__ = ["register", "SluiceModelLoader", "EXTRA_CONFIG_KEYS", "LOADS", "last_load"]

EXTRA_CONFIG_KEYS = ("weights", "index", "staging", "max_read", "queue_depth", "offload", "direct", "prefault", "map")
_OFFLOADS = ("none", "per-rank", "shared-single", "shared-cooperative")
_registered = False
#: The stats of this process's `load_weights` calls, oldest first (the last 16):
#: bytes read and received, tensors, and for one-process loads how many went
#: straight into their parameters. `llm.collective_rpc(sluice.vllm.last_load)`
#: asks every worker of an engine.
LOADS: list = []


def last_load(worker=None) -> dict:
    """The stats of this process's last `--load-format sluice` load ({} before
    any); `worker` is there so that vLLM's `collective_rpc` can call it."""
    return LOADS[-1] if LOADS else {}


def register() -> None:
    """The vLLM plugin: registers `--load-format sluice` (idempotent; no CUDA)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader
    register_model_loader("sluice")(SluiceModelLoader)
    _registered = True


def _options(extra) -> dict:
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise sluice.ConfigError(f"--model-loader-extra-config for sluice must be a JSON object, got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
    if unknown:
        raise sluice.ConfigError(f"--model-loader-extra-config: unknown key(s) {', '.join(map(repr, unknown))} for "
                                 f"--load-format sluice (known: {', '.join(EXTRA_CONFIG_KEYS)})")
    o = {"staging": "4GiB", "max_read": "32MiB", "queue_depth": 4, "offload": "none", "weights": None, "index": None,
         "direct": True, "prefault": True, "map": False}
    o.update(extra)
    for k in ("staging", "max_read"):
        o[k] = sluice.parse_size(o[k])
    if isinstance(o["queue_depth"], bool) or not isinstance(o["queue_depth"], int) or o["queue_depth"] < 1:
        raise sluice.ConfigError(f"--model-loader-extra-config: queue_depth must be a positive integer, got {o['queue_depth']!r}")
    if o["offload"] not in _OFFLOADS:
        raise sluice.ConfigError(f"--model-loader-extra-config: offload {o['offload']!r} is not one of {', '.join(_OFFLOADS)}")
    for k in ("direct", "prefault", "map"):
        if not isinstance(o[k], bool):
            raise sluice.ConfigError(f"--model-loader-extra-config: {k} must be true or false, got {o[k]!r}")
    for k in ("weights", "index"):
        if o[k] is not None and not isinstance(o[k], str):
            raise sluice.ConfigError(f"--model-loader-extra-config: {k} must be a string, got {o[k]!r}")
    return o


_LAYER = re.compile(r"layers\.(\d+)\.")  # sluice's classifier's layer_pattern (policy/classify.hpp)


def sluice_rank(pp_rank, dp_rank, pcp_rank, tp_rank, dp, pcp, tp):
    """A vLLM rank's place in sluice's world. vLLM orders its world DP x PP x
    (PCP x) TP, sluice's plan PP x DP x TP: a PP stage is a contiguous block
    of dp*pcp*tp sluice ranks, and within it a rank's offset is its vLLM EP
    rank (dp_rank*pcp*tp + pcp_rank*tp + tp_rank, as FusedMoEParallelConfig)."""
    return pp_rank * dp * pcp * tp + (dp_rank * pcp + pcp_rank) * tp + tp_rank


def stage_layers(model_config, pp, checkpoint_layers=None):
    """Layers per PP stage as vLLM splits them (its own `get_pp_indices` over
    the model's hidden layers); checkpoint layers beyond them (an MTP or draft
    layer, which vLLM's main model skips) go with the last stage."""
    from vllm.distributed.utils import get_pp_indices
    total = model_config.get_total_num_hidden_layers()
    counts = [end - start for start, end in (get_pp_indices(total, k, pp) for k in range(pp))]
    if checkpoint_layers is not None and checkpoint_layers > total:
        counts[-1] += checkpoint_layers - total
    return counts


# sluice's classifier's first_pp_stage_pattern and last_pp_stage_pattern (policy/classify.hpp)
_FIRST = re.compile(r"(^|\.)embed_tokens\.")
_LAST = re.compile(r"(^|\.)lm_head\.|^model\.(language_model\.)?norm\.")


def anchored(model) -> tuple:
    """(embeddings, head): whether a vLLM model (one PP stage of it) has
    parameters of the layer-less tensors sluice gives the first stage
    (embed_tokens) and the last (the final norm, lm_head). vLLM's models
    differ: Llama builds them on their stage only (and the embeddings on the
    last stage too when tied), Qwen3-MoE on every stage."""
    names = [n for n, _ in model.named_parameters()] if model is not None else []
    return any(_FIRST.search(n) for n in names), any(_LAST.search(n) for n in names)


# EP rank of routed expert e in sluice's plan (policy::expert_placement), per vLLM strategy name.
_SLUICE_PLACEMENT = {"linear": lambda e, ep, experts: e * ep // experts, "round_robin": lambda e, ep, experts: e % ep}


def effective_placement(model, default):
    """The expert placement the model's MoE layers were built with: vLLM's
    layers fall back from round_robin to linear where they cannot route it
    (models without expert groups, EPLB, some all-to-all backends), while its
    parallel config still says round_robin. `default` where the model has no
    such layer, or its layers disagree."""
    found = {getattr(getattr(m, "expert_map_manager", None), "placement_strategy", None)
             for m in model.modules()} - {None} if model is not None else set()
    return found.pop() if len(found) == 1 else default


def placement(model_config, local, parallel=None, ranks=None, ck=None, stages=None, strategy=None):
    """This rank's sluice world place and plan knobs under vLLM's parallel config:
    {"rank", "size", "pp", "topology", "expert_placement", "pp_stage_layers", "pp_first_pattern",
    "pp_last_pattern", "notes"}.

    Every rank of a PP stage is a sluice DP replica of the stage's dense
    weights (tp1: TP ranks get full tensors, which vLLM's weight_loaders
    narrow). With vLLM's expert parallelism on (EP weight filter, no EPLB,
    linear or round-robin placement) sluice's EP spans the stage (EP = DP x
    PCP x TP, vLLM's) with the same placement, so a rank neither reads nor
    receives another rank's experts; the split is checked against vLLM's
    `compute_local_expert_ids` for every EP rank first. Where it differs (a
    linear split of experts that EP does not divide: vLLM gives the first
    ranks one more, sluice's blocks do not), experts are replicated and vLLM's
    loaders drop the others' (said in the log). `strategy`: the placement the
    model's MoE layers use (`effective_placement()`; default: the parallel
    config's, which vLLM's layers may have overridden). PP > 1: the stages own vLLM's layer
    ranges (`get_pp_indices`); the embeddings go with the first stage and the
    final norm and lm_head with the last, or with every stage where another
    stage's model has them too (`stages`: {stage: anchored(its model)};
    default: Llama's rule, the tied embeddings on the last stage too).

    `parallel` (vLLM's ParallelConfig) and `ranks` ((pp, dp, pcp, tp) ranks)
    default to the running engine's; the TP2 x PP2 x DP2 unit test passes them.
    `ck`: the opened checkpoint, whose layers beyond the model's go with the
    last stage (without it the stages are the model's layers alone).
    """
    if parallel is None:
        from vllm.config import get_current_vllm_config
        parallel = get_current_vllm_config().parallel_config
    tp, pp, dp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size, parallel.data_parallel_size
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    if ranks is None:
        from vllm.distributed import get_dp_group, get_pcp_group, get_pp_group, get_tp_group
        ranks = (get_pp_group().rank_in_group if pp > 1 else 0, get_dp_group().rank_in_group if dp > 1 else 0,
                 get_pcp_group().rank_in_group if pcp > 1 else 0, get_tp_group().rank_in_group if tp > 1 else 0)
    stage = dp * pcp * tp
    notes = []
    ep = 1
    strategy = strategy or parallel.expert_placement_strategy
    if local is not None:
        from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
        experts = model_config.get_num_experts()
        rule = _SLUICE_PLACEMENT.get(strategy)
        if rule is None:
            notes.append(f"expert placement {strategy!r} is not one sluice's plan has (linear, round_robin): every "
                         "rank receives every expert (read once) and vLLM's weight loaders keep their own")
        elif all(compute_local_expert_ids(experts, stage, r, placement=strategy) ==
                 {e for e in range(experts) if rule(e, stage, experts) == r} for r in range(stage)):
            ep = stage
        else:
            notes.append(f"vLLM's {strategy} split of {experts} experts over EP={stage} is not sluice's: every rank "
                         "receives every expert (read once) and vLLM's weight loaders keep their own")
    out = {"rank": sluice_rank(*ranks, dp, pcp, tp), "size": pp * stage, "pp": pp, "notes": notes,
           "expert_placement": strategy if ep > 1 else "linear", "pp_stage_layers": [],
           "pp_first_pattern": None, "pp_last_pattern": None, "topology": f"tp1,dp{stage},ep{ep}" + (f",pp{pp}" if pp > 1 else "")}
    if pp > 1:
        layers = None
        if ck is not None:
            found = [int(m.group(1)) for m in (_LAYER.search(t.name) for t in ck.tensors) if m]
            layers = max(found) + 1 if found else 0
        out["pp_stage_layers"] = stage_layers(model_config, pp, layers)
        if stages is None:
            tied = getattr(model_config.hf_text_config, "tie_word_embeddings", False)
            stages = {k: (k == 0 or (tied and k == pp - 1), k == pp - 1) for k in range(pp)}
        # A group that some other stage has too goes with every stage (over-delivered
        # to a middle stage that lacks it, whose load_weights skips it).
        if any(first for k, (first, _) in stages.items() if k != 0):
            out["pp_first_pattern"] = ""
        if any(last for k, (_, last) in stages.items() if k != pp - 1):
            out["pp_last_pattern"] = ""
    return out


def _base_loader():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    return BaseModelLoader


class SluiceModelLoader(_base_loader()):
    """vLLM's model loader for `--load-format sluice` (see the module docstring)."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.options = _options(load_config.model_loader_extra_config)
        self.last_stats = None

    # ---- where the weights are
    def _location(self, model_config) -> str:
        return self.options["weights"] or getattr(model_config, "model_weights", None) or model_config.model

    def download_model(self, model_config) -> None:
        """Nothing to download: checks that the weights location opens (headers only)."""
        self._open(model_config)

    def _open(self, model_config, select=None, world=None, store=None):
        """Opens the weights (through the `index` extra-config key's index if
        set); with `world` and `store`, collectively: rank 0 reads the
        metadata, the other ranks replay it."""
        where = self._location(model_config)
        if not where.startswith("s3://") and not os.path.exists(where):
            raise sluice.ConfigError(f"--load-format sluice: the weights location '{where}' does not exist")
        index = self.options["index"]
        if index is not None and not os.path.isfile(index):
            raise sluice.ConfigError(f"--model-loader-extra-config: index '{index}' is not a file "
                                     "(a local model.safetensors.index.json)")
        return sluice.open(where, select=select, index=index, world=world, store=store)

    # ---- which tensors this rank needs
    @staticmethod
    def _world():
        import torch.distributed as dist
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @staticmethod
    def _local_experts(model_config, model=None):
        """The routed experts this rank owns under vLLM's expert parallelism
        (`compute_local_expert_ids`, its EP rank formula, with the placement
        the model's layers use: `effective_placement()`), or None when every
        rank needs every expert (no EP, or EPLB, whose redundant slots may hold
        any expert)."""
        if not getattr(model_config, "is_moe", False):
            return None
        from vllm.config import get_current_vllm_config
        from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
        pc = get_current_vllm_config().parallel_config
        if not pc.enable_expert_parallel or pc.enable_eplb:
            return None
        experts = model_config.get_num_experts()
        if experts <= 0:
            return None
        from vllm.distributed import get_dp_group, get_pcp_group, get_tensor_model_parallel_rank
        dp, tp, pcp = pc.data_parallel_size, pc.tensor_parallel_size, pc.prefill_context_parallel_size
        dp_rank = get_dp_group().rank_in_group if dp > 1 else 0
        tp_rank = get_tensor_model_parallel_rank() if tp > 1 else 0
        pcp_rank = get_pcp_group().rank_in_group if pcp > 1 else 0
        ep_size, ep_rank = dp * pcp * tp, dp_rank * pcp * tp + pcp_rank * tp + tp_rank  # as FusedMoEParallelConfig
        return compute_local_expert_ids(experts, ep_size, ep_rank,
                                        placement=effective_placement(model, pc.expert_placement_strategy))

    # ---- the loader API
    def get_all_weights(self, model_config, model):
        """(name, tensor) for every tensor this rank needs: what `load_weights`,
        `reload_weights(weights_path=...)` and sleep level 2 call."""
        local = self._local_experts(model_config, model)
        if self._world() > 1:
            yield from self._distributed(model_config, local, model)
            return
        yield from self._stream(self._open(model_config, select=self._ep_filter(local)), {})

    @staticmethod
    def _ep_filter(local):
        """The select that drops other ranks' routed-expert weights (vLLM's own
        EP weight filter), or None."""
        if local is None:
            return None
        from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight
        return lambda n: not should_skip_weight(n, local)

    def _distributed(self, model_config, local, model):
        """A load across vLLM's world group, each byte read from storage by one
        rank, the checkpoint opened collectively (rank 0 reads the index and
        the headers, the other ranks replay them). The mapping onto sluice's
        world is `placement()`'s."""
        from vllm.distributed import get_world_group
        from sluice._distributed import torch_world
        group = get_world_group()
        strategy = effective_placement(model, None)
        place = placement(model_config, local, strategy=strategy)
        stages = None
        if place["pp"] > 1:  # which stages' models hold the layer-less tensors: their own parameters say
            import torch.distributed as dist
            from vllm.distributed import get_pp_group
            flags = [None] * group.world_size
            dist.all_gather_object(flags, (get_pp_group().rank_in_group, anchored(model)), group=group.cpu_group)
            stages = {}
            for k, (first, last) in flags:
                had = stages.get(k, (False, False))
                stages[k] = (had[0] or first, had[1] or last)
        # One key prefix per load, agreed over the world's CPU group (a per-process
        # counter diverges when only some ranks load, e.g. a draft model); the
        # sluice world is ordered as sluice's plan is (PP x DP x TP).
        world, store = torch_world(group.cpu_group, prefix="sluice/vllm", rank=place["rank"])
        from vllm.logger import init_logger
        log = init_logger("vllm.sluice")
        for note in place["notes"]:
            log.info("sluice: %s", note)
        ck = self._open(model_config, world=world, store=store)
        if place["pp"] > 1:
            place = placement(model_config, local, ck=ck, stages=stages, strategy=strategy)
        options = {k: place[k] for k in ("expert_placement", "pp_stage_layers", "pp_first_pattern", "pp_last_pattern")}
        yield from self._stream(ck, {"topology": place["topology"], "offload": self.options["offload"],
                                     "store": store, "world": world, "plan": options})

    def _bar(self, total):
        from vllm.model_executor.model_loader.weight_utils import enable_tqdm
        if not enable_tqdm(self.load_config.use_tqdm_on_load):
            return None
        from tqdm.auto import tqdm
        from vllm.model_executor.model_loader.weight_utils import _BAR_FORMAT
        return tqdm(total=total, desc="Loading safetensors through sluice", unit="B", unit_scale=True,
                    unit_divisor=1024, bar_format=_BAR_FORMAT)

    @staticmethod
    def _advance(bar, base, off):
        """A load's progress callable that moves `bar` to `base` + its bytes
        done, or `off` (what the call takes for none) without a bar."""
        return (lambda done, total: bar.update(base + done - bar.n)) if bar is not None else off

    @staticmethod
    def _log():
        from vllm.logger import init_logger
        return init_logger("vllm.sluice")  # under vLLM's logger, so that its handlers print it

    def _stream(self, ck, distributed, bar=None, base=0, log=True):
        """Yields the load's tensors; `bar` (made here when None and log is
        True) advances from `base`; `log` prints the one-line summary."""
        own = bar is None and log
        if own:
            bar = self._bar(ck.tensor_bytes)
        t0 = time.perf_counter()
        it = sluice.iter_weights(ck, staging=self.options["staging"], max_read=self.options["max_read"],
                                 queue_depth=self.options["queue_depth"],
                                 progress=self._advance(bar, base, False),
                                 **{k: v for k, v in distributed.items() if k != "plan"},
                                 **distributed.get("plan", {}))
        try:
            with it:
                for name, tensor in it:
                    if getattr(tensor, "sluice_kind", None) == "placeholder":
                        continue  # another rank's expert or PP stage: neither read nor received here
                    yield name, tensor
        finally:
            if own and bar is not None:
                bar.close()
        self.last_stats = dict(it.stats or {})
        if not log:
            return
        seconds = max(time.perf_counter() - t0, 1e-9)
        read = self.last_stats.get("bytes_read", 0)
        received = self.last_stats.get("bytes_received", 0)
        self._log().info(
            "sluice: %s%s: %d tensors, %.3f GiB read, %.3f GiB received, %.2f GiB/s (%.2f s)", ck.location,
            f" (rank {distributed['world'].rank} of {distributed['world'].size} in sluice's order, {distributed['topology']})"
            if distributed else "", self.last_stats.get("tensors", 0), read / 2**30, received / 2**30,
            (read + received) / 2**30 / seconds, seconds)

    def load_weights(self, model, model_config) -> None:
        if self.options["direct"] and self._world() == 1:
            loaded = self._load_direct(model, model_config)
        else:
            loaded = model.load_weights(self.get_all_weights(model_config, model))
        LOADS.append(dict(self.last_stats or {}))
        del LOADS[:-16]
        if model_config.quantization is None and loaded is not None:
            from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
            DefaultModelLoader.track_weights_loading(self, model, loaded, quantized=False)

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

    def _load_direct(self, model, model_config):
        """One process: a dry run of `model.load_weights` (sluice._direct) finds
        the tensors whose bytes land whole in one parameter; sluice reads those
        straight into their parameters, and streams the rest through
        `model.load_weights` as usual. Returns the parameters loaded."""
        from sluice._direct import dry_run
        t0 = time.perf_counter()
        # The fresh parameters' first touch is most of a page-cache-hot load;
        # it starts now, on another core, rather than after the open and the
        # dry run (which touch no parameter memory), and load_into's own
        # prefaulter takes over from it.
        # (Not when parameters are to be mapped: most would be replaced.)
        early = sluice.prefault(model.parameters()) if self.options["prefault"] and not self.options["map"] else None
        try:
            ck = self._open(model_config, select=self._ep_filter(self._local_experts(model_config, model)))
            t1 = time.perf_counter()
            plan = dry_run(model, ck.tensors)
            dry = time.perf_counter() - t1
        finally:
            early_bytes = early.stop() if early is not None else 0
        log = self._log()
        if plan.failure:
            log.info("sluice: the dry run of load_weights failed (%s); streaming every tensor", plan.failure)
        else:
            for name, why in plan.streamed.items():
                log.debug("sluice: %s goes through load_weights: %s", name, why)
        bar = self._bar(ck.tensor_bytes)
        stats, mapped = {}, {}
        if self.options["map"] and plan.direct:
            mapped = self._map_parameters(model, ck, plan, bar)
        into = {name: dst for name, dst in plan.direct.items() if name not in mapped.get("names", ())}
        if into:
            base = bar.n if bar else 0
            stats = sluice.load_into(ck, into, staging=self.options["staging"], max_read=self.options["max_read"],
                                     queue_depth=self.options["queue_depth"], prefault=self.options["prefault"],
                                     progress=self._advance(bar, base, None))
        loaded = set(plan.loaded or ())
        streamed_stats = {}
        if plan.streamed:
            keep = set(plan.streamed)
            rest = ck.select(keep)  # the same opened checkpoint: no header read again
            base = bar.n if bar else 0
            got = model.load_weights(self._stream(rest, {}, bar=bar, base=base, log=False))
            loaded |= set(got or ())
            streamed_stats = self.last_stats or {}
        if bar is not None:
            bar.close()
        self.last_stats = {k: stats.get(k, 0) + streamed_stats.get(k, 0) + mapped.get(k, 0)
                           for k in ("bytes_read", "tensors")}
        self.last_stats.update(direct_tensors=len(plan.direct), streamed_tensors=len(plan.streamed),
                               mapped_parameters=mapped.get("mapped", {}).get("tensors", 0),
                               mapped_bytes=mapped.get("mapped", {}).get("bytes", 0),
                               dry_run_seconds=dry, prefaulted_bytes=early_bytes + stats.get("prefaulted_bytes", 0))
        seconds = max(time.perf_counter() - t0, 1e-9)
        read = self.last_stats["bytes_read"]
        log.info("sluice: %s: %d tensors (%d straight into their parameters%s, %d through load_weights), "
                 "%.3f GiB read, %.2f GiB/s (%.2f s, dry run %.2f s, %.3f GiB faulted in ahead)", ck.location,
                 len(plan.direct) + len(plan.streamed), len(plan.direct),
                 f", {self.last_stats['mapped_parameters']} of them page-cache mappings" if mapped else "", len(plan.streamed),
                 read / 2**30, read / 2**30 / seconds, seconds, dry, self.last_stats["prefaulted_bytes"] / 2**30)
        return loaded if plan.loaded is not None else None  # None: the model does not say (no strict check)
