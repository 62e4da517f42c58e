"""Which part of a tensor each rank's model copies, and how its copies replay
on that part alone (pure arithmetic over shapes and strides; no vLLM).

A dry run (dry_run.py) records each copy a model's load_weights makes of a
checkpoint tensor as a view of it: (offset, shape, strides), in elements of
the tensor laid out contiguously. A TP layer's copy is a block of dimension 0
(a column-parallel weight's rows) or 1 (a row-parallel weight's columns); an
EP rank's copies of a fused expert tensor are the dim-0 blocks of its
experts; a merged column-parallel layer (gate and up in one checkpoint
tensor, LFM2's in_proj, QKV of equal heads) copies its block of each run of
rows. `needs` says which rows and columns one rank's copies read (a box per
copy); `choose` cuts one dimension into equal runs (one run, or a fused
tensor's) and each run into the most equal blocks such that every owner's
copies fall in one block index and every block has an owner (the plan's
model_owners split); `view_in_part` maps a copy's view onto what arrives
(the rank's block of every run, packed), so the copies replay there.
"""
from __future__ import annotations

from math import prod

__all__ = ["needs", "choose", "view_in_part"]


def _extent(shape, strides) -> int:
    return sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)


def _box(shape, copy):
    """(first row, last row, first column, last column) one copy reads, or
    None when it is not a block of whole elements of rows; () when empty."""
    offset, vshape, vstrides = copy[:3]
    if prod(vshape) == 0:
        return ()
    row = prod(shape[1:])
    col = prod(shape[2:]) if len(shape) > 1 else 1
    across = [(n, s) for n, s in zip(vshape, vstrides) if s >= row and n > 1]
    if any(s % row for _, s in across):
        return None
    inner = sum((n - 1) * s for n, s in zip(vshape, vstrides) if s < row)
    at = offset % row
    if at + inner >= row:
        return None
    return offset // row, (offset + _extent(vshape, vstrides)) // row, at // col, (at + inner) // col


def _merged(boxes):
    """`boxes` with those that make one box together merged (a fused
    expert's w1 and w3 halves, consecutive experts): fewer to exchange, the
    same rows and columns."""
    out = sorted(set(boxes))
    for _ in range(2):
        merged = []
        for b in sorted(out, key=lambda b: (b[2], b[3], b[0], b[1])):   # rows of equal columns
            p = merged[-1] if merged else None
            if p and p[2:] == b[2:] and b[0] <= p[1] + 1:
                merged[-1] = (p[0], max(p[1], b[1]), p[2], p[3])
            else:
                merged.append(b)
        out = []
        for b in sorted(merged):                                          # columns of equal rows
            p = out[-1] if out else None
            if p and p[:2] == b[:2] and b[2] <= p[3] + 1:
                out[-1] = (p[0], p[1], p[2], max(p[3], b[3]))
            else:
                out.append(b)
    return tuple(out)


def needs(shape, copies):
    """The boxes (first row, last row, first column, last column) that
    `copies` (each (offset, shape, strides, ...)) read from a contiguous
    tensor of `shape` (dimension 0 rows, dimension 1 columns; a 1-D tensor
    has one column per row), merged where they make one box; None when
    some view is not a block of whole elements of rows (a stride that
    crosses rows without being a multiple of a row), or nothing is read."""
    if not shape:
        return None
    boxes = []
    for copy in copies:
        b = _box(shape, copy)
        if b is None:
            return None
        if b:
            boxes.append(b)
    return _merged(boxes) if boxes else None


