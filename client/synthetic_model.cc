#include "client/synthetic_model.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/kernels/reference_attention.h"

namespace kvfabric::client {
namespace {

// 16 random bits -> a value of magnitude [1/16, 1): sign, 2 exponent bits,
// mantissa bits.
std::uint16_t Fp16(std::uint16_t r) {
  return static_cast<std::uint16_t>((r & 0x8000) | ((11u + ((r >> 10) & 3u)) << 10) |
                                    (r & 0x3ff));
}
std::uint16_t Bf16(std::uint16_t r) {
  return static_cast<std::uint16_t>((r & 0x8000) | ((123u + ((r >> 7) & 3u)) << 7) | (r & 0x7f));
}
std::uint32_t Fp32(std::uint32_t r) {
  return (r & 0x80000000u) | ((123u + ((r >> 23) & 3u)) << 23) | (r & 0x7fffffu);
}

// A 32-bit integer hash of (seed, i) (lowbias32-style mixing).
inline std::uint32_t Hash32(std::uint32_t seed, std::uint32_t i) {
  std::uint32_t x = i * 0x9e3779b1u ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

}  // namespace

std::uint64_t NextSplitMix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t SeedFromKey(const BlockKey& key, std::uint64_t salt) {
  std::uint64_t s = 0;
  std::memcpy(&s, key.bytes().data(), sizeof(s));
  std::uint64_t x = s ^ (salt * 0xd1b54a32d192ed03ull);
  return NextSplitMix64(x);
}

Status SyntheticKv(const ModelFingerprint& model, std::uint64_t seed, std::uint32_t valid_tokens,
                   std::span<std::byte> out) {
  KVF_ASSIGN_OR_RETURN(const std::uint64_t block_bytes, model.BlockBytes());
  if (out.size() != block_bytes) {
    return Status::InvalidArgument("SyntheticKv: " + std::to_string(out.size()) +
                                   " bytes for a block of " + std::to_string(block_bytes));
  }
  const std::uint32_t elem = KvDtypeSize(model.dtype);
  if (model.dtype != KvDtype::kFp16 && model.dtype != KvDtype::kBf16 &&
      model.dtype != KvDtype::kFp32) {
    return Status::InvalidArgument("SyntheticKv: dtype " + std::string(KvDtypeName(model.dtype)) +
                                   " (fp16, bf16 or fp32 only)");
  }
  const std::uint64_t row = std::uint64_t{model.kv_heads} * model.head_dim * elem;
  const std::uint64_t half = row * model.tokens_per_block;  // K (or V) of one layer
  const std::uint64_t valid = row * std::min(valid_tokens, model.tokens_per_block);
  // Counter-based (element pairs are hashed independently), so the loop
  // vectorises: the generator must outrun the prefill time it stands in for.
  const auto s32 = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  std::uint32_t counter = 0;
  for (std::uint64_t base = 0; base < out.size(); base += half) {
    std::byte* p = out.data() + base;
    const std::uint64_t words = valid / 4;
    auto* w = reinterpret_cast<std::uint32_t*>(p);
    if (elem == 4) {
      for (std::uint64_t i = 0; i < words; ++i) {
        w[i] = Fp32(Hash32(s32, counter + static_cast<std::uint32_t>(i)));
      }
    } else if (model.dtype == KvDtype::kFp16) {
      for (std::uint64_t i = 0; i < words; ++i) {
        const std::uint32_t h = Hash32(s32, counter + static_cast<std::uint32_t>(i));
        w[i] = Fp16(static_cast<std::uint16_t>(h)) |
               (std::uint32_t{Fp16(static_cast<std::uint16_t>(h >> 16))} << 16);
      }
    } else {
      for (std::uint64_t i = 0; i < words; ++i) {
        const std::uint32_t h = Hash32(s32, counter + static_cast<std::uint32_t>(i));
        w[i] = Bf16(static_cast<std::uint16_t>(h)) |
               (std::uint32_t{Bf16(static_cast<std::uint16_t>(h >> 16))} << 16);
      }
    }
    counter += static_cast<std::uint32_t>(words);
    std::memset(p + valid, 0, half - valid);
  }
  return Status::OK();
}

Status ResidentAttention(const ModelFingerprint& model, std::uint32_t num_q_heads,
                         std::uint32_t tile_tokens, std::span<const std::byte> history,
                         std::uint32_t tokens, std::uint32_t layer, std::span<const float> q,
                         std::span<float> out, std::span<float> lse) {
  KVF_ASSIGN_OR_RETURN(const std::uint64_t block_bytes, model.BlockBytes());
  const std::uint32_t tpb = model.tokens_per_block;
  const std::uint64_t blocks = (std::uint64_t{tokens} + tpb - 1) / tpb;
  if (history.size() < blocks * block_bytes) {
    return Status::InvalidArgument("ResidentAttention: history of " +
                                   std::to_string(history.size()) + " bytes for " +
                                   std::to_string(tokens) + " tokens");
  }
  return ResidentAttention(model, num_q_heads, tile_tokens,
                           HostHistory::Contiguous(history.first(blocks * block_bytes), block_bytes),
                           tokens, layer, q, out, lse);
}

Status ResidentAttention(const ModelFingerprint& model, std::uint32_t num_q_heads,
                         std::uint32_t tile_tokens, const HostHistory& history,
                         std::uint32_t tokens, std::uint32_t layer, std::span<const float> q,
                         std::span<float> out, std::span<float> lse) {
  KVF_ASSIGN_OR_RETURN(const std::uint64_t block_bytes, model.BlockBytes());
  const std::uint32_t tpb = model.tokens_per_block;
  const std::uint64_t blocks = (std::uint64_t{tokens} + tpb - 1) / tpb;
  if (history.blocks() < blocks || history.block_bytes() < block_bytes ||
      layer >= model.layer_count) {
    return Status::InvalidArgument("ResidentAttention: history of " +
                                   std::to_string(history.blocks()) + " blocks for " +
                                   std::to_string(tokens) + " tokens, layer " +
                                   std::to_string(layer));
  }
  const std::uint64_t row = std::uint64_t{model.kv_heads} * model.head_dim *
                            KvDtypeSize(model.dtype);
  const std::uint64_t half = row * tpb;
  std::vector<std::byte> k(row * tokens), v(row * tokens);
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t n = std::min<std::uint64_t>(tpb, tokens - b * tpb);
    const std::byte* src = history.block(static_cast<std::uint32_t>(b)).data() + layer * 2 * half;
    std::memcpy(k.data() + b * half, src, n * row);
    std::memcpy(v.data() + b * half, src + half, n * row);
  }
  gpu::AttentionShape shape;
  shape.num_q_heads = num_q_heads;
  shape.num_kv_heads = model.kv_heads;
  shape.head_dim = model.head_dim;
  shape.dtype = model.dtype;
  const float scale = 1.0f / std::sqrt(static_cast<float>(model.head_dim));
  return gpu::TiledAttentionHost(shape, scale, tokens, tile_tokens, q, k, v, out, lse);
}

}  // namespace kvfabric::client
