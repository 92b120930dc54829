// CUDA attention kernels against the CPU kernels and the FP64 reference.
// Tests that need a GPU skip with one line when none is present; the
// argument checks run everywhere (they refuse before touching the device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/cuda/attention_launchers.h"
#include "gpu/cuda/attention_test_support.h"
#include "gpu/cuda/cuda_probe.h"
#include "gpu/kernels/attention_test_util.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/reference_attention.h"

namespace kvfabric::cuda {
namespace {

using gpu::testing::BoundFor;
using gpu::testing::ExpectNearFp64;
using gpu::testing::Logits;
using gpu::testing::MakeProblem;
using gpu::testing::Name;
using gpu::testing::Problem;
using gpu::testing::State;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::uint64_t Align(std::uint64_t x) { return (x + 255) / 256 * 256; }

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// Arena layout for one problem: q, the whole history (resident K and V), a
// staging tile (streamed K and V), three state slots and their lses:
// slot 0 running state, slot 1 tile state (contiguous, as MergeStatesArgs
// wants), slot 2 merge output.
struct Layout {
  std::uint64_t q, k, v, stage_k, stage_v, outs, lses, bytes;
  std::uint64_t token_bytes, elems_bytes, heads_bytes;

  Layout(const Problem& p, std::uint32_t tile) {
    token_bytes =
        std::uint64_t{p.shape.num_kv_heads} * p.shape.head_dim * KvDtypeSize(p.shape.dtype);
    elems_bytes = p.QElems() * 4;
    heads_bytes = std::uint64_t{p.shape.num_q_heads} * 4;
    q = 0;
    k = Align(q + elems_bytes);
    v = Align(k + p.tokens * token_bytes);
    stage_k = Align(v + p.tokens * token_bytes);
    stage_v = Align(stage_k + tile * token_bytes);
    outs = Align(stage_v + tile * token_bytes);
    lses = Align(outs + 3 * elems_bytes);
    bytes = Align(lses + 3 * heads_bytes);
  }
  gpu::DeviceRange Out(int slot) const { return {outs + slot * elems_bytes, elems_bytes}; }
  gpu::DeviceRange Lse(int slot) const { return {lses + slot * heads_bytes, heads_bytes}; }
};

class CudaAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbeResult r = ProbeCuda();
    if (r.devices.empty()) GTEST_SKIP() << "no CUDA device: " << r.status;
  }

  // Tiled attention on the GPU: decode each tile, fold it into the running
  // state with a 2-state merge (state first), as reference_attention.h
  // describes. `streamed`: each tile is copied into one staging region before
  // its kernel; otherwise kernels read the resident history.
  State RunTiled(const Problem& p, std::uint32_t tile, bool streamed) {
    const Layout L(p, tile);
    auto arena_or = CudaTestArena::Create(L.bytes);
    EXPECT_TRUE(arena_or.ok()) << arena_or.status();
    if (!arena_or.ok()) return {};
    CudaTestArena& arena = **arena_or;
    EXPECT_TRUE(arena.Write(L.q, Bytes(p.q)).ok());
    if (!streamed) {
      EXPECT_TRUE(arena.Write(L.k, Bytes(p.k)).ok());
      EXPECT_TRUE(arena.Write(L.v, Bytes(p.v)).ok());
    }
    for (std::uint32_t t0 = 0; t0 < p.tokens; t0 += tile) {
      const std::uint32_t n = std::min(tile, p.tokens - t0);
      const std::uint64_t bytes = n * L.token_bytes;
      gpu::AttentionTileArgs a;
      a.shape = p.shape;
      a.scale = p.scale;
      a.tokens = n;
      a.query = {L.q, L.elems_bytes};
      if (streamed) {
        EXPECT_TRUE(arena.Write(L.stage_k, Bytes(p.k).subspan(t0 * L.token_bytes, bytes)).ok());
        EXPECT_TRUE(arena.Write(L.stage_v, Bytes(p.v).subspan(t0 * L.token_bytes, bytes)).ok());
        a.keys = {L.stage_k, bytes};
        a.values = {L.stage_v, bytes};
      } else {
        a.keys = {L.k + t0 * L.token_bytes, bytes};
        a.values = {L.v + t0 * L.token_bytes, bytes};
      }
      const int slot = t0 == 0 ? 0 : 1;
      a.output = L.Out(slot);
      a.lse = L.Lse(slot);
      Status s = LaunchDecodeAttentionTile(a, arena.data(), arena.size(), arena.stream());
      EXPECT_TRUE(s.ok()) << s;
      if (t0 == 0) continue;
      const gpu::MergeStatesArgs m{2,
                                   p.shape.num_q_heads,
                                   p.shape.head_dim,
                                   {L.outs, 2 * L.elems_bytes},
                                   {L.lses, 2 * L.heads_bytes},
                                   L.Out(2),
                                   L.Lse(2)};
      s = LaunchMergeStates(m, arena.data(), arena.size(), arena.stream());
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(arena.CopyWithin(L.outs, L.Out(2).offset, L.elems_bytes).ok());
      EXPECT_TRUE(arena.CopyWithin(L.lses, L.Lse(2).offset, L.heads_bytes).ok());
    }
    State out{std::vector<float>(p.QElems()), std::vector<float>(p.shape.num_q_heads)};
    if (p.tokens == 0) {  // nothing ran: the empty state
      std::fill(out.lse.begin(), out.lse.end(), -kInf);
      return out;
    }
    EXPECT_TRUE(arena.Read(L.outs, std::as_writable_bytes(std::span(out.out))).ok());
    EXPECT_TRUE(arena.Read(L.lses, std::as_writable_bytes(std::span(out.lse))).ok());
    return out;
  }
};

