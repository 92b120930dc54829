"""The engine's own paged KV cache, registered once with a client.

Each layer is one tensor ``[2, num_blocks, tokens_per_block, kv_heads,
head_dim]`` (vLLM's layout: K at index 0, V at 1) of the model's dtype, on
the CPU. Registering reads each tensor's data pointer and strides; nothing is
copied, and the tensors are kept alive by the :class:`KvCache`. Loads then
copy a layer of a history block into an engine page with one memcpy per K and
V slice (per head row when the page is strided), in C++ with the GIL
released; saves the reverse.

For tensors on a GPU the history pool itself is the staging area: take
``client.block_view(ctx, b)`` (pinned host memory) as a tensor with
``torch.frombuffer`` and ``copy_(..., non_blocking=True)`` it into the page;
:meth:`kvfabric.Client.register_kv_cache` refuses non-CPU tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Sequence

from kvfabric.errors import InvalidArgument

if TYPE_CHECKING:
    from kvfabric.client import Client

# torch dtype names -> kvfabric dtype names (core/model_fingerprint.h).
_DTYPES = {
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
    "torch.float32": "fp32",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.int8": "int8",
}


def kvfabric_dtype(torch_dtype: Any) -> str:
    """The kvfabric dtype name of a torch dtype ("bf16" for torch.bfloat16)."""
    name = str(torch_dtype)
    if name not in _DTYPES:
        raise InvalidArgument(3, f"KV cache dtype {name} has no kvfabric dtype; "
                              f"accepted: {', '.join(sorted(_DTYPES))}")
    return _DTYPES[name]


class KvCache:
    """A registered paged KV cache (see the module docstring)."""

    def __init__(self, client: "Client", tensors: Sequence[Any]) -> None:
        model = client.model
        layers = []
        self._tensors: List[Any] = list(tensors)
        for i, t in enumerate(self._tensors):
            where = f"KV cache layer {i}"
            if str(getattr(t, "device", "cpu")) != "cpu":
                raise InvalidArgument(3, f"{where} is on {t.device}: register CPU tensors; for a "
                                      "GPU cache copy from client.block_view() (pinned)")
            if kvfabric_dtype(t.dtype) != model.dtype:
                raise InvalidArgument(3, f"{where} is {t.dtype}; the model's dtype is "
                                      f"{model.dtype}")
            shape = tuple(t.shape)
            want = (2, None, model.tokens_per_block, model.kv_heads, model.head_dim)
            if len(shape) != 5 or any(w is not None and s != w for s, w in zip(shape, want)):
                raise InvalidArgument(3, f"{where} has shape {list(shape)}; expected [2, "
                                      f"num_blocks, {model.tokens_per_block}, {model.kv_heads}, "
                                      f"{model.head_dim}] (tokens_per_block, kv_heads, head_dim)")
            e = t.element_size()
            stride = [s * e for s in t.stride()]
            if stride[4] != e:
                raise InvalidArgument(3, f"{where}: a head's elements must be adjacent "
                                      f"(last stride {t.stride()[4]}, expected 1)")
            extent = sum((n - 1) * s for n, s in zip(shape, stride)) + e
            layers.append((t.data_ptr(), shape[1], stride[0], stride[1], stride[2], stride[3],
                           extent))
        self._native = client._native.register_kv_cache(layers)
        self.num_blocks = [int(t.shape[1]) for t in self._tensors]

    @property
    def tensors(self) -> List[Any]:
        return list(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)
