"""kvfabric.Client: the client library an engine links, in Python's idiom.

The calls are the C++ client's (client/kvfabric_client.h), one for one, and
follow the calls engines already make (vLLM's KV connector): how many tokens
are cached (``match``), load asynchronously and wait per layer (``load``,
``wait_layer``), save per layer (``save``), finish (``finish``)::

    with kvfabric.Client(placement_address="127.0.0.1:7000",
                         security=kvfabric.Security(insecure=True),
                         model=kvfabric.ModelFingerprint(...),
                         history_pool_bytes=256 << 20,
                         device_arena_bytes=64 << 20,
                         num_q_heads=32) as client:
        keys = client.key_tokens(prompt)
        plan = client.match(keys, suffix_tokens=len(prompt) % tpb)
        ctx = client.new_context(len(prompt))
        client.load(plan, ctx)
        client.wait_layer(ctx, 0)
        ...
        report = client.finish(ctx)

Every blocking call releases the GIL, so engine threads run while a load
waits. Errors are :mod:`kvfabric.errors` exceptions carrying the status code.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from kvfabric import _kvfabric
from kvfabric.kv_cache import KvCache

RecomputeRequest = _kvfabric.RecomputeRequest
Match = _kvfabric.Match
ContextReport = _kvfabric.ContextReport
PlanRun = _kvfabric.PlanRun
RunOutcome = _kvfabric.RunOutcome

#: ``recompute(request, out)``: the engine's prefill of ``request.block_count``
#: blocks from ``request.first_block`` into ``out`` (a writable memoryview of
#: the block payloads back to back, docs/block-format.md), called on a loader
#: thread with the GIL taken. ``out`` is valid during the call only. Raising
#: fails the load (a :class:`kvfabric.Error` keeps its code).
RecomputeFn = Callable[[RecomputeRequest, memoryview], None]


@dataclasses.dataclass(frozen=True)
class ModelFingerprint:
    """Everything about the model and its sharding that changes the bytes of a
    KV block (core/model_fingerprint.h, docs/block-key.md). Blocks of two
    fingerprints never share a key."""

    model_id: str
    layer_count: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"  # "fp16", "bf16", "fp32", "fp8_e4m3", "int8"
    first_layer: int = 0
    tokens_per_block: int = 16
    tp_rank: int = 0
    tp_size: int = 1
    layout_version: int = 1
    # Block-key encoding (docs/block-key.md): 2, or 1 for blocks written
    # before version 2 (then every field below must keep its default).
    key_version: int = 2
    weights_revision: str = ""  # commit hash / checksum of the weights
    quantization: str = ""  # the weights' quantisation scheme, "" for none
    kv_scale_scheme: str = ""  # e.g. "fp8-per-tensor"; "" for unscaled KV
    kv_scales_digest: bytes = bytes(32)  # kvfabric.kv_scales_digest(...) of the scales
    rope: str = ""  # canonical RoPE description, e.g. "scaling=llama3;theta=500000"
    v_head_dim: int = 0  # value head size when it differs from head_dim (MLA)
    vocab_size: int = 0  # token ids >= it are refused; 0: not stated

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> bytes:
        """The fingerprint's 32-byte digest (docs/block-key.md)."""
        return _kvfabric.fingerprint_digest(self)

    def block_bytes(self) -> int:
        """Bytes of one block: every layer of the group, K and V."""
        return _kvfabric.block_bytes(self)


