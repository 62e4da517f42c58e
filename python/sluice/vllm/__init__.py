"""sluice inside vLLM: `--load-format sluice`.

    pip install .            # from sluice's source tree, into vLLM's environment
    vllm serve /models/m --load-format sluice \\
        --model-loader-extra-config '{"staging": "4GiB"}'
    vllm serve /models/m-config --load-format sluice \\
        --model-loader-extra-config '{"weights": "s3://bucket/m/"}'

The package's entry point (group `vllm.general_plugins`, see pyproject.toml)
runs `register()` in every vLLM process; it registers `SluiceModelLoader` under
the load format "sluice", is idempotent and touches no CUDA.

The package, one concern per module (only `_vllm` imports vLLM's internals):

    config    the extra-config keys, their defaults and checks
    world     vLLM's parallel groups as sluice's world, and the ownership the
              ranks' models give (their dry runs, exchanged)
    dry_run   where a model's load_weights puts each tensor (no vLLM import)
    parts     which block of a tensor each rank's copies read, and the split
              the owners' needs allow (arithmetic only)
    loader    SluiceModelLoader
    _vllm     every vLLM internal used, imported on first use
"""
from __future__ import annotations

from . import _vllm
from .config import EXTRA_CONFIG_KEYS
from .loader import LOADS, SluiceModelLoader, last_load
from .world import sluice_place, sluice_rank

__all__ = ["register", "SluiceModelLoader", "EXTRA_CONFIG_KEYS", "LOADS", "last_load", "sluice_place", "sluice_rank"]

_registered = False


def register() -> None:
    """The vLLM plugin: registers `--load-format sluice` (idempotent; no CUDA)."""
    global _registered
    if _registered:
        return
    _vllm.register_model_loader("sluice")(SluiceModelLoader)
    _registered = True
