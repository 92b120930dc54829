#include "gpu/kernels/cpu_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/kernels/attention_test_util.h"
#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/reference_attention.h"

// Counts allocations on the calling thread while `g_counting` is set, to prove
// the kernels allocate nothing.
namespace {
thread_local bool g_counting = false;
thread_local long g_allocations = 0;
}  // namespace

// malloc/free pairs are matched here; GCC cannot see that through operator new.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace kvfabric::gpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kU = 0x1p-24;  // FP32 unit roundoff

using testing::BoundFor;
using testing::ExpectNearFp64;
using testing::ExpectNoNaN;
using testing::Load;
using testing::Logits;
using testing::MakeProblem;
using testing::Name;
using testing::Problem;
using testing::State;
using testing::Store;
using testing::Tolerance;

State RunTiled(const Problem& p, std::uint32_t tile_tokens) {
  State s{std::vector<float>(p.QElems()), std::vector<float>(p.shape.num_q_heads)};
  Status st =
      TiledAttentionHost(p.shape, p.scale, p.tokens, tile_tokens, p.q, p.k, p.v, s.out, s.lse);
  EXPECT_TRUE(st.ok()) << st;
  return s;
}

bool BitIdentical(const State& a, const State& b) {
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

TEST(DecodeAttentionTileTest, MatchesFp64AcrossDtypesGqaRatiosAndAdversarialLogits) {
  std::mt19937_64 rng(
      TestSeed("DecodeAttentionTileTest.MatchesFp64AcrossDtypesGqaRatiosAndAdversarialLogits"));
  double worst = 0;
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    for (std::uint32_t ratio : {1u, 4u, 8u}) {
      for (std::uint32_t head_dim : {128u, 67u}) {
        for (Logits logits : {Logits::kNormal, Logits::kHuge, Logits::kTiny, Logits::kAllEqual}) {
          const Problem p = MakeProblem(rng, dtype, 2 * ratio, 2, head_dim, 97, logits);
          const std::string what = std::string(KvDtypeName(dtype)) + " ratio " +
                                   std::to_string(ratio) + " head_dim " + std::to_string(head_dim) +
                                   " " + Name(logits);
          for (std::uint32_t tile : {97u, 1u, 7u, 32u}) {
            const std::uint32_t tiles = (p.tokens + tile - 1) / tile;
            worst = std::max(worst, ExpectNearFp64(p, RunTiled(p, tile), tiles,
                                                   what + " tile " + std::to_string(tile)));
          }
        }
      }
    }
  }
  std::printf("largest error / asserted tolerance: %.3g\n", worst);
}

TEST(DecodeAttentionTileTest, AllEqualLogitsAverageTheValues) {
  std::mt19937_64 rng(TestSeed("DecodeAttentionTileTest.AllEqualLogitsAverageTheValues"));
  const Problem p = MakeProblem(rng, KvDtype::kFp32, 4, 1, 16, 50, Logits::kAllEqual);
  const State s = RunTiled(p, 50);
  for (std::uint32_t h = 0; h < 4; ++h) {
    for (std::uint32_t d = 0; d < 16; ++d) {
      double mean = 0;
      for (std::uint32_t t = 0; t < 50; ++t) mean += p.VAt(std::size_t{t} * 16 + d) / 50.0;
      EXPECT_NEAR(s.out[h * 16 + d], mean, 64 * kU * 3 * 4) << h << " " << d;
    }
  }
}

TEST(DecodeAttentionTileTest, OneTokenTileReturnsItsValueRowExactly) {
  std::mt19937_64 rng(TestSeed("DecodeAttentionTileTest.OneTokenTileReturnsItsValueRowExactly"));
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    const Problem p = MakeProblem(rng, dtype, 8, 2, 64, 1, Logits::kHuge);
    const State s = RunTiled(p, 1);
    for (std::uint32_t h = 0; h < 8; ++h) {
      for (std::uint32_t d = 0; d < 64; ++d) {
        ASSERT_EQ(s.out[h * 64 + d], p.VAt((h / 4) * 64 + d)) << h << " " << d;
      }
    }
  }
}

