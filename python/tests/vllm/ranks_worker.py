"""One rank of a 2-rank vLLM world over Gloo, at the loader layer (vLLM's own
`initialize_model`, `init_distributed_environment`, `initialize_model_parallel`):
for each MODEL:EP job, loads MODEL with vLLM's default loader and with sluice's
(EP: 1 turns expert parallelism on, with linear placement; rr with round-robin
placement requested), and writes each parameter's SHA-256 for both, and
sluice's stats, to OUT as {MODEL: {"safetensors", "sluice", "stats", "placement",
"seconds": {format: seconds in the loader's load_weights}}} (bench/vllm_ranks.py
reads the same file).

    python ranks_worker.py OUT RANK WORLD PORT TP[xPP] MODEL:EP [MODEL:EP ...]

A round-robin job loads through sluice first, and then through vLLM's default
loader with the placement the model's MoE layers actually use ("placement":
vLLM falls back to linear where it cannot route round-robin, while its parallel
config, which its own EP weight filter reads, still says round_robin).

(TP, or TPxPP for pipeline stages: "1x2" is PP = 2.) Each rank also writes
its PP stage and the checkpoint names its stage's model loaded ("loaded").

A job MODEL:EP+draft on the seed-shaped checkpoint (seed_v41.py) loads its
DSpark draft instead (results under MODEL#draft). Each format's load also
records the process's peak anonymous memory above its start ("memory").

A job MODEL:EP+reload: after the loads, rank 0 alone (one DP engine while
the other serves) reloads through vLLM's reload_weights (the same
after each format's load: "reload": {format: {"digests", "seconds"}}).

SLUICE_TEST_VLLM_FAULT on rank 1: "exchange" SIGKILLs it as its sluice load
exchanges the dry runs' records, "tensor:K" as its K-th tensor arrives;
"dry-raise" makes its model's load_weights raise in the dry run (as a loader
that reads a value would).

The parallel state is made once, from the first job's config (put a MoE job
first: vLLM makes its EP group only for MoE models).
"""
import hashlib
import json
import os
import signal
import sys
import time

import torch


def _sha(t):
    return hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def digests(model):
    """Every parameter's SHA-256, and what a model's finalization computed
    from them (the seed model's `broadcasts`)."""
    out = {n: _sha(p) for n, p in model.named_parameters()}
    out.update({n: _sha(t) for n, t in getattr(model, "broadcasts", dict)().items()})
    return out


def _memory():
    """This process's resident memory by kind (kB, /proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0])
    return out


def _measured(load, record):
    """`load` run with this process's peak resident memory reset first
    (clear_refs 5): `record` gets the peak of anonymous memory above the
    start, in bytes, bounded from above as peak RSS less the file and
    shared-memory pages the load added (both only grow during it)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _memory()
    try:
        return load()
    finally:
        after = _memory()
        record["peak_anon_bytes"] = 1024 * (after["VmHWM"] - before["VmRSS"] - (after["RssFile"] - before["RssFile"])
                                            - (after["RssShmem"] - before["RssShmem"]))
        record["shmem_bytes"] = 1024 * (after["RssShmem"] - before["RssShmem"])


