"""Every vLLM internal sluice uses, imported here and nowhere else in the
package: a vLLM upgrade that moves one touches this file only. Each name is
imported when first asked for (vLLM is heavy to import and its modules need
a configured engine for some of them)."""
from __future__ import annotations

__all__ = ["base_loader", "register_model_loader", "current_parallel_config",
           "parallel_ranks", "engine_group", "world_group", "logger",
           "progress_bar", "track_weights_loading", "default_weight_loader"]


def base_loader():
    """vLLM's BaseModelLoader (the loader class sluice's derives from)."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    return BaseModelLoader


def register_model_loader(name):
    from vllm.model_executor.model_loader import register_model_loader as register
    return register(name)


def current_parallel_config():
    from vllm.config import get_current_vllm_config
    return get_current_vllm_config().parallel_config








def parallel_ranks(parallel):
    """(pp, dp, pcp, tp) ranks of this process in the running engine."""
    from vllm.distributed import get_dp_group, get_pcp_group, get_pp_group, get_tp_group
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    return (get_pp_group().rank_in_group if parallel.pipeline_parallel_size > 1 else 0,
            get_dp_group().rank_in_group if parallel.data_parallel_size > 1 else 0,
            get_pcp_group().rank_in_group if pcp > 1 else 0,
            get_tp_group().rank_in_group if parallel.tensor_parallel_size > 1 else 0)


def engine_group(parallel):
    """vLLM's group of this DP engine's own ranks: its TP group (PP 1) or PP
    group (TP 1). An engine split both ways has no such group in vLLM (and a
    new one would be a collective over every engine)."""
    from vllm.distributed import get_pp_group, get_tp_group
    import sluice
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    if parallel.pipeline_parallel_size == 1 and pcp == 1:
        return get_tp_group()
    if parallel.tensor_parallel_size == 1 and pcp == 1:
        return get_pp_group()
    raise sluice.ConfigError(
        f"--load-format sluice: a reload on one of {parallel.data_parallel_size} data-parallel engines of TP "
        f"{parallel.tensor_parallel_size} x PP {parallel.pipeline_parallel_size} (x PCP {pcp}) ranks: vLLM has no "
        "group of one engine's ranks to load within; reload every engine together, or use TP or PP alone")


def world_group():
    from vllm.distributed import get_world_group
    return get_world_group()




def logger():
    """vLLM's logger for sluice (its handlers print what sluice says)."""
    from vllm.logger import init_logger
    return init_logger("vllm.sluice")


def progress_bar(load_config, total):
    """vLLM's own tqdm bar for weight loading, or None where vLLM disables it."""
    from vllm.model_executor.model_loader.weight_utils import _BAR_FORMAT, enable_tqdm
    if not enable_tqdm(load_config.use_tqdm_on_load):
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="Loading safetensors through sluice", unit="B", unit_scale=True, unit_divisor=1024,
                bar_format=_BAR_FORMAT)


def track_weights_loading(loader, model, loaded):
    """vLLM's strict check that the checkpoint set every parameter."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    DefaultModelLoader.track_weights_loading(loader, model, loaded, quantized=False)


def default_weight_loader():
    """vLLM's loader for parameters without one of their own."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader as loader
    return loader
