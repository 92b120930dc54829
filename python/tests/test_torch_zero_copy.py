"""Loads land in the engine's own registered torch tensors and saves read
them, with no copy on the Python side: the bytes in the tensor equal the
generator's, and the tensors are the very ones registered (data pointers)."""

import random

import torch

from conftest import open_client, small_model

TPB = 16


def test_loads_land_in_registered_tensors_and_saves_read_them(cluster, seed):
    torch.manual_seed(seed)
    model = small_model(model_id="python-test/zero-copy")
    layers, heads, dim = model.layer_count, model.kv_heads, model.head_dim
    num_pages, blocks = 12, 5
    prompt = [random.Random(seed).randrange(1 << 20) for _ in range(blocks * TPB)]
    costly = {"c0_us": 1e5, "c1_us_per_token": 1e3}

    # The engine's KV cache: its values are the engine's prefill output.
    engine_cache = [torch.randn(2, num_pages, TPB, heads, dim) for _ in range(layers)]
    pages = [7, 3, 11, 0, 5]  # the request's block table
    with open_client(cluster, prefill=costly) as writer:
        cache = writer.register_kv_cache(engine_cache)
        keys = writer.key_tokens(prompt)
        ctx = writer.new_context(len(prompt))
        for layer in range(layers):
            writer.save_from_kv_cache(ctx, cache, layer, pages, keys)
        assert writer.finish(ctx).blocks_written == blocks

    # Another engine loads the prompt into its own cache, other pages.
    target = [torch.zeros(2, num_pages, TPB, heads, dim) for _ in range(layers)]
    pointers = [t.data_ptr() for t in target]
    other_pages = [1, 2, 9, 4, 10]
    with open_client(cluster, prefill=costly) as reader:
        cache = reader.register_kv_cache(target)
        plan = reader.match(reader.key_tokens(prompt))
        assert plan.kind == "fetch_all", plan.kind
        ctx = reader.new_context(len(prompt))
        reader.load(plan, ctx)
        for layer in range(layers):
            reader.wait_layer(ctx, layer)
            reader.load_into_kv_cache(ctx, cache, layer, other_pages)
        # The history pool's page as a tensor, no copy: same address.
        view = reader.block_view(ctx, 0)
        as_tensor = torch.frombuffer(view, dtype=torch.float32)
        assert as_tensor.data_ptr() == reader._native.block_view(ctx, 0).address
        k0 = engine_cache[0][0, pages[0]].flatten()
        assert torch.equal(as_tensor[:k0.numel()], k0)
        reader.finish(ctx)
    assert [t.data_ptr() for t in target] == pointers  # the registered tensors themselves
    for layer in range(layers):
        for src, dst in zip(pages, other_pages):
            assert torch.equal(target[layer][:, dst], engine_cache[layer][:, src]), (layer, dst)
        untouched = [p for p in range(num_pages) if p not in other_pages]
        assert not target[layer][:, untouched].any()


def test_registration_refuses_tensors_that_do_not_fit_the_model(cluster):
    import pytest

    import kvfabric

    model = small_model()
    with open_client(cluster) as client:
        with pytest.raises(kvfabric.InvalidArgument, match="shape"):
            client.register_kv_cache([torch.zeros(2, 4, TPB, model.kv_heads + 1, model.head_dim)
                                      for _ in range(model.layer_count)])
        with pytest.raises(kvfabric.InvalidArgument, match="dtype"):
            client.register_kv_cache([torch.zeros(2, 4, TPB, model.kv_heads, model.head_dim,
                                                  dtype=torch.float16)
                                      for _ in range(model.layer_count)])
        with pytest.raises(kvfabric.InvalidArgument, match="layer"):
            client.register_kv_cache([torch.zeros(2, 4, TPB, model.kv_heads, model.head_dim)])
        cache = client.register_kv_cache([torch.zeros(2, 4, TPB, model.kv_heads, model.head_dim)
                                          for _ in range(model.layer_count)])
        ctx = client.new_context(TPB)
        with pytest.raises(kvfabric.OutOfRange):
            client.load_into_kv_cache(ctx, cache, 0, [4])  # page 4 of 4
        client.finish(ctx)