bool BitIdentical(const State& a, const State& b) {
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

TEST_F(CudaAttentionTest, DecodeTileMatchesFp64AndTheCpuKernelWithinTolerance) {
  std::mt19937_64 rng(
      TestSeed("CudaAttentionTest.DecodeTileMatchesFp64AndTheCpuKernelWithinTolerance"));
  double worst = 0;
  int identical = 0, total = 0;
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    for (std::uint32_t head_dim : {64u, 128u, 256u}) {
      for (std::uint32_t ratio : {1u, 4u, 8u}) {
        for (Logits logits : {Logits::kNormal, Logits::kHuge, Logits::kTiny, Logits::kAllEqual}) {
          const Problem p = MakeProblem(rng, dtype, 2 * ratio, 2, head_dim, 97, logits);
          const std::string what = std::string(KvDtypeName(dtype)) + " head_dim " +
                                   std::to_string(head_dim) + " ratio " + std::to_string(ratio) +
                                   " " + Name(logits);
          const State gpu_state = RunTiled(p, p.tokens, /*streamed=*/false);
          worst = std::max(worst, ExpectNearFp64(p, gpu_state, 1, what));
          State cpu{std::vector<float>(p.QElems()), std::vector<float>(p.shape.num_q_heads)};
          gpu::cpu_kernels::DecodeAttentionTile(p.shape, p.scale, p.tokens, p.q.data(), p.k.data(),
                                                p.v.data(), cpu.out.data(), cpu.lse.data());
          const auto tol = BoundFor(p, 1);
          for (std::size_t i = 0; i < cpu.out.size(); ++i) {
            ASSERT_NEAR(gpu_state.out[i], cpu.out[i], 2 * tol.out) << what << " out " << i;
          }
          for (std::size_t h = 0; h < cpu.lse.size(); ++h) {
            ASSERT_NEAR(gpu_state.lse[h], cpu.lse[h],
                        2 * (tol.lse + 0x1p-24 * std::abs(cpu.lse[h])))
                << what << " lse " << h;
          }
          identical += BitIdentical(gpu_state, cpu);
          ++total;
        }
      }
    }
  }
  std::printf("largest error / asserted tolerance: %.3g; bit-identical to CPU in %d of %d\n", worst,
              identical, total);
}

TEST_F(CudaAttentionTest, StreamedTilesEqualResidentTilesBitForBit) {
  std::mt19937_64 rng(TestSeed("CudaAttentionTest.StreamedTilesEqualResidentTilesBitForBit"));
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16}) {
    for (Logits logits : {Logits::kNormal, Logits::kHuge}) {
      const Problem p = MakeProblem(rng, dtype, 32, 8, 128, 1000, logits);
      for (std::uint32_t tile : {1u, 16u, 256u}) {
        const State resident = RunTiled(p, tile, false);
        const State streamed = RunTiled(p, tile, true);
        const State again = RunTiled(p, tile, false);
        EXPECT_TRUE(BitIdentical(resident, streamed)) << "tile " << tile;
        EXPECT_TRUE(BitIdentical(resident, again)) << "run to run, tile " << tile;
        ExpectNearFp64(p, resident, (p.tokens + tile - 1) / tile,
                       std::string(Name(logits)) + " tile " + std::to_string(tile));
      }
    }
  }
}

