#include "core/copy_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/crc32c.h"
#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

std::uint64_t Seed() {
  return TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
}

// Random ranges (sizes 0 to 1.5 MiB at any alignment) copied from one buffer
// into another, with 0 to 3 helpers and both copy kinds: every destination
// byte equals its source, and no byte outside the ranges is written.
TEST(CopyPoolTest, CopiesEveryRangeExactlyWithAnyNumberOfHelpers) {
  std::mt19937_64 rng(Seed());
  const std::size_t kBytes = 12 << 20;
  std::vector<unsigned char> src(kBytes);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (int threads = 0; threads <= 3; ++threads) {
    CopyPool pool(threads, /*min_split_bytes=*/0);
    EXPECT_EQ(pool.threads(), threads);
    for (bool streaming : {false, true}) {
      std::vector<unsigned char> dst(kBytes, 0xee);
      std::vector<CopyRange> ranges;
      std::vector<bool> covered(kBytes, false);
      std::size_t at = 0;
      while (ranges.size() < 30) {
        const std::size_t gap = rng() % 5000;
        const std::size_t n = rng() % (3 << 19);
        if (at + gap + n > kBytes) break;
        at += gap;
        ranges.push_back({dst.data() + at, src.data() + at, n});
        for (std::size_t i = at; i < at + n; ++i) covered[i] = true;
        at += n;
      }
      ASSERT_TRUE(pool.Copy(ranges, streaming).ok());
      for (std::size_t i = 0; i < kBytes; ++i) {
        ASSERT_EQ(dst[i], covered[i] ? src[i] : 0xee)
            << "byte " << i << " threads " << threads << " streaming " << streaming;
      }
    }
  }
}

// Several callers share one pool: each gets exactly its own bytes.
TEST(CopyPoolTest, ConcurrentCallersShareThePool) {
  const std::uint64_t seed = Seed();
  CopyPool pool(2, /*min_split_bytes=*/0);
  std::vector<std::thread> callers;
  std::vector<int> bad(4, 0);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      std::mt19937_64 rng(seed + c);
      std::vector<unsigned char> src(4 << 20), dst(4 << 20);
      for (int round = 0; round < 20; ++round) {
        for (auto& b : src) b = static_cast<unsigned char>(rng());
        const std::size_t half = src.size() / 2;
        const CopyRange ranges[] = {{dst.data(), src.data(), half},
                                    {dst.data() + half, src.data() + half, half}};
        ASSERT_TRUE(pool.Copy(ranges, round % 2 == 0).ok());
        if (std::memcmp(dst.data(), src.data(), src.size()) != 0) ++bad[c];
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(bad[c], 0) << "caller " << c;
}

// Checked ranges (CopyRange::crc) beside unchecked ones, split across 0 to 3
// helpers at any cut: each checked range's CRC is the CRC of its
// destination's bytes, which equal the source's; unchecked ranges' slots
// are left alone.
TEST(CopyPoolTest, CheckedRangesGetTheirDestinationsCrcWhereverTheyAreCut) {
  const std::uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  const std::size_t kBytes = 8 << 20;
  std::vector<unsigned char> src(kBytes);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (int threads = 0; threads <= 3; ++threads) {
    CopyPool pool(threads, /*min_split_bytes=*/0);
    for (int round = 0; round < 4; ++round) {
      std::vector<unsigned char> dst(kBytes, 0xee);
      std::vector<CopyRange> ranges;
      std::vector<std::uint32_t> crcs(40, 0xdeadbeefu);
      std::size_t at = 0;
      while (ranges.size() < crcs.size()) {
        const std::size_t gap = rng() % 3000;
        const std::size_t n = rng() % 5 == 0 ? 0 : rng() % (3 << 18);
        if (at + gap + n > kBytes) break;
        at += gap;
        const bool check = rng() % 3 != 0;
        ranges.push_back(
            {dst.data() + at, src.data() + at, n, check ? &crcs[ranges.size()] : nullptr});
        at += n;
      }
      ASSERT_TRUE(pool.Copy(ranges, /*streaming=*/round % 2 == 0).ok());
      for (std::size_t k = 0; k < ranges.size(); ++k) {
        const CopyRange& r = ranges[k];
        ASSERT_EQ(std::memcmp(r.dst, r.src, r.bytes), 0) << "seed " << seed << " range " << k;
        if (r.crc != nullptr) {
          EXPECT_EQ(crcs[k], crc32c::Value(r.dst, r.bytes))
              << "seed " << seed << " threads " << threads << " range " << k << " of " << r.bytes
              << " bytes";
        } else {
          EXPECT_EQ(crcs[k], 0xdeadbeefu) << "an unchecked range's slot was written";
        }
      }
    }
  }
}

// Below min_split_bytes the caller copies alone (no helper is woken); at
// and above it the copy is split. Both land every byte.
TEST(CopyPoolTest, SmallCopiesAreNotSplit) {
  constexpr std::size_t kMin = 1 << 20;
  CopyPool pool(2, kMin);
  EXPECT_EQ(pool.min_split_bytes(), kMin);
  std::vector<unsigned char> src(2 * kMin), dst(2 * kMin, 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  // Two ranges adding up to one byte under the minimum.
  std::vector<CopyRange> small = {{dst.data(), src.data(), kMin / 2},
                                  {dst.data() + kMin, src.data() + kMin, kMin / 2 - 1}};
  ASSERT_TRUE(pool.Copy(small, /*streaming=*/false).ok());
  EXPECT_EQ(pool.split_copies(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kMin / 2), 0);
  EXPECT_EQ(std::memcmp(dst.data() + kMin, src.data() + kMin, kMin / 2 - 1), 0);
  EXPECT_EQ(dst[kMin + kMin / 2 - 1], 0);
  std::vector<CopyRange> large = {{dst.data(), src.data(), 2 * kMin}};
  ASSERT_TRUE(pool.Copy(large, /*streaming=*/true).ok());
  EXPECT_EQ(pool.split_copies(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 2 * kMin), 0);
  EXPECT_EQ(CopyPool(1).min_split_bytes(), CopyPool::kDefaultMinSplitBytes);
}

TEST(CopyPoolTest, EmptyCopiesReturn) {
  CopyPool pool(2);
  EXPECT_TRUE(pool.Copy({}, true).ok());
  unsigned char a = 1, b = 2;
  const CopyRange zero[] = {{&b, &a, 0}};
  EXPECT_TRUE(pool.Copy(zero, false).ok());
  EXPECT_EQ(b, 2);
}

}  // namespace
}  // namespace kvfabric
