"""Which part of a tensor each rank's model copies, and how its copies replay
on that part alone (pure arithmetic over shapes and strides; no vLLM).

A dry run (dry_run.py) records each copy a model's load_weights makes of a
checkpoint tensor as a view of it: (offset, shape, strides), in elements of
the tensor laid out contiguously. A TP layer's copy is a block of dimension 0
(a column-parallel weight's rows) or 1 (a row-parallel weight's columns); an
EP rank's copies of a fused expert tensor are the dim-0 blocks of its
experts. `needs` says which rows and columns one rank's copies read; `choose`
cuts the tensor into the most equal blocks of one dimension such that every
owner's copies fall in one block and every block has an owner (the plan's
model_owners split); `view_in_part` maps a copy's view onto the block that
arrives, so the copies replay there.
"""
from __future__ import annotations

from math import prod

__all__ = ["needs", "choose", "view_in_part"]


def _extent(shape, strides) -> int:
    return sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)


def needs(shape, copies):
    """(first row, last row, first column, last column) that `copies` (each
    (offset, shape, strides, ...)) read from a contiguous tensor of `shape`
    (dimension 0 rows, dimension 1 columns; a 1-D tensor has one column per
    row); None when some view is not a block of whole elements of rows
    (a stride that crosses rows without being a multiple of a row)."""
    if not shape:
        return None
    row = prod(shape[1:])
    col = prod(shape[2:]) if len(shape) > 1 else 1
    lo_r = lo_c = None
    hi_r = hi_c = -1
    for offset, vshape, vstrides, *_ in copies:
        if prod(vshape) == 0:
            continue
        across = [(n, s) for n, s in zip(vshape, vstrides) if s >= row and n > 1]
        if any(s % row for _, s in across):
            return None
        inner = sum((n - 1) * s for n, s in zip(vshape, vstrides) if s < row)
        at = offset % row
        if at + inner >= row:
            return None
        r0, r1 = offset // row, (offset + _extent(vshape, vstrides)) // row
        c0, c1 = at // col, (at + inner) // col
        lo_r = r0 if lo_r is None else min(lo_r, r0)
        lo_c = c0 if lo_c is None else min(lo_c, c0)
        hi_r, hi_c = max(hi_r, r1), max(hi_c, c1)
    if lo_r is None:
        return None
    return lo_r, hi_r, lo_c, hi_c


def choose(shape, needed: dict):
    """The split of a tensor of `shape` among its owners, from what each
    needs ({rank: needs(...)}): (dim, parts, {rank: part}) for the most parts
    (at most one per owner) that divide dimension `dim` such that each
    owner's needs fall in one part and every part has an owner (rows before
    columns on a tie), or None: each owner keeps it whole."""
    if not needed or any(n is None for n in needed.values()) or not shape:
        return None
    best = None
    for dim in (0, 1) if len(shape) > 1 else (0,):
        size = shape[dim]
        for parts in range(min(len(needed), size), 1, -1):
            if size % parts:
                continue
            block = size // parts
            part = {}
            for rank, (r0, r1, c0, c1) in needed.items():
                lo, hi = (r0, r1) if dim == 0 else (c0, c1)
                if lo // block != hi // block:
                    break
                part[rank] = lo // block
            else:
                if len(set(part.values())) == parts:
                    if best is None or parts > best[1]:
                        best = (dim, parts, part)
                    break
    return best


def view_in_part(full_shape, split, copy):
    """(offset, shape, strides) of `copy`'s view (offset, shape, strides
    over the whole tensor) in the part that arrives, contiguous: `split` is
    (dim, index, parts) or None (the whole tensor arrives)."""
    offset, vshape, vstrides = copy[:3]
    if split is None:
        return offset, vshape, vstrides
    dim, index, parts = split
    row = prod(full_shape[1:])
    if dim == 0:
        return offset - index * (full_shape[0] // parts) * row, vshape, vstrides
    col = prod(full_shape[2:])
    width = full_shape[1] // parts * col   # a part's row, in elements
    strides = tuple(s // row * width if s >= row else s for s in vstrides)
    return offset // row * width + offset % row - index * width, vshape, strides
