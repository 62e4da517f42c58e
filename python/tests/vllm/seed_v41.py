"""A DeepSeek V4.1-shaped model for this CPU: its loading code is vLLM 0.32's
own V4.1 code, bound to a module tree small enough to build here (the real
classes need CUDA: FlashMLA, UVA, cudaHostRegister).

What comes from vLLM, unchanged (`vllm/models/deepseek_v41/...`):
- the VL wrapper's `load_weights` (nvidia/vl_model.py:319-330): its names mapped
  and the whole stream *sorted* before any weight loads, then a flag that the
  child finalized (its `process_weights_after_loading` then does nothing);
- the language model's `load_weights` (nvidia/model.py:1662-1680) and its
  `process_weights_after_loading` (1682): the finalization inside
  `load_weights`, which computes `hc_attn_fn_broadcast` from a loaded
  parameter (`finalize_mhc_broadcast_weights`, 1413-1426);
- the decoder's `load_weights` (nvidia/model.py:1241-1366): stacked shards,
  experts through the expert mapping (`get_expert_mapping`, 1485-1497);
- `DPSharedEngramStorage.load_weight` (common/engram.py:848-856): the group's
  leader copies the Engram table into one host allocation the node's DP
  ranks share, and every rank barriers once per call. Its `_allocate`
  (engram.py:783-838) is replaced by `CpuSharedEngramStorage._allocate`
  below, the same one `/dev/shm` file per group without cudaHostRegister;
- the DSpark draft's `load_weights` (nvidia/dspark.py:369-497), which takes
  the checkpoint's `mtp.K.*` tensors and skips the rest.

The checkpoint carries V4.1's names: `embed.weight`, `head.weight`,
`norm.weight`, `layers.N.{attn_norm,ffn_norm}.weight`, `layers.N.hc_attn_fn`,
`layers.N.attn.{wq,wo}.weight`, `layers.N.ffn.gate.weight`,
`layers.N.ffn.experts.E.w{1,2,3}.weight`, `layers.N.ffn.shared_experts.w{1,2,3}.weight`,
`layers.0.engram.embed.weight` (F8_E4M3) and `.scale` (F8_E8M0),
`mtp.0.*`. `write(path)` writes one (three shards and an index, the draft's
tensors in the last two among the main model's).

Registered in a process by `register()` (vLLM's ModelRegistry):
`SluiceSeedV41ForCausalLM` (the main model) and `SluiceSeedV41DSpark` (the
draft, through `hf_overrides={"architectures": [...]}` on the same
checkpoint). With DP > 1 the Engram group is vLLM's DP group (the tests'
ranks are one node)."""
import json
import mmap
import os
import tempfile

import numpy as np
import torch
from torch import nn

HC_MULT, HC_MIX, ENGRAM_BLOCK = 2, 4, 32
ARCH, DRAFT_ARCH = "SluiceSeedV41ForCausalLM", "SluiceSeedV41DSpark"
#: The tests' sizes; the model reads its own from the config (bench/vllm_ranks.py writes larger ones).
SIZES = dict(hidden_size=256, moe_intermediate_size=128, n_routed_experts=4, num_hidden_layers=2, vocab_size=512,
             engram_rows=8192, engram_dim=512)