def free_port():
    """A TCP port free on 127.0.0.1 now (for the ranks' rendezvous)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _arm_fault(when):
    """SIGKILLs this process at the point `when` names (see the module)."""
    import sluice.vllm.world as world
    from sluice.vllm.loader import SluiceModelLoader
    if when == "exchange":
        world.exchange_ownership = lambda *a, **k: _die()
        return
    if when == "dry-raise":
        import sluice.vllm.dry_run as dry
        run = dry.dry_run

        def raising(model, tensors, **kw):
            def load_weights(weights):
                for _ in weights:
                    raise ValueError("this loader reads a value of the tensor")
            model.load_weights, real = load_weights, model.load_weights
            try:
                return run(model, tensors, **kw)
            finally:
                model.load_weights = real
        dry.dry_run = raising
        return
    k = int(when.split(":", 1)[1])
    stream = SluiceModelLoader._stream

    def counted(self, *a, **kw):
        for i, item in enumerate(stream(self, *a, **kw)):
            if i == k:
                _die()
            yield item
    SluiceModelLoader._stream = counted


def main():
    out, rank, world, port, tp = sys.argv[1:6]
    tp, _, pp = tp.partition("x")
    rank, world, tp, pp = int(rank), int(world), int(tp), int(pp or 1)
    dp = world // (tp * pp)
    if dp > 1:
        # vLLM's offline data parallelism: each DP rank an engine of its own
        # (tp * pp ranks), its world group spanning them, met through VLLM_DP_*
        # (LLM reads them when given no data_parallel_size).
        os.environ.update(VLLM_DP_RANK=str(rank // (tp * pp)), VLLM_DP_RANK_LOCAL=str(rank // (tp * pp)),
                          VLLM_DP_SIZE=str(dp), VLLM_DP_MASTER_IP="127.0.0.1", VLLM_DP_MASTER_PORT=str(int(port) + 1))
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # the entry point registers --load-format sluice
    if rank == 1 and os.environ.get("SLUICE_TEST_VLLM_FAULT"):
        _arm_fault(os.environ["SLUICE_TEST_VLLM_FAULT"])
    result, initialised = {}, False
    for job in sys.argv[6:]:
        path, ep = job.rsplit(":", 1)
        ep, _, then = ep.partition("+")
        overrides = None
        with open(os.path.join(path, "config.json")) as f:
            arch = json.load(f).get("architectures", [""])[0]
        if arch.startswith("SluiceSeed"):
            import seed_v41
            seed_v41.register()
            if then == "draft":   # the DSpark draft, a second load of the same checkpoint
                overrides = {"architectures": [seed_v41.DRAFT_ARCH]}
        model = path + ("#draft" if then == "draft" else "")
        result[model] = {}
        strategy = "round_robin" if ep == "rr" else "linear"
        for fmt in ("sluice", "safetensors") if ep == "rr" else ("safetensors", "sluice"):
            # Small staging, so that the tests' tiny models still take several windows
            # (SLUICE_TEST_EXTRA: bench/vllm_ranks.py's own, JSON).
            extra = json.loads(os.environ.get("SLUICE_TEST_EXTRA", '{"staging": "8MiB", "max_read": "256KiB"}')) \
                if fmt == "sluice" else {}
            cfg = EngineArgs(model=path, load_format=fmt, **({"hf_overrides": overrides} if overrides else {}), tensor_parallel_size=tp, pipeline_parallel_size=pp,
                             enable_expert_parallel=ep != "0", expert_placement_strategy=strategy,
                             dtype="bfloat16", enforce_eager=True,
                             max_model_len=128, skip_tokenizer_init=True,
                             model_loader_extra_config=extra).create_engine_config()
            with set_current_vllm_config(cfg):
                if not initialised:
                    init_distributed_environment(world_size=tp * pp, rank=rank % (tp * pp), local_rank=rank, backend="gloo",
                                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
                    initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
                    initialised = True
                loader = get_model_loader(cfg.load_config)
                inner = loader.load_weights

                def timed(*a, _inner=inner, _fmt=fmt, _model=model, **k):
                    t0 = time.perf_counter()
                    r = _measured(lambda: _inner(*a, **k), result[_model].setdefault("memory", {}).setdefault(_fmt, {}))
                    result[_model].setdefault("seconds", {})[_fmt] = time.perf_counter() - t0
                    return r
                loader.load_weights = timed
                m = loader.load_model(vllm_config=cfg, model_config=cfg.model_config)
                result[model][fmt] = digests(m)
                if fmt == "sluice":
                    import sluice.vllm
                    # The placement the model's MoE layers were built with (vLLM falls back
                    # from round_robin to linear where it cannot route it).
                    used = {getattr(getattr(mod, "expert_map_manager", None), "placement_strategy", None)
                            for mod in m.modules()} - {None}
                    strategy = result[model]["placement"] = used.pop() if len(used) == 1 else None
                    result[model]["stats"] = loader.last_stats
                    from vllm.distributed import get_pp_group
                    result[model]["stage"] = get_pp_group().rank_in_group
                if then == "reload" and rank == 0:
                    from vllm.model_executor.model_loader.reload.inplace import reload_weights
                    t0 = time.perf_counter()
                    reload_weights(cfg, m, weights_iterator=None, weights_path=None, is_checkpoint_format=True)
                    result[model].setdefault("reload", {})[fmt] = {"digests": digests(m), "seconds": time.perf_counter() - t0}
                    if fmt == "sluice":
                        import sluice.vllm
                        result[model]["reload"][fmt]["stats"] = sluice.vllm.last_load()
                del m
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
