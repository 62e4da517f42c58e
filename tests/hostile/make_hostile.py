#!/usr/bin/env python3
"""Writes the hostile checkpoints of issue 40's table, one directory each.

  make_hostile.py OUT [--only NAME ...] [--tensors N]

Each case is a checkpoint a stranger could publish: valid enough to be
opened, built to break a loader (stack depth, name length, sizes, counts).
Standard library only: the files are made byte by byte, as an attacker would.
"""
import argparse
import json
import os
import struct


def write_safetensors(path, header_text, data=b""):
    raw = header_text.encode() if isinstance(header_text, str) else header_text
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(data)


def nested(depth):
    return "[" * depth + "]" * depth


def case_deep_shape(d, depth=1_000_000):
    # A shape entry nested 10^6 levels deep (2 MB of brackets).
    write_safetensors(os.path.join(d, "model.safetensors"),
                      '{"a":{"dtype":"U8","shape":' + nested(depth) + ',"data_offsets":[0,0]}}')


def case_deep_total_size(d, depth=1_000_000):
    # The same nesting in an index's metadata.total_size.
    write_safetensors(os.path.join(d, "model-00001-of-00001.safetensors"),
                      '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write('{"metadata":{"total_size":' + nested(depth) +
                '},"weight_map":{"a":"model-00001-of-00001.safetensors"}}')


def case_long_digits(d, digits=200_000):
    # A name whose layer and expert numbers have 200000 digits each.
    name = "model.layers." + "7" * digits + ".mlp.experts." + "3" * digits + ".w1.weight"
    hdr = json.dumps({name: {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                      "model.embed_tokens.weight": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})
    write_safetensors(os.path.join(d, "model.safetensors"), hdr, b"\x00" * 8)


def case_huge_index(d, size=1 << 40):
    # `truncate -s 1T model.safetensors.index.json`: a sparse file.
    write_safetensors(os.path.join(d, "model-00001-of-00001.safetensors"),
                      '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    with open(os.path.join(d, "model.safetensors.index.json"), "wb") as f:
        f.truncate(size)


def case_many_tensors(d, n=1_500_000):
    # One header with 1.5 M zero-size tensors (about 85 MB).
    parts = ['"t%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i for i in range(n)]
    write_safetensors(os.path.join(d, "model.safetensors"), "{" + ",".join(parts) + "}")


def case_control_names(d):
    # Names with a tab and a newline: each would forge a --digest line.
    forged = "evil\tU8\t[1]\t" + "0" * 64 + "\nmodel.norm.weight"
    hdr = json.dumps({forged: {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                      "model.norm.weight": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})
    write_safetensors(os.path.join(d, "model.safetensors"), hdr, b"\x01\x02\x03\x04")


CASES = {
    "deep-shape": case_deep_shape,
    "deep-total-size": case_deep_total_size,
    "long-digits": case_long_digits,
    "huge-index": case_huge_index,
    "many-tensors": case_many_tensors,
    "control-names": case_control_names,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--tensors", type=int, default=None, help="many-tensors: how many (default 1.5 M)")
    a = ap.parse_args()
    for name, make in CASES.items():
        if a.only and name not in a.only:
            continue
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        if name == "many-tensors" and a.tensors:
            make(d, a.tensors)
        else:
            make(d)
        print(d)


if __name__ == "__main__":
    main()
