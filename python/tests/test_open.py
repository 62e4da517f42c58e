"""sluice.open / inspect: metadata without data; bad inputs are typed Python exceptions."""
import os
import re

import pytest

import sluice

from conftest import SOURCE_DIR, generate, sha256


def test_metadata_matches_the_generator_without_reading_data(small):
    path, digests = small
    ck = sluice.open(path)
    assert len(ck) == len(digests)
    for t in ck.tensors:
        dtype, shape, _ = digests[t.name]
        assert t.dtype == dtype and list(t.shape) == shape
        assert os.path.dirname(t.file) == path and t.nbytes >= 0
    assert ck.tensor_bytes == sum(t.nbytes for t in ck.tensors)
    assert ck.header_bytes_read > 0


def test_select_by_regex_or_callable_and_rename(small):
    path, digests = small
    experts = sluice.open(path, select=r"\.mlp\.experts\.")
    assert experts.tensors and all(".mlp.experts." in t.name for t in experts.tensors)
    assert len(experts) == sum(1 for n in digests if ".mlp.experts." in n)
    same = sluice.open(path, select=lambda n: ".mlp.experts." in n)
    assert [t.name for t in same] == [t.name for t in experts]
    renamed = sluice.open(path, select=re.compile(r"^model\.layers\.0\."), rename={"model.layers.0.": "L0."})
    assert renamed.tensors and all(t.name.startswith("L0.") and t.source_name.startswith("model.layers.0.")
                                   for t in renamed.tensors)
    with pytest.raises(sluice.ConfigError, match="not a valid regular expression"):
        sluice.open(path, select="(")


def test_inspect_totals_per_class_and_dtype(small):
    path, digests = small
    ck = sluice.open(path)
    info = sluice.inspect(ck)
    assert info["tensor_count"] == len(digests)
    for table in ("dtypes", "classes"):
        assert sum(v["bytes"] for v in info[table].values()) == ck.tensor_bytes
        assert sum(v["tensors"] for v in info[table].values()) == len(ck)
    assert info["dtypes"]["F8_E4M3"]["tensors"] == sum(1 for d, _, _ in digests.values() if d == "F8_E4M3")
    assert set(info["classes"]) == {"replicated", "routed_expert", "shared_table"}
    assert info["classes"]["routed_expert"]["tensors"] == sum(
        1 for n in digests if re.search(r"\.mlp\.experts\.\d+\.", n))


