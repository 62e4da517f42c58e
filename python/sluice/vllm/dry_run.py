"""Where a model's `load_weights` puts each checkpoint tensor, found by a dry run (the
model is any torch module with vLLM's load_weights contract; nothing here imports vLLM).

An engine's loader (vLLM's `model.load_weights`) gets full tensors and copies
each, through its parameters' `weight_loader`s, into parameter memory: one
copy of every byte after the loader itself has put them somewhere. When a
tensor's whole bytes land unchanged in one contiguous range of one parameter,
sluice can read them from storage straight into that range instead (one copy
from the page cache, none for O_DIRECT), which is what `dry_run` proves:

- it calls `model.load_weights` once, exactly as the real load does, with a
  *probe* for every tensor: an empty tensor on the meta device of the
  checkpoint's dtype and shape, so no byte is read or written;
- a `TorchDispatchMode` watches every aten op in between. Views of a probe
  (narrow, view, t, ...) stay probes. `copy_(dst, probe)` is recorded and not
  run;
- a tensor is *direct* when its load did exactly one such copy, of the whole
  probe, unconverted (same dtype and shape, both contiguous), into memory of
  one of the model's parameters or buffers, nothing else touched its probe,
  and the loader wrote nothing of its own over that range, before or after
  (a loader's own writes elsewhere, such as the zero fill of a padded
  vocabulary, run in the dry run as they would in the real one). When the
  copy happens does not matter: a loader that buffers or sorts the stream
  (V4.1's VL wrapper sorts it whole) copies later, and the bytes are in
  place before the real pass anyway.

The dry run also knows which parameter bytes nothing writes (`Plan.unwritten`):
every copy into a parameter and every write of the loader's own is marked, so
a parameter the checkpoint has nothing for (a missing tensor, or one part of
a fused parameter) is named before any byte is read.

Everything else is *streamed*: any other op on a probe (a dtype conversion, a
transpose copied out, arithmetic, a slice of it for TP), no copy at all (a tensor the loader skips),
or a loader that writes over the copied range later (scaling it, say). Streamed tensors go through `model.load_weights` again, as real
tensors: their dry-run calls did nothing to parameter memory except what the
real call redoes. A dry run that raises (a loader reading a value, say) makes
every tensor streamed.

The weight_loaders' Python-side bookkeeping (which shards of a fused
parameter were loaded, and the names `load_weights` returns) happens in the
dry run, as for a real load; the direct tensors' bytes then arrive through
`sluice.load_into`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .._torch import arrival_shape, as_torch_dtype

__all__ = ["Plan", "dry_run", "placed"]


@dataclass
class Plan:
    direct: dict = field(default_factory=dict)   # name -> the parameter memory (a tensor view) it fills
    streamed: dict = field(default_factory=dict)  # name -> why it is not direct
    loaded: set | None = None                    # what model.load_weights returned in the dry run
    failure: str | None = None                   # why the dry run gave up (everything streamed)
    # parameter name -> (bytes nothing wrote, its bytes): what the checkpoint lacks
    unwritten: dict = field(default_factory=dict)
    # What this model does with each tensor (the ownership a multi-rank load
    # plans from): its bytes reach parameter memory ("takes"), or a weight
    # loader of the model is called with it but writes nothing ("calls": a
    # MoE expert another EP rank holds, a shared table another rank writes),
    # or neither ("ignores": another PP stage's layer, a draft's tensors).
    takes: set = field(default_factory=set)
    calls: set = field(default_factory=set)
    # name -> [(offset, shape, strides, dst, dtype)]: every copy the load made
    # of the tensor, each of a view of it (offset, shape, strides in elements
    # of its probe; `dtype` the view's, which may reinterpret an element of
    # the same size, as E8M0 scales as uint8) into parameter memory `dst`,
    # unconverted, and nothing else done with its bytes: replaying them puts
    # the tensor (or the part of it these views read) where load_weights
    # would (a TP part, an expert's slot).
    copies: dict = field(default_factory=dict)
    # direct tensors whose destination the loader reads after the copy (a
    # finalization computing from it): their bytes must be in place before
    # their loader is called, not merely before load_weights ends
    read_after: set = field(default_factory=set)
    # parameter name -> the tensors its weight_loader was called with (a
    # parameter another rank writes, as a DP-shared table, is unwritten here
    # but called for a tensor that rank takes)
    called_for: dict = field(default_factory=dict)
    # name -> its shape, for the tensors that arrive in the checkpoint's own
    # shape (not a sub-byte dtype's packed one): those a plan may cut.
    shapes: dict = field(default_factory=dict)


#: The reasons a tensor is not direct that its copies still replay (parts).
_PARTIAL = frozenset({"only part of it is copied", "copied more than once", "copied with strides"})


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _span(t: torch.Tensor):
    """The bytes [start, end) a tensor view covers in its storage's memory."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


