// The seed of a randomised test, chosen so that every failure can be replayed.
//
// TestSeed() returns the value of the environment variable KVF_TEST_SEED when it
// is set, and otherwise draws a fresh 64-bit seed; either way it prints
//   <test_name>: seed <n> (replay with KVF_TEST_SEED=<n>)
// to stdout (flushed, so the line survives a crash) and records the seed as the
// current test's "seed" property in GoogleTest's XML output. Rerunning the
// failing test with KVF_TEST_SEED=<n> makes it draw the same numbers again.
//
// A malformed KVF_TEST_SEED (anything but a decimal number in [0, 2^64 - 1],
// with nothing before or after it) aborts the test binary with a message that
// names the value: silently running with another seed would not replay anything.
//
// For tests only. Tests may read environment variables; library code may not
// (STYLE.md: binaries read flags and config once and pass Options down), so
// nothing outside a test may include this header.
//
// Thread safety: reads the environment, so call it from the test's own thread,
// not while another thread may call setenv().
#ifndef KVFABRIC_CORE_TESTING_TEST_SEED_H_
#define KVFABRIC_CORE_TESTING_TEST_SEED_H_

#include <cstdint>
#include <string_view>

namespace kvfabric {

// The environment variable TestSeed() reads.
inline constexpr char kTestSeedEnvVar[] = "KVF_TEST_SEED";

// Returns KVF_TEST_SEED if set, else a fresh random seed, and prints it as
// described above. `test_name` labels the printed line, e.g. "BlockFormatTest.RoundTrip".
// Aborts if KVF_TEST_SEED is set but malformed.
std::uint64_t TestSeed(std::string_view test_name);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_TESTING_TEST_SEED_H_
