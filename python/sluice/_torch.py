"""sluice dtypes <-> torch dtypes, and tensors from the extension's tuples."""
import torch
import torch.utils.dlpack

# Where torch has the type: the same type. Types torch lacks travel as the
# integer type of their width; `as_torch_dtype` says which.
_EXACT = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
}
# float8 where the installed torch has it (torch >= 2.1); else uint8 bytes.
_FLOAT8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
           "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}
_REINTERPRET = {"U16": torch.int16, "U32": torch.int32, "U64": torch.int64}


def as_torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype a tensor of sluice dtype `dtype` arrives as."""
    if dtype in _EXACT:
        return _EXACT[dtype]
    if dtype in _FLOAT8 and hasattr(torch, _FLOAT8[dtype]):
        return getattr(torch, _FLOAT8[dtype])
    if dtype in _REINTERPRET:
        return _REINTERPRET[dtype]
    return torch.uint8  # F8 without torch float8, F6_*, F4: the bytes


def arrival_shape(dtype: str, shape):
    """The shape a tensor of `dtype` and `shape` arrives with (sub-byte types: flat bytes)."""
    if dtype.startswith("F4") or dtype.startswith("F6"):
        bits = 4 if dtype.startswith("F4") else 6
        n = 1
        for d in shape:
            n *= d
        return [(n * bits + 7) // 8]
    return list(shape)


def tensor_from(item):
    """A torch tensor from the extension's tuple
    (name, capsule|None, dtype, shape, kind, part|None, source_name)."""
    name, capsule, dtype, shape, kind, part, _source = item
    target = as_torch_dtype(dtype)
    if capsule is None:  # a placeholder: a tensor another rank owns
        t = torch.empty(arrival_shape(dtype, shape), dtype=target, device="meta")
    else:
        t = torch.utils.dlpack.from_dlpack(capsule)
        if t.dtype != target:
            t = t.view(target)  # BOOL (uint8 on the wire), float8 where torch has it
    if target is not _EXACT.get(dtype, None):
        t.sluice_dtype = dtype  # the dtype torch has no type for
    t.sluice_kind = kind
    if part is not None:
        t.sluice_part = part  # (dim, index, count): this rank's TP part
    return t
