"""Tiny random checkpoints written by the real HF library (`save_pretrained`,
safetensors, sharded with an index): a dense Llama, a Qwen3-MoE with routed
experts (`mlp.experts.N.*`), and a DeepSeek-V3 with expert groups (the one
kind of model on which vLLM keeps round-robin expert placement). Shapes are
the smallest vLLM's CPU kernels take (head_dim 64)."""
import json
import os

import torch


def _save(model, path, shard):
    with torch.no_grad():  # random models emit near-constant tokens; spread the logits
        for p in model.parameters():
            p.mul_(4.0)
    model.save_pretrained(path, safe_serialization=True, max_shard_size=shard)
    return path


def dense(path, seed=0, tie=False, shard="400KB", **sizes):
    """`sizes`: config keys over the tiny defaults (bench/vllm_ranks.py's larger models)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                tie_word_embeddings=tie), **sizes})
    return _save(LlamaForCausalLM(cfg).to(torch.bfloat16), path, shard)


def phi3(path, seed=0):
    """Phi-3: its checkpoint keeps QKV and gate/up fused (`self_attn.qkv_proj`,
    `mlp.gate_up_proj`), which vLLM's merged column-parallel layers narrow
    run by run (q, k, v; gate, up). Grouped-query attention (4 heads, 2 KV
    heads, as Phi-3-medium and Phi-4-mini have): q's run is twice k's."""
    from transformers import Phi3Config, Phi3ForCausalLM
    torch.manual_seed(seed)
    cfg = Phi3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     original_max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     tie_word_embeddings=False)
    _save(Phi3ForCausalLM(cfg).to(torch.bfloat16), path, "400KB")
    _expect(path, "model.layers.0.self_attn.qkv_proj.weight")
    _expect(path, "model.layers.0.mlp.gate_up_proj.weight")
    return path


def moe(path, seed=0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=256, decoder_sparse_step=1,
                         mlp_only_layers=[], norm_topk_prob=True)
    return _save(Qwen3MoeForCausalLM(cfg).to(torch.bfloat16), path, "300KB")


def deepseek(path, seed=0):
    """DeepSeek-V3 (MLA, a shared expert, 4 routed experts in 2 groups) for
    vLLM's loader layer: vLLM keeps round-robin placement only where there
    are expert groups."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                           n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=0,
                           q_lora_rank=None, kv_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                           max_position_embeddings=256)
    _save(DeepseekV3ForCausalLM(cfg).to(torch.bfloat16), path, "300KB")
    # vLLM reads the gate's e_score_correction_bias only with DeepSeek-V3's routing method,
    # which transformers' config does not write.
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    c["topk_method"] = "noaux_tc"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    return path


def mixtral(path, seed=0, shard="300KB", **sizes):
    """Mixtral (8 layers' worth of naming in 2: `block_sparse_moe.experts.N.w1`,
    which sluice's name preset does not know), 4 experts, written in the
    original format (transformers fuses experts in memory and splits them
    again on save)."""
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(seed)
    cfg = MixtralConfig(**{**dict(vocab_size=512, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
                                  num_experts_per_tok=2, max_position_embeddings=256), **sizes})
    _save(MixtralForCausalLM(cfg).to(torch.bfloat16), path, shard)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        names = json.load(f)["weight_map"]
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in names, sorted(names)[:8]
    return path


def tensor_bytes(path, skip=lambda name: False):
    """The checkpoint's tensor bytes (of the tensors `skip` keeps), through HF safetensors."""
    from safetensors import safe_open
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "F8_E4M3": 1, "F8_E8M0": 1}
    total = 0
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), framework="pt") as st:
                for k in st.keys():
                    if skip(k):
                        continue
                    s = st.get_slice(k)
                    n = 1
                    for d in s.get_shape():
                        n *= d
                    total += n * sizes[s.get_dtype()]
    return total


# vLLM's parallel layers, by the checkpoint names of the models above: a
# column-parallel layer (QKV, gate/up, MLA's q and kv_b, the vocabulary)
# keeps its TP rank's block of rows, a row-parallel one (o_proj, down_proj)
# its block of columns; everything else (norms, routers, MLA's
# kv_a_proj_with_mqa, a ReplicatedLinear) is whole on every TP rank. Under
# expert parallelism a routed expert is whole on the rank that holds it, and
# a fused expert tensor (GraniteMoE's [E, ...]) is its experts' dim-0 rows.
# LFM2's short convolution: conv.conv (column-parallel), in_proj (merged
# column-parallel), out_proj (row-parallel, as its attention's out_proj).
# Phi-3's fused qkv_proj and gate_up_proj: merged column-parallel, 1/TP of
# each run, so 1/TP of the tensor.
import re as _re  # noqa: E402

_ROWS = _re.compile(r"\.(q_proj|k_proj|v_proj|qkv_proj|gate_proj|up_proj|gate_up_proj|kv_b_proj|embed_tokens|lm_head"
                   r"|conv\.conv|conv\.in_proj)"
                    r"\.weight$|^lm_head\.weight$")
_COLS = _re.compile(r"\.(o_proj|down_proj|out_proj)\.weight$")
_FUSED_EXPERTS = _re.compile(r"\.block_sparse_moe\.(input_linear|output_linear)\.weight$")


