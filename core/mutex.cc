#include "core/mutex.h"

#include <cstdio>
#include <cstdlib>

namespace kvfabric {

void Mutex::AssertHeld() const {
  if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
    std::fprintf(stderr, "kvfabric::Mutex::AssertHeld: mutex %p is not held by this thread\n",
                 static_cast<const void*>(this));
    std::abort();
  }
}

void CondVar::Wait(Mutex* mu) {
  std::unique_lock<std::mutex> lock = Adopt(mu);
  cv_.wait(lock);
  Readopt(mu, lock);
}

}  // namespace kvfabric
