"""A small decoder-only transformer in PyTorch with vLLM's paged KV cache, and
a harness that drives a KV connector the way vLLM's scheduler and workers do.

The model: random weights from a seed, RMSNorm, rotary positions, grouped-
query attention over the paged cache (per layer one tensor [2, num_pages,
block_size, kv_heads, head_dim]), a SiLU MLP, greedy decoding. Prefill runs
in chunks of one block, always at block boundaries: a block's KV and every
later token's logits are then computed by the same operations on the same
shapes whether the prefix before it was computed in this run or loaded, so
cached and uncached runs agree bit for bit.

The harness (Engine) is vLLM's v1 loop reduced to what a connector sees:
admission asks ``get_num_new_matched_tokens`` then ``update_state_after_alloc``;
each step calls ``build_connector_meta``; the worker side gets
``bind_connector_metadata``, ``start_load_kv``, per layer
``wait_for_layer_load`` / attention / ``save_kv_layer``, then
``wait_for_save``, ``get_finished``, ``get_block_ids_with_load_errors`` and
``clear_connector_metadata``; finished requests call ``request_finished``.
Pages are allocated as tokens are scheduled; preemption frees a request's
pages and sends it back to the waiting queue (resumed requests arrive with
``resumed_req_ids`` and a new page list).
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Dict, List, Optional, Set

import torch


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    vocab: int = 512
    hidden: int = 128
    layers: int = 4
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 256
    block_size: int = 16


class TinyDecoder:
    def __init__(self, config: TinyConfig, seed: int) -> None:
        c = self.c = config
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g) / shape[0] ** 0.5

        self.embed = torch.randn(c.vocab, c.hidden, generator=g)
        self.layers = [dict(wq=w(c.hidden, c.q_heads * c.head_dim),
                            wk=w(c.hidden, c.kv_heads * c.head_dim),
                            wv=w(c.hidden, c.kv_heads * c.head_dim),
                            wo=w(c.q_heads * c.head_dim, c.hidden),
                            w1=w(c.hidden, c.ffn), w2=w(c.ffn, c.hidden))
                       for _ in range(c.layers)]
        self.out = w(c.hidden, c.vocab)
        inv = 1.0 / (10000 ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.inv_freq = inv

    @staticmethod
    def norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None].float() * self.inv_freq[None, :]  # [n, d/2]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    def new_kv_caches(self, num_pages: int) -> Dict[str, torch.Tensor]:
        c = self.c
        return {f"model.layers.{i}.self_attn.attn":
                torch.zeros(2, num_pages, c.block_size, c.kv_heads, c.head_dim)
                for i in range(c.layers)}

    def embed_chunk(self, tokens: List[int]) -> torch.Tensor:
        return self.embed[torch.tensor(tokens)]

    def layer_step(self, layer: int, x: torch.Tensor, start: int, pages: List[int],
                   kv: torch.Tensor) -> torch.Tensor:
        """Layer ``layer`` for tokens at positions [start, start + len(x)):
        writes their K and V into the request's pages, attends over every
        position up to each token (from the pages), returns the new x."""
        c, p = self.c, self.layers[layer]
        n = x.shape[0]
        pos = torch.arange(start, start + n)
        h = self.norm(x)
        q = self.rope((h @ p["wq"]).view(n, c.q_heads, c.head_dim), pos)
        k = self.rope((h @ p["wk"]).view(n, c.kv_heads, c.head_dim), pos)
        v = (h @ p["wv"]).view(n, c.kv_heads, c.head_dim)
        for i in range(n):
            page, slot = pages[(start + i) // c.block_size], (start + i) % c.block_size
            kv[0, page, slot] = k[i]
            kv[1, page, slot] = v[i]
        end = start + n
        used = pages[:(end + c.block_size - 1) // c.block_size]
        keys = kv[0, used].reshape(-1, c.kv_heads, c.head_dim)[:end]
        values = kv[1, used].reshape(-1, c.kv_heads, c.head_dim)[:end]
        group = c.q_heads // c.kv_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, end, d]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys.transpose(1, 2) / c.head_dim ** 0.5  # [H, n, end]
        mask = torch.arange(end)[None, :] > pos[:, None]
        scores = scores.masked_fill(mask[None], float("-inf"))
        attn = (scores.softmax(-1) @ values).transpose(0, 1).reshape(n, -1)
        x = x + attn @ p["wo"]
        return x + torch.nn.functional.silu(self.norm(x) @ p["w1"]) @ p["w2"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x[-1:]) @ self.out


# --- vLLM's scheduler-side objects, reduced to the fields connectors read. ---


class Request:
    def __init__(self, request_id: str, prompt: List[int], max_tokens: int,
                 lora_name: Optional[str] = None) -> None:
        self.request_id = request_id
        self.lora_request = types.SimpleNamespace(lora_name=lora_name) if lora_name else None
        self.cache_salt: Optional[str] = None
        self.mm_features: list = []
        self.prompt_token_ids = list(prompt)
        self.output_token_ids: List[int] = []
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.pages: List[int] = []
        self.final_logits: Optional[torch.Tensor] = None
        self.first_token_s: Optional[float] = None
        self.arrival_s = 0.0
        self.resumed = False

    @property
    def all_token_ids(self) -> List[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class Blocks:
    def __init__(self, pages: List[int]) -> None:
        self._pages = pages

    def get_block_ids(self):
        return (list(self._pages),)


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: tuple
    num_computed_tokens: int


@dataclasses.dataclass
class CachedRequestData:
    req_ids: List[str]
    resumed_req_ids: Set[str]
    new_block_ids: List[Optional[tuple]]
    num_computed_tokens: List[int]


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    finished_req_ids: Set[str]


class Engine:
    """One vLLM-like engine: a scheduler, one worker, the model. With
    ``connector_factory`` None it runs without a KV connector (full
    recompute)."""

    def __init__(self, model: TinyDecoder, num_pages: int, connector_factory=None) -> None:
        self.model = model
        self.kv_caches = model.new_kv_caches(num_pages)
        self.names = list(self.kv_caches)
        self.free_pages = list(range(num_pages))
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self.finished: Dict[str, Request] = {}
        self.scheduler = self.worker = None
        if connector_factory is not None:
            self.scheduler = connector_factory("scheduler")
            self.worker = connector_factory("worker")
            self.worker.register_kv_caches(self.kv_caches)
        self.known: Set[str] = set()
        self.preempt_at: Dict[str, int] = {}  # req_id -> preempt after this many outputs
        # Called with the step's connector metadata before the worker starts
        # its loads (a fault test kills a daemon there).
        self.before_worker = None
        self.steps = 0

    def add(self, request: Request) -> None:
        request.arrival_s = time.perf_counter()
        self.waiting.append(request)

    def _allocate(self, request: Request, tokens: int) -> List[int]:
        need = -(-tokens // self.model.c.block_size) - len(request.pages)
        new = [self.free_pages.pop(0) for _ in range(max(0, need))]
        request.pages.extend(new)
        return new

    def _preempt(self, request: Request) -> None:
        self.free_pages.extend(request.pages)
        request.pages = []
        request.num_computed_tokens = 0
        request.resumed = True
        self.running.remove(request)
        self.waiting.insert(0, request)

    def step(self) -> None:
        bs = self.model.c.block_size
        new_reqs, cached_ids, resumed, new_blocks, cached_computed = [], [], set(), [], []
        scheduled: Dict[str, int] = {}
        admitted = []
        while self.waiting:
            r = self.waiting.pop(0)
            ext = 0
            if self.scheduler is not None:
                ext, load_async = self.scheduler.get_num_new_matched_tokens(r, 0)
                assert not load_async and ext % bs == 0 and ext < r.num_tokens
            r.num_computed_tokens = ext
            self._allocate(r, ext + 1)
            if self.scheduler is not None:
                self.scheduler.update_state_after_alloc(r, Blocks(r.pages), ext)
            admitted.append(r)
        for r in self.running + admitted:
            # Prefill: up to the next block boundary; decode: one token.
            n = min(bs - r.num_computed_tokens % bs, r.num_tokens - r.num_computed_tokens)
            before = len(r.pages)
            self._allocate(r, r.num_computed_tokens + n)
            scheduled[r.request_id] = n
            if r in admitted and not r.resumed:
                new_reqs.append(NewRequestData(r.request_id, list(r.prompt_token_ids),
                                               (list(r.pages),), r.num_computed_tokens))
            else:
                cached_ids.append(r.request_id)
                cached_computed.append(r.num_computed_tokens)
                if r.resumed:
                    resumed.add(r.request_id)
                    new_blocks.append((list(r.pages),))
                else:
                    new_blocks.append((r.pages[before:],) if len(r.pages) > before else None)
        self.running.extend(admitted)
        for r in admitted:
            r.resumed = False
        out = SchedulerOutput(new_reqs, CachedRequestData(cached_ids, resumed, new_blocks,
                                                          cached_computed),
                              scheduled, set())
        if self.scheduler is not None:
            meta = self.scheduler.build_connector_meta(out)
            if self.before_worker is not None:
                self.before_worker(meta)
            self.worker.bind_connector_metadata(meta)
            self.worker.start_load_kv(None)
        batch = [(r, r.num_computed_tokens, scheduled[r.request_id]) for r in self.running]
        xs = [self.model.embed_chunk(r.all_token_ids[s:s + n]) for r, s, n in batch]
        for layer, name in enumerate(self.names):
            if self.worker is not None:
                self.worker.wait_for_layer_load(name)
            kv = self.kv_caches[name]
            xs = [self.model.layer_step(layer, x, s, r.pages, kv)
                  for x, (r, s, n) in zip(xs, batch)]
            if self.worker is not None:
                self.worker.save_kv_layer(name, kv, None)
        bad: Set[int] = set()
        if self.worker is not None:
            self.worker.wait_for_save()
            self.worker.get_finished(set())
            bad = self.worker.get_block_ids_with_load_errors()
            self.worker.clear_connector_metadata()
        self.steps += 1
        for x, (r, s, n) in zip(xs, batch):
            if bad & set(r.pages):
                # vLLM's "recompute" policy: back to the first page that failed to load.
                first_bad = min(i for i, p in enumerate(r.pages) if p in bad)
                r.num_computed_tokens = min(r.num_computed_tokens, first_bad * bs)
                continue
            r.num_computed_tokens = s + n
            if r.num_computed_tokens < r.num_tokens:
                continue
            logits = self.model.logits(x)
            r.output_token_ids.append(int(logits.argmax()))
            if r.first_token_s is None:
                r.first_token_s = time.perf_counter() - r.arrival_s
            if len(r.output_token_ids) >= r.max_tokens:
                r.final_logits = logits
                self.running.remove(r)
                self.finished[r.request_id] = r
                if self.scheduler is not None:
                    self.scheduler.request_finished(r, list(r.pages))
                self.free_pages.extend(r.pages)
                r.pages = []
            elif self.preempt_at.get(r.request_id) == len(r.output_token_ids):
                del self.preempt_at[r.request_id]
                self._preempt(r)

    def run(self) -> None:
        """Serves every request, then waits for the connector's write-backs
        (so that a later engine finds what this one saved)."""
        while self.waiting or self.running:
            self.step()
        if self.worker is not None:
            self.worker.wait_for_write_backs()