// The AVX2 path computes the scalar path's operations in its order: the
// same bits for every dtype, GQA ratio, head_dim (whole and partial groups of
// 8 lanes), tile length (within one logit chunk of 256 and past it) and
// logit range, including huge logits that drive exp to 0.
TEST(DecodeAttentionTileTest, ScalarAndAvx2PathsAgreeBitForBit) {
  if (!cpu_kernels::KernelIsaSupported(cpu_kernels::KernelIsa::kAvx2)) {
    GTEST_SKIP() << "this CPU has no AVX2 + FMA + F16C";
  }
  std::mt19937_64 rng(TestSeed("DecodeAttentionTileTest.ScalarAndAvx2PathsAgreeBitForBit"));
  int compared = 0;
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32}) {
    for (std::uint32_t ratio : {1u, 4u, 6u}) {
      for (std::uint32_t head_dim : {128u, 67u, 8u, 3u}) {
        for (std::uint32_t tokens : {1u, 97u, 300u}) {
          for (Logits logits : {Logits::kNormal, Logits::kHuge, Logits::kTiny}) {
            const Problem p = MakeProblem(rng, dtype, 2 * ratio, 2, head_dim, tokens, logits);
            State scalar{std::vector<float>(p.QElems()), std::vector<float>(p.shape.num_q_heads)};
            State avx2 = scalar;
            cpu_kernels::DecodeAttentionTileWith(cpu_kernels::KernelIsa::kScalar, p.shape, p.scale,
                                                 tokens, p.q.data(), p.k.data(), p.v.data(),
                                                 scalar.out.data(), scalar.lse.data());
            cpu_kernels::DecodeAttentionTileWith(cpu_kernels::KernelIsa::kAvx2, p.shape, p.scale,
                                                 tokens, p.q.data(), p.k.data(), p.v.data(),
                                                 avx2.out.data(), avx2.lse.data());
            ASSERT_TRUE(BitIdentical(scalar, avx2))
                << KvDtypeName(dtype) << " ratio " << ratio << " head_dim " << head_dim
                << " tokens " << tokens << " " << Name(logits);
            ExpectNoNaN(avx2, "avx2");
            ++compared;
          }
        }
      }
    }
  }
  // More query heads than one block holds (64): blocks of whole groups (72
  // heads in groups of 9) and a group larger than a block (80 heads, 1 kv
  // head); both paths, and both near the FP64 reference.
  for (auto [q_heads, kv_heads] : {std::pair<std::uint32_t, std::uint32_t>{72, 8}, {80, 1}}) {
    const Problem p = MakeProblem(rng, KvDtype::kBf16, q_heads, kv_heads, 64, 300, Logits::kNormal);
    State scalar{std::vector<float>(p.QElems()), std::vector<float>(p.shape.num_q_heads)};
    State avx2 = scalar;
    cpu_kernels::DecodeAttentionTileWith(cpu_kernels::KernelIsa::kScalar, p.shape, p.scale,
                                         p.tokens, p.q.data(), p.k.data(), p.v.data(),
                                         scalar.out.data(), scalar.lse.data());
    cpu_kernels::DecodeAttentionTileWith(cpu_kernels::KernelIsa::kAvx2, p.shape, p.scale, p.tokens,
                                         p.q.data(), p.k.data(), p.v.data(), avx2.out.data(),
                                         avx2.lse.data());
    ASSERT_TRUE(BitIdentical(scalar, avx2)) << q_heads << " query heads";
    ExpectNearFp64(p, avx2, 1, std::to_string(q_heads) + " query heads");
    ++compared;
  }
  std::printf("%d problems: scalar and %s bit-identical\n", compared,
              cpu_kernels::KernelIsaName(cpu_kernels::KernelIsa::kAvx2));
}

