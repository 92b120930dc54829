#include "tests/test_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "client/streaming_attention.h"
#include "gpu/cpu/cpu_device.h"

namespace kvfabric::testing {

ModelFingerprint SyntheticTestModel(const std::string& model_id) {
  ModelFingerprint m;
  m.model_id = model_id;
  m.layer_count = 4;
  m.kv_heads = 2;
  m.head_dim = 64;
  m.dtype = KvDtype::kFp16;
  m.tokens_per_block = 16;
  return m;
}

StatusOr<TestDevice> CreateTestDevice(const ModelFingerprint& model, std::uint32_t q_heads,
                                      std::uint32_t tile_tokens, std::uint32_t pool_pages) {
  client::HistoryLayout layout;
  layout.layers = model.layer_count;
  layout.tokens_per_block = model.tokens_per_block;
  layout.kv_heads = model.kv_heads;
  layout.head_dim = model.head_dim;
  layout.dtype = model.dtype;
  client::StreamingAttentionOptions ao;
  ao.num_q_heads = q_heads;
  ao.tile_tokens = tile_tokens;
  TestDevice out;
  out.page_bytes = std::uint64_t{tile_tokens} * model.kv_heads * model.head_dim * 2 * 2;
  const std::uint64_t scratch =
      (client::StreamingAttention::ScratchBytes(layout, ao) + 255) / 256 * 256;
  gpu::DeviceOptions dopts;
  dopts.arena_bytes = scratch + (2 + pool_pages) * out.page_bytes;  // 2 staging + the pool
  KVF_ASSIGN_OR_RETURN(out.device, gpu::CreateCpuDevice(dopts));
  return out;
}

ServedCounts RunEngineThreads(int threads, int rounds,
                              const std::function<std::vector<Status>(int t, int r)>& serve,
                              const std::function<void()>& midway) {
  std::atomic<int> ok{0}, failed{0};
  std::mutex first_mu;
  std::condition_variable first_cv;
  int first_rounds = 0;
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      for (int r = 0; r < rounds; ++r) {
        for (const Status& s : serve(t, r)) {
          (s.ok() ? ok : failed) += 1;
          if (!s.ok() && !s.IsUnavailable() && s.code() != StatusCode::kDeadlineExceeded) {
            ADD_FAILURE() << "thread " << t << " round " << r << ": " << s.ToString();
          }
        }
        if (r == 0) {
          std::lock_guard<std::mutex> l(first_mu);
          ++first_rounds;
          first_cv.notify_all();
        }
      }
    });
  }
  {
    std::unique_lock<std::mutex> l(first_mu);
    first_cv.wait(l, [&] { return first_rounds >= threads / 2; });
  }
  midway();
  for (std::thread& t : running) t.join();
  return {ok.load(), failed.load()};
}

}  // namespace kvfabric::testing