def tp_share(path, tp, mine=None, whole=None):
    """The bytes one TP rank of `tp` keeps of the checkpoint at `path`, as
    vLLM's layers narrow its tensors (the oracle the dry run's parts are
    checked against: it knows nothing of them). `mine`: under expert
    parallelism, the routed experts this rank holds (vLLM's
    compute_local_expert_ids); their tensors come whole, the others' not.
    `whole`: a pattern of tensors counted whole although vLLM narrows them
    (a gap of sluice's, named by the test that passes it)."""
    from vllm.model_executor.model_loader.ep_weight_filter import parse_expert_id
    from safetensors import safe_open
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "F8_E4M3": 1, "F8_E8M0": 1}
    total = 0
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, f), framework="pt") as st:
            for k in st.keys():
                s = st.get_slice(k)
                n = sizes[s.get_dtype()]
                for d in s.get_shape():
                    n *= d
                expert = parse_expert_id(k) if mine is not None else None
                if expert is not None:
                    total += n if expert in mine else 0
                elif mine is not None and _FUSED_EXPERTS.search(k):
                    total += n // s.get_shape()[0] * len(mine)
                elif whole is not None and _re.search(whole, k):
                    total += n
                elif _ROWS.search(k) or _COLS.search(k):
                    total += n // tp
                else:
                    total += n
    return total


def granitemoe(path, seed=0, shard="300KB", **sizes):
    """GraniteMoE: its experts fused in two 3-D tensors per layer
    (`block_sparse_moe.input_linear.weight` [E, 2I, H], `output_linear`
    [E, H, I]), so no per-expert name exists; an EP rank's experts are dim-0
    blocks of each."""
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM
    torch.manual_seed(seed)
    cfg = GraniteMoeConfig(**{**dict(vocab_size=512, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=256, tie_word_embeddings=False),
                              **sizes})
    _save(GraniteMoeForCausalLM(cfg).to(torch.bfloat16), path, shard)
    _expect(path, "model.layers.0.block_sparse_moe.input_linear.weight")
    return path


def lfm2_moe(path, seed=0):
    """LFM2-MoE (a short-convolution layer and an attention layer, both MoE):
    experts named `feed_forward.experts.N.w1`."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM
    torch.manual_seed(seed)
    cfg = Lfm2MoeConfig(vocab_size=512, hidden_size=256, intermediate_size=128, moe_intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                        num_experts_per_tok=2, num_dense_layers=0, layer_types=["conv", "full_attention"],
                        max_position_embeddings=256, tie_word_embeddings=True)
    _save(Lfm2MoeForCausalLM(cfg).to(torch.bfloat16), path, "300KB")
    _expect(path, "model.layers.0.feed_forward.experts.3.w1.weight")
    return path


def _expect(path, name):
    """The naming scheme a test is about is the one transformers wrote."""
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        names = json.load(f)["weight_map"]
    assert name in names, sorted(names)[:8]


def deepseek_v4(path, seed=0):
    """DeepSeek V4 as transformers writes it (`model.layers.N.ffn.experts.E.w1.weight`,
    hash-routed first layer), made loadable by vLLM 0.32's own DeepseekV4ForCausalLM: vLLM's
    config reads compress_ratios and num_hash_layers where transformers writes layer_types
    and mlp_layer_types, wants the noaux_tc gate, a head_dim its compressor takes (512, not 64),
    and names two tensors otherwise (hc_head_*, attn.kv_norm). The expert names stay
    transformers'."""
    import re
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, max_position_embeddings=256, num_experts_per_tok=2,
                           tie_word_embeddings=False, moe_intermediate_size=128, head_dim=512, q_lora_rank=128,
                           o_groups=2, o_lora_rank=64, index_n_heads=4, index_head_dim=128, index_topk=16,
                           sliding_window=16, n_routed_experts=4, n_shared_experts=1, hc_mult=2,
                           num_nextn_predict_layers=0,
                           layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
                           mlp_layer_types=["hash_moe", "moe"])
    _save(DeepseekV4ForCausalLM(cfg).to(torch.bfloat16), path, "1MB")
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    ratios = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    c["compress_ratios"] = [ratios[t] for t in c.pop("layer_types")]
    c["num_hash_layers"] = sum(t == "hash_moe" for t in c.pop("mlp_layer_types"))
    c["topk_method"] = "noaux_tc"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=1)

    def rename(k):
        k = re.sub(r"^model\.hc_head\.hc_(fn|base|scale)$", r"model.hc_head_\1", k)
        return re.sub(r"\.attn\.norm\.weight$", ".attn.kv_norm.weight", k)
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as f:
        idx = json.load(f)
    for shard in sorted(set(idx["weight_map"].values())):
        file = os.path.join(path, shard)
        save_file({rename(k): v for k, v in load_file(file).items()}, file, metadata={"format": "pt"})
    idx["weight_map"] = {rename(k): v for k, v in idx["weight_map"].items()}
    with open(index, "w") as f:
        json.dump(idx, f, indent=1)
    _expect(path, "model.layers.0.ffn.experts.3.w1.weight")
    return path
