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

void MutexLock::Unlock(Mutex* mu) {
  if (mu != mu_) {
    std::fprintf(stderr, "kvfabric::MutexLock::Unlock(%p): this lock holds mutex %p\n",
                 static_cast<const void*>(mu), static_cast<const void*>(mu_));
    std::abort();
  }
  Unlock();
}

void CondVar::Wait(Mutex* mu) {
  std::unique_lock<std::mutex> lock = Adopt(mu);
  cv_.wait(lock);
  Readopt(mu, lock);
}

}  // namespace kvfabric
