#!/usr/bin/env python3
"""Independent reference implementation of kvfabric block keys (docs/block-key.md).

Standard library only (hashlib, struct, decimal). It is written from the byte
tables in docs/block-key.md, not from the C++ code, so that the two
implementations check each other: this script generates the golden vectors in
the doc, and core/block_key_test.cc (encoding v1) and core/block_key_v2_test.cc
(encoding v2) recompute every one of them in C++.

Usage:
  python3 tools/block_key_reference.py            # print the v1 golden vectors
  python3 tools/block_key_reference.py --v2       # print the v2 golden vectors
  python3 tools/block_key_reference.py --check    # compare both with docs/block-key.md
  python3 tools/block_key_reference.py --check PATH/TO/block-key.md

The printed text is exactly the body of the ```kvfabric-golden (v1) or
```kvfabric-golden-v2 fenced block in the doc (the format is described there,
sections "Golden vectors" and "Golden vectors v2").
"""

import decimal
import hashlib
import math
import os
import struct
import sys

FINGERPRINT_TAG = b"kvfabric/model-fingerprint/v1"
BLOCK_KEY_TAG = b"kvfabric/block-key/v1"
FINGERPRINT_TAG_V2 = b"kvfabric/model-fingerprint/v2"
BLOCK_KEY_TAG_V2 = b"kvfabric/block-key/v2"
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
    v2 = fp.get("key_version", 1) == 2
    if v2 and fp["vocab_size"]:
        assert all(t < fp["vocab_size"] for t in tokens), "token id outside the vocabulary"
    tag = BLOCK_KEY_TAG_V2 if v2 else BLOCK_KEY_TAG
    digest = fingerprint_digest_v2(fp) if v2 else fingerprint_digest(fp)
    parts = [lp(tag), lp(ns), digest, parent, u32(len(tokens))]
    parts.extend(u32(t) for t in tokens)
    parts.append(u32(len(extra)))
    for e in extra:
        data = e.encode("utf-8")
        assert len(data) <= MAX_STRING_BYTES
        parts.append(lp(data))
    return hashlib.sha256(b"".join(parts)).digest()


# ---------------------------------------------------------------- encoding v2

MAX_WEIGHTS_REVISION_BYTES = 256
MAX_QUANTIZATION_BYTES = 64
MAX_KV_SCALE_SCHEME_BYTES = 64
MAX_ROPE_BYTES = 256


def fingerprint_message_v2(fp):
    """The v1 fields under the v2 tag, then the v2 fields (doc section 6.1)."""
    rev = fp["weights_revision"].encode("utf-8")
    quant = fp["quantization"].encode("utf-8")
    scheme = fp["kv_scale_scheme"].encode("utf-8")
    scales = fp["kv_scales_digest"]
    rope = fp["rope"].encode("utf-8")
    assert len(rev) <= MAX_WEIGHTS_REVISION_BYTES and len(quant) <= MAX_QUANTIZATION_BYTES
    assert len(scheme) <= MAX_KV_SCALE_SCHEME_BYTES and len(rope) <= MAX_ROPE_BYTES
    assert len(scales) == 32 and (scheme == b"") == (scales == bytes(32))
    assert rope == b"" or rope_is_canonical(fp["rope"])
    v1 = fingerprint_message(fp)[4 + len(FINGERPRINT_TAG):]  # the v1 fields after the tag
    v_head_dim = fp["v_head_dim"] or fp["head_dim"]  # hashed as its effective value
    return b"".join([lp(FINGERPRINT_TAG_V2), v1, lp(rev), lp(quant), lp(scheme), scales,
                     lp(rope), u32(v_head_dim), u32(fp["vocab_size"])])


def fingerprint_digest_v2(fp):
    return hashlib.sha256(fingerprint_message_v2(fp)).digest()


def kv_scales_digest(k_scales, v_scales, layers):
    """SHA-256 over each layer's k scales then v scales, f32 LE (doc section 6.3)."""
    assert layers > 0 and k_scales and len(k_scales) == len(v_scales)
    assert len(k_scales) % layers == 0
    n = len(k_scales) // layers
    out = []
    for layer in range(layers):
        for scales in (k_scales, v_scales):
            for value in scales[layer * n:(layer + 1) * n]:
                assert math.isfinite(value) and value > 0
                out.append(struct.pack("<f", value))
    return hashlib.sha256(b"".join(out)).digest()


def rope_number(value):
    """Shortest round-trip decimal of a binary64, without exponent (doc section 6.4)."""
    value = float(value)
    assert math.isfinite(value)
    if value == 0:
        return "0"
    # repr() is the shortest round-trip form; Decimal writes it out positionally.
    return format(decimal.Decimal(repr(value)).normalize(decimal.Context(prec=40)), "f")