class _Recorder(TorchDispatchMode):
    def __init__(self, targets: set):
        super().__init__()
        self.targets = targets     # storages of the model's parameters and buffers
        self.owner = {}            # probe storage -> tensor name (views share it)
        # Every probe and tainted result stays alive for the dry run: a freed
        # storage's key could be reused by an unrelated tensor's.
        self.alive = []
        self.tainted = {}          # storage of a tensor computed from probes -> their names
        self.size = {}             # name -> its probe's element count
        self.dtype = {}            # name -> its probe's dtype
        self.current = None        # the name being loaded
        self.own_writes = {}       # target storage -> [(start, end)] the loader wrote itself (not a probe's copy)
        self.dst = {}              # name -> the one destination recorded
        self.why = {}              # name -> why it is streamed
        self.reasons = {}          # name -> every reason it is not direct
        self.copies = {}           # name -> [(offset, shape, strides, dst, dtype)] of its unconverted copies
        self.spans = []            # (start, end, name) of the copies recorded
        self.spans_of = {}         # target storage -> those of its copies
        self.read_after = set()    # names whose copied bytes a later op of the loader reads
        self.writes = {}           # target storage -> [(start, end)] of everything written into it
        self.took = set()          # names whose bytes reached parameter memory (directly or through ops)
        self.called = set()        # names a parameter's weight_loader was called with
        self.called_for = {}       # parameter name -> those names

    def mark(self, v):
        """Parameter memory `v` is written by the load (a copy of a tensor, or
        the loader's own fill): what the coverage check counts."""
        if _key(v) in self.targets:
            self.writes.setdefault(_key(v), []).append(_span(v))

    def _write_args(self, func, args, kwargs):
        """The tensors an op writes into (its mutable arguments)."""
        if not func._schema.is_mutable:
            return []
        out = []
        for i, a in enumerate(func._schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor):
                out.append(v)
        return out

    def bad(self, name, why):
        self.why.setdefault(name, why)
        self.reasons.setdefault(name, set()).add(why)

    def _names(self, tensors):
        out = set()
        for t in tensors:
            k = _key(t)
            if k in self.owner:
                out.add(self.owner[k])
            elif k in self.tainted:
                out |= self.tainted[k]
        return out

    def _copy(self, dst, src, names):
        if len(names) != 1 or _key(src) not in self.owner:
            for n in names:
                self.bad(n, "copied after an op on its bytes")
            return
        name = next(iter(names))
        if src.element_size() != self.dtype[name].itemsize:
            # A view as a dtype of another size counts its offsets in other
            # elements than the tensor's own (no parts, no replay).
            self.bad(name, f"copied as {src.dtype}, viewed from {self.dtype[name]}")
            return
        start, end = _span(dst)
        if any(s < end and start < e for s, e in self.own_writes.get(_key(dst), ())):
            # In the real pass the bytes are in place before the loader runs:
            # its own write there (a zero fill) would land after them.
            self.bad(name, "its loader writes where it goes before the copy")
            return
        if _key(dst) in self.targets and dst.dtype == src.dtype and tuple(dst.shape) == tuple(src.shape):
            self.copies.setdefault(name, []).append((src.storage_offset(), tuple(src.shape), tuple(src.stride()), dst,
                                                     src.dtype))
            self.spans.append((start, end, name))
            self.spans_of.setdefault(_key(dst), []).append((start, end, name))
        if name in self.dst:
            self.bad(name, "copied more than once")
        elif _key(dst) not in self.targets:
            self.bad(name, "copied into memory that is not a parameter's")
        elif dst.dtype != src.dtype:
            self.bad(name, f"converted from {src.dtype} to {dst.dtype}")
        elif tuple(dst.shape) != tuple(src.shape) or src.numel() != self.size[name] or src.storage_offset() != 0:
            self.bad(name, "only part of it is copied")
        elif not (dst.is_contiguous() and src.is_contiguous()):
            self.bad(name, "copied with strides")
        else:
            self.dst[name] = dst

    def _read(self, tensors, written):
        """An op of the loader's own reads `tensors` (but those it writes):
        the copies whose destination they overlap are read after the copy."""
        for t in tensors:
            spans = self.spans_of.get(_key(t))
            if not spans or any(t is w for w in written):
                continue
            start, end = _span(t)
            self.read_after.update(name for s, e, name in spans if s < end and start < e)

    def _written(self, func, v):
        """A parameter's memory written by an op of the loader's own (a zero
        fill of padding, a scale): harmless before the direct bytes land, so
        only a write over a copy already recorded makes that tensor streamed."""
        start, end = _span(v)
        for s, e, name in self.spans:
            if s < end and start < e:
                self.bad(name, f"its loader writes over it after the copy ({func})")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        names = self._names(tensors)
        if func is torch.ops.aten.copy_.default and names:
            dst, src = args[0], args[1]
            if self._names([dst]):
                for n in names:
                    self.bad(n, "written into")
            else:
                self.mark(dst)
                if _key(dst) in self.targets:
                    self.took |= names
                self._copy(dst, src, self._names([src]))
            return dst
        if not names:
            written = self._write_args(func, args, kwargs)
            for v in written:
                if _key(v) in self.targets:
                    self.mark(v)
                    self.own_writes.setdefault(_key(v), []).append(_span(v))
                    if self.spans:
                        self._written(func, v)
            if not func.is_view:
                self._read(tensors, written)
            return func(*args, **kwargs)
        if func.is_view:
            return func(*args, **kwargs)  # a view of a probe is a probe
        for v in self._write_args(func, args, kwargs):
            self.mark(v)  # parameter memory a probe's bytes reach through another op (streamed, still written)
            if _key(v) in self.targets:
                self.took |= names
        for n in names:
            self.bad(n, f"its bytes go through {func}")
        # Run it on the meta device, so that the loader carries on; what it
        # computes is tainted by the probes' names.
        meta = tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) and v.device.type != "meta" else v,
                        (args, kwargs))
        out = func(*meta[0], **meta[1])
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.tainted.setdefault(_key(t), set()).update(names)
                self.alive.append(t)
        return out


