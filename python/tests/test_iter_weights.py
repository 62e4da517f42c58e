"""iter_weights: exact bytes through torch, zero-copy leases, bounded memory, errors, Ctrl-C."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sluice

from conftest import PYTHON, sha256, tool

MiB = 1 << 20


def test_every_tensor_through_torch_equals_the_generators_digest_with_its_dtype_and_shape(small):
    path, digests = small
    seen = []
    it = sluice.iter_weights(path, staging="16MiB", max_read="1MiB")
    for name, t in it:
        dtype, shape, digest = digests[name]
        assert t.device.type == "cpu"
        assert t.dtype == sluice.as_torch_dtype(dtype, shape), name
        assert list(t.shape) == sluice.arrival_shape(dtype, shape), name
        assert sha256(t) == digest, name
        if dtype == "F8_E4M3":
            assert t.dtype == torch.float8_e4m3fn and not hasattr(t, "sluice_dtype")
        seen.append(name)
    assert sorted(seen) == sorted(digests)
    dtypes = {digests[n][0] for n in seen}
    assert {"BF16", "F32", "F8_E4M3", "BOOL", "I64"} <= dtypes
    assert it.stats["tensors"] == len(digests)


def test_the_extension_hands_out_read_only_typed_items_that_name_each_tensor(small):
    path, digests = small
    from sluice import _sluice
    from sluice._torch import tensor_from
    s = _sluice.Stream(sluice.open(path)._core, _sluice.StreamOptions())
    s.start()
    seen = []
    while (item := s.next()) is not None:
        assert isinstance(item, _sluice.TensorItem)
        dtype, shape, digest = digests[item.name]
        assert (item.dtype, item.shape, item.part, item.source_name) == (dtype, shape, None, item.name)
        assert item.kind in ("bytes", "placed") and type(item.capsule).__name__ == "PyCapsule"
        with pytest.raises(AttributeError):
            item.name = "other"
        assert sha256(tensor_from(item)) == digest, item.name
        seen.append(item.name)
    assert sorted(seen) == sorted(digests)


def test_tensors_are_views_of_staging_memory_not_copies(medium):
    path, digests = medium
    it = sluice.iter_weights(path, staging="32MiB", max_read="2MiB", map_cached=False)
    lo, size, slot = it.staging_region()
    assert size > 0
    inside = whole = 0
    for name, t in it:
        if t.numel() == 0 or t.numel() * t.element_size() > 2 * MiB:
            continue  # empty, or assembled from several reads into memory of its own
        whole += 1
        assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= lo + size, name
        inside += 1
    assert whole > 100 and inside == whole
    assert it.stats["copied_out"] == 0


def test_tensors_kept_while_the_load_reuses_slots_keep_their_bytes(medium):
    path, digests = medium
    kept = {}
    it = sluice.iter_weights(path, staging="8MiB", max_read="1MiB", queue_depth=2)
    slots = it.staging_region()[1] // it.staging_region()[2]
    for i, (name, t) in enumerate(it):
        if i % 3 == 0:
            kept[name] = t  # the rest are dropped at once: their slots are read into again
    assert it.stats["staging"]["slots_used"] <= slots
    del it  # the stream (and its pool object) go; the kept tensors' leases keep their slots
    assert len(kept) > 10
    for name, t in kept.items():
        assert sha256(t) == digests[name][2], name


def test_holding_every_tensor_copies_out_instead_of_deadlocking(medium):
    path, digests = medium
    held = []
    it = sluice.iter_weights(path, staging="6MiB", max_read="1MiB", queue_depth=2)
    total, _, _ = it.slots()
    for name, t in it:
        held.append((name, t))
        assert it.slots()[2] <= total - 2  # pinned slots never reach the pipeline's reserve
    assert len(held) == len(digests)
    assert 0 < it.stats["copied_out"] < len(held)
    for name, t in held:
        assert sha256(t) == digests[name][2], name
    held.clear()
    assert it.slots()[2] == 0 and it.slots()[1] == total  # every slot back in the pool


def test_holding_every_tensor_with_on_exhausted_raise_names_the_budget(medium):
    path, _ = medium
    held = []
    with pytest.raises(sluice.ResourceError, match=r"staging budget of \d+ bytes .* exhausted") as e:
        for name, t in sluice.iter_weights(path, staging="6MiB", max_read="1MiB", queue_depth=2, on_exhausted="raise"):
            held.append(t)
    assert e.value.tensor  # the tensor it could not place


def test_stats_carry_sluice_loads_json_names_and_figures(small):
    path, digests = small
    it = sluice.iter_weights(path)
    for _ in it:
        pass
    out = subprocess.run([tool("sluice-load"), path, "--json"], check=True, capture_output=True, text=True).stdout
    ref = json.loads(out)
    missing = set(ref) - set(it.stats)
    assert not missing
    for k in ("tensors", "tensor_bytes", "bytes_read", "header_bytes_read", "files_opened", "shards"):
        assert it.stats[k] == ref[k], k
    assert set(ref["staging"]) <= set(it.stats["staging"]) and set(ref["stages"]) <= set(it.stats["stages"])


def test_stats_are_plain_python_values_that_survive_a_json_round_trip(small):
    path, _ = small
    it = sluice.iter_weights(path)
    for _ in it:
        pass

    def plain(v):
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return v is None or isinstance(v, (bool, int, float, str))
    assert plain(it.stats) and isinstance(it.stats["stream"], dict)
    assert json.loads(json.dumps(it.stats, allow_nan=False)) == it.stats


def test_a_truncated_shard_raises_a_typed_exception_naming_the_file(tmp_path):
    from conftest import generate
    d = tmp_path / "trunc"
    generate(d, "--size", "4MiB")
    ck = sluice.open(d)  # headers are intact: opening succeeds
    victim = max(ck.tensors, key=lambda t: t.nbytes)
    os.truncate(victim.file, victim.offset + victim.nbytes // 2)
    with pytest.raises(sluice.IOError) as e:
        for _ in sluice.iter_weights(ck):
            pass
    assert e.value.file == victim.file


def test_progress_callback_sees_the_bytes(small):
    path, _ = small
    seen = []
    it = sluice.iter_weights(path, progress=lambda done, total: seen.append((done, total)))
    for _ in it:
        pass
    assert seen and seen[-1][0] == seen[-1][1] == it.stats["tensor_bytes"]
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


def test_the_load_runs_on_a_thread_named_for_sluice(small):
    """An operator's `top -H` or py-spy tells sluice's load thread from the engine's threads."""
    path, _ = small

    def named():  # this process's threads named sluice-load, by id
        out = set()
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().strip() == "sluice-load":
                        out.add(tid)
            except OSError:  # a thread that ended meanwhile
                pass
        return out

    before, seen = named(), set()
    for _ in sluice.iter_weights(path, queue=2):  # a short queue: the load is still running after the first tensor
        seen |= named()
    assert seen - before, "no thread of this load was named sluice-load"


