"""sluice inside vLLM: `--load-format sluice`.

    pip install .            # from sluice's source tree, into vLLM's environment
    vllm serve /models/m --load-format sluice \\
        --model-loader-extra-config '{"staging": "4GiB"}'
    vllm serve /models/m-config --load-format sluice \\
        --model-loader-extra-config '{"weights": "s3://bucket/m/"}'

The package's entry point (group `vllm.general_plugins`, see pyproject.toml)
runs `register()` in every vLLM process; it registers `SluiceModelLoader` under
the load format "sluice", is idempotent and touches no CUDA.

Extra-config keys (`--model-loader-extra-config '{json}'`); any other key is an
error naming it, raised before anything is read:

    weights      where the weights are: a directory, a .safetensors file or
                 s3://bucket/prefix/ (default: the model path). vLLM accepts
                 s3:// models only for its own object-storage loaders, so the
                 model argument stays a local directory with the config.
    index        a local model.safetensors.index.json to open `weights` through
                 (its shards are checked against the listing first)
    staging      the staging budget, e.g. "4GiB" (sluice's size grammar)
    max_read     the largest single read, e.g. "32MiB"
    queue_depth  reads in flight per reader
    offload      none | per-rank | shared-single | shared-cooperative (shared
                 tables, distributed loads)

S3 endpoints and credentials come from the usual AWS environment and profile
chain (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws, ...), never from here.

What the model gets: `model.load_weights()` receives the checkpoint's names and
full logical tensors, as from vLLM's default loader; each parameter's
`weight_loader` narrows them for TP. With expert parallelism on (and vLLM's EP
weight filter, no EPLB), a rank's routed-expert weights of other ranks' experts
are not read: the same rule as vLLM's own filter (`.experts.N.*.weight`; every
expert's scales are still yielded). The strict check that every parameter was
loaded is vLLM's own (`DefaultModelLoader.track_weights_loading`).

Multi-rank worlds (TP/DP/PP > 1) are not supported yet: the loader raises
sluice.ConfigError naming the world rather than loading in a way nobody has
tested (docs/design.md, "sluice inside vLLM").
"""
from __future__ import annotations

import os
import time

import torch

import sluice

__all__ = ["register", "SluiceModelLoader", "EXTRA_CONFIG_KEYS"]

EXTRA_CONFIG_KEYS = ("weights", "index", "staging", "max_read", "queue_depth", "offload")
_OFFLOADS = ("none", "per-rank", "shared-single", "shared-cooperative")
_registered = False


