#include "client/synthetic_transformer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "client/synthetic_model.h"

namespace kvfabric::client {
namespace {

ModelFingerprint Model() {
  ModelFingerprint m;
  m.model_id = "synthetic/transformer-test";
  m.layer_count = 4;
  m.kv_heads = 2;
  m.head_dim = 32;
  m.dtype = KvDtype::kFp16;
  m.tokens_per_block = 16;
  return m;
}

SyntheticTransformerOptions Options() {
  SyntheticTransformerOptions o;
  o.model = Model();
  o.hidden = 64;
  o.ffn = 128;
  o.depth = 2;
  o.vocab = 1000;
  o.max_context_tokens = 1024;
  o.max_chunk_tokens = 40;  // several chunks per call in the tests below
  o.tile_tokens = 24;       // tiles that do not line up with blocks
  return o;
}

struct History {
  std::vector<std::byte> bytes;
  std::uint64_t block_bytes;
  HostHistory view() const { return HostHistory::Contiguous(bytes, block_bytes); }
};

// Prefills blocks [0, blocks) in one call; returns the history.
History Whole(SyntheticTransformer& t, std::uint32_t blocks, PrefillResult* r = nullptr) {
  const ModelFingerprint m = Model();
  History h{std::vector<std::byte>(blocks * *m.BlockBytes()), *m.BlockBytes()};
  std::vector<std::uint32_t> ids(blocks * m.tokens_per_block);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint32_t>(i * 7 + 3);
  std::vector<std::uint64_t> seeds(blocks);
  for (std::uint32_t b = 0; b < blocks; ++b) seeds[b] = 100 + b;
  auto res = t.Prefill(HostHistory(), 0, ids, seeds, h.bytes);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  if (r != nullptr && res.ok()) *r = *res;
  return h;
}

TEST(SyntheticTransformerTest, WritesTheGeneratorsKvForEveryBlock) {
  auto t = SyntheticTransformer::Create(Options());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const ModelFingerprint m = Model();
  const History h = Whole(**t, 3);
  std::vector<std::byte> expect(*m.BlockBytes());
  for (std::uint32_t b = 0; b < 3; ++b) {
    ASSERT_TRUE(SyntheticKv(m, 100 + b, 16, expect).ok());
    EXPECT_EQ(0, std::memcmp(expect.data(), h.bytes.data() + b * h.block_bytes, expect.size()))
        << "block " << b;
  }
}

TEST(SyntheticTransformerTest, CountsTheQuadraticTermExactly) {
  auto t = SyntheticTransformer::Create(Options());
  ASSERT_TRUE(t.ok());
  const History h = Whole(**t, 4);
  // 24 tokens (a partial second block) after 2 blocks: each new token i
  // (0-based) attends to 32 + i + 1 keys, in each of the 2 decoder layers.
  std::vector<std::uint32_t> ids(24, 5);
  std::vector<std::uint64_t> seeds = {7, 8};
  std::vector<std::byte> out(2 * h.block_bytes);
  auto r = (*t)->Prefill(h.view(), 2, ids, seeds, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::uint64_t n = 24, p = 32;
  EXPECT_EQ(r->attention_pairs, 2 * (n * p + n * (n + 1) / 2));
  // Per token: 2 layers x 2 x (hidden x head_dim x 2 + hidden x ffn x 2); the
  // LM head once.
  EXPECT_EQ(r->matmul_flops, n * 2 * 2 * (64 * 32 * 2 + 64 * 128 * 2) + 2 * 1000 * 64);
  // Rows past the last token are zero.
  const std::uint64_t row = 2 * 32 * 2;
  for (std::uint64_t i = 8 * row; i < 16 * row; ++i) {
    ASSERT_EQ(out[h.block_bytes + i], std::byte{0}) << "byte " << i << " of layer 0's K";
  }
}

TEST(SyntheticTransformerTest, AttentionReadsThePrefixKv) {
  auto t = SyntheticTransformer::Create(Options());
  ASSERT_TRUE(t.ok());
  History h = Whole(**t, 4);
  std::vector<std::uint32_t> ids(16, 9);
  std::vector<std::uint64_t> seeds = {11};
  std::vector<std::byte> out(h.block_bytes);
  auto a = (*t)->Prefill(h.view(), 4, std::span(ids), seeds, out);
  auto b = (*t)->Prefill(h.view(), 4, std::span(ids), seeds, out);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->checksum, b->checksum) << "deterministic";
  // Change one K element of model layer 0 (decoder layer 0 reads it), KV
  // head 0, token 5 of block 1: the result must change.
  h.bytes[h.block_bytes + 5 * 2 * 32 * 2 + 3] ^= std::byte{0x40};
  auto c = (*t)->Prefill(h.view(), 4, std::span(ids), seeds, out);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->checksum, c->checksum);
}

TEST(SyntheticTransformerTest, ChunkingDoesNotChangeTheKvAndCountsTheSamePairs) {
  SyntheticTransformerOptions small = Options();
  SyntheticTransformerOptions big = Options();
  big.max_chunk_tokens = 4096;
  auto a = SyntheticTransformer::Create(small);
  auto b = SyntheticTransformer::Create(big);
  ASSERT_TRUE(a.ok() && b.ok());
  PrefillResult ra, rb;
  const History ha = Whole(**a, 5, &ra);
  const History hb = Whole(**b, 5, &rb);
  EXPECT_EQ(ha.bytes, hb.bytes);
  EXPECT_EQ(ra.attention_pairs, rb.attention_pairs);
  EXPECT_EQ(ra.attention_pairs, 2u * 80 * 81 / 2);
}

TEST(SyntheticTransformerTest, ConcurrentCallersShareTheSlots) {
  SyntheticTransformerOptions o = Options();
  o.concurrency = 2;
  auto t = SyntheticTransformer::Create(o);
  ASSERT_TRUE(t.ok());
  PrefillResult want;
  Whole(**t, 3, &want);
  std::vector<std::thread> threads;
  std::vector<double> sums(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      PrefillResult r;
      Whole(**t, 3, &r);
      sums[i] = r.checksum;
    });
  }
  for (auto& th : threads) th.join();
  for (double s : sums) EXPECT_EQ(s, want.checksum);
}

