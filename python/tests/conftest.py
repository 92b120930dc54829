"""Shared fixtures: a LocalCluster of real daemons on loopback (binaries from
$KVFABRIC_BIN_DIR, set by python/run_tests.sh) and a client factory."""

import os
import random

import pytest

import kvfabric


@pytest.fixture(scope="module")
def cluster():
    with kvfabric.LocalCluster(daemons=2, host_pool_bytes=64 << 20) as c:
        yield c


@pytest.fixture
def seed():
    """A seed for randomised tests, printed (pytest shows it on failure)."""
    s = int(os.environ.get("KVF_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed={s} (KVF_TEST_SEED={s} repeats it)")
    return s


def small_model(**overrides):
    fields = dict(model_id="python-test/tiny", layer_count=2, kv_heads=2, head_dim=16,
                  dtype="fp32", tokens_per_block=16)
    fields.update(overrides)
    return kvfabric.ModelFingerprint(**fields)


def open_client(cluster, model=None, **options):
    model = model or small_model()
    args = dict(placement_address=cluster.placement_address,
                security=kvfabric.Security(insecure=True), model=model,
                history_pool_bytes=256 * model.block_bytes(), device_arena_bytes=8 << 20,
                num_q_heads=2 * model.kv_heads, tile_tokens=model.tokens_per_block)
    args.update(options)
    return kvfabric.Client(**args)