def _cases():
    bad = os.path.join(SOURCE_DIR, "tests", "data", "bad")
    with open(os.path.join(bad, "cases.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if not line.startswith("#")]
    return bad, rows


INDEX_RULES = {"index-json", "shard-name", "missing-shard", "missing-tensor", "unindexed-tensor", "total-size"}


def test_every_malformed_file_of_the_corpus_is_a_typed_exception_naming_file_tensor_and_rule():
    bad, rows = _cases()
    assert len(rows) >= 40
    for name, kind, path, rule, file, tensor in rows:
        tensor = "" if tensor == "-" else tensor
        with pytest.raises(sluice.FormatError) as e:
            sluice.open(os.path.join(bad, path))
        err = e.value
        assert err.rule == rule, name
        assert err.file == os.path.join(bad, file), name
        assert err.tensor == tensor, name
        index_problem = rule in INDEX_RULES or (kind == "index" and rule == "duplicate-name")
        assert isinstance(err, sluice.IndexError) == index_problem, name
        assert isinstance(err, sluice.Error) and isinstance(err, ValueError)
        assert str(err).startswith(rule + ": ") and err.file in str(err)


def test_a_stale_index_is_an_index_error_naming_the_shard(tmp_path):
    d = tmp_path / "stale"
    generate(d)
    # Regenerating one shard with another layout leaves the index stale: drop a tensor from the shard.
    import json
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name, shard = next(iter(index["weight_map"].items()))
    index["weight_map"]["model.not.in.the.shard"] = shard
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(sluice.IndexError) as e:
        sluice.open(d)
    assert e.value.tensor == "model.not.in.the.shard" and e.value.file.endswith(shard)
    assert e.value.rule == "missing-tensor"


def test_a_missing_checkpoint_is_an_error_not_a_crash(tmp_path):
    with pytest.raises(sluice.Error) as e:
        sluice.open(tmp_path / "nothing-here")
    assert "nothing-here" in str(e.value)


def test_sizes_mean_what_sluice_load_means():
    assert sluice.parse_size("4GiB") == sluice.parse_size("4G") == 4 << 30
    assert sluice.parse_size("4GB") == 4_000_000_000
    assert sluice.parse_size("1.5GiB") == 3 << 29
    assert sluice.parse_size(12345) == 12345
    for bad in ("4XB", "", "-1", 0, "0", 1.5, True):
        with pytest.raises(sluice.ConfigError):
            sluice.parse_size(bad)


def test_select_is_a_view_over_the_opened_headers_that_reads_no_header_again(small, tmp_path):
    path, digests = small
    import shutil
    copy = tmp_path / "ck"
    shutil.copytree(path, copy)
    ck = sluice.open(copy)
    names = sorted(digests)[::3]
    # Every shard's header is now garbage on disk: a re-open or a header read would fail.
    for f in copy.iterdir():
        if f.suffix == ".safetensors":
            with open(f, "r+b") as fh:
                fh.seek(8)
                fh.write(b"\xff" * 8)
    sub = ck.select(reversed(names))
    assert [t.name for t in sub] == [t.name for t in ck if t.name in set(names)]  # file order kept
    assert sub.header_bytes_read == ck.header_bytes_read and sub.tensor_bytes == sum(ck[n].nbytes for n in names)
    seen = {name: sha256(t) for name, t in sluice.iter_weights(sub, staging="16MiB", max_read="1MiB")}
    assert seen == {n: digests[n][2] for n in names}


def test_select_of_a_name_the_checkpoint_lacks_names_it(small):
    path, _ = small
    ck = sluice.open(path)
    with pytest.raises(sluice.ConfigError, match="no-such-tensor"):
        ck.select(["no-such-tensor"])
    with pytest.raises(sluice.ConfigError):
        ck.select("a-string")


def test_hostile_metadata_raises_named_errors_and_the_caps_are_options(tmp_path):
    """Issue 40's files (tests/hostile/make_hostile.py) through sluice.open:
    a shape nested a million deep, an index nested so, a 200,000-digit name,
    a terabyte index; each a FormatError/IndexError naming its rule. The caps
    are sluice.open's `limits`."""
    import subprocess
    import sys
    subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "tests", "hostile", "make_hostile.py"), str(tmp_path),
                    "--only", "deep-shape", "deep-total-size", "long-digits", "huge-index", "control-names"],
                   check=True, stdout=subprocess.DEVNULL)
    for case, kind, rule in [("deep-shape", sluice.FormatError, "shape:"),
                             ("deep-total-size", sluice.IndexError, "index-depth:"),
                             ("long-digits", sluice.FormatError, "name-length:"),
                             ("huge-index", sluice.IndexError, "index-size:")]:
        with pytest.raises(kind, match=rule):
            sluice.open(str(tmp_path / case))
    # Raised by name, the long name opens; an unknown key is refused.
    ck = sluice.open(str(tmp_path / "long-digits"), limits={"max_name_bytes": 1 << 20})
    assert len(ck) == 2 and max(len(t.name) for t in ck) > 400_000
    with pytest.raises(sluice.ConfigError, match="unknown key 'max_names'"):
        sluice.open(str(tmp_path / "long-digits"), limits={"max_names": 1})
    # A name with a tab and a newline is kept as it is, and printed escaped.
    ck = sluice.open(str(tmp_path / "control-names"))
    assert any("\t" in t.name and "\n" in t.name for t in ck)
    with pytest.raises(sluice.ConfigError) as e:
        ck.select(["no\tsuch\nname"])
    assert "\n" not in str(e.value) and "no\\tsuch\\nname" in str(e.value)


def test_select_takes_re2_syntax(small):
    path, digests = small
    # RE2's syntax is Python's for what sluice's users write; lookaround is not RE2.
    assert len(sluice.open(path, select=r"^model\.layers\.(0|1)\.")) == sum(
        1 for n in digests if re.match(r"^model\.layers\.(0|1)\.", n))
    with pytest.raises(sluice.ConfigError, match=r"RE2 syntax"):
        sluice.open(path, select=r"^(?!model)")
