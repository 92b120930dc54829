#include "core/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

// Every alignment of source and destination and every length around the
// 16-byte head and the 64-byte body, plus a large copy: the bytes equal
// memcpy's and nothing outside [dst, dst + n) is written.
TEST(StreamingCopyTest, CopiesExactlyTheRangeAtEveryAlignmentAndLength) {
  std::mt19937_64 rng(TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  std::vector<unsigned char> src(4096 + 64);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (std::size_t src_off = 0; src_off < 16; ++src_off) {
    for (std::size_t dst_off = 0; dst_off < 16; ++dst_off) {
      for (std::size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 1000, 4096}) {
        std::vector<unsigned char> dst(4096 + 64, 0xee);
        StreamingCopy(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
            << "src_off " << src_off << " dst_off " << dst_off << " n " << n;
        for (std::size_t i = 0; i < dst.size(); ++i) {
          if (i >= dst_off && i < dst_off + n) continue;
          ASSERT_EQ(dst[i], 0xee) << "byte " << i << " written; dst_off " << dst_off << " n " << n;
        }
      }
    }
  }
}

TEST(StreamingCopyTest, CopiesLargeBlocks) {
  std::mt19937_64 rng(TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  const std::size_t n = (std::size_t{8} << 20) + 13;
  std::vector<std::uint64_t> src(n / 8 + 1), dst(n / 8 + 1, 0);
  for (auto& v : src) v = rng();
  StreamingCopy(reinterpret_cast<char*>(dst.data()) + 3, reinterpret_cast<char*>(src.data()) + 1,
                n - 8);
  EXPECT_EQ(std::memcmp(reinterpret_cast<char*>(dst.data()) + 3,
                        reinterpret_cast<char*>(src.data()) + 1, n - 8),
            0);
}

}  // namespace
}  // namespace kvfabric
