"""sluice: stream safetensors checkpoints (local files, S3) into torch tensors.

    ck = sluice.open("/models/deepseek", select=r"^model\\.", rename={"model.language_model.": "model."})
    for name, tensor in sluice.iter_weights(ck, staging="4GiB"):
        model.load_weight(name, tensor)       # zero-copy views; keep them as long as you like

See the README's Python section and docs/design.md ("The Python package").
"""
import os as _os
import re as _re
import sys as _sys
from typing import NamedTuple as _NamedTuple

try:
    from . import _sluice
except ImportError as _e:  # the .py files without their extension (a build tree that built only the tools)
    if getattr(_e, "name", None) not in (None, __name__ + "._sluice") and "_sluice" not in str(_e):
        raise
    raise ImportError(
        f"sluice: the extension sluice._sluice is missing next to {_os.path.dirname(__file__)} ({_e}). Build it with "
        "`cmake --preset release && cmake --build --preset release` (then PYTHONPATH=build/release/python), "
        "or install the package with `pip install .` from the source tree") from None
from ._sluice import (  # noqa: F401  (the exception hierarchy, mirroring sluice::error)
    Error, FormatError, IndexError, IOError, TruncatedError, CancelledError, ConfigError, ContractError,
    ResourceError, UsageError, DistributedError, CommError, PeerLostError, S3Error, S3NotFoundError, S3AccessError,
    S3ObjectChangedError, CudaError, Contract,
    release_memory, memory_stats,
)
from ._torch import as_torch_dtype, arrival_shape  # noqa: F401
from ._contract import Recorder, ReloadSession, probe  # noqa: F401

__all__ = ["open", "components", "inspect", "iter_weights", "load_into", "Recorder", "ReloadSession", "probe", "Contract",
           "TensorInfo", "World", "Checkpoint", "WeightIterator", "parse_size", "prefault", "Prefault", "plan_owners", "as_torch_dtype", "Error", "release_memory",
           "memory_stats", "cache_stats"]


def components() -> list:
    """The C++ components this build of the extension has, e.g. ["uring", "s3", "gloo", "cuda", "nccl"]."""
    return [c for c in _sluice.components.split(",") if c and c != "testing"]


def parse_size(size) -> int:
    """Bytes from an int or a string such as "4GiB", "256MiB", "1.5GiB", "4GB".

    The grammar is the C++ library's (sluice/core/size.hpp), shared with
    sluice-load: K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB,
    GB, TB powers of 1000 (GNU coreutils' units: "4GB" is 4e9 bytes)."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ConfigError(f"size {size!r}: expected an int or a string such as '4GiB'")
    if isinstance(size, int):
        if size <= 0:
            raise ConfigError(f"size {size}: must be positive")
        return size
    return _sluice.parse_size(size)


class World(_NamedTuple):
    """This rank's place in a distributed load when it is not torchrun's
    environment (an engine's own groups): global rank, world size, and the
    rank and count of the ranks on this node."""
    rank: int
    size: int
    local_rank: int
    local_size: int


class TensorInfo(_NamedTuple):
    """A tensor's metadata (no data read)."""
    name: str          # after renaming: what engines see
    source_name: str   # in the file
    dtype: str         # sluice/safetensors dtype name, e.g. "BF16", "F8_E4M3"
    shape: tuple
    nbytes: int
    file: str
    offset: int        # absolute offset in the file


class Checkpoint:
    """An opened checkpoint: validated headers and tensor metadata, no data."""

    def __init__(self, core, where):
        self._core = core
        self.where = where
        self._tensors = None   # made on first use: a header of a million tensors opens without them
        self._names = None

    @property
    def tensors(self):
        """The tensors, in file order (TensorInfo)."""
        if self._tensors is None:
            self._tensors = [TensorInfo(n, s, d, tuple(sh), nb, f, off)
                             for (n, s, d, sh, nb, f, off) in self._core.tensors()]
        return self._tensors

    @property
    def _by_name(self):
        if self._names is None:
            self._names = {t.name: t for t in self.tensors}
        return self._names

    location = property(lambda self: self._core.location)
    tensor_bytes = property(lambda self: self._core.tensor_bytes)
    header_bytes_read = property(lambda self: self._core.header_bytes_read)
    shards = property(lambda self: [n for n, _ in self._core.shards()])

    def __len__(self):
        return len(self._core)

    def __iter__(self):
        return iter(self.tensors)

    def __contains__(self, name):
        return name in self._by_name

    def __getitem__(self, name) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"the checkpoint at '{self.location}' has no tensor '{name}'") from None

    def inspect(self) -> dict:
        return self._core.inspect()

    def select(self, names) -> "Checkpoint":
        """The checkpoint of the named tensors only (an iterable of names, in
        any order; the tensors keep file order), over the same opened shards:
        no header is read again and nothing is re-opened. A name the
        checkpoint lacks raises ConfigError naming it."""
        if isinstance(names, str):
            raise ConfigError("select: expected an iterable of tensor names, not a str")
        return Checkpoint(self._core.select([str(n) for n in names]), self.where)

    def __repr__(self):
        return f"<sluice.Checkpoint {self.location!r}: {len(self.tensors)} tensors, {self.tensor_bytes} bytes>"


