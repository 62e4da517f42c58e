"""`LLM(tensor_parallel_size=2, load_format="sluice")`: vLLM's own two CPU
workers (multiprocessing, Gloo), each loading through sluice, against the same
engine loading with vLLM's safetensors loader.

vLLM's CPU backend binds each worker's OpenMP threads to a NUMA node and
refuses two workers on a one-node machine unless told where to bind
(VLLM_CPU_OMP_THREADS_BIND="0|1": one core each).

Expert parallelism is tested at the loader layer (test_vllm_ranks.py): vLLM
0.32's CPU engine itself fails it here. `LLM(moe, tensor_parallel_size=2,
enable_expert_parallel=True, distributed_executor_backend="mp")` with
`load_format="safetensors"` loads, then at the first generate: "Worker proc
VllmWorker-1 died unexpectedly (exit code: -11)"."""
import gc
import hashlib
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
vllm = pytest.importorskip("vllm")

from models import dense as _dense, tensor_bytes as _tensor_bytes  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5], [7, 100, 31, 9]]


def _digests(model):  # module level: vLLM pickles it by reference to its forked workers
    return {n: hashlib.sha256(p.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for n, p in model.named_parameters()}


def _run(model, load_format, **kw):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=model, load_format=load_format, skip_tokenizer_init=True, enforce_eager=True, max_model_len=128,
              dtype="bfloat16", max_num_seqs=2, gpu_memory_utilization=0.2, seed=0, tensor_parallel_size=2,
              distributed_executor_backend="mp", **kw)
    try:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
                            SamplingParams(max_tokens=8, temperature=0, detokenize=False), use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        digests = llm.apply_model(_digests)
        stats = None
        if load_format == "sluice":
            import sluice.vllm
            stats = llm.collective_rpc(sluice.vllm.last_load)
        return tokens, digests, stats
    finally:
        del llm
        gc.collect()


def test_two_tensor_parallel_workers_load_through_sluice_reading_each_byte_once(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # callables to the workers
    path = _dense(str(tmp_path / "dense"))
    tokens, digests, _ = _run(path, "safetensors")
    got_tokens, got_digests, stats = _run(path, "sluice")
    assert got_tokens == tokens
    assert got_digests == digests  # each rank's (TP-narrowed) parameters, bitwise
    assert len(stats) == 2
    assert sum(s["bytes_read"] for s in stats) == _tensor_bytes(path)  # each byte read by one rank
    assert all(0 < s["bytes_read"] < _tensor_bytes(path) for s in stats)

