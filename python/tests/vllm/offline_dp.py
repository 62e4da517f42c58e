"""DP2 through vLLM's engine on this CPU: vLLM's offline data parallelism (two
processes, one `LLM` each, met through VLLM_DP_*), on a MoE model written by
transformers. Each rank starts an engine per load format, one after the
other, and reports a digest of every parameter of its model (through
`apply_model`, vLLM's collective_rpc) and its greedy tokens, or the error
generation raised, with the root cause its worker printed.

Used by test_vllm_dp.py; as a script it prints each rank's report
(from the repository root, the vLLM package as the tests install it):

    PYTHONPATH=build/release/vllm-package/lib/python3.11/site-packages:python/tests/vllm \\
        .venv/bin/python python/tests/vllm/offline_dp.py [--ep] [--formats safetensors,sluice]
"""
import argparse
import gc
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import traceback

PROMPTS = [[1, 2, 3, 4, 5], [7, 100, 31, 9]]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _param_digest(model):
    """One digest of every parameter, by name (module-level: vLLM pickles it to its workers)."""
    import torch
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda x: x[0]):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _rank_main(rank, ports, model, formats, ep):
    os.environ.update(VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL=str(rank), VLLM_DP_SIZE="2",
                      VLLM_DP_MASTER_IP="127.0.0.1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
                      OMP_NUM_THREADS="1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    out = {}
    for fmt, port in zip(formats, ports):
        os.environ["VLLM_DP_MASTER_PORT"] = str(port)
        got = out[fmt] = {}
        llm = None
        try:
            llm = LLM(model=model, load_format=fmt, skip_tokenizer_init=True, enforce_eager=True, max_model_len=128,
                      dtype="bfloat16", max_num_seqs=4, seed=0, enable_expert_parallel=ep)
            got["params"] = llm.apply_model(_param_digest)[0]
            if fmt == "sluice":
                import sluice.vllm
                stats = llm.collective_rpc(sluice.vllm.last_load)[0]
                got["stats"] = {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
                                SamplingParams(max_tokens=8, temperature=0, detokenize=False), use_tqdm=False)
            got["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        except Exception as e:  # noqa: BLE001 (reported: what this is for)
            got["error"] = f"{type(e).__name__}: {e}"
            got["frames"] = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}"
                             for f in traceback.extract_tb(e.__traceback__)[-4:]]
        finally:
            print("RESULT " + json.dumps({"format": fmt, **got}), flush=True)
            if llm is not None:
                try:
                    llm.llm_engine.engine_core.shutdown()
                except Exception:  # noqa: BLE001
                    pass
            del llm
            gc.collect()
    return out


def _root_causes(text):
    """The exceptions the engine's workers logged as errors (a traceback's
    last line, 'XError' or 'XError: ...'), each with the frame that raised it."""
    lines = text.splitlines()
    found = []
    for i, ln in enumerate(lines):
        m = re.search(r"(?:\] |^)([A-Z]\w*(?:Error|Exception))(?:: (.*))?$", ln)
        if not m or " WARNING " in ln or "Worker failed" in ln or ln.startswith("RESULT"):
            continue
        frame = next((lines[j] for j in range(i - 1, max(i - 8, -1), -1) if 'File "' in lines[j]), "")
        where = re.search(r'File "(?:.*site-packages/)?([^"]+)", line (\d+)', frame)
        cause = m.group(1) + (f": {m.group(2)}" if m.group(2) else "") + (f" at {where[1]}:{where[2]}" if where else "")
        if cause not in found:
            found.append(cause)
    return found[:4]


def run(model, formats=("safetensors", "sluice"), ep=False, timeout=900):
    """Both DP ranks: [{format: {"params", "tokens" | "error", "frames", "causes"; sluice's "stats"}} per rank]."""
    ports = [free_port() for _ in formats]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--model", model,
                               "--ports", ",".join(map(str, ports)), "--formats", ",".join(formats),
                               *(["--ep"] if ep else [])],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    results = []
    for r, p in enumerate(procs):
        try:
            text = p.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text = p.communicate()[0]
        got = {}
        for ln in text.splitlines():
            if ln.startswith("RESULT "):
                rec = json.loads(ln[7:])
                got[rec.pop("format")] = rec
        for fmt in formats:
            rec = got.setdefault(fmt, {"error": f"rank {r} gave no result (exit {p.returncode})", "tail": text[-3000:]})
            if "error" in rec:
                rec["causes"] = _root_causes(text)
        results.append(got)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="safetensors,sluice")
    ap.add_argument("--ep", action="store_true", help="enable_expert_parallel (else vLLM splits each expert across DP)")
    ap.add_argument("--model", help="a MoE checkpoint directory (default: a Qwen3-MoE written by transformers)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ports", help=argparse.SUPPRESS)
    a = ap.parse_args()
    formats = a.formats.split(",")
    if a.rank is not None:
        _rank_main(a.rank, [int(p) for p in a.ports.split(",")], a.model, formats, a.ep)
        return
    model = a.model
    if model is None:
        import models
        model = models.moe(os.path.join(tempfile.mkdtemp(prefix="sluice-dp-"), "moe"))
    for r, got in enumerate(run(model, formats, a.ep)):
        print(json.dumps({"rank": r, **got}, indent=1))


if __name__ == "__main__":
    main()
