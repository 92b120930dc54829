"""Block keys (docs/block-key.md), computed by the library's own code, so an
engine in Python keys blocks exactly as the C++ client and every other
engine do; checked against the golden vectors in python/tests."""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from kvfabric import _kvfabric

Extra = Union[str, bytes]


def compute_block_keys(
    model: Any,
    tokens: Iterable[int],
    namespace_name: str = "",
    extra_per_block: Optional[Sequence[Sequence[Extra]]] = None,
) -> List[bytes]:
    """The 32-byte keys of the ``len(tokens) // tokens_per_block`` full blocks
    of ``tokens`` under ``namespace_name`` and ``model`` (a
    :class:`kvfabric.ModelFingerprint` or its dict), chained from the root.
    ``extra_per_block``: None, or one list of extra keys per full block (plus
    optionally one for the partial tail, ignored)."""
    return _kvfabric.compute_block_keys(model, namespace_name, list(tokens),
                                        extra_per_block)


def fingerprint_digest(model: Any) -> bytes:
    """The model fingerprint's 32-byte digest (docs/block-key.md, section 2)."""
    return _kvfabric.fingerprint_digest(model)


def extra_keys_per_block(
    token_count: int,
    tokens_per_block: int,
    lora_id: str = "",
    multimodal: Sequence[Tuple[str, int, int]] = (),
    cache_salt: str = "",
) -> List[List[bytes]]:
    """The canonical extra keys of each block of a request (docs/block-key.md,
    section 6.5): ``lora:<id>`` on every block, ``mm:<sha256>:<offset>:<length>``
    on each block a multimodal placeholder ``(sha256_hex, offset, length)``
    overlaps, ``salt:<salt>`` on block 0. For ``compute_block_keys``."""
    return _kvfabric.extra_keys_per_block(token_count, tokens_per_block, lora_id,
                                          list(multimodal), cache_salt)


def kv_scales_digest(k_scales: Sequence[float], v_scales: Sequence[float],
                     layer_count: int) -> bytes:
    """SHA-256 of the KV cache's scales in the canonical encoding (each layer's
    k scales then its v scales, f32 LE), for ModelFingerprint.kv_scales_digest."""
    return _kvfabric.kv_scales_digest(list(k_scales), list(v_scales), layer_count)


def compact_int8_roundtrip(dtype: str, layers: int, tokens: int, kv_heads: int, head_dim: int,
                           exact: bytes) -> Tuple[bytes, int]:
    """An exact block payload (docs/block-format.md) through the compact_int8
    codec (docs/compact.md) and back: the decoded values as float32 bytes in
    the exact layout, and the compact payload's size in bytes."""
    return _kvfabric.compact_int8_roundtrip(dtype, layers, tokens, kv_heads, head_dim, exact)
