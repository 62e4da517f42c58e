"""sluice inside vLLM with two ranks over Gloo, at the loader layer (vLLM's own
initialize_model and parallel state, in two processes: ranks_worker.py).

- TP2 on the dense model: every parameter of every rank equals vLLM's default
  load bitwise, each byte is read from storage once across the ranks, and
  each rank keeps (and receives no more than) its TP parts: the blocks of
  rows or columns vLLM's parallel layers narrow, as an oracle of vLLM's
  layer kinds says (models.tp_share), found by each rank's dry run.
- TP2 with expert parallelism (EP = 2) on the MoE model: the same equality, and
  each rank keeps only its own experts' weights and its TP parts of the rest.
- Two more naming schemes at TP2 x EP2: GraniteMoE's fused 3-D experts (each
  rank keeps its experts' dim-0 rows) and LFM2-MoE's feed_forward.experts.N
  (its merged in_proj cut as three runs of rows, each rank its block of each).
- TP2 on a Phi-3 with grouped-query attention (fused qkv_proj and
  gate_up_proj in the checkpoint): each rank gets its block of every run of
  each fused tensor, q's run twice the size of k's and v's.
- Round-robin expert placement requested (EP = 2): on a DeepSeek-V3 with
  expert groups vLLM keeps it, and each rank gets the experts r, r + 2, ...;
  on the Qwen3-MoE vLLM's layers fall back to linear, and sluice follows the
  layers, not the config. Parameters equal vLLM's default load under the
  placement its layers use.
- TP1 x DP2 (vLLM's offline data parallelism: two engines, one world group)
  with EP2 on the Qwen3-MoE, GraniteMoE, LFM2-MoE and DeepSeek V4
  (`ffn.experts.E.w1`, vLLM's native class): each rank keeps its
  experts (GraniteMoE's fused rows) and everything else whole; then engine 0
  alone reloads through vLLM's reload_weights, within itself (the other never
  joins), to the parameters vLLM's own reload gives.
- The seed-shaped DeepSeek V4.1 (seed_v41.py: V4.1's names and its own loading code, the
  sort, the DP-shared Engram table, the finalization, the DSpark draft) at TP1 x DP2 x EP2 and
  in one process.
- A rank SIGKILLed as the dry runs' records are exchanged, or at its third
  tensor: the other fails within 10 s, naming it by sluice's and vLLM's ranks.
- PP2 on both models: the same equality, and each rank reads and receives only
  its stage's layers and the layer-less tensors its stage's model has (vLLM's
  Llama: the embeddings on the first stage, the final norm and lm_head on the
  last; its Qwen3-MoE all three on every stage), each byte read once.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
pytest.importorskip("vllm")

import models  # noqa: E402
from ranks_worker import free_port as _port  # noqa: E402


def _run(d, parallel, jobs):
    """Two ranks (TP[xPP] `parallel`) loading each MODEL:EP job: ([per-rank results], logs)."""
    port, procs, outs = _port(), [], []
    # VLLM_DIST_IDENT: the shared-memory group name vLLM's CPU communicator needs (its executor sets it).
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_DIST_IDENT=f"sluice-{port}")
    for rank in range(2):
        out = d / f"rank{rank}-{parallel}.json"
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "ranks_worker.py"), str(out), str(rank), "2",
                                       str(port), parallel, *jobs],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n" + logs[rank][-4000:]
    return [json.loads(o.read_text()) for o in outs], logs


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    return models.moe(str(d / "moe")), models.dense(str(d / "dense")), d


@pytest.fixture(scope="module")
def round_robin_paths(paths):
    """The DeepSeek-V3 (expert groups: vLLM keeps round-robin) and a second copy of the Qwen3-MoE (no
    groups: vLLM's layers fall back to linear), for the round-robin jobs of the same two ranks."""
    _, _, d = paths
    return models.deepseek(str(d / "deepseek")), models.moe(str(d / "moe-rr"))


@pytest.fixture(scope="module")
def mixtral_path(paths):
    """A Mixtral written by transformers: experts named block_sparse_moe.experts.N.w1, a scheme no
    name rule of sluice's knows (issue 41: every expert went to every rank)."""
    return models.mixtral(str(paths[2] / "mixtral"))


@pytest.fixture(scope="module")
def schemes(paths):
    """Two more naming schemes, written by transformers: GraniteMoE's fused 3-D experts and LFM2-MoE's
    feed_forward.experts.N (with its short-convolution layer)."""
    d = paths[2]
    return {"granitemoe": models.granitemoe(str(d / "granitemoe")), "lfm2_moe": models.lfm2_moe(str(d / "lfm2_moe")),
            "deepseek_v4": models.deepseek_v4(str(d / "deepseek_v4"))}


@pytest.fixture(scope="module")
def phi3_path(paths):
    """A Phi-3 written by transformers: fused qkv_proj and gate_up_proj."""
    return models.phi3(str(paths[2] / "phi3"))


@pytest.fixture(scope="module")
def two_ranks(paths, round_robin_paths, mixtral_path, schemes, phi3_path):
    """The models loaded by two ranks (TP2; the MoEs with expert parallelism, linear; the round-robin
    jobs with round-robin placement requested): ({model: per-rank results}, the ranks' logs, moe, dense)."""
    moe, dense, d = paths
    tp2 = [schemes["granitemoe"], schemes["lfm2_moe"]]
    jobs = [moe, dense, mixtral_path, phi3_path, *tp2]
    results, logs = _run(d, "2", [f"{moe}:1", f"{dense}:0", f"{mixtral_path}:1", f"{phi3_path}:0", *(f"{m}:1" for m in tp2),
                                  *(f"{m}:rr" for m in round_robin_paths)])
    return {m: [r[m] for r in results] for m in (*jobs, *round_robin_paths)}, logs, moe, dense


@pytest.fixture(scope="module")
def seed_path(paths):
    """The seed-shaped V4.1 checkpoint (seed_v41.py: V4.1's names, its loading code)."""
    import seed_v41
    return seed_v41.write(str(paths[2] / "seed_v41"))


@pytest.fixture(scope="module")
def two_engines(paths, schemes, seed_path):
    """TP1 x DP2 x EP2 (two DP engines of one rank each): the MoE, GraniteMoE (engine 0 reloads it
    alone afterwards), LFM2-MoE, DeepSeek V4, and the seed-shaped V4.1 with its DSpark draft (a
    second load of the same checkpoint): ({model: per-rank results}, logs)."""
    moe, _, d = paths
    jobs = [moe, schemes["granitemoe"], schemes["lfm2_moe"], schemes["deepseek_v4"], seed_path, seed_path + "#draft"]
    results, logs = _run(d, "1", [f"{moe}:1+reload", f"{schemes['granitemoe']}:1+reload", f"{schemes['lfm2_moe']}:1",
                                  f"{schemes['deepseek_v4']}:1", f"{seed_path}:1", f"{seed_path}:1+draft"])
    return {m: [r[m] for r in results] for m in jobs}, logs


@pytest.fixture(scope="module")
def two_stages(paths):
    """Both models loaded by two PP stages (TP1 x PP2): ({model: per-rank results}, logs)."""
    moe, dense, d = paths
    results, logs = _run(d, "1x2", [f"{moe}:0", f"{dense}:0"])  # the MoE first: vLLM's EP group
    return {m: [r[m] for r in results] for m in (moe, dense)}, logs


def _run_one(d, jobs):
    """One rank alone (world 1: sluice's one-process load) on each job."""
    port = _port()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_DIST_IDENT=f"sluice-{port}")
    out = d / "one.json"
    p = subprocess.run([sys.executable, os.path.join(HERE, "ranks_worker.py"), str(out), "0", "1", str(port), "1", *jobs],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:]
    return json.loads(out.read_text()), p.stdout


