// PagedKvCache: an engine's own paged KV-cache tensors, described to the
// library once (python/kvfabric/kv_cache.py registers them), so that a load
// lands in them and a save reads from them without a copy on the Python side.
//
// The engine keeps, per layer, pages of `block_size` tokens (vLLM's layout:
// one tensor [2, num_blocks, block_size, kv_heads, head_dim], K at index 0 and
// V at index 1; any strides, as long as a head's head_dim elements are
// adjacent). A kvfabric block holds the same tokens of every layer of the
// model's layer group, K then V per layer, each token-major then head then dim
// (docs/block-format.md). So one block of one layer is two slices of
// block_size * kv_heads * head_dim elements, and where the engine's page is
// contiguous each slice is one memcpy; otherwise one memcpy per (token, head).
//
// The library never owns these tensors: the registering Python object keeps
// them alive, and the caller must not resize or free them while registered.
//
// Thread safety: a value; copies into one engine page must not overlap with
// another thread's use of that page (the engine's own rule for its cache).
#ifndef KVFABRIC_PYTHON_SRC_PAGED_KV_CACHE_H_
#define KVFABRIC_PYTHON_SRC_PAGED_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::python {

// One layer's tensor: element (kv, block, token, head, dim) starts at
//   base + kv * kv_stride + block * block_stride + token * token_stride
//        + head * head_stride + dim * element_bytes   (strides in bytes).
struct PagedLayer {
  std::byte* base = nullptr;
  std::uint64_t num_blocks = 0;
  std::int64_t kv_stride = 0;
  std::int64_t block_stride = 0;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  // Bytes the tensor spans from base (its storage extent), for the bounds check.
  std::uint64_t extent_bytes = 0;
};

class PagedKvCache {
 public:
  // Checks every layer against the model: one layer per layer of the group
  // (layer i of the list is layer first_layer + i of the model), block_size
  // == tokens_per_block, and the strides address no byte outside
  // [base, base + extent_bytes). InvalidArgument naming the layer and the
  // value otherwise.
  static StatusOr<PagedKvCache> Create(const ModelFingerprint& model,
                                       std::vector<PagedLayer> layers);

  // Copies layer `layer` of the kvfabric block `payload` (all layers, as
  // docs/block-format.md) into engine page `page` of that layer, first
  // `tokens` tokens (<= tokens_per_block; a partial tail block). OutOfRange
  // for a page past num_blocks; InvalidArgument for a short payload.
  Status BlockToPage(std::span<const std::byte> payload, std::uint32_t layer, std::uint64_t page,
                     std::uint32_t tokens) const;
  // The reverse: engine page `page` of layer `layer` into the block payload.
  Status PageToBlock(std::uint32_t layer, std::uint64_t page, std::span<std::byte> payload) const;

  std::uint32_t layers() const { return static_cast<std::uint32_t>(layers_.size()); }
  std::uint64_t num_blocks(std::uint32_t layer) const { return layers_[layer].num_blocks; }

 private:
  PagedKvCache(std::vector<PagedLayer> layers, std::uint32_t tokens_per_block,
               std::uint32_t kv_heads, std::uint32_t head_dim, std::uint32_t element_bytes)
      : layers_(std::move(layers)),
        tokens_per_block_(tokens_per_block),
        kv_heads_(kv_heads),
        head_dim_(head_dim),
        element_bytes_(element_bytes) {}

  Status CheckPage(std::uint32_t layer, std::uint64_t page) const;
  template <bool kToPage>
  void CopyHalf(std::byte* block_half, std::byte* page_half, std::uint32_t tokens,
                const PagedLayer& l) const;

  std::vector<PagedLayer> layers_;
  std::uint32_t tokens_per_block_ = 0;
  std::uint32_t kv_heads_ = 0;
  std::uint32_t head_dim_ = 0;
  std::uint32_t element_bytes_ = 0;
};

}  // namespace kvfabric::python

#endif  // KVFABRIC_PYTHON_SRC_PAGED_KV_CACHE_H_
