"""sluice dtypes <-> torch dtypes, and tensors from the extension's TensorItems."""
import torch
import torch.utils.dlpack

# torch 2.x (the package needs torch >= 2.3: float8 and unsigned types) has a type
# for every safetensors dtype but the sub-byte ones, and each is the one HF
# safetensors gives (python/tests/test_reference.py checks). The bytes travel
# through DLPack as a type of the same width; `tensor_from` views them as this.
_EXACT = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "BOOL": torch.bool, "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
}


# F4 (FP4 E2M1) packs two values per byte: HF safetensors gives it as torch's
# float4_e2m1fn_x2 with the last dimension halved (shape [2, 18] arrives as
# [2, 9]), as NVFP4/MXFP4 weights reach vLLM's loaders. A last dimension that
# is odd (or a scalar) has no such view: flat bytes, as the F6 types (which
# HF safetensors does not read at all).
_F4_X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _f4_pairs(dtype: str, shape) -> bool:
    return dtype == "F4" and _F4_X2 is not None and (shape is None or (len(shape) > 0 and shape[-1] % 2 == 0))


def as_torch_dtype(dtype: str, shape=None) -> torch.dtype:
    """The torch dtype a tensor of sluice dtype `dtype` (and `shape`, which
    decides for F4) arrives as."""
    if _f4_pairs(dtype, shape):
        return _F4_X2
    return _EXACT.get(dtype, torch.uint8)  # F6_*, F4 without pairs: the packed bytes


def arrival_shape(dtype: str, shape):
    """The shape a tensor of `dtype` and `shape` arrives with: F4 in pairs
    (the last dimension halved, as HF safetensors gives it), other sub-byte
    types as flat bytes."""
    if _f4_pairs(dtype, shape):
        return list(shape[:-1]) + [shape[-1] // 2]
    if dtype.startswith("F4") or dtype.startswith("F6"):
        bits = 4 if dtype.startswith("F4") else 6
        n = 1
        for d in shape:
            n *= d
        return [(n * bits + 7) // 8]
    return list(shape)


def tensor_from(item):
    """A torch tensor from the extension's TensorItem (its capsule is consumed)."""
    capsule, dtype, shape, kind, part = item.capsule, item.dtype, item.shape, item.kind, item.part
    target = as_torch_dtype(dtype, shape)
    if capsule is None:  # a placeholder: a tensor another rank owns
        t = torch.empty(arrival_shape(dtype, shape), dtype=target, device="meta")
    else:
        t = torch.utils.dlpack.from_dlpack(capsule)
        if t.dtype != target:
            t = t.view(target)  # BOOL, float8 (uint8 on the wire), U16-U64 (signed on the wire), F4 pairs
        if target is _F4_X2 and part is None:
            t = t.view(arrival_shape(dtype, shape))   # the pairs' shape (the wire's is flat)
    if target is not _EXACT.get(dtype, None):
        t.sluice_dtype = dtype  # the dtype torch has no type for
    t.sluice_kind = kind
    t.sluice_holds_staging = getattr(item, "holds_staging", False)  # a slot or budget of its stream (see TensorItem)
    if part is not None:
        t.sluice_part = part  # (dim, index, count[, groups]): this rank's TP part (see TensorItem.part)
    return t
