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
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/compact_test_util.h"
#include "gpu/kernels/cpu_kernels.h"

namespace kvfabric::gpu {
namespace {

constexpr std::uint64_t kArenaBytes = 4 << 20;

std::unique_ptr<Device> MakeDevice(bool scalar) {
  DeviceOptions options;
  options.arena_bytes = kArenaBytes;
  CpuDeviceOptions cpu;
  cpu.scalar_kernels = scalar;
  auto device = CreateCpuDevice(options, cpu);
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(device).value();
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
      const testing::CompactTile tile =
          testing::MakeCompactTile(rng, c.block_tokens, c.blocks, c.kv_heads, c.head_dim);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const CompactAttentionTileArgs a = testing::CompactTileLayout(tile, c.q_heads, scale);
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
      const testing::Problem p = testing::DecodedProblem(tile, c.q_heads, scale, q);
      worst = std::max(worst, testing::ExpectNearFp64(p, {out, lse}, 1, what,
                                                      testing::CompactDotRoundings(c.head_dim)));
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
  const testing::CompactTile tile = testing::MakeCompactTile(rng, 16, 2, 2, 64);
  const CompactAttentionTileArgs good = testing::CompactTileLayout(tile, 4, 0.125f);
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
