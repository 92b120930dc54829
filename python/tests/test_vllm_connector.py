"""The vLLM connector proof: a PyTorch decoder with vLLM's paged KV cache,
driven in the order vLLM's scheduler and workers call a KV connector, with
kvfabric loading cached prefixes, generates exactly the tokens and final
logits of full recompute; the fraction of prefill skipped and the time to
first token with and without the cache are printed."""

import random
import types

import pytest
import torch

import kvfabric
from kvfabric.integrations import vllm as kvf_vllm
from tiny_engine import Engine, Request, TinyConfig, TinyDecoder

CONFIG = TinyConfig()
BS = CONFIG.block_size


def vllm_config(cluster, prefill=None, max_model_len=4096):
    """The parts of vLLM's VllmConfig the connector reads."""
    extra = {"placement_address": cluster.placement_address,
             "security": {"insecure": True},
             "namespace_name": "vllm-test"}
    if prefill is not None:
        extra["prefill"] = prefill
    model_config = types.SimpleNamespace(
        model="kvfabric-test/tiny-decoder", revision="seed-7", dtype=torch.float32,
        max_model_len=max_model_len, quantization=None,
        get_vocab_size=lambda: CONFIG.vocab,
        get_num_layers=lambda pc: CONFIG.layers,
        get_num_kv_heads=lambda pc: CONFIG.kv_heads,
        get_head_size=lambda: CONFIG.head_dim)
    return types.SimpleNamespace(
        model_config=model_config,
        cache_config=types.SimpleNamespace(block_size=BS, cache_dtype="auto"),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, rank=0),
        kv_transfer_config=types.SimpleNamespace(
            kv_connector="KvfabricConnector",
            kv_connector_module_path="kvfabric.integrations.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra))


def factory(cluster, **kw):
    config = vllm_config(cluster, **kw)
    roles = {"scheduler": kvf_vllm.KVConnectorRole.SCHEDULER,
             "worker": kvf_vllm.KVConnectorRole.WORKER}
    return lambda role: kvf_vllm.KvfabricConnector(config, roles[role])


def run(model, requests, connector_factory=None, preempt=None, pages=512):
    engine = Engine(model, pages, connector_factory)
    engine.preempt_at = dict(preempt or {})
    for r in requests:
        engine.add(r)
    engine.run()
    return engine


def clone(requests):
    return [Request(r.request_id, r.prompt_token_ids, r.max_tokens) for r in requests]


# Placement plans with a stated prefill cost; this one makes fetching cached
# blocks the cheaper choice on any machine, so the test sees loads.
COSTLY_PREFILL = {"c0_us": 1e4, "c1_us_per_token": 1e3}


def test_loaded_prefixes_give_the_tokens_and_logits_of_full_recompute(cluster, seed):
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = random.Random(seed)
    model = TinyDecoder(CONFIG, seed=7)

    def tokens(n):
        return [rng.randrange(CONFIG.vocab) for _ in range(n)]

    system = tokens(10 * BS)  # cached by the first engine
    shared = tokens(6 * BS + 5)  # first seen by r3, reused by r4
    warm = [Request("warm", system + tokens(21), 4)]
    wave1 = [Request("partly-cached", system + tokens(37), 6),
             Request("shares-prefix-1", system + shared + tokens(9), 5),
             Request("preempted", system + tokens(3 * BS + 2), 12)]
    wave2 = [Request("shares-prefix-2", system + shared + tokens(23), 5)]

    make = factory(cluster, prefill=COSTLY_PREFILL)
    first = run(model, warm, make)
    assert first.scheduler.stats["tokens_loaded"] == 0

    # A second engine (a new vLLM instance) over the same cluster.
    engine = Engine(model, 512, make)
    engine.preempt_at = {"preempted": 5}
    for r in wave1:
        engine.add(r)
    engine.run()
    for r in wave2:
        engine.add(r)
    engine.run()
    cached = {**engine.finished}

    # Full recompute, no connector, preempted at the same point (a resumed
    # request recomputes its decoded tokens as one chunk, with or without a
    # connector, which is not bit-identical to decoding them one by one).
    reference = run(model, clone(warm + wave1 + wave2), preempt={"preempted": 5})
    for req_id, r in cached.items():
        ref = reference.finished[req_id]
        assert r.output_token_ids == ref.output_token_ids, req_id
        assert torch.equal(r.final_logits, ref.final_logits), req_id
    stats = engine.scheduler.stats
    skipped = stats["tokens_loaded"] / stats["prompt_tokens"]
    print(f"\nvLLM connector proof (seed {seed}): {len(cached)} requests, prompt tokens "
          f"{stats['prompt_tokens']}, loaded from kvfabric {stats['tokens_loaded']} "
          f"({100 * skipped:.1f}% of prefill skipped); generated tokens and final logits equal "
          f"full recompute bit for bit")
    # The system prompt for every request (the preempted one twice), the
    # shared prefix for its second user.
    assert stats["tokens_loaded"] >= (4 * 10 + 6) * BS
    m = engine.worker.client.metrics()
    assert m["blocks_fetched"] > 0 and m["crc_failures"] == 0
    assert engine.worker.client.metrics()["save_failures"] == 0
    for c in (first, engine):
        c.scheduler.shutdown()
        c.worker.shutdown()


def test_time_to_first_token_with_and_without_the_cache(cluster, seed):
    torch.set_num_threads(1)
    rng = random.Random(seed)
    model = TinyDecoder(CONFIG, seed=11)
    prefix = [rng.randrange(CONFIG.vocab) for _ in range(2048)]

    # The engine's own prefill cost, measured, is what placement decides with.
    probe = Engine(model, 256)
    probe.add(Request("probe", prefix[:512], 1))
    probe.run()
    us_per_token = probe.finished["probe"].first_token_s * 1e6 / 512
    make = factory(cluster, prefill={"c1_us_per_token": us_per_token})

    cold = run(model, [Request("cold", prefix + [1, 2, 3], 1)], make)
    warm = run(model, [Request("warm", prefix + [4, 5, 6], 1)], make)
    nocache = run(model, [Request("none", prefix + [4, 5, 6], 1)])
    t_cold = cold.finished["cold"].first_token_s
    t_warm = warm.finished["warm"].first_token_s
    t_none = nocache.finished["none"].first_token_s
    loaded = warm.scheduler.stats["tokens_loaded"]
    print(f"\ntime to first token, {len(prefix)}-token shared prefix, tiny decoder on this CPU "
          f"(prefill {us_per_token:.0f} us/token): without kvfabric {1e3 * t_none:.1f} ms, "
          f"first request with kvfabric (saves) {1e3 * t_cold:.1f} ms, second request "
          f"{1e3 * t_warm:.1f} ms ({loaded} tokens loaded, {t_none / t_warm:.1f}x faster)")
    assert warm.finished["warm"].output_token_ids == nocache.finished["none"].output_token_ids
    for c in (cold, warm):
        c.scheduler.shutdown()
        c.worker.shutdown()


def test_a_lora_request_never_loads_the_base_models_blocks(cluster, seed):
    rng = random.Random(seed)
    model = TinyDecoder(CONFIG, seed=13)
    prompt = [rng.randrange(CONFIG.vocab) for _ in range(4 * BS + 3)]
    make = factory(cluster, prefill=COSTLY_PREFILL)
    loaded = []
    for req in [Request("base", prompt, 1), Request("lora-1", prompt, 1, lora_name="adapter-a"),
                Request("lora-2", prompt, 1, lora_name="adapter-a"),
                Request("other-adapter", prompt, 1, lora_name="adapter-b")]:
        engine = run(model, [req], make)
        loaded.append(engine.scheduler.stats["tokens_loaded"])
        engine.scheduler.shutdown()
        engine.worker.shutdown()
    # The adapter is in every block's key (lora:<id>): only the same adapter's blocks load.
    assert loaded == [0, 0, 4 * BS, 0]


def test_a_daemon_lost_mid_load_makes_vllm_recompute_the_same_tokens(seed):
    """The only daemon holding a cached prefix is killed after the scheduler
    matched it and before the worker loads: the load fails, the connector
    reports its pages, the engine recomputes them, and the output equals full
    recompute."""
    rng = random.Random(seed)
    model = TinyDecoder(CONFIG, seed=17)
    prompt = [rng.randrange(CONFIG.vocab) for _ in range(6 * BS + 2)]
    with kvfabric.LocalCluster(daemons=1, host_pool_bytes=16 << 20) as lonely:
        make = factory(lonely, prefill=COSTLY_PREFILL)
        first = run(model, [Request("saves", prompt, 2)], make)
        engine = Engine(model, 256, make)
        killed = []

        def kill_before_load(meta):
            if meta.loads and not killed:
                lonely.kill_daemon(0)
                killed.append(len(meta.loads))

        engine.before_worker = kill_before_load
        engine.add(Request("loads", prompt + [5], 3))
        engine.run()
        assert killed == [1]
        assert engine.worker.stats["load_failures"] == 1
        reference = run(model, [Request("ref", prompt + [5], 3)])
        got, want = engine.finished["loads"], reference.finished["ref"]
        assert got.output_token_ids == want.output_token_ids
        assert torch.equal(got.final_logits, want.final_logits)
        for e in (first, engine):
            e.scheduler.shutdown()
            e.worker.shutdown()


def test_the_connector_has_vllms_method_set():
    base = kvf_vllm.KvfabricConnector
    for name in ["get_num_new_matched_tokens", "update_state_after_alloc",
                 "build_connector_meta", "request_finished", "register_kv_caches",
                 "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                 "get_finished", "get_block_ids_with_load_errors", "bind_connector_metadata",
                 "clear_connector_metadata"]:
        assert callable(getattr(base, name)), name
    assert issubclass(base, kvf_vllm.KVConnectorBase_V1)