TEST(DecodeAttentionTileTest, EmptyTileGivesZeroAndNegativeInfinity) {
  const AttentionShape shape{4, 2, 8, KvDtype::kFp16};
  std::vector<float> q(32, 1.0f), out(32, 7.0f), lse(4, 7.0f);
  cpu_kernels::DecodeAttentionTile(shape, 0.5f, 0, q.data(), nullptr, nullptr, out.data(),
                                   lse.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -kInf);
}

TEST(TiledAttentionTest, SameTilingIsBitIdenticalRunToRun) {
  std::mt19937_64 rng(TestSeed("TiledAttentionTest.SameTilingIsBitIdenticalRunToRun"));
  for (Logits logits : {Logits::kNormal, Logits::kHuge}) {
    const Problem p = MakeProblem(rng, KvDtype::kBf16, 32, 8, 128, 300, logits);
    for (std::uint32_t tile : {1u, 16u, 300u}) {
      const State a = RunTiled(p, tile);
      const State b = RunTiled(p, tile);
      EXPECT_TRUE(BitIdentical(a, b)) << "tile " << tile;
      ExpectNoNaN(a, Name(logits));
    }
  }
}

// The streaming path may start from the empty state instead of tile 0; the
// result must not change in a single bit.
TEST(TiledAttentionTest, FoldStartingFromTheEmptyStateIsBitIdentical) {
  std::mt19937_64 rng(TestSeed("TiledAttentionTest.FoldStartingFromTheEmptyStateIsBitIdentical"));
  const Problem p = MakeProblem(rng, KvDtype::kFp16, 8, 2, 64, 100, Logits::kNormal);
  const State resident = RunTiled(p, 16);
  const std::size_t elems = p.QElems(), heads = p.shape.num_q_heads;
  const std::size_t token_bytes = std::size_t{2} * 64 * 2;
  std::vector<float> states(2 * elems, 0.0f), lses(2 * heads, -kInf);
  State s{std::vector<float>(elems), std::vector<float>(heads)};
  for (std::uint32_t t0 = 0; t0 < p.tokens; t0 += 16) {
    const std::uint32_t n = std::min(16u, p.tokens - t0);
    cpu_kernels::DecodeAttentionTile(p.shape, p.scale, n, p.q.data(), &p.k[t0 * token_bytes],
                                     &p.v[t0 * token_bytes], &states[elems], &lses[heads]);
    cpu_kernels::MergeStates(2, 8, 64, states.data(), lses.data(), s.out.data(), s.lse.data());
    std::copy(s.out.begin(), s.out.end(), states.begin());
    std::copy(s.lse.begin(), s.lse.end(), lses.begin());
  }
  EXPECT_TRUE(BitIdentical(s, resident));
}

TEST(TiledAttentionTest, OneTileAndOneTokenTilesAgreeWithinTolerance) {
  std::mt19937_64 rng(TestSeed("TiledAttentionTest.OneTileAndOneTokenTilesAgreeWithinTolerance"));
  const Problem p = MakeProblem(rng, KvDtype::kFp16, 16, 2, 128, 256, Logits::kNormal);
  const State whole = RunTiled(p, 256);
  const State single = RunTiled(p, 1);
  const Tolerance tol = BoundFor(p, 256);
  for (std::size_t i = 0; i < whole.out.size(); ++i) {
    ASSERT_NEAR(whole.out[i], single.out[i], 2 * tol.out) << i;
  }
  for (std::size_t h = 0; h < whole.lse.size(); ++h) {
    ASSERT_NEAR(whole.lse[h], single.lse[h], 2 * (tol.lse + kU * std::abs(whole.lse[h]))) << h;
  }
  EXPECT_FALSE(BitIdentical(whole, single))
      << "different tilings round differently; if this ever holds the test inputs are trivial";
}

