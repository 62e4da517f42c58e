"""TP2 x PP2 x DP2 without eight processes: what sluice's dry run says each
PP stage's model takes (the ownership a multi-rank load exchanges), against
what vLLM's own model needs on each stage (pp_worker.py builds each stage with
vLLM's model class and make_layers, then offers it every checkpoint tensor
alone; a tensor is needed when its offer loads a parameter).

For the dense model, a tied-embedding dense model (vLLM's last stage ties its
lm_head to embed_tokens; its Qwen3-MoE builds embed_tokens on every stage) and
the MoE: each stage's dry run takes exactly the tensors its stage needs, with
no naming rule, and the sluice ranks are a permutation of vLLM's (vLLM orders
DP x PP x TP, sluice PP x DP x TP). Expert parallelism, which needs real
ranks, is test_vllm_ranks.py's.
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
def test_tp2_pp2_dp2_each_stages_dry_run_takes_exactly_what_its_vllm_parameters_need(stages, model):
    path, res = stages[model]
    for k, st in res["stages"].items():  # the oracle: vLLM's stage loads every parameter from what it needs
        assert st["loaded"] == st["params"], k
        assert st["takes"] == sorted(st["needed"]), (k, sorted(set(st["takes"]) ^ set(st["needed"]))[:5])
        assert st["calls"] == []   # no EP here: nothing is called without being taken
    first, last = (set(res["stages"][str(k)]["takes"]) for k in (0, PP - 1))
    assert first != last  # each stage its own layers
    # vLLM's Llama has embeddings on its last stage only when tied; its Qwen3-MoE has
    # the embeddings, the final norm and lm_head on every stage
    assert ("model.embed_tokens.weight" in last) == (model in ("tied", "moe"))
    assert ("model.norm.weight" in first) == (model == "moe")
    ranks = res["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(TP * PP * DP))
    assert all(r["size"] == TP * PP * DP for r in ranks)
    for r in ranks:   # a PP stage is a contiguous block of sluice ranks
        assert r["rank"] // (TP * DP) == r["pp_rank"]


def test_a_stage_split_that_does_not_match_the_checkpoint_fails_naming_the_numbers(stages):
    path, _ = stages["dense"]
    with pytest.raises(sluice.ConfigError, match=r"add up to 3, the checkpoint has 2 layers"):
        sluice.plan_owners(path, "tp1,dp4,pp2", pp_stage_layers=[1, 2])
    with pytest.raises(sluice.ConfigError, match="pp_stage_layers"):
        sluice.plan_owners(path, "tp1,dp4,pp2", pp_stage_layers=[1, 0])


def test_an_unknown_expert_placement_is_a_config_error_naming_it(stages):
    path, _ = stages["moe"]
    with pytest.raises(sluice.ConfigError, match="expert placement 'random': expected linear or round_robin"):
        sluice.plan_owners(path, "tp1,dp2,ep2", expert_placement="random")