def open(path, select=None, rename=None, index=None, collective=None, world=None, store=None,  # noqa: A001
         timeout=60.0, limits=None, cache=None, cache_max=None) -> Checkpoint:
    """Opens a checkpoint directory, a .safetensors file or s3://bucket/prefix/ (headers only).

    select: a regular expression in RE2 syntax (https://github.com/google/re2/wiki/Syntax:
      Python's re syntax without backreferences or lookaround), searched in the
      file's tensor names, or a callable name -> bool.
    rename: {prefix: replacement}, applied in order, first match wins.
    index: a local model.safetensors.index.json to open `path` through instead
      of its own index (e.g. the weights in S3, the index beside the config).
      The shards it names are checked against what `path` lists before any
      header is read: a shard it names that is not there (or whose size or
      ETag differs from what the index's metadata records) raises
      sluice.IndexError naming it; then a tensor it lists that its shard lacks,
      or one the shard has that it does not list, raises IndexError naming the
      tensor.
    collective/world/store/timeout: a collective open by the ranks of a
      distributed load (every rank calls it, with the same arguments): rank 0
      reads the index and the headers from storage and the other ranks replay
      what it read (no metadata request of theirs), through the same checks
      (taking rank 0's parses rather than parsing the same JSON again), so a
      corrupt shard is the same typed error on every rank; a
      rank that fails alone fails every rank (sluice.DistributedError naming
      it). The ranks are `world` (a sluice.World) with `store` (a
      torch.distributed store whose key prefix the ranks agreed on; the open
      uses the keys under "open/"), or, with collective=True, torchrun's
      environment and the default store (as iter_weights). `header_bytes_read`
      is then what this rank read: everything on rank 0, nothing elsewhere.
    limits: caps on the metadata, by name (max_header_bytes, max_index_bytes,
      max_tensors, max_depth, max_name_bytes; defaults 100 MB, 128 MiB, 2**20,
      16, 1 KiB): a checkpoint beyond one raises FormatError/IndexError naming
      it, before memory is sized from it.
    cache: s3:// only: a node-local cache directory (made 0700 if missing; one
      others can reach is refused) that loads read through: blocks it has are
      read from local disk and verified (XXH3), the others fetched once and
      written; an object whose ETag changed is fetched again. Default: the
      SLUICE_CACHE_DIR environment variable, else none. cache_max: a size cap
      (e.g. "200GiB"; SLUICE_CACHE_MAX), least recently used blocks evicted.
      What it did: sluice.cache_stats().
    """
    regex = fn = None
    if isinstance(select, (str, _re.Pattern)):
        regex = select.pattern if isinstance(select, _re.Pattern) else select
    elif select is not None:
        if not callable(select):
            raise ConfigError("select: expected a regular expression or a callable")
        fn = select
    rules = list((rename or {}).items())
    where = _os.fspath(path)
    if index is not None:
        index = _os.fspath(index)
        if not _os.path.isfile(index):
            raise ConfigError(f"index: '{index}' is not a file (a local model.safetensors.index.json)")
    who = None
    if collective or world is not None or store is not None:
        from ._distributed import collective_open_options
        who = collective_open_options(world, store, timeout)
    cache = _os.fspath(cache) if cache is not None else ""
    cache_max = parse_size(cache_max) if cache_max is not None else 0
    return Checkpoint(_sluice.open_checkpoint(where, regex, fn, rules, index or "", who, dict(limits or {}), cache,
                                              cache_max), where)


