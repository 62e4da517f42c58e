"""Run:ai Model Streamer's Python API (runai-model-streamer 0.17) over sluice.

Code written against Run:ai switches by changing one import:

    from runai_model_streamer import SafetensorsStreamer, list_safetensors
    from sluice.compat.runai import SafetensorsStreamer, list_safetensors   # instead

    with SafetensorsStreamer() as s:
        s.stream_files(list_safetensors("/models/m"), device="cpu", is_distributed=False)
        for name, tensor in s.get_tensors():
            model.load_weight(name, tensor)

The names and argument meanings are Run:ai's. Where the behaviour differs, on
purpose:

- Tensors own their bytes whatever `owned` says (sluice's are DLPack leases of
  staging memory, or memory of their own), so no clone is needed to keep one;
  `owned=False` is accepted and means the same.
- Keeping every tensor (`dict(s.get_tensors())`) works: the model's bytes stay
  resident, and once the tensors held pin so much of the staging budget that
  the load would have nothing left to read into, the next ones are copied into
  memory of their own (sluice's on_exhausted="copy") instead of waiting.
- The memory limit (RUNAI_STREAMER_MEMORY_LIMIT, bytes, a node total; Run:ai's
  default 40 GB) becomes sluice's staging budget divided by the ranks on this
  node, as Run:ai >= 0.16 divides it: in a distributed load, by the ranks of the
  process group on this host (an all-gather of host names, as Run:ai counts
  them). Differences: Run:ai floors a rank's share at its largest tensor; sluice
  keeps the share (at least 1 MiB), reads a tensor larger than a slot into
  memory of its own, and shortens its reads below 32 MiB where the share could
  not hold one 32 MiB read slot; a load that is not distributed still divides by LOCAL_WORLD_SIZE
  where torchrun sets it (Run:ai gives each process the whole limit there), so
  that the node's total stays bounded. Run:ai's modes -1 (unlimited) and 0
  (largest range) take sluice's default budget, 4 GiB per node: sluice's
  memory is always bounded.
- `is_distributed=True` with torch.distributed initialised and more than one
  rank: every rank gets every tensor, as with Run:ai, and each byte is read
  from storage by one rank and sent to the others over Gloo, whatever the
  process group's backend (Run:ai distributes over NCCL by default, over Gloo
  only with RUNAI_STREAMER_DIST=1). Without torch.distributed initialised, or
  with one rank, the load is this process's alone, as Run:ai falls back.
- `device="cuda..."`: each tensor is copied to the device after it arrives.
- Errors are sluice's (sluice.Error subclasses, naming file, tensor and bytes)
  that are also ValueError, the type Run:ai raises for a corrupt or truncated
  file, so `except ValueError` keeps working.
- S3: `s3_credentials` (Run:ai's S3Credentials or any object with its fields)
  apply to the files of that call; otherwise the AWS environment and profile
  chain, as sluice always reads them.
"""
from __future__ import annotations

import contextlib
import glob
import os
from typing import Collection, Iterator, List, Optional, Tuple

import torch

import sluice

__all__ = ["SafetensorsStreamer", "list_safetensors"]

_DEFAULT_NODE_LIMIT = 4 << 30
_error_types: dict = {}


def _as_value_error(e: sluice.Error) -> Exception:
    """The same sluice error, as a type that is also ValueError (Run:ai's)."""
    cls = type(e)
    if cls not in _error_types:
        _error_types[cls] = type(cls.__name__, (cls, ValueError), {"__module__": __name__})
    return _error_types[cls](*e.args)


@contextlib.contextmanager
def _errors():
    try:
        yield
    except sluice.Error as e:
        raise _as_value_error(e) from e


@contextlib.contextmanager
def _credentials(c):
    """Run:ai's S3Credentials as the AWS environment sluice reads, for one open."""
    if c is None:
        yield
        return
    names = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "session_token": "AWS_SESSION_TOKEN", "region_name": "AWS_REGION", "endpoint": "AWS_ENDPOINT_URL"}
    saved = {v: os.environ.get(v) for v in names.values()}
    try:
        for k, v in names.items():
            if getattr(c, k, None):
                os.environ[v] = getattr(c, k)
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


