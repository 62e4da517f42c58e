"""load_into with CUDA destinations (where sluice was built with its cuda component).

Without a device these check the typed errors; on a machine with a GPU (bench/gpu/run.sh
runs this file there) every byte loaded into device memory is copied back and compared
with the generator's digests. Device memory comes from the CUDA runtime through ctypes
when the installed torch has no CUDA (Debian's python3-torch), so the C++ path is
checked either way.
"""
import ctypes
import ctypes.util
import hashlib
import os

import pytest
import torch

import sluice
import sluice._sluice as core

from conftest import sha256


def cudart():
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12", ctypes.util.find_library("cudart")):
        for d in ("", "/usr/local/cuda/lib64/"):
            try:
                return ctypes.CDLL(d + name) if name else None
            except OSError:
                pass
    return None


def device_count():
    rt = cudart()
    if rt is None:
        return 0
    n = ctypes.c_int(0)
    return n.value if rt.cudaGetDeviceCount(ctypes.byref(n)) == 0 else 0


needs_cuda_build = pytest.mark.skipif(not core.has_cuda, reason="sluice was built without its cuda component")
needs_device = pytest.mark.skipif(device_count() == 0, reason="no CUDA device")


@needs_cuda_build
@pytest.mark.skipif(device_count() > 0, reason="a CUDA device is present")
def test_without_a_device_a_cuda_load_raises_a_typed_error_naming_the_device(small):
    path, _ = small
    ck = sluice.open(path)
    t = ck.tensors[0]
    with pytest.raises(sluice.CudaError) as e:
        core.load_into_cuda(ck._core, [(t.name, 1 << 20, t.nbytes)], 0, sluice._options("64MiB", "1MiB", 4, 1, "auto"))
    assert "device 0" in str(e.value)


def test_a_cuda_destination_without_the_cuda_component_is_a_config_error(small, monkeypatch):
    path, _ = small
    ck = sluice.open(path)
    t = ck.tensors[0]

    class FakeCuda(torch.Tensor):  # a CPU tensor that says it lives on a GPU
        @property
        def device(self):
            return torch.device("cuda", 0)

    dst = torch.empty(0).as_subclass(FakeCuda)
    monkeypatch.setattr(core, "has_cuda", False)
    with pytest.raises(sluice.ConfigError, match="no cuda component"):
        sluice.load_into(ck, {t.name: dst})


@needs_cuda_build
@needs_device
def test_every_tensor_loaded_into_device_memory_equals_the_generators_digest(medium):
    path, digests = medium
    ck = sluice.open(path)
    rt = cudart()
    ptrs, dst = [], []
    try:
        for t in ck.tensors:
            p = ctypes.c_void_p()
            assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(max(t.nbytes, 1))) == 0
            ptrs.append(p)
            dst.append((t.name, p.value, t.nbytes))
        stats = core.load_into_cuda(ck._core, dst, 0, sluice._options("64MiB", "1MiB", 4, 1, "auto"))
        assert stats["tensor_bytes"] == sum(t.nbytes for t in ck.tensors)
        for (name, ptr, n) in dst:
            host = (ctypes.c_char * max(n, 1))()
            assert rt.cudaMemcpy(host, ctypes.c_void_p(ptr), ctypes.c_size_t(n), 2) == 0  # device to host
            assert hashlib.sha256(bytes(host)[:n]).hexdigest() == digests[name][2], name
    finally:
        for p in ptrs:
            rt.cudaFree(p)


@needs_cuda_build
@pytest.mark.skipif(not torch.cuda.is_available(), reason="this torch has no CUDA")
def test_load_into_cuda_torch_tensors(medium):
    path, digests = medium
    ck = sluice.open(path)
    dst = {t.name: torch.empty(sluice.arrival_shape(t.dtype, t.shape), dtype=sluice.as_torch_dtype(t.dtype, t.shape),
                               device="cuda") for t in ck.tensors}
    sluice.load_into(ck, dst)
    for name, t in dst.items():
        assert sha256(t.cpu()) == digests[name][2], name