def cache_stats():
    """What the node-local cache did in this process, cumulative (the cache it
    used last): bytes served from it (hit_bytes), fetched from S3
    (fetched_bytes), fetched again because a cached block failed verification
    (refetched_bytes, bad_blocks), blocks written, not written and evicted,
    bytes hashed and the seconds spent hashing. None before any cached load."""
    return _sluice.cache_stats()


def inspect(ck) -> dict:
    """Per-class (replicated, routed_expert, shared_table) and per-dtype totals, headers only."""
    if not isinstance(ck, Checkpoint):
        ck = open(ck)
    return ck.inspect()


def _options(staging, max_read, queue_depth, threads, io, on_exhausted=None, queue=None):
    o = _sluice.StreamOptions()
    o.staging = parse_size(staging)
    o.max_read = parse_size(max_read)
    o.queue_depth = int(queue_depth)
    o.threads = int(threads)
    o.io = io
    if on_exhausted is not None:
        o.on_exhausted = on_exhausted
    if queue is not None:
        o.queue = int(queue)
    return o


class WeightIterator:
    """Iterates (name, torch.Tensor) over a load running on a C++ thread.

    Each tensor is a zero-copy view of staging memory (or, distributed, of
    the rank's window buffer or the node's shared segment) that owns its
    bytes: its DLPack deleter returns them. `stats` holds the load's summary
    once the loop has ended. Use it as a context manager in distributed
    loads: an exception in the loop body then fails the load on every rank.
    """

    def __init__(self, ck, options, progress):
        from ._torch import tensor_from
        self._tensor_from = tensor_from
        self.checkpoint = ck
        self._stream = _sluice.Stream(ck._core, options)
        self._progress = progress
        self._bar = None
        self._started = False
        self.stats = None

    def __iter__(self):
        if not self._started:
            self._started = True
            self._stream.start()
            if self._progress is True or (self._progress is None and _sys.stderr.isatty()):
                try:
                    import tqdm
                    self._bar = tqdm.tqdm(total=self.checkpoint.tensor_bytes, unit="B", unit_scale=True,
                                          unit_divisor=1024, desc="sluice", leave=False)
                except ImportError:
                    self._bar = None
        return self

    def __next__(self):
        if not self._started:
            iter(self)
        try:
            item = self._stream.next()
        except BaseException:
            self._close_bar()
            raise
        self._report()
        if item is None:
            self.stats = self._stream.stats()
            self._close_bar()
            raise StopIteration
        return item.name, self._tensor_from(item)

    def _report(self):
        if self._bar is None and not callable(self._progress):
            return  # nothing shows it: no call into the extension per tensor
        done, total, tensors, total_tensors = self._stream.progress()
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        else:
            self._progress(done, total)

    def _close_bar(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self):
        """Stops the load (if running) and waits for it."""
        self._stream.stop()
        self._close_bar()

    def __enter__(self):
        return iter(self)

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            self._stream.fail(f"{exc_type.__name__}: {exc}")
        else:
            self.close()
        self._close_bar()
        return False

    def staging_region(self):
        """(address, bytes, slot size) of the staging pool (local loads)."""
        return self._stream.staging_region()

    def slots(self):
        """(slots, free slots, slots pinned by tensors handed out)."""
        return self._stream.slots()