def _check_shares(ranks, path, share_of, read=None):
    """Each rank keeps exactly its share (the oracle's), receives only bytes
    of it, its parameters equal vLLM's own load; each byte is read once
    (`read`: the bytes read across the ranks, default the checkpoint's)."""
    total = models.tensor_bytes(path)
    for rank, r in enumerate(ranks):
        assert r["sluice"] == r["safetensors"], f"rank {rank}: parameters differ from vLLM's own load"
        st, share = r["stats"], share_of(rank)
        assert 0 < share < total
        assert st["bytes_kept"] == share, (rank, st["bytes_kept"], share)
        assert st["bytes_received"] <= share, rank
        # One node, local files: what it keeps and did not read it takes from the page cache; nothing
        # of the checkpoint crosses a socket between the ranks.
        assert st["bytes_received"] == 0, rank
        assert st["bytes_read"] + st["page_cache_bytes"] >= share, rank
        # What went around load_weights: every byte it keeps, but whole tensors vLLM converts
        assert st["direct_bytes"] + st["whole_fallback_bytes"] == share, rank
    assert sum(r["stats"]["bytes_read"] for r in ranks) == (total if read is None else read)


def test_tp2_dense_every_parameter_equals_vllms_load_and_each_rank_gets_only_its_parts(two_ranks):
    by_model, logs, _, path = two_ranks
    _check_shares(by_model[path], path, lambda rank: models.tp_share(path, 2))
    assert sum(r["stats"]["bytes_received"] for r in by_model[path]) < models.tensor_bytes(path) / 2
    assert any("sluice:" in log and "rank 1 of 2" in log for log in logs)


