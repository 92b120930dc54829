#include "python/src/paged_kv_cache.h"

#include <cstring>
#include <string>
#include <utility>

namespace kvfabric::python {

StatusOr<PagedKvCache> PagedKvCache::Create(const ModelFingerprint& model,
                                            std::vector<PagedLayer> layers) {
  KVF_RETURN_IF_ERROR(model.Validate());
  if (layers.size() != model.layer_count) {
    return Status::InvalidArgument(
        "the KV cache has " + std::to_string(layers.size()) +
        " layers; the model's layer group has layer_count = " + std::to_string(model.layer_count));
  }
  const std::uint32_t e = KvDtypeSize(model.dtype);
  const auto row = static_cast<unsigned __int128>(model.head_dim) * e;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const PagedLayer& l = layers[i];
    const std::string which = "KV cache layer " + std::to_string(i);
    if (l.base == nullptr || l.num_blocks == 0) {
      return Status::InvalidArgument(which + " has no memory (null base or 0 blocks)");
    }
    if (l.kv_stride < 0 || l.block_stride < 0 || l.token_stride < 0 || l.head_stride < 0) {
      return Status::InvalidArgument(which + " has a negative stride");
    }
    // The last byte any element addresses, which must lie inside the tensor.
    const unsigned __int128 last = static_cast<unsigned __int128>(l.kv_stride) +
                                   static_cast<unsigned __int128>(l.num_blocks - 1) *
                                       static_cast<std::uint64_t>(l.block_stride) +
                                   static_cast<unsigned __int128>(model.tokens_per_block - 1) *
                                       static_cast<std::uint64_t>(l.token_stride) +
                                   static_cast<unsigned __int128>(model.kv_heads - 1) *
                                       static_cast<std::uint64_t>(l.head_stride) +
                                   row;
    if (last > l.extent_bytes) {
      return Status::InvalidArgument(
          which + ": its strides address " + std::to_string(static_cast<std::uint64_t>(last)) +
          " bytes but the tensor spans " + std::to_string(l.extent_bytes) +
          " (shape [2, num_blocks, block_size = tokens_per_block = " +
          std::to_string(model.tokens_per_block) + ", kv_heads = " +
          std::to_string(model.kv_heads) + ", head_dim = " + std::to_string(model.head_dim) +
          "] of " + std::string(KvDtypeName(model.dtype)) + " expected)");
    }
  }
  return PagedKvCache(std::move(layers), model.tokens_per_block, model.kv_heads, model.head_dim, e);
}

Status PagedKvCache::CheckPage(std::uint32_t layer, std::uint64_t page) const {
  if (layer >= layers_.size()) {
    return Status::OutOfRange("layer " + std::to_string(layer) + " of a KV cache of " +
                              std::to_string(layers_.size()) + " layers");
  }
  if (page >= layers_[layer].num_blocks) {
    return Status::OutOfRange("engine block " + std::to_string(page) + " of layer " +
                              std::to_string(layer) + ", which has " +
                              std::to_string(layers_[layer].num_blocks) + " blocks");
  }
  return Status::OK();
}

template <bool kToPage>
void PagedKvCache::CopyHalf(std::byte* block_half, std::byte* page_half, std::uint32_t tokens,
                            const PagedLayer& l) const {
  const std::uint64_t row = std::uint64_t{head_dim_} * element_bytes_;
  const std::uint64_t token_bytes = row * kv_heads_;
  if (static_cast<std::uint64_t>(l.head_stride) == row &&
      static_cast<std::uint64_t>(l.token_stride) == token_bytes) {
    if (kToPage) {
      std::memcpy(page_half, block_half, token_bytes * tokens);
    } else {
      std::memcpy(block_half, page_half, token_bytes * tokens);
    }
    return;
  }
  for (std::uint32_t t = 0; t < tokens; ++t) {
    for (std::uint32_t h = 0; h < kv_heads_; ++h) {
      std::byte* b = block_half + (std::uint64_t{t} * kv_heads_ + h) * row;
      std::byte* p = page_half + t * l.token_stride + h * l.head_stride;
      if (kToPage) {
        std::memcpy(p, b, row);
      } else {
        std::memcpy(b, p, row);
      }
    }
  }
}

Status PagedKvCache::BlockToPage(std::span<const std::byte> payload, std::uint32_t layer,
                                 std::uint64_t page, std::uint32_t tokens) const {
  KVF_RETURN_IF_ERROR(CheckPage(layer, page));
  const std::uint64_t half =
      std::uint64_t{tokens_per_block_} * kv_heads_ * head_dim_ * element_bytes_;
  if (payload.size() != half * 2 * layers_.size()) {
    return Status::InvalidArgument("a block payload of " + std::to_string(payload.size()) +
                                   " bytes; the model's blocks have " +
                                   std::to_string(half * 2 * layers_.size()));
  }
  if (tokens > tokens_per_block_) {
    return Status::InvalidArgument(std::to_string(tokens) + " tokens in a block of " +
                                   std::to_string(tokens_per_block_));
  }
  const PagedLayer& l = layers_[layer];
  // The payload is only read (kToPage); CopyHalf takes one pointer type for both ways.
  auto* k = const_cast<std::byte*>(payload.data()) + std::uint64_t{layer} * 2 * half;
  std::byte* page_k = l.base + page * l.block_stride;
  CopyHalf<true>(k, page_k, tokens, l);
  CopyHalf<true>(k + half, page_k + l.kv_stride, tokens, l);
  return Status::OK();
}

Status PagedKvCache::PageToBlock(std::uint32_t layer, std::uint64_t page,
                                 std::span<std::byte> payload) const {
  KVF_RETURN_IF_ERROR(CheckPage(layer, page));
  const std::uint64_t half =
      std::uint64_t{tokens_per_block_} * kv_heads_ * head_dim_ * element_bytes_;
  if (payload.size() != half * 2 * layers_.size()) {
    return Status::InvalidArgument("a block payload of " + std::to_string(payload.size()) +
                                   " bytes; the model's blocks have " +
                                   std::to_string(half * 2 * layers_.size()));
  }
  const PagedLayer& l = layers_[layer];
  std::byte* k = payload.data() + std::uint64_t{layer} * 2 * half;
  std::byte* page_k = l.base + page * l.block_stride;
  CopyHalf<false>(k, page_k, tokens_per_block_, l);
  CopyHalf<false>(k + half, page_k + l.kv_stride, tokens_per_block_, l);
  return Status::OK();
}

}  // namespace kvfabric::python
