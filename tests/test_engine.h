// What the cross-process tests that play the engine share: the synthetic
// model they serve and a CPU device sized for it.
#ifndef KVFABRIC_TESTS_TEST_ENGINE_H_
#define KVFABRIC_TESTS_TEST_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/model_fingerprint.h"
#include "core/status.h"
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

// Engine threads serving requests while something happens to the cluster:
// `threads` threads each run serve(t, r) for r in [0, rounds), which returns
// the status of every request it made. Once half the threads finished round
// 0, `midway` runs on the calling thread (kill a daemon, say); then every
// thread is joined. A failure other than Unavailable or DeadlineExceeded
// (what a dead daemon's write-backs give) is a test failure naming the thread
// and round.
struct ServedCounts {
  int ok = 0;
  int failed = 0;
};
ServedCounts RunEngineThreads(int threads, int rounds,
                              const std::function<std::vector<Status>(int t, int r)>& serve,
                              const std::function<void()>& midway);

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_TEST_ENGINE_H_
