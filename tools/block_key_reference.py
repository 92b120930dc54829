#!/usr/bin/env python3
"""Independent reference implementation of kvfabric block keys (docs/block-key.md).

Standard library only (hashlib, struct). It is written from the byte tables in
docs/block-key.md, not from the C++ code, so that the two implementations check
each other: this script generates the golden vectors in the doc, and
core/block_key_test.cc recomputes every one of them in C++.

Usage:
  python3 tools/block_key_reference.py            # print the golden vectors
  python3 tools/block_key_reference.py --check    # compare with docs/block-key.md
  python3 tools/block_key_reference.py --check PATH/TO/block-key.md

The printed text is exactly the body of the ```kvfabric-golden fenced block in the
doc (the format is described there, section "Golden vectors").
"""

import hashlib
import os
import struct
import sys

FINGERPRINT_TAG = b"kvfabric/model-fingerprint/v1"
BLOCK_KEY_TAG = b"kvfabric/block-key/v1"
ROOT_PARENT = bytes(32)  # parent of the first block of every chain

# Numbered explicitly; these numbers are hashed and are never renumbered.
DTYPE_CODES = {"fp16": 1, "bf16": 2, "fp32": 3, "fp8_e4m3": 4, "int8": 5}

MAX_STRING_BYTES = 256  # namespace, model id, each extra key
MAX_EXTRA_KEYS = 64


def u32(value):
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError("not a u32: %r" % (value,))
    return struct.pack("<I", value)


def lp(data):
    """A variable-length byte string: u32 LE length, then the bytes."""
    return u32(len(data)) + data


def fingerprint_message(fp):
    tpb = fp["tokens_per_block"]
    assert fp["model"] and len(fp["model"].encode()) <= MAX_STRING_BYTES
    assert fp["layer_count"] > 0 and fp["kv_heads"] > 0 and fp["head_dim"] > 0
    assert 0 < tpb <= 256 and 256 % tpb == 0
    assert fp["tp_rank"] < fp["tp_size"] and fp["layout_version"] > 0
    return b"".join([
        lp(FINGERPRINT_TAG),
        lp(fp["model"].encode("utf-8")),
        u32(fp["first_layer"]),
        u32(fp["layer_count"]),
        u32(DTYPE_CODES[fp["dtype"]]),
        u32(fp["kv_heads"]),
        u32(fp["head_dim"]),
        u32(tpb),
        u32(fp["tp_rank"]),
        u32(fp["tp_size"]),
        u32(fp["layout_version"]),
    ])


def fingerprint_digest(fp):
    return hashlib.sha256(fingerprint_message(fp)).digest()


def block_key(namespace, fp, parent, tokens, extra):
    ns = namespace.encode("utf-8")
    assert len(ns) <= MAX_STRING_BYTES
    assert len(parent) == 32
    assert len(tokens) == fp["tokens_per_block"]
    assert len(extra) <= MAX_EXTRA_KEYS
    parts = [lp(BLOCK_KEY_TAG), lp(ns), fingerprint_digest(fp), parent, u32(len(tokens))]
    parts.extend(u32(t) for t in tokens)
    parts.append(u32(len(extra)))
    for e in extra:
        data = e.encode("utf-8")
        assert len(data) <= MAX_STRING_BYTES
        parts.append(lp(data))
    return hashlib.sha256(b"".join(parts)).digest()


# ---------------------------------------------------------------- the vectors

def _fp(model, first_layer, layer_count, dtype, kv_heads, head_dim, tokens_per_block,
        tp_rank, tp_size, layout_version=1):
    return dict(model=model, first_layer=first_layer, layer_count=layer_count, dtype=dtype,
                kv_heads=kv_heads, head_dim=head_dim, tokens_per_block=tokens_per_block,
                tp_rank=tp_rank, tp_size=tp_size, layout_version=layout_version)


LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FINGERPRINTS = [
    ("llama8b", _fp(LLAMA, 0, 32, "bf16", 8, 128, 16, 0, 1)),
    ("llama8b_tp2_r0", _fp(LLAMA, 0, 32, "bf16", 4, 128, 16, 0, 2)),
    ("llama8b_tp2_r1", _fp(LLAMA, 0, 32, "bf16", 4, 128, 16, 1, 2)),
    ("qwen7b_fp8_l14", _fp("Qwen/Qwen2.5-7B-Instruct", 14, 14, "fp8_e4m3", 4, 128, 16, 0, 1)),
    ("llama8b_tpb32", _fp(LLAMA, 0, 32, "bf16", 8, 128, 32, 0, 1)),
    # A model id with a space and non-ASCII bytes (percent-encoded in the vectors).
    ("tiny_tpb1", _fp("acme/tiny model \u00fc", 0, 2, "fp32", 1, 64, 1, 0, 1, layout_version=2)),
]

