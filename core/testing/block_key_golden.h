// The golden-vector blocks of docs/block-key.md (```kvfabric-golden for
// encoding v1, ```kvfabric-golden-v2 for v2), parsed for core/block_key_test.cc
// and core/block_key_v2_test.cc and fuzzed by tests/fuzz/block_key_golden_fuzz.cc.
// Records, one per line:
//   fingerprint NAME model=M first_layer=N layer_count=N dtype=D kv_heads=N
//               head_dim=N tokens_per_block=N tp_rank=N tp_size=N layout_version=N
//               (v2 blocks add: weights_revision=S quantization=S
//                kv_scale_scheme=S kv_scales_digest=HEX rope=S v_head_dim=N
//                vocab_size=N)
//   digest NAME sha256=HEX
//   scales NAME layers=N k=F,F,... v=F,F,... sha256=HEX     (v2 blocks only)
//   input NAME ns=NS fp=FP parent=root|NAME tokens=T,T,... [extra=X ...]
//   vector NAME key=HEX
// Values are %XX-escaped ('%' always). Every field is checked; an error names
// the line. A fingerprint of a v1 block has key_version 1, of a v2 block 2.
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

// A `scales` record: KvScalesDigest(k, v, layers) must be `sha256_hex`.
struct GoldenScales {
  std::string name;
  std::uint32_t layers = 0;
  std::vector<float> k, v;
  std::string sha256_hex;
};

struct Golden {
  std::map<std::string, ModelFingerprint> fingerprints;
  std::vector<GoldenScales> scales;
  std::vector<std::pair<std::string, std::string>> digests;  // fp name, expected hex
  std::map<std::string, GoldenInput> inputs;
  std::vector<std::pair<std::string, std::string>> vectors;  // vector name, expected hex
};

// The info strings of the two blocks.
inline constexpr char kGoldenBlockV1[] = "kvfabric-golden";
inline constexpr char kGoldenBlockV2[] = "kvfabric-golden-v2";

// The records of every ```<block> block of `doc` (named `origin` in errors,
// with the line); `block` is kGoldenBlockV1 or kGoldenBlockV2. NotFound when
// there is no such block.
StatusOr<Golden> ParseGolden(std::istream& doc, const std::string& origin,
                             const std::string& block = kGoldenBlockV1);

// The chain that ends in vector `name`: every vector from the root to it, its
// tokens concatenated and its extra keys one list per block, under the
// namespace and fingerprint they share. InvalidArgument if they do not share
// them or a parent is unknown.
struct GoldenChain {
  std::string ns;
  std::string fp_name;
  std::vector<std::uint32_t> tokens;
  std::vector<ExtraKeys> extra;  // one per block
};
StatusOr<GoldenChain> ChainOf(const Golden& golden, const std::string& name);

// The v2 block's llama8b_v2, built without the doc (Llama 3.1 8B with its
// revision, RoPE and vocabulary).
ModelFingerprint GoldenLlama8bV2();

// ParseGolden of docs/block-key.md, found at $KVF_SOURCE_ROOT/docs/block-key.md
// when that variable is set, otherwise by walking up from the current
// directory until docs/block-key.md exists. NotFound if there is none.
StatusOr<Golden> LoadGoldenFromDoc(const std::string& block = kGoldenBlockV1);

}  // namespace kvfabric::testing

#endif  // KVFABRIC_CORE_TESTING_BLOCK_KEY_GOLDEN_H_
