"""TP2 x PP2 x DP2 without eight processes: sluice's plan (sluice.plan_owners)
for the placement sluice.vllm computes from vLLM's parallel config, against
what vLLM's own model needs on each stage (pp_worker.py builds each stage with
vLLM's model class and make_layers, then offers it every checkpoint tensor
alone; a tensor is needed when its offer loads a parameter).

For the dense model, a tied-embedding dense model (vLLM's last stage ties its
lm_head to embed_tokens; its Qwen3-MoE builds embed_tokens on every stage) and the MoE with expert parallelism (EP = DP x TP = 4
per stage): each of the 8 ranks owns exactly the tensors its stage needs,
less, under EP, other ranks' experts (vLLM's own should_skip_weight), and the
sluice ranks are a permutation of vLLM's (vLLM orders DP x PP x TP, sluice
PP x DP x TP).
"""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
pytest.importorskip("vllm")

import sluice  # noqa: E402
import models  # noqa: E402

TP, PP, DP = 2, 2, 2


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    d = tmp_path_factory.mktemp("pp")
    paths = {"dense": models.dense(str(d / "dense")), "tied": models.dense(str(d / "tied"), tie=True),
             "moe": models.moe(str(d / "moe"))}
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = d / "pp.json"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.join(HERE, "pp_worker.py"), str(out), str(port), str(TP), str(PP),
                        str(DP), f"{paths['moe']}:1", f"{paths['dense']}:0", f"{paths['tied']}:0"],  # MoE first: vLLM makes
                       # its EP group only for a MoE model's config
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:]
    res = json.loads(out.read_text())
    return {k: (path, res[path]) for k, path in paths.items()}


@pytest.mark.parametrize("model", ["dense", "tied", "moe"])
def test_tp2_pp2_dp2_each_rank_owns_exactly_what_its_vllm_parameters_need(stages, model):
    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight
    path, res = stages[model]
    for k, st in res["stages"].items():  # the oracle: vLLM's stage loads every parameter from what it needs
        assert st["loaded"] == st["params"], k
    first, last = (set(res["stages"][str(k)]["needed"]) for k in (0, PP - 1))
    assert first != last  # each stage its own layers
    # vLLM's Llama has embeddings on its last stage only when tied; its Qwen3-MoE has
    # the embeddings, the final norm and lm_head on every stage
    assert ("model.embed_tokens.weight" in last) == (model in ("tied", "moe"))
    assert ("model.norm.weight" in first) == (model == "moe")
    ranks = res["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(TP * PP * DP))
    assert len({(r["topology"], tuple(r["pp_stage_layers"]), r["pp_first_pattern"], r["pp_last_pattern"])
                for r in ranks}) == 1
    r0 = ranks[0]
    assert r0["topology"] == ("tp1,dp4,ep4,pp2" if model == "moe" else "tp1,dp4,ep1,pp2"), r0["notes"]
    owners = sluice.plan_owners(path, r0["topology"], pp_stage_layers=r0["pp_stage_layers"],
                                pp_first_pattern=r0["pp_first_pattern"], pp_last_pattern=r0["pp_last_pattern"])
    assert len(owners) == TP * PP * DP
    for r in ranks:
        want = set(res["stages"][str(r["pp_rank"])]["needed"])
        if r["local_experts"] is not None:
            want = {n for n in want if not should_skip_weight(n, set(r["local_experts"]))}
        got = set(owners[r["rank"]])
        assert got == want, (r["vllm_rank"], sorted(got - want)[:5], sorted(want - got)[:5])


def test_a_stage_split_that_does_not_match_the_checkpoint_fails_naming_the_numbers(stages):
    path, _ = stages["dense"]
    with pytest.raises(sluice.ConfigError, match=r"add up to 3, the checkpoint has 2 layers"):
        sluice.plan_owners(path, "tp1,dp4,pp2", pp_stage_layers=[1, 2])
    with pytest.raises(sluice.ConfigError, match="pp_stage_layers"):
        sluice.plan_owners(path, "tp1,dp4,pp2", pp_stage_layers=[1, 0])


@pytest.mark.parametrize("strategy", ["linear", "round_robin"])
def test_each_expert_placement_spans_ep_over_the_stage_and_sluices_plan_gives_each_rank_vllms_experts(stages,
                                                                                                     strategy):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids, parse_expert_id
    path, _ = stages["moe"]
    cfg = EngineArgs(model=path, load_format="dummy", tensor_parallel_size=2, enable_expert_parallel=True,
                     expert_placement_strategy=strategy, dtype="bfloat16", enforce_eager=True, max_model_len=128,
                     skip_tokenizer_init=True).create_engine_config()
    local = compute_local_expert_ids(4, 2, 1, placement=strategy)
    place = sluice.vllm.placement(cfg.model_config, local, parallel=cfg.parallel_config, ranks=(0, 0, 0, 1))
    assert place["rank"] == 1
    assert place["topology"] == "tp1,dp2,ep2" and not place["notes"], place["notes"]
    assert place["expert_placement"] == strategy
    owners = sluice.plan_owners(path, place["topology"], expert_placement=place["expert_placement"])
    for r in range(2):
        experts = {parse_expert_id(n) for n in owners[r]} - {None}
        assert experts == compute_local_expert_ids(4, 2, r, placement=strategy), (r, strategy)
    # The model's layers override the config (vLLM's round-robin fallback): placement() takes theirs.
    place = sluice.vllm.placement(cfg.model_config, local, parallel=cfg.parallel_config, ranks=(0, 0, 0, 1),
                                  strategy="linear")
    assert place["expert_placement"] == "linear"
    # A placement sluice's plan does not have: experts replicated, and the log says why.
    place = sluice.vllm.placement(cfg.model_config, local, parallel=cfg.parallel_config, ranks=(0, 0, 0, 1),
                                  strategy="random")
    assert place["topology"] == "tp1,dp2,ep1" and place["expert_placement"] == "linear"
    assert len(place["notes"]) == 1 and "'random'" in place["notes"][0], place["notes"]


def test_an_unknown_expert_placement_is_a_config_error_naming_it(stages):
    path, _ = stages["moe"]
    with pytest.raises(sluice.ConfigError, match="expert placement 'random': expected linear or round_robin"):
        sluice.plan_owners(path, "tp1,dp2,ep2", expert_placement="random")
