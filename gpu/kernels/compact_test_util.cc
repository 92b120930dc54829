#include "gpu/kernels/compact_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <utility>

#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/float_convert.h"

namespace kvfabric::gpu::testing {
namespace {

std::uint64_t Align(std::uint64_t x) { return (x + 255) / 256 * 256; }

}  // namespace

std::uint64_t CompactTile::SliceBytes() const {
  return 2 * CompactHalfBytes(block_tokens, kv_heads, head_dim);
}

CompactTile MakeCompactTile(std::mt19937_64& rng, std::uint32_t block_tokens, std::uint32_t blocks,
                            std::uint32_t kv_heads, std::uint32_t head_dim) {
  CompactTile tile{block_tokens, blocks, kv_heads, head_dim, {}, {}, {}};
  const CompactShape shape{KvDtype::kFp16, 1, block_tokens, kv_heads, head_dim};
  const std::size_t row = std::size_t{kv_heads} * head_dim;
  const std::size_t half = block_tokens * row;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::byte> exact(2 * half * 2);
  std::vector<float> decoded(2 * half);
  tile.slices.resize(blocks * tile.SliceBytes());
  for (std::uint32_t b = 0; b < blocks; ++b) {
    for (std::size_t i = 0; i < 2 * half; ++i) {
      const bool key = i < half;
      float x = normal(rng);
      if (key && (i % row) % 13 == 5) x *= 20.0f;
      if (!key) x *= 0.5f + static_cast<float>((i - half) / row % 4);
      Store(KvDtype::kFp16, x, exact.data() + i * 2);
    }
    std::span<std::byte> slice(tile.slices.data() + b * tile.SliceBytes(), tile.SliceBytes());
    EXPECT_TRUE(EncodeCompactInt8(shape, exact, slice).ok());
    EXPECT_TRUE(DecodeCompactInt8(shape, slice, decoded).ok());
    tile.keys.insert(tile.keys.end(), decoded.begin(), decoded.begin() + half);
    tile.values.insert(tile.values.end(), decoded.begin() + half, decoded.end());
  }
  return tile;
}

CompactAttentionTileArgs CompactTileLayout(const CompactTile& tile, std::uint32_t q_heads,
                                           float scale) {
  CompactAttentionTileArgs a;
  a.shape = {q_heads, tile.kv_heads, tile.head_dim, KvDtype::kInt8};
  a.scale = scale;
  a.block_tokens = tile.block_tokens;
  a.blocks = tile.blocks;
  const std::uint64_t q_bytes = std::uint64_t{q_heads} * tile.head_dim * 4;
  a.query = {0, q_bytes};
  a.slices = {Align(q_bytes), tile.slices.size()};
  a.output = {Align(a.slices.offset + a.slices.bytes), q_bytes};
  a.lse = {Align(a.output.offset + q_bytes), std::uint64_t{q_heads} * 4};
  return a;
}

std::uint64_t CompactTileArenaBytes(const CompactAttentionTileArgs& args) {
  return Align(args.lse.offset + args.lse.bytes);
}

Problem DecodedProblem(const CompactTile& tile, std::uint32_t q_heads, float scale,
                       std::vector<float> q) {
  Problem p;
  p.shape = {q_heads, tile.kv_heads, tile.head_dim, KvDtype::kFp32};
  p.scale = scale;
  p.tokens = tile.blocks * tile.block_tokens;
  p.q = std::move(q);
  p.k.resize(tile.keys.size() * 4);
  p.v.resize(tile.values.size() * 4);
  std::memcpy(p.k.data(), tile.keys.data(), p.k.size());
  std::memcpy(p.v.data(), tile.values.data(), p.v.size());
  return p;
}

}  // namespace kvfabric::gpu::testing
