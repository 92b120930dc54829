#include "core/testing/test_seed.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <optional>
#include <string>

namespace kvfabric {
namespace {

// Sets or clears KVF_TEST_SEED for one test and restores the caller's value,
// so that running this binary with KVF_TEST_SEED set still tests what it says.
class TestSeedTest : public ::testing::Test {
 protected:
  TestSeedTest() {
    const char* saved = ::getenv(kTestSeedEnvVar);  // NOLINT(concurrency-mt-unsafe)
    if (saved != nullptr) saved_ = saved;
  }
  ~TestSeedTest() override {
    if (saved_) {
      ::setenv(kTestSeedEnvVar, saved_->c_str(), 1);
    } else {
      ::unsetenv(kTestSeedEnvVar);
    }
  }
  static void Set(const std::string& value) { ::setenv(kTestSeedEnvVar, value.c_str(), 1); }
  static void Unset() { ::unsetenv(kTestSeedEnvVar); }

 private:
  std::optional<std::string> saved_;
};

TEST_F(TestSeedTest, ReturnsAndPrintsTheSeedFromTheEnvironment) {
  for (const auto& [text, seed] : {std::pair<std::string, std::uint64_t>{"0", 0},
                                   {"42", 42},
                                   {"007", 7},
                                   {"18446744073709551615", UINT64_MAX}}) {
    Set(text);
    ::testing::internal::CaptureStdout();
    const std::uint64_t got = TestSeed("Suite.Name");
    const std::string printed = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(got, seed) << text;
    const std::string n = std::to_string(seed);
    EXPECT_EQ(printed, "Suite.Name: seed " + n + " (replay with KVF_TEST_SEED=" + n + ")\n");
  }
}

TEST_F(TestSeedTest, DrawsAFreshSeedAndPrintsTheOneItReturnsWhenUnset) {
  Unset();
  std::uint64_t seeds[3];
  for (std::uint64_t& seed : seeds) {
    ::testing::internal::CaptureStdout();
    seed = TestSeed("fresh");
    const std::string n = std::to_string(seed);
    EXPECT_EQ(::testing::internal::GetCapturedStdout(),
              "fresh: seed " + n + " (replay with KVF_TEST_SEED=" + n + ")\n");
  }
  // Three equal 64-bit draws would mean the seed is not being drawn at all.
  EXPECT_FALSE(seeds[0] == seeds[1] && seeds[1] == seeds[2]) << seeds[0];
}

TEST_F(TestSeedTest, AbortsNamingAMalformedSeed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const char* bad : {"", "abc", "12x", "-1", "+5", " 5", "5 ", "0x10", "1e3",
                          "18446744073709551616", "99999999999999999999999"}) {
    Set(bad);
    // A substring matcher, not a regex: the bad values are full of regex syntax.
    EXPECT_DEATH(
        TestSeed("Suite.Bad"),
        ::testing::HasSubstr(std::string("Suite.Bad: KVF_TEST_SEED=\"") + bad + "\" is not a seed"))
        << "\"" << bad << "\"";
  }
}

}  // namespace
}  // namespace kvfabric
