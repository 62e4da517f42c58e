"""8 ranks started with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) meet through a torch TCPStore.

Debian's torch 1.13 `torch.distributed.run` fails on Python 3.11 before it
starts a worker, so the test starts the processes itself with that environment.
"""
import json
import os
import re
import subprocess
import time

import pytest

from conftest import HERE, PYTHON, free_port, generate, run_ranks as _run_ranks

WORLD = 8


def run_ranks(out_dir, path, digests_path, topology, offload, fail_rank=None):
    args = [PYTHON, os.path.join(HERE, "dist_worker.py"), path, digests_path, str(out_dir), topology, offload]
    if fail_rank is not None:
        args.append(str(fail_rank))
    return _run_ranks(WORLD, args, out_dir, env={"SLUICE_COMM_TIMEOUT_MS": "300000"})


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist") / "ck"
    digests = generate(d, "--size", "16MiB", "--experts", "16")
    return str(d), str(d) + ".digests", digests


def test_8_ranks_tp1_dp8_ep8_shared_cooperative(ck, tmp_path):
    path, digests_path, digests = ck
    res = run_ranks(tmp_path, path, digests_path, "tp1,dp8,ep8", "shared-cooperative")
    for r in res:
        assert "error" not in r, r.get("error")
        assert not r["wrong"], (r["rank"], r["wrong"][:5])
    # A Recorder around a loader that cannot decline records what the rank was
    # sent (bytes, shared views), never another rank's placeholder.
    for r in res:
        assert r["recorded"] == sorted(n for n, k in r["kinds"].items() if k[0] != "placeholder"), r["rank"]
    # Every rank's loader sees the same call sequence: every tensor, once, in the same order.
    assert all(r["calls"] == res[0]["calls"] for r in res)
    assert sorted(res[0]["calls"]) == sorted(digests)
    expert = re.compile(r"\.mlp\.experts\.(\d+)\.")
    for name in digests:
        kinds = [r["kinds"][name][0] for r in res]
        if expert.search(name):  # a routed expert: one owner (EP 8), placeholders elsewhere
            assert kinds.count("bytes") == 1 and kinds.count("placeholder") == WORLD - 1, (name, kinds)
            assert all(r["kinds"][name][1] == ("cpu" if k == "bytes" else "meta") for r, k in zip(res, kinds))
        elif ".engram." in name and (name.endswith(".table") or name.endswith(".scale")):
            assert kinds == ["shared"] * WORLD, (name, kinds)  # CPU views of the node's one copy
        else:
            assert kinds == ["bytes"] * WORLD, (name, kinds)  # replicated: every DP rank owns it
    shared = [n for n in digests if res[0]["kinds"][n][0] == "shared"]
    assert shared
    # Each byte is read from storage once, by one rank.
    total = sum(r["stats"]["bytes_read"] for r in res)
    assert total == res[0]["stats"]["tensor_bytes"]
    assert sum(r["stats"]["owned"] for r in res) > 0 and all(r["stats"]["world_size"] == WORLD for r in res)
    # One node, local files: what a rank keeps and did not read it takes from the page cache, and
    # nothing crosses a socket. (Its tensors are below map_cached's 1 MiB: none comes as a view.)
    for r in res:
        assert r["stats"]["bytes_received"] == 0 and r["stats"]["bytes_sent"] == 0, r["rank"]
        assert r["stats"]["page_cache_bytes"] > 0, r["rank"]


def test_8_ranks_tp2_dp4_get_their_parts_of_split_tensors(ck, tmp_path):
    import sluice
    from conftest import sha256
    path, digests_path, digests = ck
    res = run_ranks(tmp_path, path, digests_path, "tp2,dp4,ep8", "per-rank")
    for r in res:
        assert "error" not in r, r.get("error")
        assert not r["wrong"], (r["rank"], r["wrong"][:5])
    assert all(r["calls"] == res[0]["calls"] for r in res)
    whole = {}
    for name, t in sluice.iter_weights(path):
        whole[name] = t
    checked = 0
    for r in res:
        for name, (part, digest) in r["parts"].items():
            dim, index, count = part
            assert count == 2
            assert sha256(whole[name].chunk(count, dim)[index]) == digest, (r["rank"], name, part)
            checked += 1
    assert checked > 0
    # the two TP ranks of a pair hold the two different parts
    assert any(p[0][1] == 1 for r in res for p in r["parts"].values())