def rope_canonical(params):
    """The canonical RoPE string of a dict: keys sorted, numbers canonical."""
    pairs = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = rope_number(value)
        elif isinstance(value, (list, tuple)):
            text = ",".join(rope_number(v) for v in value)
        else:
            text = str(value)
        pairs.append("%s=%s" % (key, text))
    return ";".join(pairs)


def rope_is_canonical(text):
    params = {}
    for pair in text.split(";"):
        key, _, value = pair.partition("=")
        if value[:1] == "-" or value[:1].isdigit():
            nums = [float(v) for v in value.split(",")]
            params[key] = nums[0] if len(nums) == 1 else nums
        else:
            params[key] = value
    return rope_canonical(params) == text


def extra_keys_per_block(token_count, tokens_per_block, lora="", mm=(), salt=""):
    """The canonical extra keys of each block of a request (doc section 6.5).

    mm holds (sha256 hex, offset, length) per multimodal input."""
    blocks = -(-token_count // tokens_per_block)
    out = [["lora:" + lora] if lora else [] for _ in range(blocks)]
    spans = sorted((offset, length, digest.lower()) for digest, offset, length in mm)
    end = 0
    for offset, length, digest in spans:
        assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        assert length >= 1 and offset >= end and offset + length <= token_count
        end = offset + length
        for b in range(offset // tokens_per_block, (offset + length - 1) // tokens_per_block + 1):
            out[b].append("mm:%s:%d:%d" % (digest, offset, length))
    if salt and blocks:
        out[0].append("salt:" + salt)
    return out


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

# ---------------------------------------------------------------- the v2 vectors

LLAMA_REVISION = "0e9e39f249a16976918f6564b8830bc894c89659"
LLAMA_ROPE = rope_canonical({"theta": 500000.0, "scaling": "llama3", "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192})
LLAMA_VOCAB = 128256

# Per-tensor fp8 scales of a 2-layer group (k then v per layer), exact in binary32.
SCALES = [
    ("per_tensor_a", 2, [0.5, 0.25], [0.75, 1.5]),
    ("per_tensor_b", 2, [0.5, 0.25], [0.75, 1.25]),
    ("per_head_2x2", 2, [0.5, 0.25, 0.125, 1.0], [2.0, 0.0625, 3.5, 0.375]),
]
SCALE_DIGESTS = {name: kv_scales_digest(k, v, layers) for name, layers, k, v in SCALES}


def _fp2(base, **changes):
    fp = dict(base)
    fp.update(changes)
    return fp


LLAMA_V2 = dict(_fp(LLAMA, 0, 32, "bf16", 8, 128, 16, 0, 1), key_version=2,
                weights_revision=LLAMA_REVISION, quantization="", kv_scale_scheme="",
                kv_scales_digest=bytes(32), rope=LLAMA_ROPE, v_head_dim=0, vocab_size=LLAMA_VOCAB)
SMALL_FP8 = dict(_fp("acme/small-fp8", 0, 2, "fp8_e4m3", 2, 64, 16, 0, 1), key_version=2,
                 weights_revision="", quantization="fp8", kv_scale_scheme="",
                 kv_scales_digest=bytes(32), rope="theta=10000", v_head_dim=0, vocab_size=0)
MLA = dict(_fp("acme/mla-like", 0, 4, "bf16", 1, 192, 16, 0, 1), key_version=2,
           weights_revision="", quantization="", kv_scale_scheme="", kv_scales_digest=bytes(32),
           rope="", v_head_dim=0, vocab_size=0)

# Each fingerprint after the first two differs from its base in one v2 field only.
FINGERPRINTS_V2 = [
    ("llama8b_v2", LLAMA_V2),
    # The v1 fingerprint llama8b under encoding v2: every v2 field at its default.
    ("llama8b_v2_defaults", _fp2(LLAMA_V2, weights_revision="", rope="", vocab_size=0)),
    ("llama8b_v2_revision", _fp2(LLAMA_V2, weights_revision="5206a32e0bd3067aef1ce90f5528ade7d866253f")),
    ("llama8b_v2_awq", _fp2(LLAMA_V2, quantization="awq-int4")),
    ("llama8b_v2_rope_theta", _fp2(LLAMA_V2, rope=rope_canonical({"theta": 1e6}))),
    ("llama8b_v2_vocab_unstated", _fp2(LLAMA_V2, vocab_size=0)),
    ("small_fp8_unscaled", SMALL_FP8),
    ("small_fp8_scales_a", _fp2(SMALL_FP8, kv_scale_scheme="fp8-per-tensor",
                                kv_scales_digest=SCALE_DIGESTS["per_tensor_a"])),
    ("small_fp8_scales_b", _fp2(SMALL_FP8, kv_scale_scheme="fp8-per-tensor",
                                kv_scales_digest=SCALE_DIGESTS["per_tensor_b"])),
    ("small_fp8_per_head", _fp2(SMALL_FP8, kv_scale_scheme="fp8-per-head",
                                kv_scales_digest=SCALE_DIGESTS["per_head_2x2"])),
    ("mla_equal_heads", MLA),
    # v_head_dim = head_dim is hashed as 0 is: the same digest as mla_equal_heads.
    ("mla_v_head_dim_192", _fp2(MLA, v_head_dim=192)),
    ("mla_v_head_dim_128", _fp2(MLA, v_head_dim=128)),
]

# A request of 40 tokens (two full blocks and a tail) with an adapter, one image
# whose 20 placeholder tokens [10, 30) straddle blocks 0 and 1, and a salt.
IMAGE_SHA256 = hashlib.sha256(b"kvfabric golden image").hexdigest()
REQUEST_TOKENS = [128000] + [100 + i for i in range(9)] + [128256 - 1] * 20 + \
    [200 + i for i in range(10)]
REQUEST_EXTRAS = extra_keys_per_block(len(REQUEST_TOKENS), 16, lora="acme/sql-adapter@3",
                                      mm=[(IMAGE_SHA256, 10, 20)], salt="s3cr3t")

VECTORS_V2 = [
    ("v2_first_block", "tenant-a", "llama8b_v2", "root", BLOCK0, []),
    ("v2_second_block", "tenant-a", "llama8b_v2", "v2_first_block",
     [6864, 315, 15704, 374, 22463, 13, 0, 1, 2, 3, 128255, 128254, 65535, 65536, 7, 8], []),
    ("v2_defaults", "tenant-a", "llama8b_v2_defaults", "root", BLOCK0, []),
    ("v2_revision", "tenant-a", "llama8b_v2_revision", "root", BLOCK0, []),
    ("v2_awq", "tenant-a", "llama8b_v2_awq", "root", BLOCK0, []),
    ("v2_rope_theta", "tenant-a", "llama8b_v2_rope_theta", "root", BLOCK0, []),
    ("v2_vocab_unstated", "tenant-a", "llama8b_v2_vocab_unstated", "root", BLOCK0, []),
    ("v2_vocab_unstated_any_id", "tenant-a", "llama8b_v2_vocab_unstated", "root", BLOCK1, []),
    ("v2_fp8_unscaled", "tenant-a", "small_fp8_unscaled", "root", BLOCK2, []),
    ("v2_fp8_scales_a", "tenant-a", "small_fp8_scales_a", "root", BLOCK2, []),
    ("v2_fp8_scales_b", "tenant-a", "small_fp8_scales_b", "root", BLOCK2, []),
    ("v2_fp8_per_head", "tenant-a", "small_fp8_per_head", "root", BLOCK2, []),
    ("v2_mla_equal", "tenant-a", "mla_equal_heads", "root", BLOCK2, []),
    ("v2_mla_v128", "tenant-a", "mla_v_head_dim_128", "root", BLOCK2, []),
    ("v2_request_block0", "tenant-a", "llama8b_v2", "root", REQUEST_TOKENS[0:16],
     REQUEST_EXTRAS[0]),
    ("v2_request_block1", "tenant-a", "llama8b_v2", "v2_request_block0", REQUEST_TOKENS[16:32],
     REQUEST_EXTRAS[1]),
    ("v2_request_block0_no_salt", "tenant-a", "llama8b_v2", "root", REQUEST_TOKENS[0:16],
     REQUEST_EXTRAS[0][:-1]),
]

_UNRESERVED = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/:+@")


def pct(text):
    """Percent-encodes the UTF-8 bytes of `text`: unreserved bytes stay, others become %XX."""
    return "".join(chr(b) if b in _UNRESERVED else "%%%02X" % b for b in text.encode("utf-8"))


def _v1_fingerprint_fields(fp):
    return ("model=%s first_layer=%d layer_count=%d dtype=%s kv_heads=%d head_dim=%d "
            "tokens_per_block=%d tp_rank=%d tp_size=%d layout_version=%d" % (
                pct(fp["model"]), fp["first_layer"], fp["layer_count"], fp["dtype"],
                fp["kv_heads"], fp["head_dim"], fp["tokens_per_block"], fp["tp_rank"],
                fp["tp_size"], fp["layout_version"]))


def _vector_lines(fingerprints, vectors):
    """The input and vector records of `vectors`, keyed under `fingerprints`."""
    fps = dict(fingerprints)
    lines = []
    keys = {"root": ROOT_PARENT}
    for name, ns, fp_name, parent, tokens, extra in vectors:
        assert name not in keys
        fields = ["input", name, "ns=" + pct(ns), "fp=" + fp_name, "parent=" + parent,
                  "tokens=" + ",".join(str(t) for t in tokens)]
        fields.extend("extra=" + pct(e) for e in extra)
        lines.append(" ".join(fields))
        key = block_key(ns, fps[fp_name], keys[parent], tokens, extra)
        keys[name] = key
        lines.append("vector %s key=%s" % (name, key.hex()))
    return lines


def golden_text():
    lines = ["# kvfabric block-key golden vectors, encoding v1 (generated by "
             "tools/block_key_reference.py)"]
    for name, fp in FINGERPRINTS:
        lines.append("fingerprint %s %s" % (name, _v1_fingerprint_fields(fp)))
        lines.append("digest %s sha256=%s" % (name, fingerprint_digest(fp).hex()))
    lines.extend(_vector_lines(FINGERPRINTS, VECTORS))
    return "\n".join(lines) + "\n"


def golden_text_v2():
    lines = ["# kvfabric block-key golden vectors, encoding v2 (generated by "
             "tools/block_key_reference.py --v2)"]
    for name, layers, k, v in SCALES:
        lines.append("scales %s layers=%d k=%s v=%s sha256=%s" % (
            name, layers, ",".join(repr(x) for x in k), ",".join(repr(x) for x in v),
            SCALE_DIGESTS[name].hex()))
    for name, fp in FINGERPRINTS_V2:
        lines.append(
            "fingerprint %s %s weights_revision=%s quantization=%s kv_scale_scheme=%s "
            "kv_scales_digest=%s rope=%s v_head_dim=%d vocab_size=%d" % (
                name, _v1_fingerprint_fields(fp), pct(fp["weights_revision"]),
                pct(fp["quantization"]), pct(fp["kv_scale_scheme"]),
                fp["kv_scales_digest"].hex(), pct(fp["rope"]), fp["v_head_dim"],
                fp["vocab_size"]))
        lines.append("digest %s sha256=%s" % (name, fingerprint_digest_v2(fp).hex()))
    lines.extend(_vector_lines(FINGERPRINTS_V2, VECTORS_V2))
    return "\n".join(lines) + "\n"


def _check_v2_properties():
    """What the v2 vectors are there to show; fails loudly if an edit breaks it."""
    fps = dict(FINGERPRINTS_V2)
    digest = {name: fingerprint_digest_v2(fp).hex() for name, fp in FINGERPRINTS_V2}
    assert digest["mla_v_head_dim_192"] == digest["mla_equal_heads"]
    assert len(set(digest.values())) == len(digest) - 1
    assert fingerprint_digest_v2(fps["llama8b_v2_defaults"]) != fingerprint_digest(
        dict(FINGERPRINTS)["llama8b"])
    for name, fp in FINGERPRINTS_V2[2:]:
        base = fps["small_fp8_unscaled" if "fp8" in name else
                   "mla_equal_heads" if "mla" in name else "llama8b_v2"]
        changed = [k for k in fp if fp[k] != base[k]]
        assert set(changed) <= {"weights_revision", "quantization", "kv_scale_scheme",
                                "kv_scales_digest", "rope", "v_head_dim", "vocab_size"}, name


def _doc_block(path, info):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index("```" + info) + 1
    end = lines.index("```", start)
    return "\n".join(lines[start:end]) + "\n"


def main(argv):
    _check_v2_properties()
    if len(argv) >= 2 and argv[1] == "--check":
        path = argv[2] if len(argv) > 2 else os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "docs", "block-key.md")
        failed = False
        for info, text in (("kvfabric-golden", golden_text()),
                           ("kvfabric-golden-v2", golden_text_v2())):
            if _doc_block(path, info) != text:
                sys.stderr.write("block_key_reference: the %s block of %s differs from the "
                                 "reference output\n" % (info, path))
                failed = True
        if failed:
            return 1
        print("block_key_reference: %s matches (%d v1 vectors, %d v2 vectors)" % (
            path, len(VECTORS), len(VECTORS_V2)))
        return 0
    if argv[1:] == ["--v2"]:
        sys.stdout.write(golden_text_v2())
        return 0
    if len(argv) > 1:
        sys.stderr.write(__doc__)
        return 2
    sys.stdout.write(golden_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
