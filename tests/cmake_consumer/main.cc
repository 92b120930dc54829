// A C++ engine built against an installed kvfabric (find_package, linking
// kvfabric::kvfabric, the shared libkvfabric): the C++ API and the public
// headers work from the install alone.
//
//   consumer              keys the first block of a context, checks its shape
//                         (32 bytes, 64 hex digits) and the block size, and
//                         the CRC32C check value.
//   consumer PLACEMENT    also opens a Client on a CPU device against a running
//                         cluster (tests/cmake_consumer/run.sh starts one),
//                         keys a prompt and matches it: nothing is cached.
#include <cstdio>
#include <vector>

#include "client/kvfabric_client.h"
#include "core/block_key.h"
#include "core/crc32c.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "gpu/cpu/cpu_device.h"

namespace {

kvfabric::ModelFingerprint Model() {
  kvfabric::ModelFingerprint fp;
  fp.model_id = "consumer-test-model";
  fp.layer_count = 32;
  fp.kv_heads = 8;
  fp.head_dim = 128;
  fp.tokens_per_block = 16;
  return fp;
}

// Client::Open, KeyTokens and Match through the shared library.
int MatchAgainst(const char* placement) {
  kvfabric::ModelFingerprint fp = Model();
  fp.layer_count = 2;
  fp.kv_heads = 2;
  fp.head_dim = 64;
  kvfabric::gpu::DeviceOptions dopts;
  dopts.arena_bytes = 1 << 20;
  auto device = kvfabric::gpu::CreateCpuDevice(dopts, kvfabric::gpu::CpuDeviceOptions{});
  if (!device.ok()) {
    std::fprintf(stderr, "consumer: CreateCpuDevice: %s\n", device.status().ToString().c_str());
    return 1;
  }
  kvfabric::client::ClientOptions o;
  o.placement_address = placement;
  o.security.insecure = true;  // the daemons listen on 127.0.0.1 with --insecure
  o.namespace_name = "consumer-cc";
  o.model = fp;
  o.device = device->get();
  o.num_q_heads = 4;
  o.tile_tokens = 64;
  o.staging_bytes = 1 << 20;
  o.history_pool_bytes = 4 << 20;
  o.recompute = [](const kvfabric::client::RecomputeRequest&, std::span<std::byte>) {
    return kvfabric::Status::OK();
  };
  auto client = kvfabric::client::Client::Open(std::move(o));
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: Client::Open: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<std::uint32_t> tokens(1024);
  for (std::uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 7 * i + 3;
  auto chain = (*client)->KeyTokens(tokens);
  if (!chain.ok() || chain->size() != 64) {
    std::fprintf(stderr, "consumer: KeyTokens: %s\n", chain.status().ToString().c_str());
    return 1;
  }
  auto match = (*client)->Match(*chain, 0);
  if (!match.ok() || match->plan_id == 0 || match->cached_prefix_blocks != 0) {
    std::fprintf(stderr, "consumer: Match: %s (plan %llu, %u cached; want a plan from "
                 "placement and nothing cached)\n",
                 match.status().ToString().c_str(),
                 match.ok() ? static_cast<unsigned long long>(match->plan_id) : 0ull,
                 match.ok() ? match->cached_prefix_blocks : 0u);
    return 1;
  }
  std::printf("consumer: Client::Open and Match through libkvfabric.so: plan %llu, %s\n",
              static_cast<unsigned long long>(match->plan_id), match->kind.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const kvfabric::ModelFingerprint fp = Model();
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
  return argc > 1 ? MatchAgainst(argv[1]) : 0;
}
