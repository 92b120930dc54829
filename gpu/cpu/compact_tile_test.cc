// Device::DecodeAttentionCompactTile on the CPU backend: bit-identical to the
// compact kernel called directly on the same bytes, within the float rounding
// bound of gpu/kernels/attention_test_util.h of exact (FP64) attention over
// the values the codes decode to, and its argument checks (which every
// backend shares: gpu/kernel_args.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/kernels/attention_test_util.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

namespace kvfabric::gpu {
namespace {

constexpr std::uint64_t kArenaBytes = 4 << 20;

std::uint64_t Align(std::uint64_t x) { return (x + 255) / 256 * 256; }

std::unique_ptr<Device> MakeDevice(bool scalar) {
  DeviceOptions options;
  options.arena_bytes = kArenaBytes;
  CpuDeviceOptions cpu;
  cpu.scalar_kernels = scalar;
  auto device = CreateCpuDevice(options, cpu);
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(device).value();
}

// A tile of `blocks` compact blocks (one layer each) encoded from random fp16
// KV shaped like real KV (keys with outlier channels, values whose size
// varies by token), and the values they decode to.
struct CompactTile {
  std::uint32_t block_tokens = 0, blocks = 0, kv_heads = 0, head_dim = 0;
  std::vector<std::byte> slices;    // blocks x [K half, V half]
  std::vector<float> keys, values;  // decoded, [blocks * block_tokens, kv_heads, head_dim]

  std::uint64_t SliceBytes() const {
    return 2 * CompactHalfBytes(block_tokens, kv_heads, head_dim);
  }
};

CompactTile MakeTile(std::mt19937_64& rng, std::uint32_t block_tokens, std::uint32_t blocks,
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
      const std::uint16_t bits = FloatToFp16Bits(x);
      std::memcpy(exact.data() + i * 2, &bits, 2);
    }
    std::span<std::byte> slice(tile.slices.data() + b * tile.SliceBytes(), tile.SliceBytes());
    EXPECT_TRUE(EncodeCompactInt8(shape, exact, slice).ok());
    EXPECT_TRUE(DecodeCompactInt8(shape, slice, decoded).ok());
    tile.keys.insert(tile.keys.end(), decoded.begin(), decoded.begin() + half);
    tile.values.insert(tile.values.end(), decoded.begin() + half, decoded.end());
  }
  return tile;
}