def iter_weights(ck, staging="4GiB", max_read="32MiB", queue_depth=4, threads=1, io="auto", on_exhausted="copy",
                 queue=8, progress=None, topology=None, offload="none", store=None, timeout=60.0,
                 world=None, pp_stage_layers=None, pp_first_pattern=None, pp_last_pattern=None,
                 expert_placement="linear", map_cached=True, placeholders=True, model_owners=None,
                 stand_ins=None) -> WeightIterator:
    """Streams the checkpoint's tensors as (name, torch.Tensor).

    staging: the staging budget (bytes or "4GiB"); memory stays within it.
    on_exhausted: what happens when the tensors the caller still holds pin so
      many staging slots that the load would have none left to read into:
      "copy" (default) hands out the next tensors as copies in memory of their
      own, so the load never waits on the caller; "raise" raises
      sluice.ResourceError naming the budget.
    map_cached: a tensor of 1 MiB or more (or larger than a staging slot)
      whose bytes are in the page cache (any, under io="buffered"; never under
      io="direct") comes as a view of the page cache, a private mapping of its
      file: no copy and no memory of its own; writing to it copies the page,
      never the file. False reads it into a slot or memory of its own. In a
      distributed load, the tensors of 1 MiB or more that this rank keeps
      whole and reads or takes itself from local files (and, where the
      node's page cache is its copy, the shared tables) come as such views.
    placeholders: in a distributed load, whether another rank's tensors come
      as empty placeholders (sluice_kind "placeholder": every rank then sees
      the same sequence of names); False skips them in C++, but for the names
      in `stand_ins`, whose placeholders still come (a byte-less stand-in for
      an engine loader that must be called).
    model_owners: {name: [ranks]}: the ranks each tensor goes to, as the
      engine's own model says (every rank passes the same map; see
      plan_options::model_owners): a listed tensor is read by one of them and
      sent, whole, only to the others; listed with no rank, it is not read.
      A value ([ranks], dim, parts, [part of each rank]) splits the tensor
      into `parts` equal blocks of dimension `dim` (0 or 1), each rank
      keeping its block: it arrives as that block (`sluice_part`) and no
      rank reads or receives another's. A fifth element `groups` > 1 cuts
      dimension `dim` into that many equal runs first (a fused tensor: gate
      and up, QKV of equal heads) and gives each rank its block of every
      run, packed in order (`sluice_part` (dim, index, parts, groups)), as a
      merged column-parallel layer keeps it; a tuple of row counts instead
      gives dimension 0's runs of unequal sizes (a QKV of grouped-query
      attention: q's rows, k's, v's). Unlisted tensors follow sluice's name
      rules.
    progress: True (a tqdm bar), False, None (a bar when stderr is a
      terminal), or a callable(bytes_done, total_bytes) called per tensor.
    topology/offload/store/world: a distributed load (see sluice._distributed):
      the ranks from `world` (a sluice.World) or torchrun's environment (RANK,
      WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE); the topology defaults to
      "tp1,dpN,epN", as sluice-load's. Without any of the four, the load is
      this process's alone.
    pp_stage_layers/pp_first_pattern/pp_last_pattern: a topology with PP > 1:
      the layers of each stage, in stage order (default: sluice's even split,
      which is vLLM's get_pp_indices without VLLM_PP_LAYER_PARTITION), and the
      patterns of the layer-less tensors that go with the first stage only
      (default: embed_tokens) and the last only (default: the final norm and
      lm_head); "" puts them on every stage. See plan_owners.
    expert_placement: which EP rank holds routed expert e: "linear" (default:
      contiguous blocks, e * EP // E) or "round_robin" (e % EP), vLLM's two
      `--expert-placement-strategy` values.
    """
    if not isinstance(ck, Checkpoint):
        ck = open(ck)
    o = _options(staging, max_read, queue_depth, threads, io, on_exhausted, queue)
    o.map_cached = bool(map_cached)
    o.placeholders = bool(placeholders)
    if stand_ins:
        o.stand_ins = set(stand_ins)
    if topology is not None or store is not None or world is not None:
        from ._distributed import configure
        configure(o, topology, offload, store, timeout, world)
    _plan_options(o, pp_stage_layers, pp_first_pattern, pp_last_pattern, expert_placement, model_owners)
    return WeightIterator(ck, o, progress)