def dry_run(model, tensors, default_weight_loader=None) -> Plan:
    """Runs `model.load_weights` over probes of `tensors` (sluice tensor
    infos: name, dtype, shape) and says which are direct (see the module),
    and what the model takes, calls its loaders with, or ignores.

    `default_weight_loader`: the engine's loader for parameters that have no
    `weight_loader` of their own (vLLM's), so that calls through it are seen
    too; every parameter's loader is wrapped for the dry run and restored."""
    targets = {_key(t) for t in model.parameters()} | {_key(t) for t in model.buffers()}
    rec = _Recorder(targets)
    tensors = list(tensors)

    def probes():
        for info in tensors:
            probe = stand_in(info)
            rec.owner[_key(probe)] = info.name
            rec.alive.append(probe)
            rec.size[info.name] = probe.numel()
            rec.dtype[info.name] = probe.dtype
            rec.current = info.name
            yield info.name, probe
            rec.current = None

    plan = Plan()
    restore = _watch_loaders(model, rec, default_weight_loader)
    try:
        with rec, torch.no_grad():
            loaded = model.load_weights(probes())
    except Exception as e:  # the loader needs real values: nothing is direct
        plan.failure = f"{type(e).__name__}: {e}"
        plan.streamed = {t.name: "the dry run failed" for t in tensors}
        return plan
    finally:
        restore()
    plan.loaded = set(loaded) if loaded is not None else None
    plan.unwritten = _unwritten(model, rec.writes)
    plan.takes = set(rec.took)
    plan.calls = set(rec.called) - plan.takes
    plan.called_for = rec.called_for
    plan.read_after = set(rec.read_after)
    plan.copies = {n: c for n, c in rec.copies.items() if rec.reasons.get(n, set()) <= _PARTIAL}
    plan.shapes = {t.name: tuple(t.shape) for t in tensors
                   if tuple(arrival_shape(t.dtype, t.shape)) == tuple(t.shape)}
    for info in tensors:
        if info.name in rec.why:
            plan.streamed[info.name] = rec.why[info.name]
        elif info.name not in rec.dst:
            plan.streamed[info.name] = "not copied anywhere"
        else:
            plan.direct[info.name] = rec.dst[info.name]
    return plan