TEST(SyntheticPrefillProbeTest, TimesPrefillsOfTheSizesItWasMadeFor) {
  auto t = SyntheticTransformer::Create(Options());
  ASSERT_TRUE(t.ok());
  auto probe = SyntheticPrefillProbe::Create(t->get(), 64, 256);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  auto us = (*probe)->Run(64, 256);
  ASSERT_TRUE(us.ok()) << us.status().ToString();
  EXPECT_GT(*us, 0.0);
  EXPECT_TRUE((*probe)->Run(65, 0).status().IsInvalidArgument());
  EXPECT_TRUE((*probe)->Run(16, 272).status().IsInvalidArgument());
  EXPECT_TRUE((*probe)->Run(16, 8).status().IsInvalidArgument());
  EXPECT_TRUE(SyntheticPrefillProbe::Create(t->get(), 1000, 100).status().IsInvalidArgument());
}

TEST(SyntheticTransformerTest, RefusesBadArguments) {
  SyntheticTransformerOptions o = Options();
  o.depth = 5;
  auto bad = SyntheticTransformer::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("depth 5"), std::string::npos) << bad.status().ToString();
  o = Options();
  o.max_context_tokens = 0;
  EXPECT_FALSE(SyntheticTransformer::Create(o).ok());

  auto t = SyntheticTransformer::Create(Options());
  ASSERT_TRUE(t.ok());
  const std::uint64_t bb = *Model().BlockBytes();
  std::vector<std::byte> out(bb);
  std::vector<std::uint32_t> ids(16, 1);
  std::vector<std::uint64_t> one = {1}, two = {1, 2};
  // Seeds that do not match the blocks.
  EXPECT_FALSE((*t)->Prefill(HostHistory(), 0, ids, two, out).ok());
  // A prefix shorter than first_block.
  EXPECT_FALSE((*t)->Prefill(HostHistory(), 1, ids, one, out).ok());
  // Beyond max_context_tokens (1024 = 64 blocks).
  std::vector<std::byte> hist(64 * bb);
  auto r = (*t)->Prefill(HostHistory::Contiguous(hist, bb), 64, ids, one, out);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_context_tokens"), std::string::npos);
  // No tokens.
  EXPECT_FALSE((*t)->Prefill(HostHistory(), 0, {}, {}, {}).ok());
}

}  // namespace
}  // namespace kvfabric::client
