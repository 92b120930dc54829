#include "core/thread_cache.h"

#include <algorithm>
#include <utility>

namespace kvfabric {

ThreadCache::ThreadCache(std::size_t max_idle) : max_idle_(max_idle) {}

ThreadCache::~ThreadCache() {
  std::list<std::thread> threads;
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.NotifyAll();
    threads.swap(threads_);
  }
  // Parked threads wake and exit; running ones finish their task and the
  // queue's first.
  for (std::thread& t : threads) t.join();
}

void ThreadCache::Run(std::function<void()> task) {
  std::vector<std::thread> exited;
  {
    MutexLock l(&mu_);
    queue_.push_back(std::move(task));
    if (idle_ >= queue_.size()) {
      cv_.NotifyOne();
    } else {
      exited = TakeExited();
      ++started_;
      threads_.emplace_back([this] { Loop(); });
    }
  }
  // Joined outside the lock: they have left Loop, or are about to.
  for (std::thread& t : exited) t.join();
}

std::size_t ThreadCache::idle() const {
  MutexLock l(&mu_);
  return idle_;
}

std::uint64_t ThreadCache::started() const {
  MutexLock l(&mu_);
  return started_;
}

std::vector<std::thread> ThreadCache::TakeExited() {
  std::vector<std::thread> out;
  if (exited_.empty()) return out;
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (std::find(exited_.begin(), exited_.end(), it->get_id()) != exited_.end()) {
      out.push_back(std::move(*it));
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  exited_.clear();
  return out;
}

void ThreadCache::Loop() {
  MutexLock l(&mu_);
  for (;;) {
    if (queue_.empty()) {
      // Parks only while fewer than max_idle are (a thread that just ran a
      // task and finds the cache full exits instead).
      if (stop_ || idle_ >= max_idle_) {
        if (!stop_) exited_.push_back(std::this_thread::get_id());
        return;
      }
      ++idle_;
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      --idle_;
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    l.Unlock();
    task();
    task = nullptr;  // its captures are released before the thread parks
    l.Lock();
  }
}

void TaskGroup::Run(ThreadCache* cache, std::function<void()> task) {
  {
    MutexLock l(&mu_);
    ++running_;
  }
  cache->Run([this, task = std::move(task)]() mutable {
    task();
    // Its captures go before Wait can return: a load's task holds the
    // context, which Finish recycles only when it holds the last reference.
    task = nullptr;
    MutexLock l(&mu_);
    if (--running_ == 0) cv_.NotifyAll();
  });
}

void TaskGroup::Wait() {
  MutexLock l(&mu_);
  cv_.Wait(&mu_, [&]() KVF_REQUIRES(mu_) { return running_ == 0; });
}

}  // namespace kvfabric