def _plan_options(o, pp_stage_layers, pp_first_pattern, pp_last_pattern, expert_placement, model_owners=None):
    if pp_stage_layers:
        layers = list(pp_stage_layers)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers):
            raise ConfigError(f"pp_stage_layers: expected positive layer counts, got {layers!r}")
        o.pp_stage_layers = layers
    if pp_first_pattern is not None:
        o.pp_first_pattern = str(pp_first_pattern)
    if pp_last_pattern is not None:
        o.pp_last_pattern = str(pp_last_pattern)
    o.expert_placement = str(expert_placement)
    if model_owners:
        owners, parts = {}, {}
        for n, v in model_owners.items():
            if isinstance(v, tuple):
                ranks, dim, count, part, *runs = v
                runs = runs[0] if runs else 1
                rows = [int(r) for r in runs] if isinstance(runs, (tuple, list)) else []
                parts[str(n)] = (int(dim), int(count), [int(k) for k in part], len(rows) or int(runs), rows)
            else:
                ranks = v
            owners[str(n)] = [int(r) for r in ranks]
        o.model_owners = owners
        o.model_parts = parts


def plan_owners(ck, topology, offload="none", local_size=None, pp_stage_layers=None, pp_first_pattern=None,
                pp_last_pattern=None, expert_placement="linear", model_owners=None) -> list:
    """The tensors each rank of a distributed load would own, from sluice's
    plan alone (no process, no read): a list over the topology's ranks (in
    sluice's order: PP x DP x TP) of tensor names in file order. The plan is
    the one iter_weights computes for the same topology, offload and PP
    options; an inconsistent request raises ConfigError (e.g. stage layer
    counts that do not add up to the checkpoint's layers)."""
    if not isinstance(ck, Checkpoint):
        ck = open(ck)
    o = _sluice.StreamOptions()
    o.topology, o.offload = topology, offload
    o.local_size = int(local_size) if local_size else 0
    _plan_options(o, pp_stage_layers, pp_first_pattern, pp_last_pattern, expert_placement, model_owners)
    return _sluice.plan_owners(ck._core, o)