def test_a_rank_that_raises_makes_every_rank_raise_naming_it(ck, tmp_path):
    path, digests_path, _ = ck
    res = run_ranks(tmp_path, path, digests_path, "tp1,dp8,ep8", "none", fail_rank=3)
    for r in res:
        assert "error" in r, f"rank {r['rank']} did not raise"
        kind, message, failed = r["error"]
        if r["rank"] == 3:
            assert kind == "ValueError" and "boom on rank 3" in message
        else:
            assert kind == "DistributedError", (r["rank"], kind, message)
            assert failed == 3 and "rank 3" in message and "boom on rank 3" in message


CTRL_C_RANK = r"""
import os, sys, time
import sluice
path, ready = sys.argv[1:3]
n = 0
try:
    with sluice.iter_weights(path, topology="tp1,dp4,ep4", offload="shared-cooperative", staging="64MiB",
                             timeout=300) as it:
        for name, t in it:
            n += 1
            if n == 3:
                open(ready, "w").close()
            time.sleep(0.02)  # a slow consumer: the load outlasts the test's Ctrl-C
    print("completed", n)
except KeyboardInterrupt:
    print("interrupted", n)
except sluice.DistributedError as e:  # a peer's interrupt reached this rank first
    print("peer-interrupted", n, "KeyboardInterrupt" in str(e))
"""