def _divisors(n):
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _unequal_runs(size, needed):
    """(0, parts, {rank: part}, (rows of each run)) where the owners' row
    ranges tile dimension 0 as runs of unequal sizes, each run `parts`
    equal blocks and each owner always the same block (a QKV of
    grouped-query attention: q's blocks, then k's, then v's); or None."""
    keepers = {}
    for rank, boxes in needed.items():
        for b in boxes:
            keepers.setdefault((b[0], b[1]), set()).add(rank)
    ranges = sorted(keepers)
    at = 0
    for lo, hi in ranges:   # the ranges tile the rows: none overlaps, none is missing
        if lo != at:
            return None
        at = hi + 1
    if at != size:
        return None
    for parts in range(min(len(needed), len(ranges)), 1, -1):
        if len(ranges) % parts:
            continue
        part, runs = {}, []
        for g in range(0, len(ranges), parts):
            run = ranges[g:g + parts]
            rows = run[0][1] - run[0][0] + 1
            if any(hi - lo + 1 != rows for lo, hi in run):
                break
            runs.append(rows * parts)
            if any(part.setdefault(r, k) != k for k, rng in enumerate(run) for r in keepers[rng]):
                break
        else:
            if len(part) == len(needed):
                return 0, parts, part, tuple(runs)
    return None


def choose(shape, needed: dict):
    """The split of a tensor of `shape` among its owners, from what each
    needs ({rank: needs(...)}): (dim, parts, {rank: part}, groups), where
    dimension `dim` is `groups` equal runs each cut into `parts` blocks and
    each owner's boxes all fall in block `part` of some run; the most parts
    (at most one per owner) such that every part has an owner, then the
    fewest runs, rows before columns; or None: each owner keeps it whole.
    Where no equal runs do, dimension 0's runs may be unequal (`groups` a
    tuple of each run's rows: _unequal_runs)."""
    if not needed or any(n is None for n in needed.values()) or not shape:
        return None
    best = None
    for dim in (0, 1) if len(shape) > 1 else (0,):
        size = shape[dim]
        # A block holds the widest box: most tensors (every owner reads all
        # of it) stop here.
        widest = max(b[2 * dim + 1] - b[2 * dim] + 1 for boxes in needed.values() for b in boxes)
        if 2 * widest > size:
            continue
        for groups in _divisors(size):
            run = size // groups
            for parts in range(min(len(needed), run // widest), 1, -1):
                if run % parts or (best is not None and (parts, -groups) <= (best[1], -best[3])):
                    continue
                block = run // parts
                part = {}
                for rank, boxes in needed.items():
                    got = set()
                    for r0, r1, c0, c1 in boxes:
                        lo, hi = (r0, r1) if dim == 0 else (c0, c1)
                        if lo // block != hi // block:
                            break
                        got.add(lo % run // block)
                    else:
                        if len(got) == 1:
                            part[rank] = got.pop()
                            continue
                    break
                else:
                    if len(set(part.values())) == parts:
                        best = (dim, parts, part, groups)
                        break
    odd = _unequal_runs(shape[0], needed)
    if odd is not None and (best is None or odd[1] > best[1]):
        best = odd
    return best


def view_in_part(full_shape, split, copy):
    """(offset, shape, strides) of `copy`'s view (offset, shape, strides
    over the whole tensor) in the part that arrives, contiguous: `split` is
    (dim, index, parts[, groups]) (block `index` of every one of `groups`
    runs of `dim`, packed in order; `groups` a tuple: dimension 0's runs of
    those many rows) or None (the whole tensor arrives)."""
    offset, vshape, vstrides = copy[:3]
    if split is None:
        return offset, vshape, vstrides
    dim, index, parts, *more = split
    groups = more[0] if more else 1
    row = prod(full_shape[1:])
    if dim == 0 and isinstance(groups, (tuple, list)):   # runs of unequal sizes (rows each)
        r, start = offset // row, 0
        for rows in groups:
            if r < start + rows:
                break
            start += rows
        return (start // parts + r - start - index * (rows // parts)) * row + offset % row, vshape, vstrides
    if dim == 0:
        run = full_shape[0] // groups
        block = run // parts
        r = offset // row
        return (r // run * block + r % run - index * block) * row + offset % row, vshape, vstrides
    col = prod(full_shape[2:])
    run = full_shape[1] // groups
    block = run // parts
    width = full_shape[1] // parts * col   # a part's row, in elements
    c, within = divmod(offset % row, col)
    strides = tuple(s // row * width if s >= row else s for s in vstrides)
    return offset // row * width + (c // run * block + c % run - index * block) * col + within, vshape, strides