def write(path, seed=0, **sizes):
    """A seed-shaped checkpoint at `path` (a directory), with a config vLLM
    parses as DeepSeek V4 (the keys models.deepseek_v4 found it reads);
    `sizes` over SIZES."""
    from safetensors.torch import save_file
    from transformers import DeepseekV4Config
    z = {**SIZES, **sizes}
    H, I, E, LAYERS, VOCAB = (z[k] for k in ("hidden_size", "moe_intermediate_size", "n_routed_experts",
                                             "num_hidden_layers", "vocab_size"))
    ENGRAM_ROWS, ENGRAM_DIM = z["engram_rows"], z["engram_dim"]
    g = torch.Generator().manual_seed(seed)

    def r(*shape, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g) * 0.5).to(dtype)
    t = {"embed.weight": r(VOCAB, H), "head.weight": r(VOCAB, H), "norm.weight": r(H)}
    for n in range(LAYERS):
        p = f"layers.{n}."
        t.update({p + "attn_norm.weight": r(H), p + "ffn_norm.weight": r(H), p + "hc_attn_fn": r(HC_MIX, HC_MULT * H,
                  dtype=torch.float32), p + "attn.wq.weight": r(H, H), p + "attn.wo.weight": r(H, H),
                  p + "ffn.gate.weight": r(E, H), p + "ffn.shared_experts.w1.weight": r(I, H),
                  p + "ffn.shared_experts.w3.weight": r(I, H), p + "ffn.shared_experts.w2.weight": r(H, I)})
        for e in range(E):
            t.update({f"{p}ffn.experts.{e}.w1.weight": r(I, H), f"{p}ffn.experts.{e}.w3.weight": r(I, H),
                      f"{p}ffn.experts.{e}.w2.weight": r(H, I)})
    t["layers.0.engram.embed.weight"] = r(ENGRAM_ROWS, ENGRAM_DIM, dtype=torch.float32).to(torch.float8_e4m3fn)
    t["layers.0.engram.embed.scale"] = torch.randint(100, 140, (ENGRAM_ROWS, ENGRAM_DIM // ENGRAM_BLOCK), generator=g,
                                                     dtype=torch.uint8).view(torch.float8_e8m0fnu)
    draft = {"mtp.0.main_proj.weight": r(H, 2 * H), "mtp.0.attn_norm.weight": r(H), "mtp.0.norm.weight": r(H),
             "mtp.0.ffn.gate.weight": r(E, H), "mtp.0.ffn.shared_experts.w1.weight": r(I, H),
             "mtp.0.ffn.shared_experts.w3.weight": r(I, H), "mtp.0.ffn.shared_experts.w2.weight": r(H, I)}
    for e in range(E):
        draft.update({f"mtp.0.ffn.experts.{e}.w1.weight": r(I, H), f"mtp.0.ffn.experts.{e}.w3.weight": r(I, H),
                      f"mtp.0.ffn.experts.{e}.w2.weight": r(H, I)})
    os.makedirs(path, exist_ok=True)
    names = sorted(t)
    shards = [names[: len(names) // 3], names[len(names) // 3: 2 * len(names) // 3], names[2 * len(names) // 3:]]
    dnames = sorted(draft)
    shards[1] += dnames[: len(dnames) // 2]
    shards[2] += dnames[len(dnames) // 2:]
    t.update(draft)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({k: t[k].contiguous() for k in shard}, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update({k: file for k in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.numel() * v.element_size() for v in t.values())},
                   "weight_map": weight_map}, f, indent=1)
    cfg = DeepseekV4Config(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=4,
                           num_key_value_heads=1, max_position_embeddings=256, num_experts_per_tok=2,
                           tie_word_embeddings=False, moe_intermediate_size=I, head_dim=512, q_lora_rank=128,
                           o_groups=2, o_lora_rank=64, index_n_heads=4, index_head_dim=128, index_topk=16,
                           sliding_window=16, n_routed_experts=E, n_shared_experts=1, hc_mult=HC_MULT,
                           num_nextn_predict_layers=0)
    c = cfg.to_dict()
    c.pop("layer_types", None)
    c.pop("mlp_layer_types", None)
    c.update(architectures=[ARCH], compress_ratios=[0] * LAYERS, num_hash_layers=0, topk_method="noaux_tc",
             torch_dtype="bfloat16", engram_rows=ENGRAM_ROWS, engram_dim=ENGRAM_DIM)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return path


def draft_names(path):
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        return {k for k in json.load(f)["weight_map"] if k.startswith("mtp.")}


def share(path, rank, draft, ep=2):
    """The oracle of a seed-shaped checkpoint at TP1 x DPn x EPn, n = `ep`:
    the bytes rank `rank` keeps of the main model's tensors or the draft's
    (mtp.*): routed experts only on their EP rank (vLLM's parse_expert_id
    and compute_local_expert_ids), the DP-shared Engram table only on its
    group's leader (DP rank 0, which writes the one copy), everything else
    whole. It knows nothing of the dry run."""
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids, parse_expert_id
    from models import tensor_bytes
    with open(os.path.join(path, "config.json")) as f:
        mine = compute_local_expert_ids(json.load(f)["n_routed_experts"], ep, rank)

    def skip(name):
        if name.startswith("mtp.") != draft:
            return True
        if ".engram.embed." in name:
            return rank != 0
        expert = parse_expert_id(name)
        return expert is not None and expert not in mine
    return tensor_bytes(path, skip=skip)


def register():
    """Registers both classes with vLLM in this process (the class objects:
    vLLM inspects them here, not in a subprocess that would need this
    directory on its path)."""
    from vllm import ModelRegistry
    ModelRegistry.register_model(ARCH, SeedV41ForCausalLM)
    ModelRegistry.register_model(DRAFT_ARCH, SeedV41DSpark)


# ---- the module tree (CPU layers of vLLM's), with V4.1's loading code bound

from vllm.distributed import get_dp_group  # noqa: E402
from vllm.model_executor.layers.fused_moe import FusedMoEFactory  # noqa: E402
from vllm.model_executor.layers.layernorm import RMSNorm  # noqa: E402
from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,  # noqa: E402
                                               ReplicatedLinear, RowParallelLinear)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding  # noqa: E402
from vllm.model_executor.models.utils import WeightsMapper  # noqa: E402
from vllm.model_executor.utils import set_weight_attrs  # noqa: E402
from vllm.models.deepseek_v41.common import engram as _engram  # noqa: E402
from vllm.models.deepseek_v41.nvidia import dspark as _dspark  # noqa: E402
from vllm.models.deepseek_v41.nvidia import model as _model  # noqa: E402
from vllm.models.deepseek_v41.nvidia import vl_model as _vl  # noqa: E402


class CpuSharedEngramStorage(_engram.DPSharedEngramStorage):
    """vLLM's DPSharedEngramStorage (its load_weight: the leader writes, all
    barrier) over one `/dev/shm` file per group, as its `_allocate` makes it,
    without the cudaHostRegister this CPU has no use for."""

    def _allocate(self, num_bytes):
        group = self.group
        backing = path = None
        if group.rank_in_group == 0:
            backing = tempfile.NamedTemporaryFile(prefix="vllm_engram_", dir="/dev/shm")
            backing.truncate(num_bytes)
            path = backing.name
        path = group.broadcast_object(path)
        with open(path, "r+b") as file:
            self._mapping = mmap.mmap(file.fileno(), num_bytes, flags=mmap.MAP_SHARED)
        tensor = torch.from_numpy(np.frombuffer(self._mapping, dtype=np.uint8))
        torch.distributed.barrier(group=group.cpu_group)   # every rank mapped it before the leader unlinks
        if backing is not None:
            backing.close()
        self.path = path
        return tensor


class SeedEngramEmbedding(nn.Module):
    """ParallelEngramEmbedding's parameters and loader with dp_shared_memory
    (engram.py:1005-1015, 1036-1043): one table for the node's DP ranks."""

    def __init__(self, config):
        super().__init__()
        ENGRAM_ROWS, ENGRAM_DIM = config.engram_rows, config.engram_dim
        group = get_dp_group()
        if group.world_size > 1:
            self.shared = CpuSharedEngramStorage(ENGRAM_ROWS, ENGRAM_DIM, ENGRAM_BLOCK, group)
            weight, scales, loader = self.shared.weight, self.shared.weight_scale_inv, self.shared.load_weight
        else:
            self.shared = None
            weight = torch.empty(ENGRAM_ROWS, ENGRAM_DIM, dtype=torch.float8_e4m3fn)
            scales = torch.empty(ENGRAM_ROWS, ENGRAM_DIM // ENGRAM_BLOCK, dtype=torch.uint8)
            loader = _engram._engram_head_shard_weight_loader
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scales, requires_grad=False)
        for p in (self.weight, self.weight_scale_inv):
            set_weight_attrs(p, {"weight_loader": loader, "engram_vocab_start": 0})


class SeedMoE(_model.DeepseekV4MoE):
    """V4's MoE as far as loading goes: router, routed experts (vLLM's fused
    MoE, EP-split as configured), a shared expert; finalize_mega_moe_weights
    is V4's (nothing to do without the native mega-MoE)."""

    def __init__(self, config, prefix):
        nn.Module.__init__(self)
        H, I, E = config.hidden_size, config.moe_intermediate_size, config.n_routed_experts
        self.use_native_mega_moe = False
        self.gate = ReplicatedLinear(H, E, bias=False, quant_config=None, prefix=f"{prefix}.gate")
        self.shared_experts = nn.Module()
        self.shared_experts.gate_up_proj = MergedColumnParallelLinear(H, [I, I], bias=False,
                                                                      prefix=f"{prefix}.shared_experts.gate_up_proj")
        self.shared_experts.down_proj = RowParallelLinear(I, H, bias=False, prefix=f"{prefix}.shared_experts.down_proj")
        self.experts = FusedMoEFactory(gate=self.gate, num_experts=E, top_k=2, hidden_size=H, intermediate_size=I,
                                       renormalize=True, quant_config=None, prefix=f"{prefix}.experts")


class SeedLayer(_model.DeepseekV4DecoderLayer):
    def __init__(self, config, prefix, engram):
        nn.Module.__init__(self)
        H = config.hidden_size
        self.hidden_size, self.hc_mult = H, HC_MULT
        self.attn_norm = RMSNorm(H)
        self.ffn_norm = RMSNorm(H)
        self.hc_attn_fn = nn.Parameter(torch.empty(HC_MIX, HC_MULT * H, dtype=torch.float32), requires_grad=False)
        self.hc_attn_fn_broadcast = None
        self.attn = nn.Module()
        self.attn.wq = ColumnParallelLinear(H, H, bias=False, prefix=f"{prefix}.attn.wq")
        self.attn.wo = RowParallelLinear(H, H, bias=False, prefix=f"{prefix}.attn.wo")
        self.ffn = SeedMoE(config, f"{prefix}.ffn")
        self.engram = None
        if engram:
            self.engram = nn.Module()
            self.engram.embed_tokens = SeedEngramEmbedding(config)


class SeedModel(_model.DeepseekV4Model):
    """The decoder stack; its load_weights, get_expert_mapping and
    finalize_* are V4.1's."""

    def __init__(self, vllm_config, prefix=""):
        nn.Module.__init__(self)
        self.config = vllm_config.model_config.hf_config
        self.vllm_config, self.quant_config, self.use_sequence_parallel = vllm_config, None, False
        c = self.config
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(SeedLayer(c, f"{prefix}.layers.{n}", engram=n == 0) for n in range(c.num_hidden_layers))
        self.start_layer, self.end_layer = 0, c.num_hidden_layers
        self.norm = RMSNorm(c.hidden_size)


class SeedLLM(_model.DeepseekV41LLMForCausalLM):
    def __init__(self, vllm_config, prefix=""):
        nn.Module.__init__(self)
        self.config = vllm_config.model_config.hf_config
        self.hf_to_vllm_mapper = WeightsMapper()   # as the VL wrapper sets it (vl_model.py:183)
        self.model = SeedModel(vllm_config, prefix=f"{prefix}.model")
        self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size, prefix=f"{prefix}.lm_head")


class _LoadingOnly:
    """What vLLM checks a generative model for; these models only load."""

    def forward(self, *a, **k):
        raise NotImplementedError("a loading test model")

    def compute_logits(self, hidden_states):
        raise NotImplementedError("a loading test model")

    def embed_input_ids(self, input_ids):
        raise NotImplementedError("a loading test model")


class SeedV41ForCausalLM(_LoadingOnly, nn.Module):
    """The VL wrapper (DeepseekV41ForCausalLM's loading: sort, then the child)."""
    load_weights = _vl.DeepseekV41ForCausalLM.load_weights
    process_weights_after_loading = _vl.DeepseekV41ForCausalLM.process_weights_after_loading

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        self.config = vllm_config.model_config.hf_config
        self.language_model = SeedLLM(vllm_config, prefix="language_model")
        self.hf_to_vllm_mapper = _vl._make_deepseek_v4_vl_weights_mapper(
            getattr(self.config, "expert_dtype", "fp4"), "weight_scale_inv")

    def broadcasts(self):
        """The finalization's outputs (not parameters): {name: tensor}."""
        return {f"layers.{n}.hc_attn_fn_broadcast": layer.hc_attn_fn_broadcast
                for n, layer in enumerate(self.language_model.model.layers) if layer.hc_attn_fn_broadcast is not None}


class SeedDraftLayer(nn.Module):
    def __init__(self, config, prefix):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size)
        self.ffn = SeedMoE(config, f"{prefix}.ffn")


class SeedV41DSpark(_LoadingOnly, _dspark.DSparkDeepseekV4ForCausalLM):
    """The DSpark draft: V4.1's draft loader over `mtp.0.*`."""

    def __init__(self, *, vllm_config, prefix=""):
        nn.Module.__init__(self)
        self.config = vllm_config.model_config.hf_config
        self.quant_config, self.linear_scale_name, self.pad_shared_expert = None, "weight_scale_inv", False
        H = self.config.hidden_size
        self.model = nn.Module()
        self.model.main_proj = ReplicatedLinear(2 * H, H, bias=False, prefix="model.main_proj")
        self.model.norm = RMSNorm(H)
        self.model.confidence_head = None
        self.model.layers = nn.ModuleList([SeedDraftLayer(self.config, "model.layers.0")])
