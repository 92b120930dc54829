#include "python/src/paged_kv_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace kvfabric::python {
namespace {

ModelFingerprint Model() {
  ModelFingerprint fp;
  fp.model_id = "paged-kv-cache-test";
  fp.layer_count = 2;
  fp.dtype = KvDtype::kFp32;
  fp.kv_heads = 2;
  fp.head_dim = 4;
  fp.tokens_per_block = 4;
  return fp;
}

// Engine pages [2, num_blocks, block_size, kv_heads, head_dim] of fp32, and a
// block payload whose element (layer, kv, t, h, d) holds a distinct value.
struct Fixture {
  static constexpr std::uint64_t kBlocks = 3;
  static constexpr std::uint32_t kElems = 4 * 2 * 4;  // block_size * heads * dim
  std::vector<std::vector<float>> layers =
      std::vector<std::vector<float>>(2, std::vector<float>(2 * kBlocks * kElems, -1.0f));
  std::vector<float> block = std::vector<float>(2 * 2 * kElems);

  Fixture() {
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<float>(i);
  }
  PagedLayer Layer(int l) {
    PagedLayer p;
    p.base = reinterpret_cast<std::byte*>(layers[l].data());
    p.num_blocks = kBlocks;
    p.kv_stride = kBlocks * kElems * 4;
    p.block_stride = kElems * 4;
    p.token_stride = 2 * 4 * 4;
    p.head_stride = 4 * 4;
    p.extent_bytes = layers[l].size() * 4;
    return p;
  }
  std::span<std::byte> Payload() { return std::as_writable_bytes(std::span(block)); }
};

TEST(PagedKvCacheTest, ALayerOfABlockLandsInItsPageAndComesBack) {
  Fixture f;
  StatusOr<PagedKvCache> cache = PagedKvCache::Create(Model(), {f.Layer(0), f.Layer(1)});
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  ASSERT_TRUE(cache->BlockToPage(f.Payload(), 1, 2, 4).ok());
  // K of layer 1 is payload elements [64, 96), V [96, 128); page 2 of layer 1.
  for (std::uint32_t i = 0; i < Fixture::kElems; ++i) {
    EXPECT_EQ(f.layers[1][2 * Fixture::kElems + i], 64.0f + i);
    EXPECT_EQ(f.layers[1][(Fixture::kBlocks + 2) * Fixture::kElems + i], 96.0f + i);
  }
  EXPECT_EQ(f.layers[0][0], -1.0f);  // other layers and pages untouched
  EXPECT_EQ(f.layers[1][Fixture::kElems], -1.0f);
  std::vector<float> back(f.block.size(), 0.0f);
  ASSERT_TRUE(cache->PageToBlock(1, 2, std::as_writable_bytes(std::span(back))).ok());
  for (std::size_t i = 64; i < 128; ++i) EXPECT_EQ(back[i], f.block[i]);
}

TEST(PagedKvCacheTest, APartialTailCopiesOnlyItsTokensAndStridedPagesWork) {
  Fixture f;
  // Heads of a page interleaved with padding: token stride 2x the heads' bytes.
  std::vector<float> padded(2 * Fixture::kBlocks * Fixture::kElems * 2, -1.0f);
  PagedLayer l = f.Layer(0);
  l.base = reinterpret_cast<std::byte*>(padded.data());
  l.kv_stride *= 2;
  l.block_stride *= 2;
  l.token_stride *= 2;
  l.extent_bytes = padded.size() * 4;
  StatusOr<PagedKvCache> cache = PagedKvCache::Create(Model(), {l, f.Layer(1)});
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  ASSERT_TRUE(cache->BlockToPage(f.Payload(), 0, 0, 3).ok());
  for (std::uint32_t t = 0; t < 4; ++t) {
    for (std::uint32_t e = 0; e < 8; ++e) {
      const float want = t < 3 ? static_cast<float>(t * 8 + e) : -1.0f;
      EXPECT_EQ(padded[t * 16 + e], want) << "token " << t << " element " << e;
      EXPECT_EQ(padded[t * 16 + 8 + e], -1.0f);  // padding untouched
    }
  }
}

TEST(PagedKvCacheTest, RefusesWhatDoesNotFitTheModelOrTheTensor) {
  Fixture f;
  EXPECT_EQ(PagedKvCache::Create(Model(), {f.Layer(0)}).status().code(),
            StatusCode::kInvalidArgument);  // one layer of two
  PagedLayer small = f.Layer(1);
  small.extent_bytes -= 4;
  Status s = PagedKvCache::Create(Model(), {f.Layer(0), small}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("KV cache layer 1"), std::string_view::npos) << s.ToString();
  StatusOr<PagedKvCache> cache = PagedKvCache::Create(Model(), {f.Layer(0), f.Layer(1)});
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->BlockToPage(f.Payload(), 0, 3, 4).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache->BlockToPage(f.Payload(), 2, 0, 4).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache->BlockToPage(f.Payload().first(16), 0, 0, 4).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->BlockToPage(f.Payload(), 0, 0, 5).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfabric::python
