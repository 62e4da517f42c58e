"""One rank of a 2-rank vLLM world over Gloo, at the loader layer (vLLM's own
`initialize_model`, `init_distributed_environment`, `initialize_model_parallel`):
loads MODEL with vLLM's default loader and with sluice's, and writes each
parameter's SHA-256 for both, and sluice's stats, to OUT.

    python ranks_worker.py MODEL OUT RANK WORLD PORT TP EP(0|1)
"""
import hashlib
import json
import sys


def digests(model):
    return {n: hashlib.sha256(p.detach().contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
            .hexdigest() for n, p in model.named_parameters()}


def main():
    model, out, rank, world, port, tp, ep = sys.argv[1:8]
    rank, world, tp, ep = int(rank), int(world), int(tp), ep == "1"
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # the entry point registers --load-format sluice
    result = {}
    for fmt in ("safetensors", "sluice"):
        cfg = EngineArgs(model=model, load_format=fmt, tensor_parallel_size=tp, data_parallel_size=world // tp,
                         enable_expert_parallel=ep, dtype="bfloat16", enforce_eager=True, max_model_len=128,
                         skip_tokenizer_init=True, model_loader_extra_config={"staging": "8MiB", "max_read": "256KiB"}
                         if fmt == "sluice" else {}).create_engine_config()
        with set_current_vllm_config(cfg):
            if not result:
                init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                             distributed_init_method=f"tcp://127.0.0.1:{port}")
                initialize_model_parallel(tensor_model_parallel_size=tp)
            loader = get_model_loader(cfg.load_config)
            m = loader.load_model(vllm_config=cfg, model_config=cfg.model_config)
            result[fmt] = digests(m)
            if fmt == "sluice":
                result["stats"] = loader.last_stats
            del m
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
