#include "core/secure_random.h"

#include <gtest/gtest.h>

#include <array>
#include <set>

namespace kvfabric {
namespace {

// Not a test of randomness (the kernel's job), only that every byte is
// written and values do not repeat as a counter or a fixed value would.
TEST(SecureRandomTest, FillsEveryByteAndDoesNotRepeat) {
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(seen.insert(SecureRandomU64()).second);
  std::array<std::uint8_t, 256> a{}, b{};
  SecureRandomBytes(a);
  SecureRandomBytes(b);
  EXPECT_NE(a, b);
  int zeros = 0;
  for (std::uint8_t x : a) zeros += x == 0;
  EXPECT_LT(zeros, 32);  // about 1 in 256 bytes is 0; 32 has odds far below 1e-20
}

}  // namespace
}  // namespace kvfabric
