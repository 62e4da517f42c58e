"""vLLM's parallel groups as sluice's world: where a vLLM rank sits in
sluice's plan (PP x DP x TP), the layers of each PP stage, which experts a
rank's MoE layers own, and the plan knobs that follow. The plan's naming
rules are the C++ classifier's own (`_sluice.name_rules`), never a copy."""
from __future__ import annotations

from .. import _sluice
from . import _vllm

__all__ = ["sluice_rank", "stage_layers", "anchored", "effective_placement", "placement", "local_experts",
           "ep_filter", "checkpoint_layers"]

# EP rank of routed expert e in sluice's plan (policy::expert_placement), per vLLM strategy name.
_SLUICE_PLACEMENT = {"linear": lambda e, ep, experts: e * ep // experts, "round_robin": lambda e, ep, experts: e % ep}


def sluice_rank(pp_rank, dp_rank, pcp_rank, tp_rank, dp, pcp, tp):
    """A vLLM rank's place in sluice's world. vLLM orders its world DP x PP x
    (PCP x) TP, sluice's plan PP x DP x TP: a PP stage is a contiguous block
    of dp*pcp*tp sluice ranks, and within it a rank's offset is its vLLM EP
    rank (dp_rank*pcp*tp + pcp_rank*tp + tp_rank, as FusedMoEParallelConfig)."""
    return pp_rank * dp * pcp * tp + (dp_rank * pcp + pcp_rank) * tp + tp_rank


def checkpoint_layers(ck):
    """Decoder layers the checkpoint's names hold, by the plan's layer rule (0: none)."""
    found = [layer for layer, _ in _sluice.name_rules([t.name for t in ck.tensors]) if layer is not None]
    return max(found) + 1 if found else 0


def stage_layers(model_config, pp, checkpoint_layers=None):
    """Layers per PP stage as vLLM splits them (its own `get_pp_indices` over
    the model's hidden layers); checkpoint layers beyond them (an MTP or draft
    layer, which vLLM's main model skips) go with the last stage."""
    total = model_config.get_total_num_hidden_layers()
    counts = [end - start for start, end in (_vllm.get_pp_indices(total, k, pp) for k in range(pp))]
    if checkpoint_layers is not None and checkpoint_layers > total:
        counts[-1] += checkpoint_layers - total
    return counts


def anchored(model) -> tuple:
    """(embeddings, head): whether a vLLM model (one PP stage of it) has
    parameters of the layer-less tensors sluice gives the first stage
    (embed_tokens) and the last (the final norm, lm_head), by the plan's own
    anchor rules. vLLM's models differ: Llama builds them on their stage only
    (and the embeddings on the last stage too when tied), Qwen3-MoE on every
    stage."""
    names = [n for n, _ in model.named_parameters()] if model is not None else []
    anchors = {a for _, a in _sluice.name_rules(names)} if names else set()
    return "first" in anchors, "last" in anchors


def effective_placement(model, default):
    """The expert placement the model's MoE layers were built with: vLLM's
    layers fall back from round_robin to linear where they cannot route it
    (models without expert groups, EPLB, some all-to-all backends), while its
    parallel config still says round_robin. `default` where the model has no
    such layer, or its layers disagree."""
    found = {getattr(getattr(m, "expert_map_manager", None), "placement_strategy", None)
             for m in model.modules()} - {None} if model is not None else set()
    return found.pop() if len(found) == 1 else default


def local_experts(model_config, model=None):
    """The routed experts this rank owns under vLLM's expert parallelism
    (`compute_local_expert_ids`, its EP rank formula, with the placement the
    model's layers use: `effective_placement()`), or None when every rank
    needs every expert (no EP, or EPLB, whose redundant slots may hold any
    expert)."""
    if not getattr(model_config, "is_moe", False):
        return None
    pc = _vllm.current_parallel_config()
    if not pc.enable_expert_parallel or pc.enable_eplb:
        return None
    experts = model_config.get_num_experts()
    if experts <= 0:
        return None
    pp_rank, dp_rank, pcp_rank, tp_rank = _vllm.parallel_ranks(pc)
    dp, tp, pcp = pc.data_parallel_size, pc.tensor_parallel_size, pc.prefill_context_parallel_size
    ep_size, ep_rank = dp * pcp * tp, dp_rank * pcp * tp + pcp_rank * tp + tp_rank  # as FusedMoEParallelConfig
    return _vllm.compute_local_expert_ids(experts, ep_size, ep_rank,
                                          effective_placement(model, pc.expert_placement_strategy))


def ep_filter(local):
    """The select that drops other ranks' routed-expert weights (vLLM's own
    EP weight filter), or None."""
    if local is None:
        return None
    return lambda n: not _vllm.should_skip_weight(n, local)


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
        parallel = _vllm.current_parallel_config()
    tp, pp, dp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size, parallel.data_parallel_size
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    if ranks is None:
        ranks = _vllm.parallel_ranks(parallel)
    stage = dp * pcp * tp
    notes = []
    ep = 1
    strategy = strategy or parallel.expert_placement_strategy
    if local is not None:
        experts = model_config.get_num_experts()
        rule = _SLUICE_PLACEMENT.get(strategy)
        if rule is None:
            notes.append(f"expert placement {strategy!r} is not one sluice's plan has (linear, round_robin): every "
                         "rank receives every expert (read once) and vLLM's weight loaders keep their own")
        elif all(_vllm.compute_local_expert_ids(experts, stage, r, strategy) ==
                 {e for e in range(experts) if rule(e, stage, experts) == r} for r in range(stage)):
            ep = stage
        else:
            notes.append(f"vLLM's {strategy} split of {experts} experts over EP={stage} is not sluice's: every rank "
                         "receives every expert (read once) and vLLM's weight loaders keep their own")
    out = {"rank": sluice_rank(*ranks, dp, pcp, tp), "size": pp * stage, "pp": pp, "notes": notes,
           "expert_placement": strategy if ep > 1 else "linear", "pp_stage_layers": [],
           "pp_first_pattern": None, "pp_last_pattern": None, "topology": f"tp1,dp{stage},ep{ep}" + (f",pp{pp}" if pp > 1 else "")}
    if pp > 1:
        out["pp_stage_layers"] = stage_layers(model_config, pp, checkpoint_layers(ck) if ck is not None else None)
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
