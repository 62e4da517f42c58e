#!/usr/bin/env python3
"""Seeds for the fuzz targets, made at configure time into the build folder
(tests/fuzz/CMakeLists.txt): issue 40's hostile inputs (a shape nested a
million deep, a name of 400,000 digits, a lying range answer, an endless
nesting in CBOR...) and honest ones beside them. Too large, or too
repetitive, to keep in the repository; corpus/ keeps the small findings.

  make_seeds.py OUT    writes OUT/<target>/<seed>
Standard library only.
"""
import json
import os
import struct
import sys



def put(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def safetensors(header):
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw


# A minimal CBOR encoder (RFC 8949) for the open record's seeds: what
# nlohmann::json::to_cbor writes for maps, arrays, strings, byte strings,
# unsigned numbers, booleans and null.
def cbor(v):
    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        for ai, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
            if n < 1 << (8 * struct.calcsize(fmt)):
                return bytes([major << 5 | ai]) + struct.pack(fmt, n)
        raise ValueError(n)
    if v is None:
        return b"\xf6"
    if v is True:
        return b"\xf5"
    if v is False:
        return b"\xf4"
    if isinstance(v, int):
        return head(0, v)
    if isinstance(v, bytes):
        return head(2, len(v)) + v
    if isinstance(v, str):
        b = v.encode()
        return head(3, len(b)) + b
    if isinstance(v, list):
        return head(4, len(v)) + b"".join(cbor(x) for x in v)
    if isinstance(v, dict):
        return head(5, len(v)) + b"".join(cbor(k) + cbor(x) for k, x in v.items())
    raise TypeError(v)


def main():
    out = sys.argv[1]
    # header / index: the table's files.
    deep = "[" * 1_000_000 + "]" * 1_000_000
    put(out, "header", "deep-shape", safetensors('{"a":{"dtype":"U8","shape":' + deep + ',"data_offsets":[0,0]}}'))
    name = "model.layers." + "7" * 200_000 + ".mlp.experts." + "3" * 200_000 + ".w1.weight"
    put(out, "header", "long-digits",
        safetensors(json.dumps({name: {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})) + b"\0" * 4)
    forged = "evil\tU8\t[1]\t" + "0" * 64 + "\nmodel.norm.weight"
    put(out, "header", "control-names",
        safetensors(json.dumps({forged: {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})) + b"\1\2")
    put(out, "header", "many-tensors-20k",
        safetensors("{" + ",".join('"t%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i for i in range(20000)) + "}"))
    put(out, "index", "deep-total-size",
        '{"metadata":{"total_size":' + deep + '},"weight_map":{"x":"model-00001-of-00002.safetensors"}}')
    put(out, "index", "long-name", json.dumps({"weight_map": {name: "model-00001-of-00002.safetensors"}}))

    # range_answer: first, end, status, flags, Content-Length, Content-Range.
    def answer(first, end, status, flags, length, cr):
        return struct.pack("<QQHBQ", first, end, status, flags, length & (2**64 - 1)) + cr.encode()
    put(out, "range_answer", "wraparound", answer(8, 1048584, 206, 3, 2**64 - 8 + 1, "bytes 8-0/1"))
    put(out, "range_answer", "honest", answer(100, 200, 206, 3, 100, "bytes 100-199/1000"))
    put(out, "range_answer", "tail", answer(900, 2000, 206, 3, 100, "bytes 900-999/1000"))
    put(out, "range_answer", "whole", answer(0, 10, 200, 1, 4, ""))
    put(out, "range_answer", "star", answer(0, 10, 416, 2, 0, "bytes */4"))

    # list_page: honest, outside the prefix, more than max-keys, a huge key.
    def page(keys, truncated="false", token=""):
        c = "".join(f"<Contents><Key>{k}</Key><Size>{s}</Size><ETag>&quot;e&quot;</ETag></Contents>" for k, s in keys)
        t = f"<NextContinuationToken>{token}</NextContinuationToken>" if token else ""
        return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><Prefix>ck/</Prefix>'
                f"<IsTruncated>{truncated}</IsTruncated>{c}{t}</ListBucketResult>")
    put(out, "list_page", "honest", page([("ck/model.safetensors", 8), ("ck/model.safetensors.index.json", 20)]))
    put(out, "list_page", "outside-prefix", page([("elsewhere/model.safetensors", 8)]))
    put(out, "list_page", "too-many-keys", page([(f"ck/x{i}", 1) for i in range(1001)]))
    put(out, "list_page", "huge-key", page([("ck/" + "k" * 100_000, 1)]))
    put(out, "list_page", "truncated", page([("ck/a", 1)], "true", "again"))
    put(out, "list_page", "error-document", "<Error><Code>AccessDenied</Code><Message>no</Message></Error>")

    # names: the placement rules' inputs, and patterns.
    for i, n in enumerate(["model.layers.3.mlp.experts.7.w1.weight", name, forged, "model.layers.99999999999999999999.x",
                           "model.embed_tokens.weight", "lm_head.weight", "model.layers.1.engram.0.table",
                           r"layers\.(\d+)\.", r"(\d+)+x", "(unclosed", "a" * 5000]):
        put(out, "names", f"name-{i}", n)

    # open_record: an honest record (its CBOR part, then rank 0's parses),
    # damaged ones, and a million-deep nesting.
    def u64(n):
        return struct.pack("<Q", n)

    def s(t):
        return u64(len(t.encode())) + t.encode()

    limits = u64(100_000_000) + u64(128 << 20) + u64(1 << 20) + u64(16) + u64(1024)
    tensor = s("w") + bytes([17]) + u64(2) + u64(2) + u64(2) + u64(0) + u64(16)  # F32 [2, 2]
    parses = (limits + u64(1) + s("model.safetensors") + u64(56) + u64(80) + u64(1) + s("format") + s("pt")
              + u64(1) + tensor + b"\x01" + s("/models/m/model.safetensors.index.json") + b"\x01" + u64(16)
              + u64(1) + s("w") + s("model.safetensors") + u64(1) + s("model.safetensors") + b"\x01" + u64(80) + b"\x00")

    def framed(record, tail=b""):
        c = cbor(record)
        return u64(len(c)) + c + tail

    record = {"format": "sluice-open/3", "failure": None, "at": "/models/m",
              "calls": [[2, "model.safetensors", 0, 0, False, "", 80], [0, "", 0, 0, False, "", ["model.safetensors"]],
                        [3, "model.safetensors", 0, 0, True, "no ETag here", None]],
              "shards": [["model.safetensors", 80, None]], "parsed": len(parses)}
    put(out, "open_record", "honest", framed(record, parses))
    put(out, "open_record", "truncated", framed(record, parses)[:-5])
    put(out, "open_record", "deep", u64(1_000_001) + b"\x81" * 1_000_000 + b"\xf6")
    put(out, "open_record", "wrong-types",
        framed({"format": "sluice-open/3", "failure": 3, "at": [], "calls": {}, "shards": 1, "parsed": "x"}))
    failed = dict(record, failure="rank 0 could not read", parsed=0,
                  calls=[[4, "model.safetensors", 0, 8, False, "", b"\x10\0\0\0\0\0\0\0"]])
    put(out, "open_record", "failed", framed(failed))

    # parse_size
    for i, s in enumerate(["4GiB", "1.5GiB", "512k", "18446744073709551615", "18446744073709551616", " 4 GB ", "0",
                           "1e3", "-1", "4GiBx", "9" * 400]):
        put(out, "parse_size", f"size-{i}", s)


if __name__ == "__main__":
    main()
