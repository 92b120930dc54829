// The golden-vector block of docs/block-key.md (```kvfabric-golden), parsed for
// core/block_key_test.cc and fuzzed by tests/fuzz/block_key_golden_fuzz.cc.
// Records, one per line:
//   fingerprint NAME model=M first_layer=N layer_count=N dtype=D kv_heads=N
//               head_dim=N tokens_per_block=N tp_rank=N tp_size=N layout_version=N
//   digest NAME sha256=HEX
//   input NAME ns=NS fp=FP parent=root|NAME tokens=T,T,... [extra=X ...]
//   vector NAME key=HEX
// Values are %XX-escaped ('%' always). Every field is checked; an error names
// the line.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_CORE_TESTING_BLOCK_KEY_GOLDEN_H_
#define KVFABRIC_CORE_TESTING_BLOCK_KEY_GOLDEN_H_

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "core/statusor.h"

namespace kvfabric::testing {

struct GoldenInput {
  std::string ns;
  std::string fp_name;
  std::string parent;  // "root" or the name of an earlier vector
  std::vector<std::uint32_t> tokens;
  ExtraKeys extra;
};

struct Golden {
  std::map<std::string, ModelFingerprint> fingerprints;
  std::vector<std::pair<std::string, std::string>> digests;  // fp name, expected hex
  std::map<std::string, GoldenInput> inputs;
  std::vector<std::pair<std::string, std::string>> vectors;  // vector name, expected hex
};

// The records of every ```kvfabric-golden block of `doc` (named `origin` in
// errors, with the line). NotFound when there is no such block.
StatusOr<Golden> ParseGolden(std::istream& doc, const std::string& origin);

}  // namespace kvfabric::testing

#endif  // KVFABRIC_CORE_TESTING_BLOCK_KEY_GOLDEN_H_