def load_into(ck, tensors: dict, staging="1GiB", max_read="32MiB", queue_depth=4, threads=1, io="auto",
              progress=None, prefault=True) -> dict:
    """Reads the named tensors into preallocated tensors (dtype, shape and size
    checked first). CPU tensors: large ones are read straight into place. CUDA
    tensors (where sluice was built with its cuda component, `sluice.has_cuda`):
    through pinned staging and asynchronous copies, complete on return, one
    load per device. Returns the load's stats (summed over devices: a dict per
    device under "devices" when there are several). `progress`, a callable,
    is called as progress(bytes_done, bytes_total) while CPU destinations fill
    (every 50 ms and at the end; CUDA destinations report once, when done).
    `prefault`: CPU destinations of 64 MiB or more in all are faulted in on a
    thread of sluice's own, from the last backwards, while the reads fill them
    from the first (fresh memory's first touch on two cores; stats'
    `prefaulted_bytes` says how much it did)."""
    import torch
    if not isinstance(ck, Checkpoint):
        ck = open(ck)
    by_device = {}
    for name, t in tensors.items():
        info = ck[name]
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"load_into: the destination of '{name}' is a {type(t).__name__}, not a torch.Tensor")
        if t.device.type not in ("cpu", "cuda"):
            raise ConfigError(f"load_into: the destination of '{name}' is on {t.device}; sluice loads into CPU or CUDA tensors")
        if t.device.type == "cuda" and not _sluice.has_cuda:
            raise ConfigError(f"load_into: the destination of '{name}' is on {t.device}; this build of sluice has no "
                              "cuda component (build it where the CUDA toolkit is found)")
        want = as_torch_dtype(info.dtype, info.shape)
        if t.dtype != want:
            raise ConfigError(f"load_into: tensor '{name}' is {info.dtype} (torch {want}), the destination is {t.dtype}")
        shape = arrival_shape(info.dtype, info.shape)
        if list(t.shape) != shape:
            raise ConfigError(f"load_into: tensor '{name}' has shape {list(info.shape)}, the destination {list(t.shape)}")
        if not t.is_contiguous():
            raise ConfigError(f"load_into: the destination of '{name}' is not contiguous")
        nbytes = t.numel() * t.element_size()
        if nbytes != info.nbytes:
            raise ConfigError(f"load_into: tensor '{name}' has {info.nbytes} bytes, the destination {nbytes}")
        device = t.device.index if t.device.type == "cuda" else None
        if device is None and t.device.type == "cuda":
            device = torch.cuda.current_device()
        by_device.setdefault(device, []).append((name, t.data_ptr(), nbytes))
    options = _options(staging, max_read, queue_depth, threads, io)
    options.prefault = bool(prefault)
    runs = {}
    for device, dst in by_device.items():
        if device is None:
            runs["cpu"] = _sluice.load_into(ck._core, dst, options, progress)
        else:
            torch.cuda.synchronize(device)  # the destinations' pending work (their allocation, a zero fill) first
            runs[f"cuda:{device}"] = _sluice.load_into_cuda(ck._core, dst, device, options)
            if progress is not None:
                done = sum(n for _, _, n in dst)
                progress(done, done)
    if len(runs) == 1:
        return next(iter(runs.values()))
    if not runs:
        return _sluice.load_into(ck._core, [], options)
    total = {k: sum(r[k] for r in runs.values()) for k in ("bytes_read", "tensor_bytes", "tensors")
             if all(k in r for r in runs.values())}
    total["devices"] = runs
    return total


class Prefault:
    """Fresh CPU memory being faulted in on a thread of sluice's own (see
    `prefault`). Stop it before the load that fills the memory starts, or
    leave it to the `with` block: `stop()` joins the thread and returns the
    bytes it faulted in (whole pages, so slightly more than the tensors')."""

    def __init__(self, core, keep):
        self._core, self._keep = core, keep

    @property
    def started(self) -> bool:
        """Whether a thread was started (the tensors reached min_bytes)."""
        return self._core.started

    def stop(self) -> int:
        self._core.stop()
        self._keep = None  # the tensors may go once the thread has
        return self._core.bytes

    def __del__(self):
        self.stop()  # the thread is joined before the tensors it faults in can go

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def prefault(tensors, min_bytes="64MiB") -> Prefault:
    """Starts faulting in `tensors`' memory (CPU tensors, in the order a load
    will fill them; others are skipped) on a thread of sluice's own, from the
    last backwards, and returns at once. For the time before a load knows its
    destinations, such as an engine's dry run of its weight loaders: the
    first touch of fresh parameters is most of a page-cache-hot load, and
    this starts it early. Nothing is written. The tensors are kept alive
    until `stop()`. Nothing is started under `min_bytes` in all."""
    import torch
    keep, spans, seen = [], [], set()
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        keep.append(t)
        spans.append((storage.data_ptr(), storage.nbytes()))
    return Prefault(_sluice.Prefaulter(spans, parse_size(min_bytes)), keep)