def test_ctrl_c_at_the_terminal_stops_every_rank(ck, tmp_path):
    """Ctrl-C at a terminal reaches every process of the foreground group: each
    rank raises (KeyboardInterrupt, or the DistributedError naming a peer's),
    none completes, and every process exits."""
    import signal
    import time
    path, _, digests = ck
    world, port = 4, free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLUICE_COMM_TIMEOUT_MS="300000")
        procs.append(subprocess.Popen([PYTHON, "-c", CTRL_C_RANK, path, str(tmp_path / f"ready-{r}")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 600  # a guard against a hang, not a speed limit
    while not all((tmp_path / f"ready-{r}").exists() for r in range(world)):
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGINT)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, (r, out)
        word, n, *rest = out.split("\n")[-2].split()
        assert word in ("interrupted", "peer-interrupted"), (r, out)
        assert int(n) < len(digests), (r, out)
        assert rest in ([], ["True"]), (r, out)
    assert any(o.split("\n")[-2].startswith("interrupted") for o in outs)


def test_rank_0_killed_during_the_exchange_fails_every_survivor_naming_it(ck, tmp_path):
    """torchrun-shaped, 4 ranks: rank 0, which serves the TCPStore, raises
    SIGKILL on itself once its first exchange's messages are posted (the test
    fault hook, SLUICE_TEST_FAULT). Every survivor raises PeerLostError naming
    rank 0 within a quarter of the communicator's timeout (a bound derived from
    the timeout: a hang would take all of it), although the store died too."""
    path, digests_path, _ = ck
    timeout = 300
    port = free_port()
    procs = []
    # The hook is no part of the package: the ranks preload the tests' own
    # (tests/support/fault_hook.cpp), as ctest's environment names it.
    preload = os.environ.get("SLUICE_TEST_FAULT_PRELOAD")
    assert preload, "SLUICE_TEST_FAULT_PRELOAD is not set (run through ctest: tests/python/CMakeLists.txt)"
    t0 = time.monotonic()
    for r in range(4):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="4", LOCAL_WORLD_SIZE="4",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLUICE_COMM_TIMEOUT_MS=str(timeout * 1000),
                   SLUICE_TEST_FAULT="exchange:0:KILL", LD_PRELOAD=preload)
        args = [PYTHON, os.path.join(HERE, "dist_worker.py"), path, digests_path, str(tmp_path), "tp1,dp4,ep4",
                "shared-cooperative"]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs, took = [], []
    for p in procs:
        outs.append(p.communicate(timeout=900)[0])
        took.append(time.monotonic() - t0)
    assert procs[0].returncode == -9, outs[0]
    for r in (1, 2, 3):
        f = tmp_path / f"rank-{r}.json"
        assert f.exists(), f"rank {r} wrote no result (exit {procs[r].returncode}):\n{outs[r]}"
        kind, message, _ = json.loads(f.read_text())["error"]
        assert kind == "PeerLostError", (r, kind, message)
        assert "peer rank 0 lost" in message, (r, message)
        assert took[r] < timeout / 4, (r, took[r], message)


def test_a_world_across_nodes_advertises_an_address_the_other_nodes_reach(monkeypatch):
    """Issue 40: with more ranks than on this node and no SLUICE_GLOO_HOST, the
    address a rank advertises is the local end of its route toward the store's
    host (127.0.0.1 would send the other nodes to themselves); within one node
    nothing is set (127.0.0.1 is right there)."""
    from sluice import _distributed, _sluice
    monkeypatch.delenv("SLUICE_GLOO_HOST", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    o = _sluice.StreamOptions()
    o.world_size, o.local_size = 4, 2
    _distributed._set_host(o)
    addr = _distributed.node_address()
    assert o.host == addr
    assert not addr.startswith("127."), addr   # this machine's own address, or "" (then the C++ side refuses)
    one = _sluice.StreamOptions()
    one.world_size, one.local_size = 4, 4
    _distributed._set_host(one)
    assert one.host == ""
    monkeypatch.setenv("SLUICE_GLOO_HOST", "10.1.2.3")   # an explicit address wins, and is not overwritten
    o2 = _sluice.StreamOptions()
    o2.world_size, o2.local_size = 4, 2
    _distributed._set_host(o2)
    assert o2.host == ""


def test_a_node_is_what_the_kernel_says_not_the_host_name():
    """Issue 42: a rank's node is never inferred from host names. node_key()
    is the kernel's boot id and network namespace (sluice's node memory goes
    over an abstract Unix socket, which lives in one): a process in another
    network namespace has the same host name and is another node; one in
    this namespace is this node. local_of() groups contiguous ranks alike,
    else every rank is its own node."""
    import shutil
    import socket
    import subprocess
    import sys
    from sluice import _distributed
    probe = [sys.executable, "-c",
             "import socket; from sluice._distributed import node_key; print(node_key(), socket.gethostname())"]
    env = dict(os.environ)
    same = subprocess.run(probe, capture_output=True, text=True, env=env, check=True).stdout.split()
    assert same == [_distributed.node_key(), socket.gethostname()]
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("another network namespace needs root and unshare(1)")
    other = subprocess.run(["unshare", "--net"] + probe, capture_output=True, text=True, env=env)
    if other.returncode != 0:
        pytest.skip(f"unshare --net failed here: {other.stderr.strip()}")
    key, host = other.stdout.split()
    assert host == socket.gethostname()          # the same host name...
    assert key != _distributed.node_key()        # ...and another node
    assert key.split("/")[0] == _distributed.node_key().split("/")[0]  # on the same kernel
    # Grouping: contiguous nodes alike, else every rank alone.
    assert [_distributed.local_of(["a", "a", "b", "b"], r) for r in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [_distributed.local_of(["a", "b", "a", "b"], r) for r in range(4)] == [(0, 1)] * 4
    assert [_distributed.local_of(["a", "a", "a", "b"], r) for r in range(4)] == [(0, 1)] * 4
    assert _distributed.local_of(["a"] * 3, 2) == (2, 3)