@dataclasses.dataclass(frozen=True)
class Security:
    """How gRPC to placement and the daemons is secured (docs/security.md):
    ``ca_file`` for TLS (with ``cert_file`` and ``key_file`` for mutual TLS,
    or ``token_file`` for a bearer token), or ``insecure=True`` for plaintext
    to loopback addresses (``allow_insecure_remote`` for others)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    token_file: str = ""
    server_name: str = ""
    insecure: bool = False
    allow_insecure_remote: bool = False

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


Keys = Sequence[bytes]


class Client:
    """A connected kvfabric client (C++ ``kvfabric::client::Client``).

    Keyword options have the C++ option names (client/kvfabric_client.h,
    ``ClientOptions``); an unknown name is refused with the list of accepted
    ones. Required: ``placement_address``, ``security``, ``model``,
    ``history_pool_bytes`` (the pinned memory every context's history lives
    in, allocated and pre-faulted here), ``device_arena_bytes`` (the device
    working set) and ``num_q_heads``. Others, with their C++ defaults:
    ``namespace_name``, ``client_node``, ``data_transport`` ("ucx" | "tcp"),
    ``ucx_tls``, ``data_plane_tls``, ``device`` ("cpu" | "cuda"),
    ``device_index``, ``arena`` (dict: page_bytes, staging_pages,
    context_floor_pages, hot_newest_pages), ``tile_tokens``,
    ``staging_bytes``, ``fetch_depth``, ``store_by_key``, ``save_threads``,
    ``max_context_tokens``, ``prefill`` (dict: c0_us, c1_us_per_token,
    c2_us_per_token2, c3_us_per_prefix_token, split_serial_fraction),
    ``straggler_factor``, ``straggler_slack`` (seconds), ``connect_at_open``,
    ``daemon_checks_landing``, ``rpc_timeout`` and
    ``transfer_timeout`` (seconds or timedelta), ``lease_ttl_ms``,
    ``metrics_address``.

    ``recompute``: see :data:`RecomputeFn`. Without it, a plan that needs a
    prefill fails its load with FailedPrecondition (an engine that prefills
    uncached tokens itself, like vLLM, loads only fetched prefixes).

    Use as a context manager, or call :meth:`close`. Methods may be called from
    any thread, concurrently, for different contexts.
    """

    def __init__(
        self,
        *,
        placement_address: str,
        model: Union[ModelFingerprint, Dict[str, Any]],
        history_pool_bytes: int,
        device_arena_bytes: int,
        num_q_heads: int,
        security: Union[Security, Dict[str, Any], None] = None,
        recompute: Optional[RecomputeFn] = None,
        **options: Any,
    ) -> None:
        opts: Dict[str, Any] = dict(options)
        opts.update(
            placement_address=placement_address,
            model=model,
            history_pool_bytes=history_pool_bytes,
            device_arena_bytes=device_arena_bytes,
            num_q_heads=num_q_heads,
            security=security if security is not None else {},
        )
        self._model = model if isinstance(model, ModelFingerprint) else ModelFingerprint(**model)
        self._native = _kvfabric.NativeClient(opts, recompute)

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Finishes every open context (waiting for loads and saves), stops
        the client's threads. Idempotent; raises the first error seen."""
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def model(self) -> ModelFingerprint:
        return self._model

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (every layer of the model's layer group)."""
        return self._model.block_bytes()

    # -- the engine's calls -------------------------------------------------

    def key_tokens(self, tokens: Iterable[int]) -> List[bytes]:
        """The 32-byte keys of the full blocks of ``tokens`` (a partial tail
        has none), under this client's namespace and model."""
        return self._native.key_tokens(tokens)

    def match(
        self,
        keys: Keys,
        suffix_tokens: int = 0,
        explain: bool = False,
        accuracy: str = "exact",
        decode_steps: int = 0,
        prefix_only: bool = False,
    ) -> Match:
        """Placement's plan for the chain ``keys`` plus ``suffix_tokens`` the
        engine prefills anyway: ``cached_prefix_blocks``, ``kind``, ``runs``
        (fetch or recompute per run of blocks), ``predicted_us`` and, with
        ``explain``, the formula. Placement being down is not an error: a
        local recompute-all plan (``plan_id`` 0) comes back.

        ``accuracy`` is the request's policy (docs/compact.md): ``"exact"``
        (the default; nothing compact is ever fetched) or
        ``"compact_after=N"``: blocks ending N or more tokens before the last
        may be fetched as their compact_int8 copies where the plan finds that
        cheaper over ``decode_steps`` decode steps (0 counts as 1). Runs that
        do say ``compact``; ``representation`` names the plan's choice.

        ``prefix_only``: only plans whose fetch runs are a leading prefix of
        the chain (no split), for an engine that can take only a loaded
        prefix and computes the rest itself (the vLLM connector)."""
        return self._native.match(keys, suffix_tokens, explain, accuracy, decode_steps,
                                  prefix_only)

    def block_is_compact(self, context: int, block: int) -> bool:
        """Whether block ``block`` landed as its compact copy (then
        :meth:`block_view` refuses it, :meth:`decode_block` decodes it, and
        :meth:`load_into_kv_cache` decodes it into the engine's dtype)."""
        return self._native.block_is_compact(context, block)

    def decode_block(self, context: int, block: int) -> bytes:
        """Block ``block``'s KV as float32 values in the payload's layout
        ([layers][K, V][tokens][kv_heads][head_dim]): exact values converted,
        or a compact copy decoded. ``numpy.frombuffer(b, numpy.float32)``."""
        return self._native.decode_block(context, block)

    def new_context(self, tokens: int) -> int:
        """A request's history of ``tokens`` tokens: pages of the history pool
        (ResourceExhausted, with the arithmetic, when too few are free)."""
        return self._native.new_context(tokens)

    def load(self, match: Match, context: int) -> None:
        """Starts ``match``'s plan into ``context`` (returns at once)."""
        self._native.load(match, context)

    def wait_layer(self, context: int, layer: int, timeout: float = 300.0) -> None:
        """Returns when layer ``layer`` of every block is in the history and
        verified (that layer only: other layers may still be landing, and the
        engine must not write into the history until each was waited for);
        raises the load's error, or DeadlineExceeded."""
        self._native.wait_layer(context, layer, timeout)

    def block_view(self, context: int, block: int) -> memoryview:
        """Block ``block``'s payload in the context's history: a writable
        memoryview over the pinned pool page itself (no copy), valid until
        :meth:`finish` of the context. ``torch.frombuffer(view, dtype=...)``
        gives a tensor over the same bytes (for a GPU engine: the pinned source
        of its host-to-device copy)."""
        return memoryview(self._native.block_view(context, block))

    def save(self, context: int, layer: int, first_block: int, keys: Keys) -> None:
        """The engine has written layer ``layer`` of full blocks
        ``[first_block, first_block + len(keys))`` into the history; a block is
        written back once all its layers are saved (each layer once)."""
        self._native.save(context, layer, first_block, keys)

    def attend(self, context: int, layer: int, step: int, q: Any, out: Any, lse: Any) -> None:
        """Decode attention over layer ``layer`` of the history on the
        client's device: ``q`` and ``out`` float32 [num_q_heads, head_dim],
        ``lse`` float32 [num_q_heads] (numpy arrays, or anything with the
        buffer protocol; ``tensor.numpy()`` for torch)."""
        self._native.attend(context, layer, step, q, out, lse)

    def finish(self, context: int) -> ContextReport:
        """Waits for the load and the saves, reports to placement, frees the
        history. Raises the load's error, or an error if any block was not
        written back (the exception's ``report`` holds the report)."""
        return self._native.finish(context)

    # -- the engine's own KV cache -------------------------------------------

    def register_kv_cache(self, tensors: Sequence[Any]) -> KvCache:
        """Describes the engine's paged KV cache, one tensor per layer of the
        model's layer group, each ``[2, num_blocks, tokens_per_block,
        kv_heads, head_dim]`` of the model's dtype (vLLM's layout), once. The
        tensors are kept alive by the returned object; loads land in them and
        saves read them with no copy on the Python side."""
        return KvCache(self, tensors)

    def load_into_kv_cache(
        self,
        context: int,
        cache: KvCache,
        layer: int,
        pages: Sequence[int],
        first_block: int = 0,
        last_tokens: int = 0,
    ) -> None:
        """Copies layer ``layer`` of history blocks ``first_block ..
        first_block + len(pages)`` into the engine's pages ``pages`` of that
        layer (call after :meth:`wait_layer`); ``last_tokens`` (0: all) of the
        last block only, for a partial tail."""
        self._native.load_into_kv_cache(
            context, cache._native, layer, first_block, list(pages), last_tokens
        )

    def save_from_kv_cache(
        self,
        context: int,
        cache: KvCache,
        layer: int,
        pages: Sequence[int],
        keys: Keys,
        first_block: int = 0,
    ) -> None:
        """Copies layer ``layer`` of the engine's pages ``pages`` into history
        blocks ``first_block ..`` and saves them (:meth:`save`) with ``keys``."""
        self._native.save_from_kv_cache(context, cache._native, layer, first_block, list(pages))
        self._native.save(context, layer, first_block, keys)

    # -- observability --------------------------------------------------------

    def metrics(self) -> Dict[str, int]:
        """Counters since open (``ClientMetrics``), by name."""
        return self._native.metrics()

    def metrics_text(self) -> str:
        """The client's Prometheus families as exposition text
        (kvfabric_client_*, docs/metrics.md), for the engine's own /metrics."""
        return self._native.metrics_text()

    @property
    def metrics_url(self) -> str:
        """``http://HOST:PORT/metrics`` when ``metrics_address`` was set."""
        return self._native.metrics_url

    def describe_history_pool(self) -> str:
        """The history pool's arithmetic, one line."""
        return self._native.describe_history_pool()

    def describe_arena(self) -> str:
        """The device arena's layout, one line."""
        return self._native.describe_arena()
