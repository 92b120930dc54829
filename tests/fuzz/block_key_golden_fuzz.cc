// libFuzzer target: the parser of docs/block-key.md's golden-vector block
// (core/testing/block_key_golden.h), which block_key_test reads to check every
// implementation of the key against the spec. Any bytes must parse or be
// refused with a Status naming the line; what parses holds only vectors whose
// input line came first.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "core/testing/block_key_golden.h"

using namespace kvfabric;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in("```kvfabric-golden\n" +
                        std::string(reinterpret_cast<const char*>(data), size) + "\n```\n");
  auto g = testing::ParseGolden(in, "fuzz.md");
  if (!g.ok()) return 0;
  for (const auto& [name, hex] : g->vectors) {
    if (g->inputs.count(name) != 1) std::abort();
  }
  return 0;
}
