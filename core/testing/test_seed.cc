#include "core/testing/test_seed.h"

#include <gtest/gtest.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <system_error>

namespace kvfabric {

std::uint64_t TestSeed(std::string_view test_name) {
  std::uint64_t seed = 0;
  const char* fixed = std::getenv(kTestSeedEnvVar);  // NOLINT(concurrency-mt-unsafe)
  if (fixed != nullptr) {
    const std::string_view text(fixed);
    // from_chars takes no sign, no space and no base prefix; requiring it to
    // consume every character also rejects trailing junk and the empty string.
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seed);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      std::fprintf(stderr,
                   "%.*s: %s=\"%s\" is not a seed: want a decimal integer in "
                   "[0, 18446744073709551615]; unset it to draw a fresh seed\n",
                   static_cast<int>(test_name.size()), test_name.data(), kTestSeedEnvVar, fixed);
      std::abort();
    }
  } else {
    std::random_device device;
    seed = (std::uint64_t{device()} << 32) ^ device();
  }
  std::printf("%.*s: seed %llu (replay with %s=%llu)\n", static_cast<int>(test_name.size()),
              test_name.data(), static_cast<unsigned long long>(seed), kTestSeedEnvVar,
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

}  // namespace kvfabric
