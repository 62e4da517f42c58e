"""The load contract from Python: Recorder, ReloadSession, probe.

A weight loader is `loader(name, tensor)` or `loader(name, tensor, log)`;
returning False declines the tensor (any other value accepts it). With `log`,
the loader names what it applied: `log.record(destination, shard="q",
expert=3)`; without, an accepted tensor is one application onto the
destination of its own name.
"""
import inspect as _inspect

import torch

from . import _sluice
from ._torch import _EXACT, tensor_from

_TORCH_TO_SLUICE = {t: name for name, t in _EXACT.items()}


def sluice_dtype(t: torch.Tensor) -> str:
    """The sluice dtype name of a tensor sluice produced (or of a plain torch tensor)."""
    d = getattr(t, "sluice_dtype", None)
    if d is not None:
        return d
    try:
        return _TORCH_TO_SLUICE[t.dtype]
    except KeyError:
        raise _sluice.ConfigError(f"torch dtype {t.dtype} has no safetensors dtype") from None


class Log:
    """What one loader call applied (see the module docstring)."""

    def __init__(self, source):
        self.source = source
        self.records = []

    def record(self, destination, **selectors):
        self.records.append((str(destination), dict(selectors)))


def _takes_log(loader):
    try:
        params = [p for p in _inspect.signature(loader).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(params) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in _inspect.signature(loader).parameters.values())
    except (TypeError, ValueError):
        return False


def _adapter(loader):
    takes_log = _takes_log(loader)

    def call(name, arg):
        tensor = arg if isinstance(arg, torch.Tensor) else tensor_from(arg)
        if takes_log:
            log = Log(name)
            r = loader(name, tensor, log)
            records = log.records
        else:
            r = loader(name, tensor)
            records = [(name, {})]
        accepted = r is not False  # only an explicit False declines
        return accepted, (records if accepted else [])
    return call


class Recorder:
    """Wraps a weight loader during the initial load and records every accepted
    application; `freeze()` gives the Contract. Call it as the loader:
    `for name, t in sluice.iter_weights(ck): rec(name, t)`."""

    def __init__(self, loader, layer_pattern=r"layers\.(\d+)\."):
        self.loader = loader
        self._core = _sluice.RecorderCore(_adapter(loader), layer_pattern)

    def __call__(self, name, tensor):
        # why: a placeholder stands for a tensor another rank owns; nothing is
        # applied here, so it is never offered to the loader nor recorded (a
        # loader that cannot decline would otherwise put it in the contract,
        # and a reload could never meet that key).
        if getattr(tensor, "sluice_kind", None) == "placeholder":
            return False
        shape = list(getattr(tensor, "sluice_shape", tensor.shape))
        return self._core.offer(name, sluice_dtype(tensor), shape, tensor.numel() * tensor.element_size(), tensor)

    def freeze(self) -> "_sluice.Contract":
        return self._core.freeze()

    def applications(self):
        """[(source, destination, selectors)] recorded so far (sorted)."""
        return self._core.applications()


def probe(ck, loader):
    """Offers every tensor of `ck` to `loader` (a Recorder or a weight loader) as
    a meta tensor, reading headers only. Returns {"tensors", "accepted",
    "tensor_bytes", "header_bytes_read", "bytes_read": 0, "contract"}."""
    from . import Checkpoint, open as _open
    if not isinstance(ck, Checkpoint):
        ck = _open(ck)
    rec = loader if isinstance(loader, Recorder) else Recorder(loader)
    r = rec._core.probe(ck._core)
    r["contract"] = rec.freeze()
    return r


class ReloadSession:
    """Layerwise reload against a contract: tensors are buffered per layer, and a
    layer is offered to `loader` and published (`on_publish(layer, keys)`)
    once every key of its contract has arrived. `finish()` raises
    sluice.ContractError naming the missing keys."""

    def __init__(self, contract, loader, on_publish=None, require_all_layers=True, warn=None):
        self.contract = contract
        self._core = _sluice.ReloadCore(contract, _adapter(loader), on_publish, bool(require_all_layers), warn)

    def reload(self, ck, staging="1GiB", max_read="32MiB", queue_depth=4, threads=1, io="auto"):
        """Reads the update `ck` (a Checkpoint or a path) into the session and ends
        the update (finish()); returns the load's stats."""
        from . import Checkpoint, open as _open, _options
        if not isinstance(ck, Checkpoint):
            ck = _open(ck)
        return self._core.reload(ck._core, _options(staging, max_read, queue_depth, threads, io))

    def push(self, name, tensor):
        """Pushes a CPU tensor the engine holds (copied)."""
        if tensor.device.type != "cpu":
            raise _sluice.ConfigError(f"push: tensor '{name}' is on {tensor.device}, not the CPU")
        t = tensor.contiguous()
        return self._core.push(name, sluice_dtype(tensor), list(t.shape), t.data_ptr(), t.numel() * t.element_size())

    def finish(self) -> bool:
        return self._core.finish()

    @property
    def stats(self) -> dict:
        return self._core.stats()