BLOCK0 = [128000, 791, 6864, 315, 9822, 374, 12366, 13, 578, 6864, 315, 9635, 374, 20023, 13, 578]
BLOCK1 = [6864, 315, 15704, 374, 22463, 13, 0, 1, 2, 3, 4294967295, 4294967294, 65535, 65536,
          16777216, 7]
BLOCK2 = [100 + i for i in range(16)]
BLOCK_TPB32 = BLOCK0 + BLOCK1

# (name, namespace, fingerprint name, parent vector name or "root", tokens, extra keys)
VECTORS = [
    ("first_block", "tenant-a", "llama8b", "root", BLOCK0, []),
    ("second_block", "tenant-a", "llama8b", "first_block", BLOCK1, []),
    ("third_block_two_extra", "tenant-a", "llama8b", "second_block", BLOCK2,
     ["lora:42", "mm:sha256:9f86d081884c7d65"]),
    ("first_block_one_extra", "tenant-a", "llama8b", "root", BLOCK0, ["lora:42"]),
    ("first_block_two_extra", "tenant-a", "llama8b", "root", BLOCK0, ["lora:42", "salt=s1"]),
    ("first_block_empty_extra", "tenant-a", "llama8b", "root", BLOCK0, [""]),
    ("other_tenant", "tenant-b", "llama8b", "root", BLOCK0, []),
    ("empty_tenant", "", "llama8b", "root", BLOCK0, []),
    ("tp_rank0", "tenant-a", "llama8b_tp2_r0", "root", BLOCK0, []),
    ("tp_rank1", "tenant-a", "llama8b_tp2_r1", "root", BLOCK0, []),
    ("other_model_fp8", "tenant-a", "qwen7b_fp8_l14", "root", BLOCK0, []),
    ("tokens_per_block_32", "tenant-a", "llama8b_tpb32", "root", BLOCK_TPB32, []),
    ("tokens_per_block_1", "tenant a/\u00e9", "tiny_tpb1", "root", [4294967295],
     ["a b", "%"]),
]

_UNRESERVED = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/:+@")


def pct(text):
    """Percent-encodes the UTF-8 bytes of `text`: unreserved bytes stay, others become %XX."""
    return "".join(chr(b) if b in _UNRESERVED else "%%%02X" % b for b in text.encode("utf-8"))


def golden_text():
    fps = dict(FINGERPRINTS)
    lines = ["# kvfabric block-key golden vectors, encoding v1 (generated by "
             "tools/block_key_reference.py)"]
    for name, fp in FINGERPRINTS:
        lines.append(
            "fingerprint %s model=%s first_layer=%d layer_count=%d dtype=%s kv_heads=%d "
            "head_dim=%d tokens_per_block=%d tp_rank=%d tp_size=%d layout_version=%d" % (
                name, pct(fp["model"]), fp["first_layer"], fp["layer_count"], fp["dtype"],
                fp["kv_heads"], fp["head_dim"], fp["tokens_per_block"], fp["tp_rank"],
                fp["tp_size"], fp["layout_version"]))
        lines.append("digest %s sha256=%s" % (name, fingerprint_digest(fp).hex()))
    keys = {"root": ROOT_PARENT}
    for name, ns, fp_name, parent, tokens, extra in VECTORS:
        assert name not in keys
        fields = ["input", name, "ns=" + pct(ns), "fp=" + fp_name, "parent=" + parent,
                  "tokens=" + ",".join(str(t) for t in tokens)]
        fields.extend("extra=" + pct(e) for e in extra)
        lines.append(" ".join(fields))
        key = block_key(ns, fps[fp_name], keys[parent], tokens, extra)
        keys[name] = key
        lines.append("vector %s key=%s" % (name, key.hex()))
    return "\n".join(lines) + "\n"


def _doc_block(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index("```kvfabric-golden") + 1
    end = lines.index("```", start)
    return "\n".join(lines[start:end]) + "\n"


def main(argv):
    text = golden_text()
    if len(argv) >= 2 and argv[1] == "--check":
        path = argv[2] if len(argv) > 2 else os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "docs", "block-key.md")
        if _doc_block(path) != text:
            sys.stderr.write("block_key_reference: %s differs from the reference output\n" % path)
            return 1
        print("block_key_reference: %s matches (%d vectors)" % (path, len(VECTORS)))
        return 0
    if len(argv) > 1:
        sys.stderr.write(__doc__)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