TEST_F(CudaAttentionTest, MergeMatchesTheCpuMergeAndEmptyStatesStayEmpty) {
  std::mt19937_64 rng(TestSeed("CudaAttentionTest.MergeMatchesTheCpuMergeAndEmptyStatesStayEmpty"));
  const std::uint32_t n = 5, heads = 6, dim = 100;
  std::vector<float> outs(n * heads * dim), lses(n * heads);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> lse_dist(-1e4f, 1e4f);
  for (float& x : outs) x = normal(rng);
  for (float& x : lses) x = lse_dist(rng);
  for (std::uint32_t i = 0; i < n; ++i) {
    lses[i * heads + 0] = -kInf;        // head 0 empty everywhere
    outs[(i * heads + 0) * dim] = NAN;  // an empty state's output is never read
  }
  lses[2 * heads + 1] = -kInf;
  outs[(2 * heads + 1) * dim] = NAN;
  const std::uint64_t outs_off = 0, lses_off = Align(outs.size() * 4),
                      out_off = Align(lses_off + lses.size() * 4),
                      lse_off = Align(out_off + heads * dim * 4),
                      bytes = Align(lse_off + heads * 4);
  auto arena_or = CudaTestArena::Create(bytes);
  ASSERT_TRUE(arena_or.ok()) << arena_or.status();
  CudaTestArena& arena = **arena_or;
  ASSERT_TRUE(arena.Write(outs_off, Bytes(outs)).ok());
  ASSERT_TRUE(arena.Write(lses_off, Bytes(lses)).ok());
  const gpu::MergeStatesArgs m{n,
                               heads,
                               dim,
                               {outs_off, outs.size() * 4},
                               {lses_off, lses.size() * 4},
                               {out_off, heads * dim * 4},
                               {lse_off, heads * 4}};
  Status s = LaunchMergeStates(m, arena.data(), arena.size(), arena.stream());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> out(heads * dim), lse(heads), cpu_out(heads * dim), cpu_lse(heads);
  ASSERT_TRUE(arena.Read(out_off, std::as_writable_bytes(std::span(out))).ok());
  ASSERT_TRUE(arena.Read(lse_off, std::as_writable_bytes(std::span(lse))).ok());
  gpu::cpu_kernels::MergeStates(n, heads, dim, outs.data(), lses.data(), cpu_out.data(),
                                cpu_lse.data());
  for (std::uint32_t d = 0; d < dim; ++d) EXPECT_EQ(out[d], 0.0f);
  EXPECT_EQ(lse[0], -kInf);
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << i;
    ASSERT_NEAR(out[i], cpu_out[i], 1e-5) << i;  // |O| <~ 4: a few ulp of each weight
  }
  for (std::uint32_t h = 0; h < heads; ++h) {
    ASSERT_NEAR(lse[h], cpu_lse[h], 4 * 0x1p-24 * (std::abs(cpu_lse[h]) + n)) << h;
  }
}

TEST_F(CudaAttentionTest, GatherCopiesPagesInListOrderAndZeroFillsAnOutOfRangePage) {
  const std::uint64_t page = 4096, arena_bytes = 64 * page;
  auto arena_or = CudaTestArena::Create(arena_bytes);
  ASSERT_TRUE(arena_or.ok()) << arena_or.status();
  CudaTestArena& arena = **arena_or;
  std::vector<std::uint8_t> fill(arena_bytes);
  for (std::size_t i = 0; i < fill.size(); ++i) fill[i] = static_cast<std::uint8_t>(i * 31 + 7);
  ASSERT_TRUE(arena.Write(0, Bytes(fill)).ok());
  const std::vector<std::uint64_t> offsets = {40 * page, 33 * page + 3, arena_bytes, 50 * page};
  ASSERT_TRUE(arena.Write(0, Bytes(offsets)).ok());
  const gpu::GatherPagesArgs g{4, page, {0, 32}, {page, 4 * page}};
  Status s = LaunchGatherPages(g, arena.data(), arena.size(), arena.stream());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<std::uint8_t> got(4 * page);
  ASSERT_TRUE(arena.Read(page, std::as_writable_bytes(std::span(got))).ok());
  for (int p = 0; p < 4; ++p) {
    for (std::uint64_t j = 0; j < page; ++j) {
      const std::uint8_t want = p == 2 ? 0 : fill[offsets[p] + j];
      ASSERT_EQ(got[p * page + j], want) << "page " << p << " byte " << j;
    }
  }
}

