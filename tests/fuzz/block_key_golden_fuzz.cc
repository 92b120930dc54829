// libFuzzer target: the parser of docs/block-key.md's golden-vector blocks, v1
// and v2 (core/testing/block_key_golden.h), which block_key_test reads to check every
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
  const std::string body(reinterpret_cast<const char*>(data), size);
  // The same bytes as the body of the v1 block and of the v2 block.
  for (const std::string block : {testing::kGoldenBlockV1, testing::kGoldenBlockV2}) {
    std::istringstream in("```" + block + "\n" + body + "\n```\n");
    auto g = testing::ParseGolden(in, "fuzz.md", block);
    if (!g.ok()) continue;
    for (const auto& [name, hex] : g->vectors) {
      if (g->inputs.count(name) != 1) std::abort();
    }
  }
  return 0;
}