def test_ep2_moe_each_rank_reads_and_receives_only_its_own_experts(two_ranks):
    by_model, _, path, _ = two_ranks
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    _check_shares(by_model[path], path, lambda rank: models.tp_share(path, 2, compute_local_expert_ids(4, 2, rank)))
    # One Gloo world per load: the stream ran over the world the collective open joined.
    assert all(r["stats"]["reused_open_world"] is True for r in by_model[path])


def test_ep2_mixtral_each_rank_gets_only_its_own_experts_whatever_their_names(two_ranks, mixtral_path):
    """Ownership from each rank's own model (its dry run, exchanged), not from names: a Mixtral's
    block_sparse_moe.experts.N go only to the EP rank whose layers hold N, and the attention's TP
    parts only to their TP rank; the bytes each rank keeps equal an oracle made with vLLM's own
    parse_expert_id and compute_local_expert_ids and its layer kinds (before: every expert and
    whole tensors to every rank), each byte read once, every parameter bitwise vLLM's."""
    by_model = two_ranks[0]
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    _check_shares(by_model[mixtral_path], mixtral_path,
                  lambda rank: models.tp_share(mixtral_path, 2, compute_local_expert_ids(4, 2, rank)))


def test_ep2_fused_experts_each_rank_gets_its_dim0_blocks(two_ranks, schemes):
    """GraniteMoE keeps each layer's experts in two 3-D tensors: no name says which expert is
    whose. Each EP rank's model copies its experts' dim-0 rows; the plan cuts the tensors there, so
    a rank keeps its experts' rows, its attention's TP parts and the rest whole (the oracle)."""
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    path = schemes["granitemoe"]
    _check_shares(two_ranks[0][path], path, lambda rank: models.tp_share(path, 2, compute_local_expert_ids(4, 2, rank)))


def test_ep2_lfm2_moe_feed_forward_experts_go_to_their_owners(two_ranks, schemes):
    """LFM2-MoE names its experts feed_forward.experts.N. Its short convolution's in_proj is one
    checkpoint tensor that vLLM's merged column-parallel layer narrows into three row blocks per
    TP rank (B, C, x): the plan cuts it as three runs of rows, each rank getting its block of
    every run, packed (before: it arrived whole on both ranks)."""
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    path = schemes["lfm2_moe"]
    _check_shares(two_ranks[0][path], path, lambda rank: models.tp_share(path, 2, compute_local_expert_ids(4, 2, rank)))


