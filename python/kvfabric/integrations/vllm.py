"""kvfabric as a vLLM KV connector (vLLM's KV-connector v1 interface).

Enable it without patching vLLM (docs/vllm.md)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvfabricConnector",
        "kv_connector_module_path": "kvfabric.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"placement_address": "10.0.0.5:7000",
                                      "security": {"ca_file": "/etc/kvfabric/ca.pem"}}}'

What it does, per the interface's two roles:

- **Scheduler** (one instance, vLLM's EngineCore): ``get_num_new_matched_tokens``
  keys the request's full blocks (docs/block-key.md) and asks placement for
  its plan; the tokens vLLM may skip are the plan's leading *fetch* runs
  (placement's fetch-or-recompute decision, from its bus cost model), never
  the whole prompt (vLLM computes at least one token). ``build_connector_meta``
  tells the workers which blocks to load into which of vLLM's pages, and which
  blocks became full this step and are to be saved.
- **Worker** (one per GPU process): ``register_kv_caches`` registers vLLM's
  per-layer paged tensors once; ``start_load_kv`` starts the loads (each a
  kvfabric context over the request's prefix); ``wait_for_layer_load`` waits
  for that layer of every block and copies it into vLLM's pages (so layer 0's
  attention starts while later layers are in flight); ``save_kv_layer``
  copies the step's full blocks of that layer out of vLLM's pages and saves
  them; ``wait_for_save`` waits for the write-backs. A load that fails (a
  daemon gone, a CRC mismatch that no replica fixes) reports its pages through
  ``get_block_ids_with_load_errors`` and vLLM recomputes them
  (``kv_load_failure_policy = "recompute"``, vLLM's default).

Loads are synchronous within the step (``load_async`` False), saves are
finished by ``wait_for_save``, so ``request_finished`` never delays freeing.

The interface followed is vLLM's v1 connector as of vLLM 0.11-0.12 (the
constructor takes ``kv_cache_config``, optional here), with the
``[2, num_blocks, block_size, num_kv_heads, head_size]`` per-layer layout of
its FlashAttention backend. When ``import vllm`` fails, the base classes are
the stand-ins below with the same names and methods, so the connector is
importable and testable without vLLM (python/tests/test_vllm_connector.py).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import queue
import re
import threading
from abc import ABC
from typing import Any, Dict, List, Optional, Set, Tuple

import kvfabric

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorRole."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata(ABC):  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorMetadata (a marker base class)."""

    class KVConnectorBase_V1(ABC):  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorBase_V1: its constructor and the
        default methods a connector inherits."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any = None) -> None:
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._role = role
            self._kv_cache_config = kv_cache_config
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            if self._kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for a KV connector")

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def get_block_ids_with_load_errors(self) -> Set[int]:
            return set()

        def shutdown(self) -> None:
            pass

        def update_connector_output(self, connector_output: Any) -> None:
            pass

        def take_events(self) -> Tuple[()]:
            return ()

log = logging.getLogger("kvfabric.vllm")


@dataclasses.dataclass(frozen=True)
class RequestExtras:
    """What a request's blocks depend on besides their tokens (docs/block-key.md,
    section 6.5): its LoRA adapter, its multimodal inputs' placeholders
    ``(sha256 hex, offset, length)``, its cache salt."""

    lora_id: str = ""
    multimodal: Tuple[Tuple[str, int, int], ...] = ()
    cache_salt: str = ""

    @staticmethod
    def of(request: Any) -> "RequestExtras":
        lora = getattr(request, "lora_request", None)
        mm = []
        for feature in getattr(request, "mm_features", None) or []:
            ident = str(getattr(feature, "identifier", ""))
            if not re.fullmatch(r"[0-9a-fA-F]{64}", ident):
                ident = hashlib.sha256(ident.encode()).hexdigest()
            pos = feature.mm_position
            mm.append((ident, int(pos.offset), int(pos.length)))
        return RequestExtras(lora_id=str(getattr(lora, "lora_name", "") or "") if lora else "",
                             multimodal=tuple(mm),
                             cache_salt=str(getattr(request, "cache_salt", None) or ""))


