"""kvfabric: a distributed KV-cache service for LLM serving, from Python.

:class:`Client` is the client library a serving engine links (a binding of
libkvfabric's C++ client); :mod:`kvfabric.integrations.vllm` plugs it into
vLLM as a KV connector; :func:`compute_block_keys` computes the block keys of
docs/block-key.md; :class:`LocalCluster` starts daemons on this machine to
try it. Errors are the classes of :mod:`kvfabric.errors`. docs/python.md.
"""

from kvfabric.client import (
    Client,
    ContextReport,
    Match,
    ModelFingerprint,
    PlanRun,
    RecomputeFn,
    RecomputeRequest,
    RunOutcome,
    Security,
)
from kvfabric.cluster import LocalCluster
from kvfabric.errors import *  # noqa: F401,F403  (Error, Unavailable, ...)
from kvfabric.errors import __all__ as _errors_all
from kvfabric.keys import (
    compact_int8_roundtrip,
    compute_block_keys,
    extra_keys_per_block,
    fingerprint_digest,
    kv_scales_digest,
)
from kvfabric.kv_cache import KvCache

__all__ = [
    "Client",
    "ContextReport",
    "KvCache",
    "LocalCluster",
    "Match",
    "ModelFingerprint",
    "PlanRun",
    "RecomputeFn",
    "RecomputeRequest",
    "RunOutcome",
    "Security",
    "compact_int8_roundtrip",
    "compute_block_keys",
    "extra_keys_per_block",
    "fingerprint_digest",
    "kv_scales_digest",
] + list(_errors_all)
