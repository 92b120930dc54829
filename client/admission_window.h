// AdmissionWindow: how many requests of one kind a client session keeps in
// flight to one daemon, shared by every load (or save) that uses the
// session, and in what order waiting requests get a slot.
//
// Size: additive increase, multiplicative decrease. The window starts at
// `initial`, halves (down to 1) at a reply that refused something for room
// (the daemon's per-namespace lease bound) and grows by one after `size`
// replies that did not, up to `max`: the session settles at what the daemon
// admits.
//
// Order: the lowest rank first, then the earliest arrival. A load's
// requests are ranked by the first layer they move, so with several loads
// sharing a daemon, a newly started load's layer 0 (what its engine waits
// for first) is admitted before the requests of later layers that other
// loads already queued (32 layers, 4 and 8 contexts at once: layer 0 came
// after 0.43-0.89 of each load in first-come order; docs/benchmarks.md,
// issue 22). Later layers of one load wait only while earlier layers are
// waiting, which each load's stream bounds (it queues at most fetch_depth
// requests), so none waits without end.
//
// Thread safety: every method may be called from any thread. Acquire
// allocates nothing: waiters are linked through their own stack frames.
#ifndef KVFABRIC_CLIENT_ADMISSION_WINDOW_H_
#define KVFABRIC_CLIENT_ADMISSION_WINDOW_H_

#include <chrono>
#include <cstdint>

#include "core/mutex.h"

namespace kvfabric::client {

class AdmissionWindow {
 public:
  using Clock = std::chrono::steady_clock;

  // `max` is clamped to at least 1, `initial` to [1, max].
  AdmissionWindow(std::uint32_t initial, std::uint32_t max);

  AdmissionWindow(const AdmissionWindow&) = delete;
  AdmissionWindow& operator=(const AdmissionWindow&) = delete;

  // Takes a slot, waiting until one is free and no waiter ranks before this
  // one, or until `deadline` (false: no slot was taken).
  bool Acquire(std::uint32_t rank, Clock::time_point deadline);
  // Takes a slot if one is free and nobody waits; never blocks.
  bool TryAcquire();
  // Gives a slot back: `refused` if its reply refused something for room,
  // `answered` if it got a reply at all (a failed call changes no size).
  void Release(bool refused, bool answered);

  std::uint32_t size() const;
  std::uint32_t in_flight() const;
  std::uint32_t waiting() const;

 private:
  struct Waiter {
    std::uint32_t rank = 0;
    Waiter* next = nullptr;
  };
  void Unlink(Waiter* w) KVF_REQUIRES(mu_);

  const std::uint32_t max_;
  mutable Mutex mu_;
  CondVar cv_;
  std::uint32_t size_ KVF_GUARDED_BY(mu_);
  std::uint32_t in_flight_ KVF_GUARDED_BY(mu_) = 0;
  std::uint32_t accepted_ KVF_GUARDED_BY(mu_) = 0;  // replies since the size last changed
  // Waiters in admission order (rank, then arrival: a newcomer goes behind
  // every waiter of its rank); the head is admitted next.
  Waiter* head_ KVF_GUARDED_BY(mu_) = nullptr;
  std::uint32_t waiting_ KVF_GUARDED_BY(mu_) = 0;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_ADMISSION_WINDOW_H_
