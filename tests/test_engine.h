// What the cross-process tests that play the engine share: the synthetic
// model they serve and a CPU device sized for it.
#ifndef KVFABRIC_TESTS_TEST_ENGINE_H_
#define KVFABRIC_TESTS_TEST_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/model_fingerprint.h"
#include "core/statusor.h"
#include "gpu/device.h"

namespace kvfabric::testing {

// 4 layers, 2 KV heads of 64, fp16, 16 tokens per block: 32 KiB blocks.
ModelFingerprint SyntheticTestModel(const std::string& model_id);

struct TestDevice {
  std::unique_ptr<gpu::Device> device;
  std::uint64_t page_bytes = 0;  // one arena page: tile_tokens of one layer's K and V
};

// A CPU device whose arena holds streaming attention's scratch for `model`,
// plus 2 staging pages and `pool_pages` pool pages of `tile_tokens`.
StatusOr<TestDevice> CreateTestDevice(const ModelFingerprint& model, std::uint32_t q_heads,
                                      std::uint32_t tile_tokens, std::uint32_t pool_pages);

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_TEST_ENGINE_H_