PROGRESS = textwrap.dedent("""
    import sys
    import sluice
    progress = {"auto": None, "on": True, "off": False}[sys.argv[2]]
    it = sluice.iter_weights(sys.argv[1], progress=progress)
    for _ in it:
        pass
    print("loaded", it.stats["tensor_bytes"], flush=True)
""")


def run_with_stderr_on_a_terminal(args):
    """Runs `args` with stderr on a pseudo-terminal (stdout a pipe); returns (stdout, terminal output)."""
    import fcntl
    import pty
    import struct
    import termios
    main_fd, term_fd = pty.openpty()
    # A terminal has a size (openpty's is 0 x 0, on which tqdm >= 4.66 draws nothing).
    fcntl.ioctl(term_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=term_fd, text=True)
    os.close(term_fd)
    seen = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(main_fd)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, seen.decode(errors="replace")
    return out, seen.decode(errors="replace")


def test_a_progress_bar_appears_on_a_terminal_by_default(small):
    path, _ = small
    out, term = run_with_stderr_on_a_terminal([PYTHON, "-c", PROGRESS, path, "auto"])
    assert out.startswith("loaded")
    assert "sluice:" in term and "B/s" in term, term  # tqdm's bar: "sluice:  40% 278k/696k [00:00<00:00, 1.2MB/s]"


