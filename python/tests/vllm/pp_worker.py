"""What each PP stage of a vLLM model needs from its checkpoint, from vLLM itself,
in one process: the model is built as stage k of PP (vLLM's own model class and
`make_layers`, with a PP group that says "rank k of PP"; TP = 1, since TP does
not change the names a rank needs), then every checkpoint tensor is offered to
its `load_weights` alone: the stage needs the tensors whose offer loads a
parameter. Beside that oracle, the same stage's model goes through sluice's
dry run of load_weights over the whole checkpoint (what the ranks of a
multi-rank load exchange): {stage: {"needed", "params", "loaded", "takes",
"calls"}}, and every rank of TP x PP x DP's place in sluice's order
(sluice.vllm.sluice_place), to OUT.

    python pp_worker.py OUT PORT TP PP DP MODEL:EP [MODEL:EP ...]

(EP: 1 turns vLLM's expert parallelism on.) Writes {MODEL: {"stages", "ranks"}}.
"""
import json
import sys
import types

import torch


def main():
    out, port, tp, pp, dp = sys.argv[1:6]
    tp, pp, dp = int(tp), int(pp), int(dp)
    import os
    from safetensors import safe_open
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel, parallel_state
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    import sluice
    import sluice.vllm
    from sluice.vllm.dry_run import dry_run
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    def config(model, ep, pp_size, tp_size, dp_size):
        return EngineArgs(model=model, load_format="dummy", tensor_parallel_size=tp_size, pipeline_parallel_size=pp_size,
                          data_parallel_size=dp_size, enable_expert_parallel=ep, dtype="bfloat16", enforce_eager=True,
                          max_model_len=128, skip_tokenizer_init=True).create_engine_config()

    results, initialised = {}, False
    for job in sys.argv[6:]:
        model, ep = job.rsplit(":", 1)
        ep = ep == "1"
        tensors = {}
        for f in sorted(os.listdir(model)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(model, f), framework="pt") as st:
                    for k in st.keys():
                        tensors[k] = st.get_tensor(k)
        one = config(model, False, 1, 1, 1)
        result = {"stages": {}, "ranks": []}
        with set_current_vllm_config(one):
            if not initialised:
                init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                             distributed_init_method=f"tcp://127.0.0.1:{port}")
                initialize_model_parallel(tensor_model_parallel_size=1)
                initialised = True
            real = parallel_state._PP
            try:
                for k in range(pp):
                    # vLLM's models ask the PP group these four things while they are built and loaded.
                    parallel_state._PP = types.SimpleNamespace(rank_in_group=k, world_size=pp, is_first_rank=k == 0,
                                                               is_last_rank=k == pp - 1)
                    with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
                        m = initialize_model(vllm_config=one, model_config=one.model_config)
                    params = sorted(n for n, _ in m.named_parameters())
                    plan = dry_run(m, sluice.open(model).tensors, default_weight_loader=default_weight_loader)
                    assert plan.failure is None, plan.failure
                    needed, loaded = [], set()
                    for name, t in tensors.items():
                        got = m.load_weights([(name, t.clone())])
                        if got:
                            needed.append(name)
                            loaded |= set(got)
                    result["stages"][k] = {"needed": needed, "params": params, "loaded": sorted(loaded),
                                           "takes": sorted(plan.takes), "calls": sorted(plan.calls)}
                    del m
            finally:
                parallel_state._PP = real
        # Every rank of the TP x PP x DP engine (vLLM's world order: DP x PP x TP) in sluice's order.
        full = config(model, ep, pp, tp, dp)
        for r in range(dp * pp * tp):
            dp_rank, pp_rank, tp_rank = r // (pp * tp), (r // tp) % pp, r % tp
            rank, size, _ = sluice.vllm.sluice_place(full.parallel_config, (pp_rank, dp_rank, 0, tp_rank))
            result["ranks"].append({"rank": rank, "size": size, "vllm_rank": r, "pp_rank": pp_rank})
        results[model] = result
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