def test_tp2_phi3_fused_qkv_and_gate_up_each_rank_gets_its_block_of_every_run(two_ranks, phi3_path):
    """Phi-3 as transformers writes it keeps QKV and gate/up fused in one tensor each; vLLM's
    merged layers narrow q, k and v (gate and up) separately: each rank's copies are one block of
    each run, and with grouped-query attention q's run is twice k's and v's (runs of unequal
    size). Each rank keeps (and receives no more than) half of each fused tensor, no name saying
    so, and every parameter equals vLLM's own load."""
    _check_shares(two_ranks[0][phi3_path], phi3_path, lambda rank: models.tp_share(phi3_path, 2))


@pytest.mark.parametrize("model", ["moe", "granitemoe", "lfm2_moe", "deepseek_v4"])
def test_dp2_ep2_each_engine_keeps_its_experts_and_the_rest_whole(paths, schemes, two_engines, model):
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    path = paths[0] if model == "moe" else schemes[model]
    _check_shares(two_engines[0][path], path, lambda rank: models.tp_share(path, 1, compute_local_expert_ids(4, 2, rank)))


def test_seed_shaped_v41_dp2_ep2_experts_to_owners_the_table_once_parameters_bitwise(seed_path, two_engines):
    """The seed's deployment at TP1 x DP2 x EP2 on this CPU, through V4.1's own loading code: the
    VL wrapper sorts the whole stream, the DP-shared Engram table is written by the group's leader
    with a barrier per call on every rank, load_weights finalizes at its end (after a dry run that
    finalized first, on empty parameters). Each rank keeps exactly the oracle's share: its experts,
    the table on the leader only (the other rank's engine reads it through the one /dev/shm copy,
    bitwise vLLM's); the draft's tensors are not read for the main model; every parameter and the
    finalization's output equal vLLM's own load; each byte is read once. Memory stays within
    staging + 2 windows + what went through load_weights (printed)."""
    import seed_v41
    ranks = two_engines[0][seed_path]
    _check_shares(ranks, seed_path, lambda rank: seed_v41.share(seed_path, rank, draft=False),
                  read=models.tensor_bytes(seed_path, skip=lambda n: n.startswith("mtp.")))
    for rank, r in enumerate(ranks):
        assert "layers.0.hc_attn_fn_broadcast" in r["sluice"], rank   # the finalization's output is compared too
    table = models.tensor_bytes(seed_path, skip=lambda n: ".engram.embed." not in n)
    # What one rank alone takes it reads itself, straight into its parameters: the table on the
    # leader, each rank's experts (never in an exchange window).
    assert ranks[0]["stats"]["local_bytes"] >= table
    assert ranks[1]["stats"]["local_bytes"] > 0
    # The node's host memory for the table: the leader's one shared copy, nothing on the other rank.
    assert ranks[0]["memory"]["sluice"]["shmem_bytes"] >= table
    assert ranks[1]["memory"]["sluice"]["shmem_bytes"] < table
    staging = 8 << 20
    for rank, r in enumerate(ranks):
        st, peak = r["stats"], r["memory"]["sluice"]["peak_anon_bytes"]
        windows = 2 * min(256 << 20, st["bytes_received"] + st["page_cache_bytes"] + st["bytes_read"])
        bound = staging + windows + st["whole_fallback_bytes"]
        print(f"rank {rank}: peak anonymous memory above the load's start {peak} bytes <= staging {staging} + "
              f"2 windows {windows} + through load_weights {st['whole_fallback_bytes']} = {bound}")
        assert peak <= bound, rank


def test_seed_shaped_v41_draft_reads_only_the_drafts_bytes(seed_path, two_engines):
    """The DSpark draft, a second load of the same checkpoint through V4.1's draft loader: only the
    mtp.* tensors are read (spread over three shards among the main model's), each rank keeps its
    draft experts and the rest of the draft whole, parameters bitwise vLLM's."""
    import seed_v41
    assert seed_v41.draft_names(seed_path)
    ranks = two_engines[0][seed_path + "#draft"]
    _check_shares(ranks, seed_path, lambda rank: seed_v41.share(seed_path, rank, draft=True),
                  read=models.tensor_bytes(seed_path, skip=lambda n: not n.startswith("mtp.")))