// These run without a GPU: the launchers refuse before touching the device.
TEST(CudaLauncherArgumentsTest, RefuseUnsupportedShapesAndBadRanges) {
  EXPECT_TRUE(CheckDecodeAttentionSupported(KvDtype::kBf16, 128).ok());
  Status s = CheckDecodeAttentionSupported(KvDtype::kFp16, 96);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("head_dim=96 is not supported (64, 128 or 256)"),
            std::string_view::npos)
      << s;
  EXPECT_TRUE(CheckDecodeAttentionSupported(KvDtype::kInt8, 128).IsInvalidArgument());

  gpu::AttentionTileArgs a;
  a.shape = {4, 2, 96, KvDtype::kFp16};
  a.scale = 0.1f;
  a.tokens = 1;
  a.query = {0, 4 * 96 * 4};
  a.keys = {2048, 2 * 96 * 2};
  a.values = {4096, 2 * 96 * 2};
  a.output = {6144, 4 * 96 * 4};
  a.lse = {8192, 16};
  alignas(16) static std::byte fake_arena[16];  // never dereferenced: refused first
  s = LaunchDecodeAttentionTile(a, fake_arena, 8208, nullptr);
  EXPECT_NE(s.message().find("head_dim=96"), std::string_view::npos) << s;
  a.keys.bytes = 1;  // validation runs before the dispatch
  s = LaunchDecodeAttentionTile(a, fake_arena, 8208, nullptr);
  EXPECT_NE(s.message().find("AttentionTileArgs.keys.bytes=1"), std::string_view::npos) << s;
  const gpu::MergeStatesArgs m{2, 2, 2, {0, 32}, {32, 16}, {48, 16}, {64, 8}};
  EXPECT_TRUE(LaunchMergeStates(m, nullptr, 72, nullptr).IsInvalidArgument());
  EXPECT_TRUE(LaunchMergeStates(m, fake_arena, 71, nullptr).IsInvalidArgument());
  const gpu::GatherPagesArgs g{1, 8, {0, 8}, {4, 8}};  // overlapping ranges
  EXPECT_TRUE(LaunchGatherPages(g, fake_arena, 16, nullptr).IsInvalidArgument());
}

TEST(CudaLauncherArgumentsTest, CompactTilesRefuseUnsupportedHeadDimsAfterValidation) {
  gpu::CompactAttentionTileArgs a;
  a.shape = {4, 2, 96, KvDtype::kInt8};
  a.scale = 0.1f;
  a.block_tokens = 16;
  a.blocks = 2;
  a.query = {0, 4 * 96 * 4};
  a.slices = {2048, 2 * 2 * gpu::CompactHalfBytes(16, 2, 96)};
  a.output = {16384, 4 * 96 * 4};
  a.lse = {18432, 16};
  alignas(16) static std::byte fake_arena[16];  // never dereferenced: refused first
  Status s = LaunchDecodeAttentionCompactTile(a, fake_arena, 18448, nullptr);
  EXPECT_NE(s.message().find("head_dim=96 is not supported (64, 128 or 256)"),
            std::string_view::npos)
      << s;
  a.shape.dtype = KvDtype::kFp16;  // validation runs before the dispatch
  s = LaunchDecodeAttentionCompactTile(a, fake_arena, 18448, nullptr);
  EXPECT_NE(s.message().find("CompactAttentionTileArgs.shape.dtype=fp16"), std::string_view::npos)
      << s;
  a.shape = {4, 2, 128, KvDtype::kInt8};  // supported and valid: the arena is checked
  a.query.bytes = a.output.bytes = 4 * 128 * 4;
  a.slices.bytes = 2 * 2 * gpu::CompactHalfBytes(16, 2, 128);  // 18432
  a.output.offset = 20480;
  a.lse.offset = 22528;
  s = LaunchDecodeAttentionCompactTile(a, nullptr, 22544, nullptr);
  EXPECT_NE(s.message().find("LaunchDecodeAttentionCompactTile: arena is null"),
            std::string_view::npos)
      << s;
}

}  // namespace
}  // namespace kvfabric::cuda
