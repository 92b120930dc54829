// ThreadCache: parked threads for tasks that block, so that starting one
// costs a wake-up, not a thread creation.
//
// Why: a client's load runs a thread per daemon stream and fetch_depth
// workers per stream, each of which waits on a daemon; with two daemons a
// load started 11 threads, 6 of them one after another before the first
// request left for the first daemon. On the development machine (2 vCPUs) a
// std::thread costs about 17 us to create and 30-50 us until it runs, so a
// load's first request left 0.3-0.6 ms after Load, against a 0.5 ms round
// trip and a layer-0 target of about 1.4 ms (docs/benchmarks.md, issue 22).
//
// How: Run hands the task to a parked thread when one is free, else starts a
// new thread for it; there is never a queued task without a thread bound to
// run it, so a task that blocks never holds up another (unlike a fixed-size
// pool). After its task a thread parks again if fewer than `max_idle` are
// parked, else it exits (and is joined by a later Run or the destructor):
// the threads held while idle are bounded by max_idle; those running are as
// many as the caller's tasks.
//
// TaskGroup is the join of a set of tasks, the way a std::vector<std::thread>
// is joined: Run starts a task on the cache, Wait returns when every task
// started so far has returned.
//
// Thread safety: every method may be called from any thread; the
// destructor waits for queued and running tasks, and must not race Run.
#ifndef KVFABRIC_CORE_THREAD_CACHE_H_
#define KVFABRIC_CORE_THREAD_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace kvfabric {

class ThreadCache {
 public:
  explicit ThreadCache(std::size_t max_idle);
  ~ThreadCache();

  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  // Runs `task` on a parked thread, or on a new one when none is free.
  void Run(std::function<void()> task);

  std::size_t max_idle() const { return max_idle_; }
  // Threads parked now.
  std::size_t idle() const;
  // Threads started since construction.
  std::uint64_t started() const;

 private:
  void Loop();
  // Moves the threads that have exited out of threads_. REQUIRES: mu_ held.
  std::vector<std::thread> TakeExited() KVF_REQUIRES(mu_);

  const std::size_t max_idle_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ KVF_GUARDED_BY(mu_);
  // Parked threads, counted until they take a task: Run starts a thread
  // unless more are parked than tasks are queued.
  std::size_t idle_ KVF_GUARDED_BY(mu_) = 0;
  std::uint64_t started_ KVF_GUARDED_BY(mu_) = 0;
  bool stop_ KVF_GUARDED_BY(mu_) = false;
  std::list<std::thread> threads_ KVF_GUARDED_BY(mu_);
  std::vector<std::thread::id> exited_ KVF_GUARDED_BY(mu_);
};

class TaskGroup {
 public:
  TaskGroup() = default;
  ~TaskGroup() { Wait(); }

  TaskGroup(const TaskGroup&) = delete;
  TaskGroup& operator=(const TaskGroup&) = delete;

  // Runs `task` on one of `cache`'s threads.
  void Run(ThreadCache* cache, std::function<void()> task);
  // Returns once every task Run so far has returned. The group may be used
  // again afterwards.
  void Wait();

 private:
  Mutex mu_;
  CondVar cv_;
  std::size_t running_ KVF_GUARDED_BY(mu_) = 0;
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_THREAD_CACHE_H_