TEST(TiledAttentionTest, ZeroTokensGiveTheEmptyState) {
  std::mt19937_64 rng(TestSeed("TiledAttentionTest.ZeroTokensGiveTheEmptyState"));
  const Problem p = MakeProblem(rng, KvDtype::kFp32, 4, 4, 32, 0, Logits::kNormal);
  const State s = RunTiled(p, 8);
  for (float x : s.out) EXPECT_EQ(x, 0.0f);
  for (float x : s.lse) EXPECT_EQ(x, -kInf);
}

TEST(TiledAttentionTest, RefusesAZeroTileAndMismatchedSpans) {
  std::mt19937_64 rng(TestSeed("TiledAttentionTest.RefusesAZeroTileAndMismatchedSpans"));
  const Problem p = MakeProblem(rng, KvDtype::kFp32, 4, 4, 32, 3, Logits::kNormal);
  std::vector<float> out(p.QElems()), lse(4);
  EXPECT_TRUE(
      TiledAttentionHost(p.shape, p.scale, 3, 0, p.q, p.k, p.v, out, lse).IsInvalidArgument());
  EXPECT_TRUE(
      TiledAttentionHost(p.shape, p.scale, 4, 1, p.q, p.k, p.v, out, lse).IsInvalidArgument());
  std::vector<float> short_lse(3);
  EXPECT_TRUE(TiledAttentionHost(p.shape, p.scale, 3, 1, p.q, p.k, p.v, out, short_lse)
                  .IsInvalidArgument());
}

TEST(MergeStatesTest, MergesEveryHeadInIndexOrderAndEmptyHeadsStayEmpty) {
  // 3 states, 2 heads, head_dim 2. Head 1 is empty in every state.
  const float outputs[3][2][2] = {{{1, 2}, {NAN, NAN}}, {{3, 4}, {0, 0}}, {{5, 6}, {9, 9}}};
  const float lses[3][2] = {{0.0f, -kInf}, {std::log(2.0f), -kInf}, {-kInf, -kInf}};
  float out[2][2], lse[2];
  cpu_kernels::MergeStates(3, 2, 2, &outputs[0][0][0], &lses[0][0], &out[0][0], lse);
  EXPECT_NEAR(out[0][0], (1 + 2 * 3) / 3.0, 1e-6);
  EXPECT_NEAR(out[0][1], (2 + 2 * 4) / 3.0, 1e-6);
  EXPECT_NEAR(lse[0], std::log(3.0), 1e-6);
  EXPECT_EQ(out[1][0], 0.0f);
  EXPECT_EQ(out[1][1], 0.0f);
  EXPECT_EQ(lse[1], -kInf);
}

// ---- validation and the arena forms ----

struct Arena {
  std::vector<std::uint64_t> words;  // 8-byte aligned storage
  explicit Arena(std::size_t bytes) : words((bytes + 7) / 8) {}
  std::span<std::byte> span() {
    return {reinterpret_cast<std::byte*>(words.data()), words.size() * 8};
  }
};

AttentionTileArgs GoodTileArgs() {
  AttentionTileArgs a;
  a.shape = {8, 2, 64, KvDtype::kFp16};
  a.scale = 0.125f;
  a.tokens = 16;
  a.query = {0, 8 * 64 * 4};         // 2048
  a.keys = {2048, 16 * 2 * 64 * 2};  // 4096
  a.values = {6144, 4096};
  a.output = {10240, 2048};
  a.lse = {12288, 32};
  return a;
}
constexpr std::uint64_t kTileArena = 12320;