def test_no_bar_when_stderr_is_not_a_terminal_unless_asked(small):
    path, _ = small
    quiet = subprocess.run([PYTHON, "-c", PROGRESS, path, "auto"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0, quiet.stderr
    assert "sluice:" not in quiet.stderr
    asked = subprocess.run([PYTHON, "-c", PROGRESS, path, "on"], capture_output=True, text=True, timeout=600)
    assert asked.returncode == 0, asked.stderr
    assert "sluice:" in asked.stderr and "B/s" in asked.stderr
    _, term = run_with_stderr_on_a_terminal([PYTHON, "-c", PROGRESS, path, "off"])
    assert "sluice:" not in term


CTRL_C = textwrap.dedent("""
    import os, signal, sys, threading, time
    import sluice
    it = sluice.iter_weights(sys.argv[1], staging="4MiB", max_read="64KiB", queue=1, queue_depth=1)
    total = it.slots()[0]
    got = threading.Event()
    def interrupt():
        got.wait()
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    n = 0
    try:
        for name, t in it:
            n += 1
            if n == 3:
                got.set()
            time.sleep(0.001)
        print("completed", n)
    except KeyboardInterrupt:
        it.close()
        t = None
        print("interrupted", n, it.stats, it.slots() == (total, total, 0))
""")


def test_ctrl_c_mid_load_raises_keyboardinterrupt_and_returns_every_slot(medium, tmp_path):
    path, digests = medium
    r = subprocess.run([PYTHON, "-c", CTRL_C, path], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    word, n, stats, slots_back = r.stdout.split()
    assert word == "interrupted" and 3 <= int(n) < len(digests)
    assert stats == "None" and slots_back == "True"


def test_tensors_of_a_mib_or_more_are_page_cache_views_that_never_write_the_file(medium):
    path, digests = medium
    # io="buffered" maps every such tensor, cached or not (io="auto": the cached ones).
    it = sluice.iter_weights(path, staging="8MiB", max_read="1MiB", queue_depth=2, io="buffered")
    lo, size, _ = it.staging_region()
    kept = {}
    for name, t in it:
        if t.numel() * t.element_size() >= MiB:
            assert not lo <= t.data_ptr() < lo + size, name  # not in a staging slot
            assert not t.sluice_holds_staging, name  # kept for good at no cost to the load
            kept[name] = t
        else:
            assert t.sluice_holds_staging, name  # a slot's
    assert kept
    st = it.stats
    assert st["stream"]["mapped_tensors"] == len(kept) == st["mapped"]["tensors"]
    assert st["own_tensors"] == 0 and st["copied_out"] == 0
    assert st["bytes_read"] == sluice.open(path).tensor_bytes
    files = {f: open(os.path.join(path, f), "rb").read() for f in os.listdir(path) if f.endswith(".safetensors")}
    for name, t in kept.items():  # valid after the load, and writable: copy on write, the file keeps its bytes
        assert sha256(t) == digests[name][2], name
        t.view(torch.uint8).reshape(-1)[:4096].fill_(0x5A)
    for f, b in files.items():
        assert open(os.path.join(path, f), "rb").read() == b, f
    # Off: the ones larger than a slot's 1 MiB read get buffers of their own, the rest share slots.
    off = sluice.iter_weights(path, staging="8MiB", max_read="1MiB", queue_depth=2, io="buffered", map_cached=False)
    larger = 0
    for name, t in off:
        assert sha256(t) == digests[name][2], name
        larger += t.numel() * t.element_size() > MiB
        assert t.sluice_holds_staging, name  # a slot, or a buffer of its own counted against the budget
    assert off.stats["stream"]["mapped_tensors"] == 0 and off.stats["own_tensors"] == larger > 0
