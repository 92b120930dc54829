"""kvfabric.Client against real daemons: a prompt saved by one client is
loaded byte for byte by another, into the pinned history pool itself; errors
are exceptions with codes; blocking calls release the GIL."""

import random
import threading

import pytest

import kvfabric
from conftest import open_client, small_model

TPB = 16


def block_bytes_for(seed, block, size):
    return random.Random(seed * 1_000_003 + block).randbytes(size)


class Prefill:
    """A recompute callable: writes generator bytes for each requested block
    and records the calls."""

    def __init__(self, seed, block_size):
        self.seed = seed
        self.block_size = block_size
        self.calls = []

    def __call__(self, request, out):
        self.calls.append((request.first_block, request.block_count))
        for i in range(request.block_count):
            b = request.first_block + i
            out[i * self.block_size:(i + 1) * self.block_size] = block_bytes_for(
                self.seed, b, self.block_size)


def test_a_saved_prompt_loads_byte_for_byte_into_the_pool_with_no_copy(cluster, seed):
    model = small_model()
    size = model.block_bytes()
    prompt = [random.Random(seed).randrange(50000) for _ in range(8 * TPB)]
    # Prefill is priced high so that placement fetches what is cached.
    costly = {"c0_us": 1e5, "c1_us_per_token": 1e3}
    writer_prefill = Prefill(seed, size)
    with open_client(cluster, recompute=writer_prefill, prefill=costly) as writer:
        keys = writer.key_tokens(prompt)
        assert len(keys) == 8 and all(len(k) == 32 for k in keys)
        assert keys == kvfabric.compute_block_keys(model, prompt)
        plan = writer.match(keys)
        assert plan.kind == "recompute_all" and plan.cached_prefix_blocks == 0
        ctx = writer.new_context(len(prompt))
        writer.load(plan, ctx)
        for layer in range(model.layer_count):
            writer.wait_layer(ctx, layer)
            writer.save(ctx, layer, 0, keys)
        assert writer_prefill.calls == [(0, 8)]
        report = writer.finish(ctx)
        assert report.blocks_written == 8 and report.save_failures == 0

    reader_prefill = Prefill(seed + 1, size)  # different bytes: must never be called
    with open_client(cluster, recompute=reader_prefill, prefill=costly) as reader:
        plan = reader.match(reader.key_tokens(prompt), explain=True)
        assert plan.cached_prefix_blocks == 8, plan.explanation
        assert plan.kind == "fetch_all", plan.explanation
        assert all(run.fetch for run in plan.runs)
        ctx = reader.new_context(len(prompt))
        reader.load(plan, ctx)
        for layer in range(model.layer_count):  # each layer's wait covers that layer only
            reader.wait_layer(ctx, layer)
        views = [reader.block_view(ctx, b) for b in range(8)]
        for b, view in enumerate(views):
            assert view.nbytes == size and not view.readonly
            assert bytes(view) == block_bytes_for(seed, b, size), f"block {b}"
        # No copy: a write through one view is seen by a view taken later,
        # since both are the pinned page itself.
        views[3][0] ^= 0xFF
        assert reader.block_view(ctx, 3)[0] == block_bytes_for(seed, 3, size)[0] ^ 0xFF
        report = reader.finish(ctx)
        assert report.blocks_fetched == 8 and report.blocks_recomputed == 0
        assert reader_prefill.calls == []
        m = reader.metrics()
        assert m["blocks_fetched"] == 8 and m["bytes_fetched"] == 8 * size
        assert "kvfabric_client" in reader.metrics_text()


def test_errors_are_exceptions_with_codes_and_settings(cluster):
    with pytest.raises(kvfabric.InvalidArgument) as e:
        open_client(cluster, history_pool_bytes=0)
    assert e.value.code == 3 and "history_pool_bytes" in str(e.value)
    with pytest.raises(kvfabric.InvalidArgument) as e:
        open_client(cluster, fetch_dpeth=4)
    assert "fetch_dpeth" in str(e.value) and "fetch_depth" in str(e.value)
    with pytest.raises(kvfabric.InvalidArgument):
        open_client(cluster, model=small_model(tokens_per_block=12))
    with pytest.raises(kvfabric.InvalidArgument) as e:
        open_client(cluster, recompute=lambda request, out: None, straggler_factor=1.0)
    assert "straggler_factor" in str(e.value)
    # The straggler, connection and landing-check options are taken by name.
    with open_client(cluster, recompute=lambda request, out: None, straggler_factor=2.0,
                     straggler_slack=0.1, connect_at_open=False,
                     daemon_checks_landing=False) as client:
        assert client.metrics()["blocks_fetched"] == 0
    with pytest.raises(kvfabric.Unavailable) as e:
        open_client(cluster, placement_address="127.0.0.1:1", rpc_timeout=0.5)
    assert isinstance(e.value, kvfabric.Error) and e.value.code_name == "Unavailable"
    with open_client(cluster, history_pool_bytes=4 * small_model().block_bytes()) as client:
        with pytest.raises(kvfabric.ResourceExhausted) as e:
            client.new_context(5 * TPB)
        assert "history_pool_bytes" in str(e.value)
        with pytest.raises(kvfabric.InvalidArgument):
            client.match([b"short"])
    with pytest.raises(kvfabric.FailedPrecondition):
        client.new_context(TPB)  # closed


def test_a_load_without_a_recompute_callable_fails_naming_it(cluster):
    with open_client(cluster) as client:
        prompt = list(range(2 * TPB))
        keys = client.key_tokens([t + 7 for t in prompt])
        ctx = client.new_context(len(prompt))
        client.load(client.match(keys), ctx)
        with pytest.raises(kvfabric.FailedPrecondition) as e:
            client.wait_layer(ctx, 0)
        assert "recompute" in str(e.value)
        with pytest.raises(kvfabric.FailedPrecondition) as e:
            client.finish(ctx)
        assert e.value.report is not None and e.value.report.blocks_fetched == 0


def test_a_raising_prefill_fails_the_load_with_its_text_and_code(cluster):
    def prefill(request, out):
        raise kvfabric.ResourceExhausted(8, "engine out of memory")

    with open_client(cluster, recompute=prefill) as client:
        keys = client.key_tokens(list(range(100, 100 + TPB)))
        ctx = client.new_context(TPB)
        client.load(client.match(keys), ctx)
        with pytest.raises(kvfabric.ResourceExhausted) as e:
            client.wait_layer(ctx, 0)
        assert "engine out of memory" in str(e.value)
        with pytest.raises(kvfabric.Error):
            client.finish(ctx)


def test_blocking_calls_release_the_gil(cluster):
    """A load whose prefill (Python, on a loader thread) needs the GIL finishes
    while the calling thread waits in wait_layer: it would deadlock if
    wait_layer held the GIL. Eight threads load at once."""
    model = small_model()
    size = model.block_bytes()
    errors = []
    with open_client(cluster, recompute=Prefill(5, size)) as client:
        def one(i):
            try:
                prompt = [1000 * i + t for t in range(4 * TPB)]
                ctx = client.new_context(len(prompt))
                client.load(client.match(client.key_tokens(prompt)), ctx)
                for layer in range(model.layer_count):
                    client.wait_layer(ctx, layer, timeout=60)
                assert bytes(client.block_view(ctx, 2)) == block_bytes_for(5, 2, size)
                client.finish(ctx)
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_help_reads_well():
    doc = kvfabric.Client.__doc__
    assert "history_pool_bytes" in doc and "context manager" in doc
    assert kvfabric.Client.match.__doc__ and kvfabric.Client.wait_layer.__doc__
