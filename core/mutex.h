// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with
// clang thread-safety annotations (core/thread_annotations.h).
//
// What: Mutex is a capability, so members can be declared
// `KVF_GUARDED_BY(mu_)` and functions `KVF_REQUIRES(mu_)`, and clang's
// -Wthread-safety (tools/thread_safety_check.sh) proves at compile time that
// the lock is held where the comments used to say so. It is a std::mutex
// underneath: same blocking, same fairness, not recursive, no reader mode.
// MutexLock is the scoped lock (std::lock_guard, plus Unlock/Lock for the
// stretch of a scope that must run unlocked, as std::unique_lock allows).
// CondVar is a std::condition_variable that waits on a Mutex.
//
// Mutex also remembers which thread holds it, so AssertHeld can check it at
// run time (one relaxed store per Lock and Unlock).
//
// Thread safety: every method may be called from any thread, with the usual
// mutex contract: Unlock and the CondVar waits only by the holder.
#ifndef KVFABRIC_CORE_MUTEX_H_
#define KVFABRIC_CORE_MUTEX_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "core/thread_annotations.h"

namespace kvfabric {

class CondVar;

class KVF_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KVF_ACQUIRE() {
    mu_.lock();
    MarkHeld();
  }
  void Unlock() KVF_RELEASE() {
    MarkReleased();
    mu_.unlock();
  }
  // Takes the mutex if it is free; true when it did.
  [[nodiscard]] bool TryLock() KVF_TRY_ACQUIRE(true) {
    if (!mu_.try_lock()) return false;
    MarkHeld();
    return true;
  }

  // Aborts (with a message on stderr) unless the calling thread holds the
  // mutex; afterwards the analysis treats it as held. For code the analysis
  // cannot see into, such as a callback that runs under the caller's lock.
  void AssertHeld() const KVF_ASSERT_CAPABILITY(this);

 private:
  friend class CondVar;

  // The owner is written only by the holder, and a thread compares it with
  // its own id: it reads back its own latest write, so relaxed suffices.
  void MarkHeld() { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  void MarkReleased() { owner_.store(std::thread::id(), std::memory_order_relaxed); }

  std::mutex mu_;
  std::atomic<std::thread::id> owner_{};
};

// Holds a Mutex for its scope. Unlock() and Lock() release and retake it
// inside the scope; the destructor unlocks only if it is held then.
class KVF_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KVF_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() KVF_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // REQUIRES: held (the lock was not Unlock()ed since the last Lock()).
  void Unlock() KVF_RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  // REQUIRES: not held.
  void Lock() KVF_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

  // Unlock() for a function that is handed this lock and releases it: the
  // analysis cannot tie a MutexLock& parameter to its mutex, so the function
  // names it, is declared KVF_RELEASE(mu_), and calls held.Unlock(&mu_).
  // Aborts unless `mu` is the mutex this lock holds.
  void Unlock(Mutex* mu) KVF_RELEASE(mu) KVF_NO_THREAD_SAFETY_ANALYSIS;

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable for Mutex. Every wait requires the mutex held; it is
// released while the thread sleeps and held again on return. Waits without a
// predicate may return spuriously, as std::condition_variable's do.
//
// A predicate runs with the mutex held. A lambda that reads guarded members
// says so to the analysis: cv_.Wait(&mu_, [&]() KVF_REQUIRES(mu_) { return done_; }).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) KVF_REQUIRES(*mu);

  // The predicate waits skip the analysis inside: it cannot tie the lambda's
  // KVF_REQUIRES(mu_) to `*mu`. Callers are checked against KVF_REQUIRES(*mu)
  // and the lambda's body against its own annotation.

  // Returns when pred() is true.
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate pred) KVF_REQUIRES(*mu) KVF_NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) Wait(mu);
  }

  // std::cv_status::timeout when `deadline` passed before a wake-up.
  template <typename Clock, typename Duration>
  std::cv_status WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline)
      KVF_REQUIRES(*mu) {
    std::unique_lock<std::mutex> lock = Adopt(mu);
    const std::cv_status s = cv_.wait_until(lock, deadline);
    Readopt(mu, lock);
    return s;
  }
  template <typename Rep, typename Period>
  std::cv_status WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout)
      KVF_REQUIRES(*mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  // Returns pred(): false when `deadline` (or `timeout`) passed with pred() false.
  template <typename Clock, typename Duration, typename Predicate>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline,
                 Predicate pred) KVF_REQUIRES(*mu) KVF_NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) {
      if (WaitUntil(mu, deadline) == std::cv_status::timeout) return pred();
    }
    return true;
  }
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout, Predicate pred)
      KVF_REQUIRES(*mu) KVF_NO_THREAD_SAFETY_ANALYSIS {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout, std::move(pred));
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  // The std::mutex inside `mu`, which the caller holds, in a unique_lock for
  // std::condition_variable; Readopt hands it back without unlocking.
  static std::unique_lock<std::mutex> Adopt(Mutex* mu) {
    mu->MarkReleased();
    return std::unique_lock<std::mutex>(mu->mu_, std::adopt_lock);
  }
  static void Readopt(Mutex* mu, std::unique_lock<std::mutex>& lock) {
    lock.release();
    mu->MarkHeld();
  }

  std::condition_variable cv_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_MUTEX_H_
