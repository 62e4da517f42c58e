"""What each PP stage of a vLLM model needs from its checkpoint, from vLLM itself,
in one process: the model is built as stage k of PP (vLLM's own model class and
`make_layers`, with a PP group that says "rank k of PP"; TP = 1, since TP does
not change the names a rank needs), then every checkpoint tensor is offered to
its `load_weights` alone: the stage needs the tensors whose offer loads a
parameter. Writes {stage: {"needed": [...], "params": [...], "loaded": [...]}}
and the parallel config's placement (sluice.vllm.placement) for every rank of
TP x PP x DP, to OUT.

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
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    import sluice
    import sluice.vllm

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
                    needed, loaded = [], set()
                    for name, t in tensors.items():
                        got = m.load_weights([(name, t.clone())])
                        if got:
                            needed.append(name)
                            loaded |= set(got)
                    result["stages"][k] = {"needed": needed, "params": params, "loaded": sorted(loaded),
                                           "anchored": sluice.vllm.anchored(m)}
                    del m
            finally:
                parallel_state._PP = real
        # The placement of every rank of the TP x PP x DP engine (vLLM's world order: DP x PP x TP).
        full = config(model, ep, pp, tp, dp)
        ck = sluice.open(model)
        for r in range(dp * pp * tp):
            dp_rank, pp_rank, tp_rank = r // (pp * tp), (r // tp) % pp, r % tp
            local = None
            if ep:  # vLLM's EP rank within a stage: dp_rank * TP + tp_rank, of DP x TP
                local = compute_local_expert_ids(full.model_config.get_num_experts(), dp * tp, dp_rank * tp + tp_rank)
            place = sluice.vllm.placement(full.model_config, local, parallel=full.parallel_config,
                                          ranks=(pp_rank, dp_rank, 0, tp_rank), ck=ck,
                                          stages={int(k): tuple(st["anchored"])
                                                  for k, st in result["stages"].items()})
            result["ranks"].append({**place, "vllm_rank": r, "pp_rank": pp_rank, "dp_rank": dp_rank, "tp_rank": tp_rank,
                                    "local_experts": sorted(local) if local is not None else None})
        results[model] = result
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