def test_seed_shaped_v41_one_process_finalizes_after_the_bytes_and_skips_the_draft(paths, seed_path):
    """One process: every tensor of the main model goes straight into its parameter, and
    load_weights still runs for real afterwards (over stand-ins), so the finalization the dry run
    did first, on empty parameters, is redone on the loaded bytes; the draft's mtp.* tensors, which
    the model takes nowhere, are not read."""
    import seed_v41
    out, log = _run_one(paths[2], [f"{seed_path}:0"])
    r = out[seed_path]
    assert r["sluice"] == r["safetensors"]
    assert "layers.0.hc_attn_fn_broadcast" in r["sluice"]
    draft = seed_v41.draft_names(seed_path)
    assert r["stats"]["ignored_tensors"] == len(draft)
    assert r["stats"]["bytes_read"] == models.tensor_bytes(seed_path, skip=lambda n: n in draft)
    assert r["stats"]["streamed_tensors"] == 0


def test_reloading_one_dp_engine_alone_loads_within_it_and_never_waits_for_the_other(schemes, two_engines):
    """vLLM's reload_weights on engine 0 while engine 1 serves (here: has finished): the reload spans
    engine 0's own ranks (one, so this process alone), not the world group of the first load, and
    ends with the parameters vLLM's own reload gives (vLLM's CPU MoE does not give back the first
    load's expert layout on a reload, with its own loader or sluice's)."""
    by_model, logs = two_engines
    path = schemes["granitemoe"]
    reload = by_model[path][0]["reload"]
    assert reload["sluice"]["digests"] == reload["safetensors"]["digests"]
    loads = [x for x in logs[0].splitlines() if f"sluice: {path}" in x and " tensors," in x]
    assert len(loads) == 2, loads   # the first load, then the reload
    assert "rank 0 of 2 in sluice's order" in loads[0]
    assert "in sluice's order" not in loads[1], loads[1]   # a one-process load: no world, no rendezvous
    assert "reload" not in by_model[path][1]


def test_an_engines_own_reload_reads_only_what_its_model_took(paths, two_engines):
    """Engine 0 reloading alone (one process: no rendezvous, no dry run, since vLLM's layerwise
    reload consumes the stream inside load_weights) reads what its model took in the first load,
    its own experts and everything else whole, and passes the other engine's experts as
    stand-ins: the bytes read are its share (the oracle's), and the parameters vLLM's own reload's."""
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    moe = paths[0]
    reload = two_engines[0][moe][0]["reload"]
    assert reload["sluice"]["digests"] == reload["safetensors"]["digests"]
    share = models.tp_share(moe, 1, compute_local_expert_ids(4, 2, 0))
    assert share < models.tensor_bytes(moe)
    assert reload["sluice"]["stats"]["bytes_read"] == share


@pytest.mark.parametrize("model, placement", [("deepseek", "round_robin"), ("moe-rr", "linear")])
def test_round_robin_ep2_each_rank_reads_and_receives_only_the_experts_its_layers_hold(two_ranks, round_robin_paths,
                                                                                      model, placement):
    """Round-robin requested: sluice follows the placement vLLM's MoE layers were built with (round-robin
    where the model has expert groups, linear where vLLM falls back), and each rank gets exactly those
    experts, with every parameter equal to vLLM's default load under that placement."""
    by_model = two_ranks[0]
    path = dict(zip(("deepseek", "moe-rr"), round_robin_paths))[model]
    ranks = by_model[path]
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids
    for rank, r in enumerate(ranks):
        assert r["placement"] == placement, rank
    _check_shares(ranks, path, lambda rank: models.tp_share(path, 2, compute_local_expert_ids(4, 2, rank, placement=placement)))


