"""bench/vllm_ranks.py: what each of two vLLM ranks reads and receives through
--load-format sluice, against its share, and the time of the two-rank load
against vLLM's own safetensors loader, at vLLM's loader layer (vLLM's own
initialize_model and parallel state over Gloo, one process per rank:
python/tests/vllm/ranks_worker.py, the workers the tests use).

    PYTHONPATH=build/py/lib/python3.11/site-packages .venv/bin/python bench/vllm_ranks.py \\
        [--dir .samples/vllm-ranks] [--models mixtral,dense] [--package DIR] [--repeat 3] [--extra JSON]

Models (random, kept in --dir): written by transformers' save_pretrained,
"mixtral" (block_sparse_moe.experts.N, 8 experts, about 0.6 GiB) at TP2 with
expert parallelism (EP2), "granitemoe" (8 experts fused in two 3-D tensors
per layer, about 0.4 GiB) at TP2 x EP2, and "dense" (a Llama, about 0.5 GiB)
at TP2; and "seed" (python/tests/vllm/seed_v41.py: DeepSeek V4.1's names and
its own loading code, a DP-shared Engram table of 264 MiB, about 0.6 GiB) at
TP1 x DP2 x EP2, with the host memory each rank's load added (peak anonymous
memory above its start, and the shared memory it touched) against the table.

A rank's share is what vLLM's layers keep of the checkpoint on it, from an
oracle of vLLM's layer kinds and its compute_local_expert_ids
(python/tests/vllm/models.py, tp_share): a column-parallel weight's rows, a
row-parallel one's columns, the rank's own experts, everything else whole.
`kept` is sluice's bytes_kept (what it delivered to the rank; absent before
it existed), `read + received` the bytes that reached the rank from storage
and Gloo (a reader of a row-parallel weight reads whole rows and sends the
other part: its read includes bytes it does not keep).

--package DIR runs another sluice Python package (a tree with sluice/ and its
extension) in place of the one on PYTHONPATH: the "before" rows of
bench/README.md ran main at d0796fb's python/sluice with this tree's extension.
The load times are each format's load_weights inside vLLM's load_model, the
first load of each process (safetensors first), page cache hot, best of
--repeat pairs of processes (the bytes are the same in every run: checked).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "python", "tests", "vllm")
sys.path.insert(0, TESTS)

import models  # noqa: E402  (python/tests/vllm/models.py)
from ranks_worker import free_port as _port  # noqa: E402

SHAPES = {  # model -> (maker's sizes, TP ("1" with 2 ranks: DP2), EP on, experts)
    "mixtral": (dict(hidden_size=1024, intermediate_size=1536, num_hidden_layers=4, num_local_experts=8,
                     num_attention_heads=16, num_key_value_heads=8, vocab_size=8192, shard="200MB"), 2, True, 8),
    "granitemoe": (dict(hidden_size=1024, intermediate_size=1536, num_hidden_layers=4, num_local_experts=8,
                        num_attention_heads=16, num_key_value_heads=8, vocab_size=8192, shard="200MB"), 2, True, 8),
    "dense": (dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=16,
                   num_key_value_heads=8, vocab_size=8192, shard="200MB"), 2, False, 0),
    "seed": (dict(hidden_size=1024, moe_intermediate_size=1536, n_routed_experts=8, num_hidden_layers=4,
                  vocab_size=8192, engram_rows=262144, engram_dim=1024), 1, True, 8),
}


def make(d, name):
    path = os.path.join(d, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        sizes = dict(SHAPES[name][0])
        if name == "seed":
            import seed_v41
            seed_v41.write(path, **sizes)
        else:
            getattr(models, name)(path, **sizes)
    return path


def share(name, path, rank):
    _, tp, ep, experts = SHAPES[name]
    if name == "seed":
        import seed_v41
        return seed_v41.share(path, rank, draft=False)
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    return models.tp_share(path, tp, compute_local_expert_ids(experts, 2, rank) if ep else None)


def run(path, tp, ep, package, out_dir, extra):
    port = _port()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_DIST_IDENT=f"bench-{port}",
               SLUICE_TEST_EXTRA=extra)   # default: sluice's defaults (the tests' workers shrink staging)
    if package:
        env["PYTHONPATH"] = os.pathsep.join([package, env.get("PYTHONPATH", "")])
    procs, outs = [], []
    for rank in range(2):
        out = os.path.join(out_dir, f"rank{rank}.json")
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, os.path.join(TESTS, "ranks_worker.py"), out, str(rank), "2",
                                       str(port), str(tp), f"{path}:{1 if ep else 0}"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate()[0] for p in procs]
    for rank, p in enumerate(procs):
        if p.returncode != 0:
            sys.exit(f"rank {rank} exited with {p.returncode}:\n{logs[rank][-3000:]}")
    return [json.load(open(o))[path] for o in outs]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join(ROOT, ".samples", "vllm-ranks"))
    ap.add_argument("--models", default="mixtral,dense")
    ap.add_argument("--package", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--extra", default="{}", help="sluice's extra config, JSON (default: its defaults)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    print(f"# {' '.join(sys.argv)}")
    print("model     shape      rank  share MiB  kept MiB  read MiB  received MiB  page cache MiB  (read+received+page cache)/share  "
          "sluice s  safetensors s  params equal")
    for name in a.models.split(","):
        path = make(a.dir, name)
        _, tp, ep, experts = SHAPES[name]
        runs = [run(path, tp, ep, a.package, a.dir, a.extra) for _ in range(a.repeat)]
        ranks = runs[0]
        for again in runs[1:]:
            for r, r2 in zip(ranks, again):
                assert {k: r["stats"][k] for k in ("bytes_read", "bytes_received", "page_cache_bytes")} == \
                    {k: r2["stats"][k] for k in ("bytes_read", "bytes_received", "page_cache_bytes")}, "the bytes differ between runs"
                for fmt in ("sluice", "safetensors"):
                    r["seconds"][fmt] = min(r["seconds"][fmt], r2["seconds"][fmt])
        total = models.tensor_bytes(path)
        shape = ("TP2" if tp == 2 else "TP1xDP2") + ("xEP2" if ep else "")
        for rank, r in enumerate(ranks):
            mine = share(name, path, rank)
            st = r["stats"]
            got = st["bytes_read"] + st["bytes_received"] + st.get("page_cache_bytes", 0)
            kept = st.get("bytes_kept")
            print(f"{name:9} {shape:10} {rank:4}  {mine / 2**20:9.1f}  "
                  f"{kept / 2**20 if kept is not None else float('nan'):8.1f}  {st['bytes_read'] / 2**20:8.1f}  "
                  f"{st['bytes_received'] / 2**20:12.1f}  {st.get('page_cache_bytes', 0) / 2**20:14.1f}  {got / mine:32.2f}  {r['seconds']['sluice']:8.2f}  "
                  f"{r['seconds']['safetensors']:13.2f}  {r['sluice'] == r['safetensors']}")
        print(f"{name:9} checkpoint {total / 2**20:.1f} MiB; read across the ranks "
              f"{sum(r['stats']['bytes_read'] for r in ranks) / 2**20:.1f} MiB")
        if name == "seed" and "memory" in ranks[0]:
            table = models.tensor_bytes(path, skip=lambda n: ".engram.embed." not in n)
            for fmt in ("sluice", "safetensors"):
                m = [r["memory"][fmt] for r in ranks]
                anon = " + ".join(f"{x['peak_anon_bytes'] / 2**20:.1f}" for x in m)
                shared = " + ".join(f"{x['shmem_bytes'] / 2**20:.1f}" for x in m)
                print(f"{name:9} {fmt:11} host memory the load added: peak anonymous {anon} MiB, shared {shared} MiB; "
                      f"the Engram table {table / 2**20:.1f} MiB (first run)")


if __name__ == "__main__":
    main()