class placed(TorchDispatchMode):
    """The real pass over tensors whose bytes are already in place: within
    it, a copy *from* a meta tensor (a stand-in of a tensor the dry run found
    direct, or of one another rank's model writes) into real memory does
    nothing, and every other op runs. So `load_weights` can be called with
    a stand-in of every tensor its dry run saw, in the same order: its
    loaders' bookkeeping, collectives (a leader's write plus a barrier per
    call: V4.1's DPSharedEngramStorage) and the finalization at its end run
    as in the engine's own load, after the bytes arrived, without copying
    any twice. (A direct tensor's load did nothing else with its bytes than
    views and these copies, or it would not be direct.)"""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten.copy_.default and isinstance(args[1], torch.Tensor)
                and args[1].device.type == "meta" and args[0].device.type != "meta"):
            return args[0]
        return func(*args, **kwargs)


def stand_in(info) -> torch.Tensor:
    """A byte-less tensor (meta) of a checkpoint tensor's dtype and shape, as
    it would arrive."""
    return torch.empty(arrival_shape(info.dtype, info.shape), dtype=as_torch_dtype(info.dtype, info.shape),
                       device="meta")


def _watch_loaders(model, rec, default_weight_loader):
    """Wraps every parameter's weight_loader (and gives the default one to
    those without) so that a call with a probe, or a view of one, is
    recorded; returns what restores them. vLLM's newer parameter classes
    keep theirs behind a property whose deleter leaves None."""
    saved = []
    for pname, p in model.named_parameters():
        own = getattr(p, "weight_loader", None)
        inner = own if own is not None else default_weight_loader
        if inner is None:
            continue

        def watched(*args, _inner=inner, _pname=pname, **kwargs):
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            names = rec._names(tensors)
            rec.called |= names
            rec.called_for.setdefault(_pname, set()).update(names)
            return _inner(*args, **kwargs)
        # Restored from a snapshot of the instance's own attributes: a
        # property's deleter (vLLM's parameters) would not give the old
        # loader back.
        before = {a: vars(p)[a] for a in ("weight_loader", "_weight_loader") if a in vars(p)}
        for attr in ("weight_loader", "_weight_loader"):
            try:
                setattr(p, attr, watched)
            except AttributeError:
                continue
            saved.append((p, before))
            break

    def restore():
        for p, before in saved:
            for attr in ("weight_loader", "_weight_loader"):
                if attr in before:
                    vars(p)[attr] = before[attr]
                else:
                    vars(p).pop(attr, None)
    return restore


def _unwritten(model, writes) -> dict:
    """Parameters some of whose bytes nothing in the load wrote: {name:
    (bytes unwritten, bytes)}. A checkpoint that lacks a tensor leaves its
    parameter (or its part of a fused one) so, whatever vLLM's strict check
    exempts (every module with a quant method, so every linear layer)."""
    out = {}
    for name, p in model.named_parameters():
        if p.numel() == 0 or p.device.type == "meta":
            continue
        start, end = _span(p)
        covered, at = 0, start
        for s, e in sorted(writes.get(_key(p), [])):
            s, e = max(s, at), min(e, end)
            if e > s:
                covered += e - s
                at = e
        if covered < end - start:
            out[name] = (end - start - covered, end - start)
    return out