def test_pp2_each_stage_reads_and_receives_only_its_layers_and_vllm_loads_them_bitwise(paths, two_stages):
    import re
    moe, dense, _ = paths
    by_model, logs = two_stages
    layer = re.compile(r"\.layers\.(\d+)\.")
    for path in (moe, dense):
        ranks = by_model[path]
        assert [r["stage"] for r in ranks] == [0, 1]
        for rank, r in enumerate(ranks):
            assert r["sluice"] == r["safetensors"], f"rank {rank}: parameters differ from vLLM's own load"
        total = models.tensor_bytes(path)
        assert sum(r["stats"]["bytes_read"] for r in ranks) == total  # each byte read once
        for stage, r in enumerate(ranks):  # 2 layers: layer k is stage k's
            def other(n):
                m = layer.search(n)
                if m:
                    return int(m.group(1)) != stage
                if path == moe:
                    return False  # vLLM's Qwen3-MoE has embed_tokens, norm and lm_head on every stage
                return ("embed_tokens" in n) != (stage == 0)  # Llama: embeddings first, norm and lm_head last
            mine = total - models.tensor_bytes(path, skip=lambda n: not other(n))
            assert 0 < mine < total
            st = r["stats"]
            assert st["bytes_read"] + st["bytes_received"] + st["page_cache_bytes"] == mine, (path, stage)
            assert st["bytes_received"] == 0, (path, stage)  # one node: taken from the page cache
            assert r["stats"]["bytes_kept"] == mine, (path, stage)
    # the stages came from each stage's own model, not from a PP name rule
    assert all("the models' dry runs" in log for log in logs)


@pytest.mark.parametrize("model", ["moe", "seed"])
def test_a_dry_run_that_raises_on_one_rank_fails_every_rank_naming_it(paths, seed_path, model):
    """Rank 1's model cannot be dry-run (its load_weights reads a value): no rank knows what its
    model takes, so every rank fails before reading a byte, naming rank 1 by both numberings. On
    the seed-shaped model (TP1 x DP2) rank 0's dry run is then blocked in the Engram table's
    barrier, which rank 1's never reaches: rank 1 fails after the 'timeout' key (5 s here), naming
    rank 0 as still in its dry run, and rank 0's barrier fails as rank 1 leaves; the store tells it
    why."""
    moe, _, d = paths
    path, parallel, vllm_rank = (moe, "2", "dp 0, pp 0, tp 1") if model == "moe" else (seed_path, "1", "dp 1, pp 0, tp 0")
    port = _port()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_DIST_IDENT=f"sluice-{port}",
               SLUICE_TEST_EXTRA='{"staging": "8MiB", "max_read": "256KiB", "timeout": 5}')
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ranks_worker.py"), str(d / f"dry{rank}.json"),
                               str(rank), "2", str(port), parallel, f"{path}:1"],
                              env=dict(env, SLUICE_TEST_VLLM_FAULT="dry-raise") if rank == 1 else env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for rank, p in enumerate(procs):
        assert p.returncode not in (0, None), rank
        assert "the dry run of load_weights failed on" in logs[rank], logs[rank][-3000:]
        assert f"rank 1 (vLLM {vllm_rank}): ValueError: this loader reads a value of the tensor" in logs[rank]
        assert f"sluice: {path} (rank" not in logs[rank]   # no load began
    if model == "seed":
        assert "rank(s) 0 have not finished theirs after 5 s" in logs[1]


@pytest.mark.parametrize("when", ["exchange", "tensor:3"])
def test_a_rank_killed_during_the_load_fails_the_other_within_10_s_naming_it(paths, when):
    moe, _, d = paths
    port = _port()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_DIST_IDENT=f"sluice-{port}")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ranks_worker.py"), str(d / f"killed{rank}.json"),
                               str(rank), "2", str(port), "2", f"{moe}:1"],
                              env=dict(env, SLUICE_TEST_VLLM_FAULT=when) if rank == 1 else env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        procs[1].communicate(timeout=600)
        assert procs[1].returncode == -9, "rank 1 was to SIGKILL itself"
        try:
            log = procs[0].communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still runs 10 s after rank 1 died ({when})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[0].returncode not in (0, None)
    assert "gone: rank 1 (vLLM dp 0, pp 0, tp 1; pid" in log, log[-3000:]