TEST(ValidateTest, AcceptsAConsistentTile) {
  Status s = ValidateAttentionTile(GoodTileArgs(), kTileArena);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ValidateTest, RejectsBadTilesNamingTheFieldAndNumbers) {
  struct Case {
    const char* what;
    void (*mutate)(AttentionTileArgs&);
    const char* expect;  // a substring of the message
  };
  const Case cases[] = {
      {"dtype", [](AttentionTileArgs& a) { a.shape.dtype = KvDtype::kInt8; }, "shape.dtype=int8"},
      {"gqa",
       [](AttentionTileArgs& a) {
         a.shape.num_q_heads = 6;
         a.shape.num_kv_heads = 4;
       },
       "num_q_heads=6 must be a positive multiple of num_kv_heads=4"},
      {"kv0", [](AttentionTileArgs& a) { a.shape.num_kv_heads = 0; }, "num_kv_heads=0"},
      {"dim", [](AttentionTileArgs& a) { a.shape.head_dim = 513; }, "head_dim=513"},
      {"scale", [](AttentionTileArgs& a) { a.scale = NAN; }, "scale="},
      {"keys size", [](AttentionTileArgs& a) { a.keys.bytes = 4095; },
       "keys.bytes=4095 but the layout needs tokens(16) * num_kv_heads(2) * head_dim(64) * "
       "dtype_size(2) = 4096"},
      {"outside", [](AttentionTileArgs& a) { a.lse.offset = kTileArena - 16; },
       "lse [offset=12304, bytes=32) lies outside the arena of 12320 bytes"},
      {"offset overflow", [](AttentionTileArgs& a) { a.values.offset = ~std::uint64_t{0} - 8; },
       "values [offset="},
      {"alignment",
       [](AttentionTileArgs& a) {
         a.query.offset = 2;
         a.query.bytes = 2048;
       },
       "query.offset=2 is not a multiple of its element size 4"},
      {"in-place", [](AttentionTileArgs& a) { a.output = a.query; },
       "output [0, +2048) overlaps "
       "AttentionTileArgs.query"},
      {"overflow",
       [](AttentionTileArgs& a) {
         a.tokens = 0xffffffffu;
         a.shape.num_kv_heads = 0x40000000u;
         a.shape.num_q_heads = 0x40000000u;
         a.shape.head_dim = 512;
       },
       "overflows 64 bits"},
  };
  for (const Case& c : cases) {
    AttentionTileArgs a = GoodTileArgs();
    c.mutate(a);
    Status s = ValidateAttentionTile(a, kTileArena);
    EXPECT_TRUE(s.IsInvalidArgument()) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.expect), std::string_view::npos) << c.what << ": " << s;
  }
}

TEST(ValidateTest, EmptyTileMayHaveEmptyKeyRangesAnywhereInTheArena) {
  AttentionTileArgs a = GoodTileArgs();
  a.tokens = 0;
  a.keys = {kTileArena, 0};
  a.values = {0, 0};
  Status s = ValidateAttentionTile(a, kTileArena);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ValidateTest, MergeAndGatherRangesAreChecked) {
  MergeStatesArgs m{3, 2, 4, {0, 96}, {96, 24}, {128, 32}, {160, 8}};
  EXPECT_TRUE(ValidateMergeStates(m, 168).ok());
  EXPECT_TRUE(ValidateMergeStates(m, 167).IsInvalidArgument());
  MergeStatesArgs bad = m;
  bad.lses.bytes = 20;
  Status s = ValidateMergeStates(bad, 168);
  EXPECT_NE(s.message().find("num_states(3) * num_heads(2) * sizeof(float)(4) = 24"),
            std::string_view::npos)
      << s;
  bad = m;
  bad.output = {0, 32};
  EXPECT_TRUE(ValidateMergeStates(bad, 168).IsInvalidArgument());
  bad = m;
  bad.num_heads = 0;
  EXPECT_TRUE(ValidateMergeStates(bad, 168).IsInvalidArgument());
  MergeStatesArgs none{0, 2, 4, {0, 0}, {0, 0}, {0, 32}, {32, 8}};
  EXPECT_TRUE(ValidateMergeStates(none, 40).ok());

  GatherPagesArgs g{2, 100, {0, 16}, {16, 200}};
  EXPECT_TRUE(ValidateGatherPages(g, 216).ok());
  g.page_offsets.offset = 4;
  EXPECT_TRUE(ValidateGatherPages(g, 216).IsInvalidArgument());
  g = {2, 0, {0, 16}, {16, 0}};
  EXPECT_TRUE(ValidateGatherPages(g, 216).IsInvalidArgument());
  g = {2, 100, {0, 16}, {16, 200}};
  EXPECT_TRUE(ValidateGatherSource(g, 0, 216, 400).ok());
  EXPECT_TRUE(ValidateGatherSource(g, 1, 150, 400).IsInvalidArgument());  // overlaps destination
  EXPECT_TRUE(ValidateGatherSource(g, 1, 350, 400).IsInvalidArgument());  // past the arena
  EXPECT_TRUE(ValidateGatherSource(g, 1, ~std::uint64_t{0}, 400).IsInvalidArgument());
}

