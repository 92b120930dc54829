"""Compact copies through the Python package (docs/compact.md): daemons with
their converter on; a saved prompt loads exact by default, and under
``accuracy="compact_after=N"`` its old blocks land compact: ``block_view``
refuses them, ``decode_block`` and ``load_into_kv_cache`` decode them."""

import time

import numpy as np
import pytest
import torch

import kvfabric
from conftest import open_client, small_model

TPB = 16
BLOCKS = 8


def values_for(seed, block, model):
    rng = np.random.default_rng(seed * 1000 + block)
    n = model.block_bytes() // 4
    return rng.uniform(-1.0, 1.0, n).astype(np.float32)


@pytest.fixture(scope="module")
def compact_cluster():
    with kvfabric.LocalCluster(daemons=1, host_pool_bytes=64 << 20,
                               daemon_args=["--compact-threads=1"]) as c:
        yield c


def test_compact_after_loads_old_blocks_compact_and_exact_never_does(compact_cluster, seed):
    model = small_model(model_id="python-test/compact")
    prompt = list(range(seed % 1000, seed % 1000 + BLOCKS * TPB))

    def prefill(request, out):
        size = model.block_bytes()
        for i in range(request.block_count):
            b = request.first_block + i
            out[i * size:(i + 1) * size] = values_for(seed, b, model).tobytes()

    costly = {"c0_us": 1e5, "c1_us_per_token": 1e3}
    with open_client(compact_cluster, model=model, recompute=prefill, prefill=costly,
                     compact_extra_decode_us_per_token=0.0) as client:
        keys = client.key_tokens(prompt)
        ctx = client.new_context(len(prompt))
        client.load(client.match(keys), ctx)
        for layer in range(model.layer_count):
            client.wait_layer(ctx, layer)
            client.save(ctx, layer, 0, keys)
        assert client.finish(ctx).blocks_written == BLOCKS

        # The daemon converts in the background; placement lists the copies
        # after its next report. A plan made while placement lists the
        # compact copies but not (yet or again) the exact ones says
        # "compact-where-gone" (seen once in five runs on a loaded 2-vCPU VM):
        # wait for both.
        after = 2 * TPB
        old = (BLOCKS * TPB - after) // TPB  # blocks 0..5 may be compact
        deadline = time.monotonic() + 30
        while True:
            plan = client.match(keys, accuracy=f"compact_after={after}", explain=True)
            if (sum(r.block_count for r in plan.runs if r.compact) == old
                    and plan.representation == "compact"):
                break
            assert time.monotonic() < deadline, plan.explanation
            time.sleep(0.1)
        assert plan.representation == "compact"

        exact = client.match(keys)
        assert exact.representation == "exact" and not any(r.compact for r in exact.runs)

        ctx = client.new_context(len(prompt))
        client.load(plan, ctx)
        for layer in range(model.layer_count):
            client.wait_layer(ctx, layer)
        tensors = [torch.zeros(2, BLOCKS, TPB, model.kv_heads, model.head_dim)
                   for _ in range(model.layer_count)]
        cache = client.register_kv_cache(tensors)
        for b in range(BLOCKS):
            want = values_for(seed, b, model)
            got = np.frombuffer(client.decode_block(ctx, b), dtype=np.float32)
            if b < old:
                assert client.block_is_compact(ctx, b)
                with pytest.raises(kvfabric.FailedPrecondition):
                    client.block_view(ctx, b)
                # Half a step of at most 1/127 (|x| < 1) plus the scale's fp16 rounding.
                assert np.max(np.abs(got - want)) <= 0.5 / 127 + 1e-3
            else:
                assert not client.block_is_compact(ctx, b)
                assert np.array_equal(got, want)
        for layer in range(model.layer_count):
            client.load_into_kv_cache(ctx, cache, layer, list(range(BLOCKS)))
        # The engine's pages hold the decoded values ([layers][K, V][T][H][D] per block).
        for b in range(BLOCKS):
            got = torch.from_numpy(np.frombuffer(client.decode_block(ctx, b), dtype=np.float32)
                                   .reshape(model.layer_count, 2, TPB, model.kv_heads,
                                            model.head_dim).copy())
            for layer in range(model.layer_count):
                assert torch.equal(tensors[layer][:, b], got[layer]), (b, layer)
        with pytest.raises(kvfabric.FailedPrecondition):
            client.save(ctx, 0, 0, keys[:1])  # a compact block is never written back as exact
        report = client.finish(ctx)
        assert report.blocks_recomputed == 0
        m = client.metrics()
        assert m["compact_blocks_fetched"] == old and m["plans_with_compact"] >= 1
