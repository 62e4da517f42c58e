"""bench/vllm_load.py: the time vLLM spends in its model loader's load_weights
(each format's, timed the same way inside vLLM's own load_model: the CPU model
runner logs no total, and only the default loader logs its own), sluice against
vLLM's own safetensors loader and Run:ai's streamer, on one generated model,
page cache hot and cold, in one run.

    PYTHONPATH=build/py/lib/python3.11/site-packages .venv/bin/python bench/vllm_load.py \\
        [--model DIR | --size 2GiB] [--formats sluice,safetensors,runai_streamer] [--repeat 2] [--warmup 1] [--no-cold]

A format "sluice+map" is --load-format sluice with the `map` extra-config key
(whole parameters as page-cache mappings; opt-in, see sluice/vllm.py).

The model is a random Llama written by transformers (save_pretrained, 5 GB
shards), at least --size of bf16 weights; it is kept in .samples/ between runs.
Each load is its own process (vLLM's engine in-process, VLLM_ENABLE_V1_MULTIPROCESSING=0)
running LLM(model, load_format=F, enforce_eager=True) and generating one token;
the figure is the time vLLM logs for the weights, best of --repeat. Hot: the
files are read once right before (this VM reclaims idle page cache after ~60 s).
Cold: `echo 3 > /proc/sys/vm/drop_caches` before each load (root). sluice is
the package `pip install .` put on PYTHONPATH (a Release build).

Before the timed repeats of each mode, --warmup rounds load every format once,
untimed (printed on their own line). On this VM the first loads after the model
is written or the machine has been idle fault fresh memory in up to 4x slower
(its balloon device reports free pages to the host, which then backs them
again; bench/fresh_memory.c shows the same spread), for every format alike; the
format that happens to go first would pay for it alone.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import page_cache  # bench/page_cache.py
from page_cache import drop_caches

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import sys, time
import vllm.model_executor.model_loader as ml
_get = ml.get_model_loader
def _timed(cfg):  # every load format's load_weights, timed the same way
    loader = _get(cfg)
    inner = loader.load_weights
    def load_weights(*a, **k):
        t0 = time.perf_counter()
        r = inner(*a, **k)
        print(f"BENCH load_weights took {time.perf_counter() - t0:.3f} seconds", flush=True)
        return r
    loader.load_weights = load_weights
    return loader
ml.get_model_loader = _timed
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
def main():
    llm = LLM(model=sys.argv[1], load_format=sys.argv[2], skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=128, dtype="bfloat16", max_num_seqs=1, gpu_memory_utilization=0.3, seed=0,
              **({"model_loader_extra_config": {"staging": sys.argv[3], "map": sys.argv[4] == "map"}}
                 if sys.argv[2] == "sluice" else {}))
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=1, detokenize=False),
                 use_tqdm=False)
if __name__ == "__main__":
    main()
"""


def make_model(path, size):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    hidden, inter, vocab = 2048, 5632, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    layers = max(1, -(-(size // 2 - 2 * vocab * hidden) // per_layer))
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=256)
    torch.manual_seed(0)
    with torch.device("cpu"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(path, safe_serialization=True, max_shard_size="2GB")


def warm(path):
    page_cache.warm(os.path.join(path, f) for f in sorted(os.listdir(path)))


def load_seconds(model, fmt, staging):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    t0 = time.perf_counter()
    # "sluice+map": --load-format sluice with the map extra-config key (page-cache parameters)
    base, _, variant = fmt.partition("+")
    p = subprocess.run([sys.executable, "-c", CHILD, model, base, staging, variant], env=env, capture_output=True,
                       text=True)
    wall = time.perf_counter() - t0
    out = p.stdout + p.stderr
    m = re.findall(r"BENCH load_weights took ([0-9.]+) seconds", out)
    if p.returncode != 0 or not m:
        tail = "\n".join(out.splitlines()[-8:])
        raise RuntimeError(f"{fmt}: exit {p.returncode}, no load time in its log:\n{tail}")
    return float(m[-1]), wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--formats", default="sluice,safetensors,runai_streamer")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of every format before each mode's repeats")
    ap.add_argument("--staging", default="1GiB")
    ap.add_argument("--no-cold", action="store_true")
    a = ap.parse_args()
    import sluice
    size = sluice.parse_size(a.size)
    model = a.model or os.path.join(ROOT, ".samples", f"vllm-llama-{a.size}")
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"# writing {model} (random Llama, >= {a.size} of bf16 weights)", flush=True)
        make_model(model, size)
    total = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))
    import vllm
    print(f"# {' '.join(sys.argv)}")
    print(f"# model {model}: {total / 2**30:.2f} GiB of safetensors; vllm {vllm.__version__}, sluice {sluice.__file__}")
    modes = ["hot"] + ([] if a.no_cold or os.geteuid() != 0 else ["cold"])
    formats = a.formats.split(",")
    rows = {}  # (mode, format) -> every load's seconds, or None once one failed
    for mode in modes:
        # The formats take turns within each repeat, so that a drift of the
        # machine over the run falls on all of them alike, in the order
        # reversed every other repeat (A B, B A, ...), so that none always
        # follows the same one.
        warmup = []
        for r in range(-a.warmup, a.repeat):
            for fmt in (formats if r % 2 == 0 else formats[::-1]):
                if rows.get((mode, fmt), []) is None:
                    continue
                warm(model) if mode == "hot" else drop_caches()
                try:
                    s, wall = load_seconds(model, fmt, a.staging)
                except RuntimeError as e:
                    print(f"# {mode} {fmt}: {e}")
                    rows[(mode, fmt)] = None
                    continue
                if r < 0:
                    warmup.append(f"{fmt} {s:.2f}")
                else:
                    rows.setdefault((mode, fmt), []).append(s)
        if warmup:
            print(f"# {mode} warm-up, untimed, in order: " + ", ".join(warmup), flush=True)
    print(f"\n{'page cache':10} {'load format':16} {'best s':>7} {'median s':>8} {'GiB/s':>7} {'sluice speed':>12}  every load (s)")
    for mode in modes:
        ours = rows.get((mode, "sluice"))
        for fmt in formats:
            v = rows.get((mode, fmt))
            if not v:
                print(f"{mode:10} {fmt:16} {'failed':>7}")
                continue
            ratio = f"{min(v) / min(ours):.2f}x" if ours else "-"
            print(f"{mode:10} {fmt:16} {min(v):7.2f} {statistics.median(v):8.2f} {total / 2**30 / min(v):7.2f} {ratio:>12}  "
                  + " ".join(f"{x:.2f}" for x in v))
        # Each sluice variant against the best other loader, by best and by median load.
        peers = [v for f, v in ((f, rows.get((mode, f))) for f in formats) if v and not f.startswith("sluice")]
        for fmt in formats:
            v = rows.get((mode, fmt))
            if fmt.startswith("sluice") and v and peers:
                best = min(min(p) for p in peers) / min(v)
                med = min(statistics.median(p) for p in peers) / statistics.median(v)
                print(f"{mode:10} {fmt:16} vs the best other loader: {best:.2f}x by best load, {med:.2f}x by median")

if __name__ == "__main__":
    main()