TEST(ArenaKernelsTest, GatherCopiesPagesInListOrderAndRefusesABadOffsetBeforeCopying) {
  Arena arena(1024);
  auto bytes = arena.span();
  for (std::size_t i = 0; i < 1024; ++i) bytes[i] = static_cast<std::byte>(i * 7);
  const std::uint64_t offsets[3] = {800, 512, 640};
  std::memcpy(&bytes[0], offsets, sizeof(offsets));
  GatherPagesArgs g{3, 64, {0, 24}, {64, 192}};
  ASSERT_TRUE(cpu_kernels::GatherPagesInArena(g, bytes).ok());
  for (int p = 0; p < 3; ++p) {
    for (int j = 0; j < 64; ++j) {
      ASSERT_EQ(bytes[64 + p * 64 + j], static_cast<std::byte>((offsets[p] + j) * 7));
    }
  }
  const std::vector<std::byte> before(bytes.begin(), bytes.end());
  const std::uint64_t bad[3] = {800, 1000, 512};
  std::memcpy(&bytes[0], bad, sizeof(bad));
  const std::vector<std::byte> with_bad(bytes.begin(), bytes.end());
  Status s = cpu_kernels::GatherPagesInArena(g, bytes);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("page 1"), std::string_view::npos) << s;
  EXPECT_TRUE(std::equal(with_bad.begin(), with_bad.end(), bytes.begin()))
      << "nothing may be copied when a page is refused";
}

TEST(ArenaKernelsTest, KernelsAllocateNothing) {
  Arena arena(kTileArena + 64 + 2 * (2048 + 32));
  auto bytes = arena.span();
  for (std::size_t i = 0; i < kTileArena; i += 2) Store(KvDtype::kFp16, 0.5f, &bytes[i]);
  const AttentionTileArgs a = GoodTileArgs();
  AttentionTileArgs b = a;
  b.output = {kTileArena + 64, 2048};  // second state after the first
  b.lse = {kTileArena + 64 + 2048, 32};
  const std::uint64_t merged = kTileArena + 64 + 2048 + 32;
  const MergeStatesArgs m{1, 8, 64, a.output, a.lse, {merged, 2048}, {merged + 2048, 32}};
  GatherPagesArgs g{0, 64, {0, 0}, {0, 0}};
  g_counting = true;
  g_allocations = 0;
  Status s;
  for (int step = 0; step < 1000 && s.ok(); ++step) {
    s = cpu_kernels::DecodeAttentionTileInArena(a, bytes);
    if (s.ok()) s = cpu_kernels::DecodeAttentionTileInArena(b, bytes);
    if (s.ok()) s = cpu_kernels::MergeStatesInArena(m, bytes);
    if (s.ok()) s = cpu_kernels::GatherPagesInArena(g, bytes);
  }
  g_counting = false;
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(g_allocations, 0);
}

}  // namespace
}  // namespace kvfabric::gpu