@dataclasses.dataclass
class LoadSpec:
    """Load blocks [0, blocks) of ``token_ids`` into vLLM pages; pages for
    blocks before ``first_new_block`` are already in vLLM (local hits) and
    are not overwritten."""

    req_id: str
    token_ids: List[int]
    extras: "RequestExtras"
    blocks: int
    first_new_block: int
    page_ids: List[int]  # vLLM block ids of blocks [first_new_block, blocks)


@dataclasses.dataclass
class SaveSpec:
    """Save full blocks [first_block, first_block + len(page_ids)) of
    ``token_ids`` (the request's tokens up to their end) from vLLM pages."""

    req_id: str
    token_ids: List[int]
    extras: "RequestExtras"
    first_block: int
    page_ids: List[int]


@dataclasses.dataclass
class KvfabricConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """What the scheduler tells the workers for one step (picklable)."""

    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)


def _layer_index(name: str) -> int:
    numbers = re.findall(r"\d+", name)
    if not numbers:
        raise kvfabric.InvalidArgument(3, f"KV cache layer name {name!r} holds no layer number")
    return int(numbers[-1])


def model_fingerprint(vllm_config: Any, extra: Dict[str, Any]) -> kvfabric.ModelFingerprint:
    """The fingerprint of this engine's KV blocks, from vLLM's configuration
    (model, layers, KV heads of this TP rank, head size, cache dtype, block
    size, TP rank and size); ``extra["model"]`` overrides any field."""
    fields: Dict[str, Any] = {}
    mc = getattr(vllm_config, "model_config", None)
    pc = getattr(vllm_config, "parallel_config", None)
    cc = getattr(vllm_config, "cache_config", None)
    if mc is not None:
        fields["model_id"] = str(mc.model)
        fields["weights_revision"] = str(getattr(mc, "revision", None) or "")
        fields["quantization"] = str(getattr(mc, "quantization", None) or "")
        if hasattr(mc, "get_vocab_size"):
            fields["vocab_size"] = int(mc.get_vocab_size())
        fields["layer_count"] = int(mc.get_num_layers(pc))
        fields["kv_heads"] = int(mc.get_num_kv_heads(pc))
        fields["head_dim"] = int(mc.get_head_size())
        dtype = getattr(cc, "cache_dtype", "auto")
        if dtype in (None, "auto"):
            dtype = str(mc.dtype)
        fields["dtype"] = {"torch.float16": "fp16", "torch.bfloat16": "bf16",
                           "torch.float32": "fp32", "fp8": "fp8_e4m3",
                           "fp8_e4m3": "fp8_e4m3"}.get(str(dtype), str(dtype))
    if cc is not None:
        fields["tokens_per_block"] = int(cc.block_size)
    if pc is not None:
        fields["tp_size"] = int(getattr(pc, "tensor_parallel_size", 1))
        fields["tp_rank"] = int(getattr(pc, "rank", 0)) % fields["tp_size"]
    fields.update(extra.get("model", {}))
    return kvfabric.ModelFingerprint(**fields)


class KvfabricConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM KV connector backed by kvfabric (see the module docstring).

    ``kv_connector_extra_config`` keys: ``placement_address`` (required),
    ``security`` (dict: ca_file, cert_file, key_file, token_file, insecure,
    ...), ``namespace_name``, ``history_pool_bytes`` (worker; default: room
    for ``max_context_tokens`` x 4), ``max_context_tokens`` (default
    ``model_config.max_model_len``), ``device_arena_bytes`` (default 16 MiB),
    ``model`` (fingerprint fields overriding vLLM's), ``client`` (any other
    kvfabric.Client option), ``prefill`` (the engine's prefill cost, for
    placement's decision), ``accuracy`` (``"exact"``, the default, or
    ``"compact_after=N"``: older blocks may load from their compact copies,
    decoded into vLLM's pages; docs/compact.md) and ``decode_steps`` (what
    the plan weighs a compact token's extra decode time over; default 256).
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra: Dict[str, Any] = dict(
            getattr(self._kv_transfer_config, "kv_connector_extra_config", None) or {})
        self._model = model_fingerprint(vllm_config, extra)
        self._bs = self._model.tokens_per_block
        self._ns = extra.get("namespace_name", "")
        self._accuracy = str(extra.get("accuracy", "exact"))
        self._decode_steps = int(extra.get("decode_steps", 256))
        mc = getattr(vllm_config, "model_config", None)
        max_tokens = int(extra.get("max_context_tokens",
                                   getattr(mc, "max_model_len", 0) or 64 * self._bs))
        blocks = -(-max_tokens // self._bs)
        pool = int(extra.get("history_pool_bytes", 4 * blocks * self._model.block_bytes()))
        if role == KVConnectorRole.SCHEDULER:
            pool = self._model.block_bytes()  # plans only; no history
        options: Dict[str, Any] = dict(extra.get("client", {}))
        if "prefill" in extra:
            options["prefill"] = extra["prefill"]
        self._client = kvfabric.Client(
            placement_address=extra["placement_address"],
            security=extra.get("security", {}),
            model=self._model,
            namespace_name=self._ns,
            history_pool_bytes=pool,
            max_context_tokens=max_tokens if role == KVConnectorRole.WORKER else 0,
            device_arena_bytes=int(extra.get("device_arena_bytes", 16 << 20)),
            num_q_heads=self._model.kv_heads,
            tile_tokens=self._bs,
            **options,
        )
        # Scheduler state.
        self._matched: Dict[str, int] = {}  # req -> blocks to load, from the last match
        self._pending_loads: Dict[str, LoadSpec] = {}
        self._saved_blocks: Dict[str, int] = {}  # req -> full blocks saved or loaded so far
        self._requests: Dict[str, Any] = {}  # req -> vLLM's live Request
        self._pages: Dict[str, List[int]] = {}  # req -> its vLLM block ids, in order
        self.stats = {"requests": 0, "prompt_tokens": 0, "tokens_loaded": 0, "load_failures": 0}
        # Worker state.
        self._cache: Optional[kvfabric.KvCache] = None
        self._layer_of: Dict[str, int] = {}
        self._loads: List[Tuple[LoadSpec, int]] = []  # (spec, context)
        self._saves: Dict[str, Tuple[SaveSpec, int, List[bytes]]] = {}
        self._failed_loads: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._finishing: "queue.Queue[Optional[Tuple[str, int]]]" = queue.Queue()
        self._finisher = threading.Thread(target=self._finish_saves, name="kvfabric-saves",
                                          daemon=True)
        self._finisher.start()

    # ---------------------------------------------------------- scheduler --

    def _keys(self, token_ids: List[int], extras: RequestExtras) -> List[bytes]:
        per_block = None
        if extras != RequestExtras():
            per_block = kvfabric.extra_keys_per_block(
                len(token_ids), self._bs, extras.lora_id, list(extras.multimodal),
                extras.cache_salt)
        return kvfabric.compute_block_keys(self._model, token_ids, self._ns, per_block)

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> Tuple[int, bool]:
        """Tokens beyond ``num_computed_tokens`` that kvfabric will load: the
        plan's leading fetch runs over the request's full blocks, leaving at
        least one token for vLLM to compute. No side effects but a cache of
        the answer for ``update_state_after_alloc``."""
        tokens = list(request.all_token_ids)
        usable = (len(tokens) - 1) // self._bs
        if usable == 0:
            return 0, False
        keys = self._keys(tokens[:usable * self._bs], RequestExtras.of(request))
        # vLLM takes only a loaded prefix and computes every token after it:
        # a split (a recomputed front, the rest fetched) would load nothing.
        plan = self._client.match(keys, suffix_tokens=len(tokens) - usable * self._bs,
                                  accuracy=self._accuracy, decode_steps=self._decode_steps,
                                  prefix_only=True)
        fetched = 0
        for run in sorted(plan.runs, key=lambda r: r.first_block):
            if not run.fetch or run.first_block != fetched:
                break
            fetched = run.first_block + run.block_count
        fetched = min(fetched, plan.cached_prefix_blocks)
        external = max(0, fetched * self._bs - num_computed_tokens)
        self._matched[request.request_id] = fetched
        return external, False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        # vLLM calls this for every request it admits: keep the live Request
        # (its all_token_ids grows as it decodes) for the saves of later steps.
        self._requests[request.request_id] = request
        if num_external_tokens == 0:
            return
        fetched = self._matched[request.request_id]
        page_ids = list(blocks.get_block_ids()[0])
        first_new = fetched - num_external_tokens // self._bs
        self._pending_loads[request.request_id] = LoadSpec(
            req_id=request.request_id,
            token_ids=list(request.all_token_ids)[:fetched * self._bs],
            extras=RequestExtras.of(request), blocks=fetched, first_new_block=first_new, page_ids=page_ids[first_new:fetched])

    def build_connector_meta(self, scheduler_output: Any) -> KvfabricConnectorMetadata:
        """This step's loads (from update_state_after_alloc) and saves: every
        block that becomes full in the tokens scheduled this step."""
        meta = KvfabricConnectorMetadata(loads=list(self._pending_loads.values()))
        self._pending_loads.clear()
        loaded = {spec.req_id: spec.blocks for spec in meta.loads}
        for new in scheduler_output.scheduled_new_reqs:
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(new.prompt_token_ids)
            self.stats["tokens_loaded"] += loaded.get(new.req_id, 0) * self._bs
            self._pages[new.req_id] = list(new.block_ids[0])
            self._saved_blocks[new.req_id] = max(loaded.get(new.req_id, 0),
                                                 new.num_computed_tokens // self._bs)
            self._add_save(meta, new.req_id, new.num_computed_tokens,
                           scheduler_output.num_scheduled_tokens[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_pages = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # Preempted and resumed: a new list of pages, computed from scratch
                # after what was loaded.
                self._pages[req_id] = list(new_pages[0]) if new_pages else []
                self._saved_blocks[req_id] = max(loaded.get(req_id, 0),
                                                 cached.num_computed_tokens[i] // self._bs)
            elif new_pages:
                self._pages[req_id].extend(new_pages[0])
            self._add_save(meta, req_id, cached.num_computed_tokens[i],
                           scheduler_output.num_scheduled_tokens[req_id])
        return meta

    def _add_save(self, meta: KvfabricConnectorMetadata, req_id: str, num_computed: int,
                  num_scheduled: int) -> None:
        done = self._saved_blocks.get(req_id, 0)
        full = (num_computed + num_scheduled) // self._bs
        if full <= done:
            return
        tokens = list(self._requests[req_id].all_token_ids)
        full = min(full, len(tokens) // self._bs)  # the newest sampled token has no KV yet
        if full <= done:
            return
        meta.saves.append(SaveSpec(req_id=req_id, token_ids=tokens[:full * self._bs],
                                   extras=RequestExtras.of(self._requests[req_id]),
                                   first_block=done, page_ids=self._pages[req_id][done:full]))
        self._saved_blocks[req_id] = full

    def request_finished(self, request: Any,
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Saves finish within their step (wait_for_save): never delay the free."""
        for state in (self._matched, self._saved_blocks, self._requests, self._pages):
            state.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------- worker --

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        names = sorted(kv_caches, key=_layer_index)
        self._layer_of = {name: i for i, name in enumerate(names)}
        self._cache = self._client.register_kv_cache([kv_caches[n] for n in names])

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        for spec in meta.loads:
            ctx: Optional[int] = None
            try:
                # A full history pool (ResourceExhausted) or a plan that changed
                # fails only this load: vLLM recomputes its pages.
                ctx = self._client.new_context(spec.blocks * self._bs)
                keys = self._keys(spec.token_ids, spec.extras)
                plan = self._client.match(keys, accuracy=self._accuracy,
                                          decode_steps=self._decode_steps, prefix_only=True)
                if plan.cached_prefix_blocks < spec.blocks or not all(r.fetch for r in plan.runs):
                    raise kvfabric.NotFound(5, f"request {spec.req_id}: placement no longer "
                                            f"plans a fetch of {spec.blocks} blocks ({plan.kind})")
                self._client.load(plan, ctx)
            except kvfabric.Error as e:
                self._fail_load(spec, ctx, e)
                continue
            self._loads.append((spec, ctx))

    def _fail_load(self, spec: LoadSpec, ctx: Optional[int], error: Exception) -> None:
        log.warning("kvfabric: load of request %s failed, vLLM recomputes %d blocks: %s",
                    spec.req_id, len(spec.page_ids), error)
        self._failed_loads.add(spec.req_id)
        self._load_errors.update(spec.page_ids)
        self.stats["load_failures"] += 1
        if ctx is None:
            return
        try:
            self._client.finish(ctx)
        except kvfabric.Error:
            pass  # the failure was logged above

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self._layer_of[layer_name]
        for spec, ctx in self._loads:
            if spec.req_id in self._failed_loads:
                continue
            try:
                self._client.wait_layer(ctx, layer)
                self._client.load_into_kv_cache(ctx, self._cache, layer, spec.page_ids,
                                                first_block=spec.first_new_block)
            except kvfabric.Error as e:
                self._fail_load(spec, ctx, e)
        if layer == len(self._layer_of) - 1:
            for spec, ctx in self._loads:
                if spec.req_id in self._failed_loads:
                    continue
                try:
                    self._client.finish(ctx)
                except kvfabric.Error as e:
                    self._fail_load(spec, None, e)
            self._loads = []

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        layer = self._layer_of[layer_name]
        meta = self._get_connector_metadata()
        for spec in meta.saves:
            if spec.req_id in self._failed_loads:
                # Computed over pages whose load failed this step: vLLM discards
                # and recomputes them, and so must the cache (a block with some
                # layers saved is never written back).
                continue
            entry = self._saves.get(spec.req_id)
            if entry is None:
                ctx = self._new_save_context(len(spec.token_ids))
                keys = self._keys(spec.token_ids, spec.extras)[spec.first_block:]
                entry = self._saves[spec.req_id] = (spec, ctx, keys)
            _, ctx, keys = entry
            self._client.save_from_kv_cache(ctx, self._cache, layer, spec.page_ids, keys,
                                            first_block=spec.first_block)

    def wait_for_save(self) -> None:
        """The step's blocks were copied out of vLLM's pages by save_kv_layer,
        so vLLM may reuse them now: the write-backs (from kvfabric's history
        pool) finish on the finisher thread, off the step. Best effort: a
        failed one is logged and counted by the client, never an engine error."""
        for spec, ctx, _ in self._saves.values():
            self._finishing.put((spec.req_id, ctx))
        self._saves = {}

    def wait_for_write_backs(self) -> None:
        """Returns when every write-back handed over by wait_for_save so far
        has finished (not a vLLM hook: for a drain before shutdown, and for
        tests that need earlier requests' blocks in the cluster)."""
        self._finishing.join()

    def _finish_saves(self) -> None:
        while True:
            item = self._finishing.get()
            try:
                if item is None:
                    return
                req_id, ctx = item
                try:
                    self._client.finish(ctx)
                except kvfabric.Error as e:
                    log.warning("kvfabric: saving request %s: %s", req_id, e)
            finally:
                self._finishing.task_done()

    def _new_save_context(self, tokens: int) -> int:
        try:
            return self._client.new_context(tokens)
        except kvfabric.ResourceExhausted:
            # The history pool is held by write-backs still in flight: wait for
            # them, then ask once more (history_pool_bytes sizes this).
            self.wait_for_write_backs()
            return self._client.new_context(tokens)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]],
                                                                 Optional[Set[str]]]:
        return None, None  # loads and saves complete within their step

    def get_block_ids_with_load_errors(self) -> Set[int]:
        errors, self._load_errors = self._load_errors, set()
        self._failed_loads.clear()
        return errors

    def shutdown(self) -> None:
        """Waits for the write-backs in flight, then closes the client."""
        self._finishing.put(None)
        self._finisher.join()
        self._client.close()

    @property
    def client(self) -> kvfabric.Client:
        return self._client
