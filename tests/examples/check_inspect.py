#!/usr/bin/python3
"""Independent oracle for sluice-inspect (stdlib only).

check_inspect.py report INSPECT PATH SEED
    Runs `INSPECT PATH --json` and compares it with what this script reads from
    the files itself: tensor count, tensor bytes, tensors and bytes per dtype,
    per class (the DeepSeek preset's rules, recomputed here by name), per
    shard, and the header bytes read (index + 8 + N per shard). Then checks
    the bytes of a few tensors against the generator's content function
    (splitmix64 per 8-byte word of (seed, name)).
check_inspect.py report-one INSPECT DIR SEED
    The same for the directory's first shard, opened as one file.
check_inspect.py digests DIR FILE
    Checks gen-checkpoint's --digests FILE (name, dtype, shape, sha256 per
    tensor) against hashlib over the bytes in the shard files.
check_inspect.py error INSPECT PATH RULE FILE [TENSOR]
    Runs `INSPECT PATH` and expects a non-zero exit and exactly one stderr line,
    beginning `sluice: error:`, naming the rule, the file and the tensor.
"""
import json
import os
import re
import struct
import subprocess
import sys

M64 = (1 << 64) - 1
SIZES = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
         "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
         "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


# The classifier's DeepSeek preset (include/sluice/policy/classify.hpp,
# classifier::deepseek()): a shared table first, then a routed expert, else
# replicated; patterns are searched in the tensor's name as stored in the file.
TABLE = re.compile(r"engram\.\d+\.(table|scale)$")
EXPERT = re.compile(r"mlp\.experts\.(\d+)\.")


def tensor_class(name):
    if TABLE.search(name):
        return "shared_table"
    if EXPERT.search(name):
        return "routed_expert"
    return "replicated"


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def content(seed, name, n):
    key = mix(seed ^ fnv1a(name))
    words = (n + 7) // 8
    out = b"".join(struct.pack("<Q", mix((key + (w + 1) * 0x9E3779B97F4A7C15) & M64)) for w in range(words))
    return out[:n]


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return n, hdr


def fail(msg):
    print("check_inspect: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def report(inspect, path, seed):
    run = subprocess.run([inspect, path, "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"sluice-inspect exited {run.returncode}: {run.stderr}")
    got = json.loads(run.stdout)
    if os.path.isdir(path):
        ix_path = os.path.join(path, "model.safetensors.index.json")
        with open(ix_path) as f:
            ix = json.load(f)
        shards = sorted(set(ix["weight_map"].values()))
        header_read = os.path.getsize(ix_path)
        files = [os.path.join(path, s) for s in shards]
    else:
        ix = None
        files = [path]
        header_read = 0
    count, total, per_dtype, per_class, per_shard, tensors = 0, 0, {}, {}, [], []
    for fp in files:
        n, hdr = read_header(fp)
        header_read += 8 + n
        shard_bytes = 0
        for name, t in hdr.items():
            size = t["data_offsets"][1] - t["data_offsets"][0]
            elems = 1
            for d in t["shape"]:
                elems *= d
            if elems * SIZES[t["dtype"]] != size * 8:
                fail(f"{fp}: {name}: size disagrees with shape")
            count += 1
            total += size
            shard_bytes += size
            d = per_dtype.setdefault(t["dtype"], {"tensors": 0, "bytes": 0})
            d["tensors"] += 1
            d["bytes"] += size
            c = per_class.setdefault(tensor_class(name), {"tensors": 0, "bytes": 0})
            c["tensors"] += 1
            c["bytes"] += size
            tensors.append((fp, 8 + n + t["data_offsets"][0], name, size))
        per_shard.append({"name": os.path.basename(fp), "tensors": len(hdr), "tensor_bytes": shard_bytes})
    if ix is not None and int(ix["metadata"]["total_size"]) != total:
        fail(f"index total_size {ix['metadata']['total_size']} != {total}")
    checks = {
        "tensor_count": (got["tensor_count"], count),
        "tensor_bytes": (got["tensor_bytes"], total),
        "header_bytes_read": (got["header_bytes_read"], header_read),
        "dtypes": (got["dtypes"], per_dtype),
        "shards": ([{k: s[k] for k in ("name", "tensors", "tensor_bytes")} for s in got["shards"]], per_shard),
        "classes": (got["classes"], per_class),
    }
    for what, (a, b) in checks.items():
        if a != b:
            fail(f"{what}: sluice-inspect says {a}, the files say {b}")
    # Contents: the generator's function, recomputed here.
    for fp, off, name, size in tensors[:: max(1, len(tensors) // 25)]:
        with open(fp, "rb") as f:
            f.seek(off)
            data = f.read(min(size, 4096))
        if data != content(seed, name, len(data)):
            fail(f"{fp}: bytes of {name} are not the generator's")
    print(f"check_inspect: ok: {count} tensors, {total} bytes, {len(per_dtype)} dtypes, {len(per_class)} classes, "
          f"{header_read} header bytes")


def digests(path, listing):
    import hashlib
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    actual = {}
    for name in files:
        fp = os.path.join(path, name)
        n, hdr = read_header(fp)
        with open(fp, "rb") as f:
            for tname, t in hdr.items():
                b, e = t["data_offsets"]
                f.seek(8 + n + b)
                shape = "[" + ",".join(str(d) for d in t["shape"]) + "]"
                actual[tname] = "\t".join((tname, t["dtype"], shape, hashlib.sha256(f.read(e - b)).hexdigest()))
    with open(listing) as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    if len(lines) != len(actual):
        fail(f"{len(lines)} digest lines for {len(actual)} tensors")
    for line in lines:
        if actual.get(line.split("\t")[0]) != line:
            fail(f"digest line {line!r} != files' {actual.get(line.split(chr(9))[0])!r}")
    print(f"check_inspect: ok: {len(lines)} digests match hashlib")


def error(inspect, path, rule, file, tensor=""):
    run = subprocess.run([inspect, path], capture_output=True, text=True)
    lines = run.stderr.splitlines()
    if run.returncode == 0:
        fail("sluice-inspect accepted a malformed checkpoint")
    if len(lines) != 1:
        fail(f"expected exactly one stderr line, got {len(lines)}: {run.stderr!r}")
    line = lines[0]
    if not line.startswith("sluice: error: "):
        fail(f"stderr line does not begin 'sluice: error:': {line!r}")
    for part in (rule + ":", f"file '{file}'") + ((f"tensor '{tensor}'",) if tensor else ()):
        if part not in line:
            fail(f"{part!r} missing from {line!r}")
    print("check_inspect: ok: " + line)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "report":
        report(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "report-one":  # the directory's first shard alone
        first = sorted(f for f in os.listdir(sys.argv[3]) if f.endswith(".safetensors"))[0]
        report(sys.argv[2], os.path.join(sys.argv[3], first), int(sys.argv[4]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "digests":
        digests(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 6 and sys.argv[1] == "error":
        error(*sys.argv[2:7])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