// Arena layout of one call: query, slices, output, lse, each 256-aligned.
CompactAttentionTileArgs Layout(const CompactTile& tile, std::uint32_t q_heads, float scale) {
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

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(CompactTileTest, ThroughTheDeviceEqualsTheKernelBitForBitAndExactAttentionOnDecodedValues) {
  std::mt19937_64 rng(TestSeed(
      "CompactTileTest.ThroughTheDeviceEqualsTheKernelBitForBitAndExactAttentionOnDecodedValues"));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int cases = 0;
  double worst = 0;
  for (bool scalar : {false, true}) {
    auto device = MakeDevice(scalar);
    const cpu_kernels::KernelIsa isa =
        scalar ? cpu_kernels::KernelIsa::kScalar : cpu_kernels::BestKernelIsa();
    struct Case {
      std::uint32_t q_heads, kv_heads, head_dim, block_tokens, blocks;
    };
    for (const Case& c : {Case{8, 2, 64, 16, 1}, Case{8, 2, 64, 16, 5}, Case{4, 4, 128, 16, 16},
                          Case{32, 8, 128, 16, 3}, Case{6, 3, 40, 7, 9}, Case{2, 1, 256, 1, 33}}) {
      const std::string what =
          std::string(scalar ? "scalar" : "best") + " q_heads " + std::to_string(c.q_heads) +
          " kv_heads " + std::to_string(c.kv_heads) + " head_dim " + std::to_string(c.head_dim) +
          " blocks " + std::to_string(c.blocks) + " x " + std::to_string(c.block_tokens);
      SCOPED_TRACE(what);
      const CompactTile tile = MakeTile(rng, c.block_tokens, c.blocks, c.kv_heads, c.head_dim);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const CompactAttentionTileArgs a = Layout(tile, c.q_heads, scale);
      std::vector<float> q(std::size_t{c.q_heads} * c.head_dim);
      for (float& x : q) x = normal(rng);
      ASSERT_TRUE(device->TEST_Write(std::as_bytes(std::span(q)), a.query).ok());
      ASSERT_TRUE(device->TEST_Write(tile.slices, a.slices).ok());
      ASSERT_TRUE(device->DecodeAttentionCompactTile(a).ok());
      ASSERT_TRUE(
          device->Synchronize(std::chrono::steady_clock::now() + std::chrono::seconds(10)).ok());
      std::vector<float> out(q.size()), lse(c.q_heads);
      ASSERT_TRUE(device->TEST_Read(a.output, std::as_writable_bytes(std::span(out))).ok());
      ASSERT_TRUE(device->TEST_Read(a.lse, std::as_writable_bytes(std::span(lse))).ok());

      std::vector<const std::byte*> slices;
      for (std::uint32_t b = 0; b < c.blocks; ++b) {
        slices.push_back(tile.slices.data() + b * tile.SliceBytes());
      }
      std::vector<float> direct(q.size()), direct_lse(c.q_heads);
      DecodeAttentionCompactInt8BlocksWith(isa, a.shape, scale, c.block_tokens, c.blocks, q.data(),
                                           slices.data(), direct.data(), direct_lse.data());
      EXPECT_TRUE(SameBits(out, direct));
      EXPECT_TRUE(SameBits(lse, direct_lse));

      // Exact attention over the values the codes stand for, in FP64.
      testing::Problem p;
      p.shape = {c.q_heads, c.kv_heads, c.head_dim, KvDtype::kFp32};
      p.scale = scale;
      p.tokens = c.blocks * c.block_tokens;
      p.q = q;
      p.k.resize(tile.keys.size() * 4);
      p.v.resize(tile.values.size() * 4);
      std::memcpy(p.k.data(), tile.keys.data(), p.k.size());
      std::memcpy(p.v.data(), tile.values.data(), p.v.size());
      worst = std::max(worst, testing::ExpectNearFp64(p, {out, lse}, 1, what, c.head_dim + 3));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 12);
  std::printf("largest error against FP64 over the decoded values / asserted tolerance: %.3g\n",
              worst);
}

// Every refusal names the field; nothing reaches the compute queue.
TEST(CompactTileTest, RefusesBadArgumentsNamingTheField) {
  auto device = MakeDevice(false);
  std::mt19937_64 rng(1);
  const CompactTile tile = MakeTile(rng, 16, 2, 2, 64);
  const CompactAttentionTileArgs good = Layout(tile, 4, 0.125f);
  auto refusal = [&](CompactAttentionTileArgs a) {
    Status s = device->DecodeAttentionCompactTile(a);
    EXPECT_TRUE(s.IsInvalidArgument()) << s;
    return std::string(s.message());
  };
  auto expect_refused = [&](const CompactAttentionTileArgs& a, const std::string& needle) {
    const std::string message = refusal(a);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  CompactAttentionTileArgs a = good;
  a.shape.dtype = KvDtype::kFp16;
  expect_refused(a, "CompactAttentionTileArgs.shape.dtype=fp16");
  a = good;
  a.shape.num_kv_heads = 0;
  expect_refused(a, "CompactAttentionTileArgs.shape.num_kv_heads=0");
  a = good;
  a.shape.num_q_heads = 3;
  expect_refused(a, "CompactAttentionTileArgs.shape.num_q_heads=3");
  a = good;
  a.shape.head_dim = kMaxHeadDim + 1;
  expect_refused(a, "CompactAttentionTileArgs.shape.head_dim=513");
  a = good;
  a.scale = std::numeric_limits<float>::quiet_NaN();
  expect_refused(a, "CompactAttentionTileArgs.scale=");
  a = good;
  a.blocks = 0;
  expect_refused(a, "CompactAttentionTileArgs.blocks=0");
  a = good;
  a.block_tokens = 0;
  expect_refused(a, "block_tokens=0");
  a = good;
  a.blocks = kMaxCompactTileTokens / 16 + 1;  // one block past the tile's limit
  expect_refused(a, "kMaxCompactTileTokens=4096");
  a = good;
  a.slices.bytes -= 8;
  expect_refused(a, "CompactAttentionTileArgs.slices.bytes=" + std::to_string(a.slices.bytes) +
                        " but the layout needs blocks(2) * halves(2) * CompactHalfBytes");
  a = good;
  a.slices.offset += 4;  // 4-aligned, not 8
  expect_refused(a, "CompactAttentionTileArgs.slices.offset=" + std::to_string(a.slices.offset) +
                        " is not a multiple of its element size 8");
  a = good;
  a.query.bytes = 4;
  expect_refused(a, "CompactAttentionTileArgs.query.bytes=4");
  a = good;
  a.output.offset = a.slices.offset;
  expect_refused(a, "CompactAttentionTileArgs.output");
  EXPECT_NE(refusal(a).find("overlaps CompactAttentionTileArgs.slices"), std::string::npos);
  a = good;
  a.lse.offset = kArenaBytes - 8;
  expect_refused(a, "CompactAttentionTileArgs.lse [offset=");
  EXPECT_NE(refusal(a).find("outside the arena"), std::string::npos);
  EXPECT_EQ(TEST_CpuDeviceHooks(*device)->PendingEntries(Queue::kCompute), 0u);
  EXPECT_TRUE(device->DecodeAttentionCompactTile(good).ok());
}

}  // namespace
}  // namespace kvfabric::gpu
