#!/usr/bin/python3
"""Writes the bad-input corpus: one small malformed file (or checkpoint
directory) per format rule, and cases.tsv, the table the tests read:

    case <TAB> kind <TAB> path <TAB> rule <TAB> file <TAB> tensor

kind: header (path is one .safetensors file) or index (path is a checkpoint
directory); rule: the format_error/index_error rule(); file: the path (relative
to bad/) that error.file() must name; tensor: error.tensor() ('-' = none).
Also writes the libFuzzer seed corpora under tests/fuzz/corpus/.
Run: /usr/bin/python3 tests/data/make_bad_corpus.py (deterministic)."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
BAD = os.path.join(HERE, "bad")
FUZZ = os.path.join(HERE, "..", "fuzz", "corpus")


def st(header, data=b"", length=None, pad=b""):
    """A safetensors file: header is a dict (dumped compactly) or raw bytes."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    text += pad
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


OK = {"__metadata__": {"format": "pt"}, "a": t("F32", [2], 0, 8), "b": t("BF16", [2, 2], 8, 16)}
OK_DATA = bytes(range(16))

# (case, rule, tensor, bytes)
HEADER_CASES = [
    ("short-file", "header-length", "", b"\x10\x00\x00\x00\x00"),
    ("header-length-too-large", "header-length", "", struct.pack("<Q", 100_000_001) + b"{}" + b" " * 30),
    ("header-length-beyond-file", "header-length", "", st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00", length=4096)),
    ("header-length-zero", "header-json", "", struct.pack("<Q", 0) + b"xxxxxxxx"),
    ("header-not-json", "header-json", "", st(b"{this is not json}")),
    ("header-not-object", "header-json", "", st(b'["a", "b"]')),
    ("header-leading-space", "header-json", "", st(b' {"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00")),
    ("padding-not-spaces", "header-json", "", st(OK, OK_DATA, pad=b"\x00\x00\x00")),
    ("padding-newline", "header-json", "", st(OK, OK_DATA, pad=b"\n")),
    ("trailing-garbage", "header-json", "", st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} }', b"\x00")),
    ("invalid-utf8", "header-json", "", st(b'{"a\xff\xfe":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00")),
    ("duplicate-name", "duplicate-name", "a",
     st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x00\x00")),
    ("metadata-not-string", "metadata", "", st({"__metadata__": {"format": 1}, "a": t("U8", [1], 0, 1)}, b"\x00")),
    ("metadata-not-object", "metadata", "", st({"__metadata__": "pt", "a": t("U8", [1], 0, 1)}, b"\x00")),
    ("tensor-not-object", "tensor-entry", "a", st({"a": [1, 2, 3]})),
    ("tensor-missing-field", "tensor-entry", "a", st({"a": {"dtype": "U8", "shape": [1]}}, b"\x00")),
    ("tensor-unknown-field", "tensor-entry", "a", st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"\x00")),
    ("unknown-dtype", "dtype", "w", st({"w": t("F7", [1], 0, 1)}, b"\x00")),
    ("dtype-not-string", "dtype", "w", st({"w": t(8, [1], 0, 1)}, b"\x00")),
    ("negative-shape", "shape", "w", st({"w": t("U8", [-1], 0, 1)}, b"\x00")),
    ("float-shape", "shape", "w", st({"w": t("U8", [2.5], 0, 2)}, b"\x00\x00")),
    ("shape-not-array", "shape", "w", st({"w": t("U8", 4, 0, 4)}, b"\x00" * 4)),
    ("data-offsets-one-number", "data-offsets", "w", st({"w": {"dtype": "U8", "shape": [1], "data_offsets": [1]}}, b"\x00")),
    ("data-offsets-negative", "data-offsets", "w", st({"w": t("U8", [1], -1, 0)}, b"\x00")),
    ("data-offsets-reversed", "data-offsets", "w", st({"w": t("U8", [0], 4, 0)}, b"\x00" * 4)),
    ("size-mismatch", "tensor-size", "w", st({"w": t("F32", [2], 0, 4)}, b"\x00" * 4)),
    ("subbyte-partial-byte", "tensor-size", "w", st({"w": t("F4", [3], 0, 2)}, b"\x00" * 2)),
    ("f6-partial-byte", "tensor-size", "w", st({"w": t("F6_E2M3", [3], 0, 3)}, b"\x00" * 3)),
    ("shape-overflow", "tensor-size", "w", st({"w": t("U8", [2**32, 2**32, 16], 0, 16)}, b"\x00" * 16)),
    ("bits-overflow", "tensor-size", "w", st({"w": t("F64", [2**61], 0, 8)}, b"\x00" * 8)),
    ("overlap", "layout", "b", st({"a": t("U8", [8], 0, 8), "b": t("U8", [8], 4, 12)}, b"\x00" * 12)),
    ("hole", "layout", "b", st({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 8, 12)}, b"\x00" * 12)),
    ("not-starting-at-zero", "layout", "a", st({"a": t("U8", [4], 4, 8)}, b"\x00" * 8)),
    ("data-past-last-tensor", "data-end", "b", st(OK, OK_DATA + b"\x00" * 5)),
    ("data-without-tensors", "data-end", "", st({"__metadata__": {"format": "pt"}}, b"\x00" * 3)),
    ("truncated-after-header", "data-end", "b", st(OK, b"")),
    ("truncated-mid-data", "data-end", "b", st(OK, OK_DATA[:11])),
]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def ckpt_dir(case, index, shards):
    """A checkpoint directory with an index (dict or raw bytes) and shards {name: bytes}."""
    d = os.path.join(BAD, case)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    text = index if isinstance(index, bytes) else json.dumps(index, indent=2).encode()
    write(os.path.join(d, "model.safetensors.index.json"), text)
    for name, data in shards.items():
        write(os.path.join(d, name), data)


S1 = "model-00001-of-00002.safetensors"
S2 = "model-00002-of-00002.safetensors"
SHARD1 = st({"x": t("F32", [2], 0, 8)}, b"\x01" * 8)
SHARD2 = st({"y": t("BF16", [4], 0, 8), "z": t("U8", [3], 8, 11)}, b"\x02" * 11)
GOOD_MAP = {"x": S1, "y": S2, "z": S2}
IX = "model.safetensors.index.json"


def index(weight_map, total=27):
    return {"metadata": {"total_size": total}, "weight_map": weight_map}


# (case, rule, file relative to the case directory, tensor, index, shards)
INDEX_CASES = [
    ("index-shard-with-slash", "shard-name", IX, "y", index({**GOOD_MAP, "y": "sub/" + S2}), {S1: SHARD1, S2: SHARD2}),
    ("index-shard-dotdot", "shard-name", IX, "x", index({**GOOD_MAP, "x": ".."}), {S1: SHARD1, S2: SHARD2}),
    ("index-shard-parent-path", "shard-name", IX, "x", index({**GOOD_MAP, "x": "../" + S1}), {S1: SHARD1, S2: SHARD2}),
    ("index-shard-absolute", "shard-name", IX, "z", index({**GOOD_MAP, "z": "/etc/passwd"}), {S1: SHARD1, S2: SHARD2}),
    ("index-missing-shard", "missing-shard", IX, "x", index(GOOD_MAP), {S2: SHARD2}),
    ("index-tensor-missing-from-shard", "missing-tensor", S1, "w", index({**GOOD_MAP, "w": S1}), {S1: SHARD1, S2: SHARD2}),
    ("index-tensor-not-in-index", "unindexed-tensor", S2, "z", index({"x": S1, "y": S2}), {S1: SHARD1, S2: SHARD2}),
    ("index-tensor-in-other-shard", "unindexed-tensor", S2, "z", index({**GOOD_MAP, "z": S1}),
     {S1: st({"x": t("F32", [2], 0, 8), "z": t("U8", [3], 8, 11)}, b"\x01" * 11), S2: SHARD2}),
    ("index-total-size-mismatch", "total-size", IX, "", index(GOOD_MAP, total=28), {S1: SHARD1, S2: SHARD2}),
    ("index-total-size-not-number", "index-json", IX, "", index(GOOD_MAP, total="27 bytes"), {S1: SHARD1, S2: SHARD2}),
    ("index-not-json", "index-json", IX, "", b'{"weight_map": {"x": ', {S1: SHARD1}),
    ("index-not-object", "index-json", IX, "", b'["x"]', {S1: SHARD1}),
    ("index-no-weight-map", "index-json", IX, "", {"metadata": {"total_size": 8}}, {S1: SHARD1}),
    ("index-shard-not-string", "index-json", IX, "x", index({**GOOD_MAP, "x": 1}), {S1: SHARD1, S2: SHARD2}),
    ("index-duplicate-tensor", "duplicate-name", IX, "y",
     ('{"metadata":{"total_size":27},"weight_map":{"x":"%s","y":"%s","y":"%s","z":"%s"}}' % (S1, S1, S2, S2)).encode(),
     {S1: SHARD1, S2: SHARD2}),
    ("index-bad-shard-header", "tensor-size", S2, "y",
     index(GOOD_MAP), {S1: SHARD1, S2: st({"y": t("BF16", [5], 0, 8), "z": t("U8", [3], 8, 11)}, b"\x02" * 11)}),
]


# Index seeds whose total_size does not fit in uint64 (kept byte for byte as
# first committed: the corpus is rewritten from this script).
INDEX_SEEDS_BEYOND_UINT64 = {
    "total_size_beyond_uint64.json":
        (json.dumps(index({"x": S2}, total=2184467440737095516157), indent=2) + "\n").encode(),
    "total_size_digits_beyond_uint64.json":
        (json.dumps(index({"x": S1}, total="9" * 23), separators=(",", ":")) + "\n").encode(),
}


def main():
    shutil.rmtree(BAD, ignore_errors=True)
    os.makedirs(BAD)
    rows = []
    for case, rule, tensor, data in HEADER_CASES:
        name = case + ".safetensors"
        write(os.path.join(BAD, name), data)
        rows.append((case, "header", name, rule, name, tensor or "-"))
    for case, rule, file, tensor, ix, shards in INDEX_CASES:
        ckpt_dir(case, ix, shards)
        rows.append((case, "index", case, rule, case + "/" + file, tensor or "-"))
    with open(os.path.join(BAD, "cases.tsv"), "w") as f:
        f.write("# case\tkind\tpath\trule\tfile\ttensor   (generated by ../make_bad_corpus.py)\n")
        for r in rows:
            f.write("\t".join(r) + "\n")

    # libFuzzer seeds: every bad header plus good ones; indexes likewise.
    for sub in ("header", "index"):
        shutil.rmtree(os.path.join(FUZZ, sub), ignore_errors=True)
        os.makedirs(os.path.join(FUZZ, sub))
    for case, _, _, data in HEADER_CASES:
        write(os.path.join(FUZZ, "header", case), data)
    write(os.path.join(FUZZ, "header", "good-small"), st(OK, OK_DATA))
    write(os.path.join(FUZZ, "header", "good-padded"), st(OK, OK_DATA, pad=b"      "))
    write(os.path.join(FUZZ, "header", "good-odd"), st({"s": t("F32", [], 0, 4), "e": t("BF16", [0, 3], 4, 4),
                                                         "m": t("BOOL", [3], 4, 7), "f": t("F4", [2], 7, 8)}, b"\x00" * 8))
    for case, _, _, _, ix, _ in INDEX_CASES:
        text = ix if isinstance(ix, bytes) else json.dumps(ix, indent=2).encode()
        write(os.path.join(FUZZ, "index", case), text)
    write(os.path.join(FUZZ, "index", "good"), json.dumps(index(GOOD_MAP)).encode())
    write(os.path.join(FUZZ, "index", "good-string-total"), json.dumps(index(GOOD_MAP, total="27")).encode())
    # total_size past 2^64, as a number and as a string of digits (fuzz_index
    # found UB converting 2.18e21 to uint64): must stay index_error, not UB.
    for name, text in INDEX_SEEDS_BEYOND_UINT64.items():
        write(os.path.join(FUZZ, "index", name), text)
    print(f"wrote {len(HEADER_CASES)} header cases and {len(INDEX_CASES)} index cases to {BAD}")


if __name__ == "__main__":
    main()