def list_safetensors(path: str, s3_credentials=None) -> List[str]:
    """The .safetensors files directly in `path` (not recursive), as Run:ai lists them."""
    if path.startswith("s3://"):
        with _credentials(s3_credentials), _errors():
            ck = sluice.open(path if path.endswith("/") else path + "/")
        return [ck.location.rstrip("/") + "/" + s for s in ck.shards]
    return glob.glob(os.path.join(path, "*.safetensors"))


def _staging(local_ranks: Optional[int] = None) -> int:
    """This rank's staging budget: the node's limit over `local_ranks` (a
    distributed load's ranks on this host), else over LOCAL_WORLD_SIZE."""
    limit = int(os.environ.get("RUNAI_STREAMER_MEMORY_LIMIT", "40000000000"))
    node = limit if limit > 0 else _DEFAULT_NODE_LIMIT
    ranks = local_ranks if local_ranks is not None else int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(node // max(ranks, 1), 1 << 20)


class SafetensorsStreamer:
    """Run:ai's SafetensorsStreamer over sluice (see the module docstring)."""

    def __init__(self) -> None:
        self.total_size = 0
        self.device_str = None
        self.files_to_tensors_metadata = {}
        self._files: List[Tuple[sluice.Checkpoint, Optional[frozenset]]] = []
        self._device = "cpu"
        self._distributed = False
        self._running = None

    def __enter__(self) -> "SafetensorsStreamer":
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if self._running is not None:
            self._running.close()
            self._running = None
        return None

    def stream_file(self, path: str, s3_credentials=None, device: Optional[str] = "cpu", is_distributed: bool = False,
                    tensor_names: Optional[Collection[str]] = None, owned: bool = True) -> None:
        return self.stream_files([path], s3_credentials=s3_credentials, device=device, is_distributed=is_distributed,
                                 tensor_names=tensor_names, owned=owned)

    def stream_files(self, paths: List[str], s3_credentials=None, device: Optional[str] = "cpu",
                     is_distributed: bool = False, tensor_names: Optional[Collection[str]] = None,
                     owned: bool = True) -> None:
        """Opens the files (headers only, validated); get_tensors() then streams them."""
        if isinstance(tensor_names, str):
            raise ValueError("tensor_names must be a collection of names, not a single str")
        if tensor_names is not None and len(tensor_names) == 0:
            raise ValueError("tensor_names must not be empty - pass None to load every tensor")
        wanted = frozenset(tensor_names) if tensor_names is not None else None
        self._files, self.total_size, self.files_to_tensors_metadata = [], 0, {}
        self._device, self.device_str, self._distributed = device or "cpu", device, bool(is_distributed)
        kept = []
        with _credentials(s3_credentials), _errors():
            for i, path in enumerate(paths):
                ck = sluice.open(path, select=(lambda n: n in wanted) if wanted is not None else None)
                self._files.append(ck)
                self.files_to_tensors_metadata[i] = ck.tensors
                self.total_size += ck.tensor_bytes
                kept.extend(t.name for t in ck.tensors)
        if wanted is not None:
            missing = wanted - set(kept)
            if missing:
                raise ValueError(f"tensor_names not found in checkpoint: {sorted(missing)}")
            if len(kept) != len(set(kept)):
                dup = sorted({n for n in kept if kept.count(n) > 1})
                raise ValueError(f"tensor_names requested tensors that appear in more than one file: {dup}")

    def get_tensors(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """(name, tensor) for every tensor of the files streamed, each owning its bytes."""
        dist, local_ranks = {}, None
        if self._distributed:
            import torch.distributed as tdist
            if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
                from sluice._distributed import torch_world
                world, store = torch_world(None, prefix="sluice/runai")
                dist = {"topology": f"tp1,dp{world.size}", "store": store, "world": world}
                local_ranks = world.local_size
        staging = _staging(local_ranks)
        # One read slot is max_read rounded up to 4 KiB plus 8 KiB of O_DIRECT
        # room (sluice's slot_size_for): reads shrink until one fits the share.
        max_read = min(32 << 20, (staging - 8192) // 4096 * 4096)
        for ck in self._files:
            with _errors():
                self._running = sluice.iter_weights(ck, staging=staging, max_read=max_read, progress=False, **dist)
                with self._running as it:
                    for name, tensor in it:
                        if self._device != "cpu":
                            tensor = tensor.to(self._device)
                        yield name, tensor
                self._running = None
