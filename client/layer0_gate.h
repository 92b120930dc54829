// Layer0Gate: the streams of one layered load (one per daemon) wait for each
// other's layer 0 before moving later layers, a bounded time.
//
// Why: where the daemons' copies share cores with each other and with the
// client (2 vCPUs, two embedded daemons), a daemon that finished its share of
// layer 0 and went on to later layers slowed the other daemon's layer-0
// copies, and WaitLayer(0) waits for the slower one (32 layers: layer 0 ready
// after 0.08-0.20 of the load; docs/benchmarks.md, issue 22). The wait is
// bounded by the caller (FetchFrom waits at most as long again as its own
// layer 0 took), so a slow or dead daemon holds the others back by at most
// that.
//
// Thread safety: every method may be called from any thread.
#ifndef KVFABRIC_CLIENT_LAYER0_GATE_H_
#define KVFABRIC_CLIENT_LAYER0_GATE_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>

#include "core/mutex.h"

namespace kvfabric::client {

class Layer0Gate {
 public:
  // `streams`: how many streams will call Done (each once).
  explicit Layer0Gate(std::size_t streams) : pending_(streams) {}

  Layer0Gate(const Layer0Gate&) = delete;
  Layer0Gate& operator=(const Layer0Gate&) = delete;

  // One stream's layer 0 is answered (or it had none, or it stopped). Calls
  // beyond `streams` change nothing.
  void Done() {
    MutexLock l(&mu_);
    if (pending_ > 0) --pending_;
    cv_.NotifyAll();
  }

  // Waits until every stream called Done or `deadline` passed; true: every
  // stream had.
  bool AwaitUntil(std::chrono::steady_clock::time_point deadline) {
    MutexLock l(&mu_);
    while (pending_ > 0) {
      if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) return pending_ == 0;
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::size_t pending_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_LAYER0_GATE_H_
