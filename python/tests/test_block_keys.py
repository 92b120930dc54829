"""kvfabric.compute_block_keys against the golden vectors of docs/block-key.md
(its fenced kvfabric-golden block), as core/block_key_test.cc checks the C++."""

import os
import re
import urllib.parse

import pytest

import kvfabric

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "block-key.md")
INT_FIELDS = {"first_layer", "layer_count", "kv_heads", "head_dim", "tokens_per_block",
              "tp_rank", "tp_size", "layout_version", "v_head_dim", "vocab_size"}


def golden_records(info):
    with open(DOC) as f:
        text = f.read()
    block = re.search(r"```" + info + r"\n(.*?)```", text, re.S)
    assert block, f"no {info} block in docs/block-key.md"
    for line in block.group(1).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, name, *fields = line.split(" ")
        yield kind, name, [(k, urllib.parse.unquote_to_bytes(v))
                           for k, v in (f.split("=", 1) for f in fields)]


def key_of(name, inputs, fingerprints):
    """Vector `name`'s key: its chain's tokens keyed from the root, each block
    with its own extra keys (whole-sequence keying, as the C++ test does)."""
    d = dict(inputs[name])
    ns, fp = d["ns"].decode(), fingerprints[d["fp"].decode()]
    chain, extras = [], []
    while name != "root":
        fields = inputs[name]
        d = dict(fields)
        tokens = [int(t) for t in d["tokens"].decode().split(",")]
        extra = [v for k, v in fields if k == "extra"]
        chain = tokens + chain
        extras = [extra] * (len(tokens) // fp["tokens_per_block"]) + extras
        name = d["parent"].decode()
    return kvfabric.compute_block_keys(fp, chain, ns, extras)[-1]


def check_golden(info, key_version):
    fingerprints, inputs, checked = {}, {}, 0
    for kind, name, fields in golden_records(info):
        d = dict(fields)
        if kind == "fingerprint":
            fp = {"model_id": d.pop("model").decode(), "dtype": d.pop("dtype").decode(),
                  "key_version": key_version}
            for k, v in d.items():
                if k in INT_FIELDS:
                    fp[k] = int(v)
                elif k == "kv_scales_digest":
                    fp[k] = bytes.fromhex(v.decode())
                else:
                    fp[k] = v.decode()
            fingerprints[name] = fp
        elif kind == "digest":
            assert kvfabric.fingerprint_digest(fingerprints[name]).hex() == d["sha256"].decode()
            checked += 1
        elif kind == "scales":
            k = [float(x) for x in d["k"].decode().split(",")]
            v = [float(x) for x in d["v"].decode().split(",")]
            got = kvfabric.kv_scales_digest(k, v, int(d["layers"]))
            assert got.hex() == d["sha256"].decode(), name
            checked += 1
        elif kind == "input":
            inputs[name] = fields
        elif kind == "vector":
            assert key_of(name, inputs, fingerprints).hex() == d["key"].decode(), name
            checked += 1
    return checked


def test_the_golden_vectors_of_encoding_v1():
    assert check_golden("kvfabric-golden", key_version=1) >= 14


def test_the_golden_vectors_of_encoding_v2():
    assert check_golden("kvfabric-golden-v2", key_version=2) >= 30


def test_extra_keys_follow_the_carrying_rule():
    per_block = kvfabric.extra_keys_per_block(40, 16, lora_id="adapter-7",
                                              multimodal=[("ab" * 32, 10, 12)], cache_salt="s")
    assert len(per_block) == 3
    assert per_block[0] == [b"lora:adapter-7", b"mm:" + b"ab" * 32 + b":10:12", b"salt:s"]
    assert per_block[1] == [b"lora:adapter-7", b"mm:" + b"ab" * 32 + b":10:12"]
    assert per_block[2] == [b"lora:adapter-7"]
    with pytest.raises(kvfabric.InvalidArgument):
        kvfabric.extra_keys_per_block(40, 16, multimodal=[("zz", 0, 1)])


def test_a_stated_vocabulary_refuses_token_ids_outside_it():
    model = kvfabric.ModelFingerprint(model_id="m", layer_count=1, kv_heads=1, head_dim=8,
                                      tokens_per_block=2, vocab_size=100)
    assert len(kvfabric.compute_block_keys(model, [1, 99])) == 1
    with pytest.raises(kvfabric.InvalidArgument, match="100"):
        kvfabric.compute_block_keys(model, [1, 100])
    v1 = kvfabric.ModelFingerprint(model_id="m", layer_count=1, kv_heads=1, head_dim=8,
                                   key_version=1, vocab_size=100)
    with pytest.raises(kvfabric.InvalidArgument, match="key_version"):
        v1.digest()


def test_a_token_id_past_32_bits_is_refused():
    model = kvfabric.ModelFingerprint(model_id="m", layer_count=1, kv_heads=1, head_dim=8,
                                      tokens_per_block=1)
    with pytest.raises(kvfabric.InvalidArgument):
        kvfabric.compute_block_keys(model, [1 << 32])