def register() -> None:
    """The vLLM plugin: registers `--load-format sluice` (idempotent; no CUDA)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader
    register_model_loader("sluice")(SluiceModelLoader)
    _registered = True


def _options(extra) -> dict:
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise sluice.ConfigError(f"--model-loader-extra-config for sluice must be a JSON object, got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
    if unknown:
        raise sluice.ConfigError(f"--model-loader-extra-config: unknown key(s) {', '.join(map(repr, unknown))} for "
                                 f"--load-format sluice (known: {', '.join(EXTRA_CONFIG_KEYS)})")
    o = {"staging": "4GiB", "max_read": "32MiB", "queue_depth": 4, "offload": "none", "weights": None, "index": None}
    o.update(extra)
    for k in ("staging", "max_read"):
        o[k] = sluice.parse_size(o[k])
    if isinstance(o["queue_depth"], bool) or not isinstance(o["queue_depth"], int) or o["queue_depth"] < 1:
        raise sluice.ConfigError(f"--model-loader-extra-config: queue_depth must be a positive integer, got {o['queue_depth']!r}")
    if o["offload"] not in _OFFLOADS:
        raise sluice.ConfigError(f"--model-loader-extra-config: offload {o['offload']!r} is not one of {', '.join(_OFFLOADS)}")
    for k in ("weights", "index"):
        if o[k] is not None and not isinstance(o[k], str):
            raise sluice.ConfigError(f"--model-loader-extra-config: {k} must be a string, got {o[k]!r}")
    return o


def _base_loader():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    return BaseModelLoader


class SluiceModelLoader(_base_loader()):
    """vLLM's model loader for `--load-format sluice` (see the module docstring)."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.options = _options(load_config.model_loader_extra_config)
        self.last_stats = None

    # ---- where the weights are
    def _location(self, model_config) -> str:
        return self.options["weights"] or getattr(model_config, "model_weights", None) or model_config.model

    def download_model(self, model_config) -> None:
        """Nothing to download: checks that the weights location opens (headers only)."""
        self._open(model_config)

    def _open(self, model_config, select=None):
        where = self._location(model_config)
        if self.options["index"]:
            raise sluice.ConfigError("--model-loader-extra-config: index is not supported by the Python package yet")
        if not where.startswith("s3://") and not os.path.exists(where):
            raise sluice.ConfigError(f"--load-format sluice: the weights location '{where}' does not exist")
        return sluice.open(where, select=select)

    # ---- which tensors this rank needs
    @staticmethod
    def _world():
        import torch.distributed as dist
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @staticmethod
    def _skip_expert(model_config):
        """vLLM's own EP weight filter for this rank, or None (no expert parallelism)."""
        if not getattr(model_config, "is_moe", False):
            return None
        try:
            from vllm.config import get_current_vllm_config
            from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight
            from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        except ImportError:
            return None
        get_current_vllm_config()  # (the filter reads the parallel config from it)
        probe = DefaultModelLoader.__new__(DefaultModelLoader)
        probe.local_expert_ids = None
        DefaultModelLoader._init_ep_weight_filter(probe, model_config)
        local = probe.local_expert_ids
        if local is None:
            return None
        return lambda name: should_skip_weight(name, local)

    # ---- the loader API
    def get_all_weights(self, model_config, model):
        """(name, tensor) for every tensor this rank needs: what `load_weights`,
        `reload_weights(weights_path=...)` and sleep level 2 call."""
        world = self._world()
        if world > 1:
            raise sluice.ConfigError(
                f"--load-format sluice: a {world}-rank vLLM world (TP/DP/PP > 1) is not supported yet; "
                "use one rank, or another load format")
        skip = self._skip_expert(model_config)
        ck = self._open(model_config, select=(lambda n: not skip(n)) if skip else None)
        from vllm.model_executor.model_loader.weight_utils import enable_tqdm
        show = enable_tqdm(self.load_config.use_tqdm_on_load)
        bar = None
        if show:
            from tqdm.auto import tqdm
            from vllm.model_executor.model_loader.weight_utils import _BAR_FORMAT
            bar = tqdm(total=ck.tensor_bytes, desc="Loading safetensors through sluice", unit="B", unit_scale=True,
                       unit_divisor=1024, bar_format=_BAR_FORMAT)
        t0 = time.perf_counter()
        it = sluice.iter_weights(ck, staging=self.options["staging"], max_read=self.options["max_read"],
                                 queue_depth=self.options["queue_depth"],
                                 progress=(lambda done, total: bar.update(done - bar.n)) if bar else False)
        try:
            with it:
                for name, tensor in it:
                    yield name, tensor
        finally:
            if bar is not None:
                bar.close()
        self.last_stats = dict(it.stats or {})
        seconds = max(time.perf_counter() - t0, 1e-9)
        from vllm.logger import init_logger
        got = self.last_stats.get("bytes_read", 0)
        init_logger(__name__).info(
            "sluice: %s: %d tensors, %.2f GiB read, 0.00 GiB received, %.2f GiB/s (%.2f s)", ck.location,
            self.last_stats.get("tensors", 0), got / 2**30, got / 2**30 / seconds, seconds)

    def load_weights(self, model, model_config) -> None:
        loaded = model.load_weights(self.get_all_weights(model_config, model))
        if model_config.quantization is None and loaded is not None:
            from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
            DefaultModelLoader.track_weights_loading(self, model, loaded, quantized=False)
