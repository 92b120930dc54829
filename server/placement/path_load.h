// PathLoad: the bytes already planned on each path, so that two plans do not both assume a
// path's whole bandwidth.
//
// Model: every path resource (a BusPath on one daemon, or the host→device link of one client)
// is a FIFO. A plan admitted on it adds its bytes to the resource's queue; the planner predicts
// that a new transfer on the resource starts only after the queued bytes have drained, i.e. it
// waits QueuedBytes / beta. Bytes leave the queue when the plan is released (the client reported
// it finished) or when its deadline (its predicted end plus a margin the caller picks) passes,
// whichever comes first, so a client that never reports cannot inflate a path forever.
// This is deliberately simple: it ignores that the admitted plan has partly drained by now
// (pessimistic by at most one plan's transfer) and treats concurrent transfers as queued rather
// than sharing bandwidth (the same finish time for the last byte).
//
// Memory: one entry per admitted, unreleased plan and per resource with bytes queued.
//
// Thread safety: every method may be called from any thread (one mutex).
#ifndef KVFABRIC_SERVER_PLACEMENT_PATH_LOAD_H_
#define KVFABRIC_SERVER_PLACEMENT_PATH_LOAD_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/bus_cost_model.h"
#include "core/mutex.h"

namespace kvfabric {

// Bytes a plan moves over one path resource. `resource` is the daemon's host_id for daemon
// paths (remote, NVMe, memcpy from a local daemon) and the client's id for host→device.
struct PathCharge {
  BusPath path = BusPath::kUnspecified;
  std::string resource;
  uint64_t bytes = 0;
};

class PathLoad {
 public:
  PathLoad() = default;
  PathLoad(const PathLoad&) = delete;
  PathLoad& operator=(const PathLoad&) = delete;

  // Bytes queued on (path, resource) now.
  uint64_t QueuedBytes(BusPath path, std::string_view resource) const;

  // Adds a plan's charges; returns a ticket (non-zero) for Release. `deadline_us` is on the
  // caller's monotonic clock (Env::NowMicros) and is used only by ReleaseExpired.
  uint64_t Admit(const std::vector<PathCharge>& charges, uint64_t deadline_us);
  // Removes a plan's charges. Idempotent; false if the ticket is unknown (released or expired).
  bool Release(uint64_t ticket);
  // Releases every plan whose deadline is <= now_us; returns how many.
  size_t ReleaseExpired(uint64_t now_us);
  // Plans admitted and not released.
  size_t admitted_plans() const;

 private:
  struct Admitted {
    std::vector<PathCharge> charges;
    uint64_t deadline_us = 0;
  };
  using Key = std::pair<int, std::string>;

  void RemoveLocked(const Admitted& a) KVF_REQUIRES(mu_);

  mutable Mutex mu_;
  uint64_t next_ticket_ KVF_GUARDED_BY(mu_) = 1;
  std::map<Key, uint64_t, std::less<>> queued_ KVF_GUARDED_BY(mu_);  // entries > 0 only
  std::unordered_map<uint64_t, Admitted> plans_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_PLACEMENT_PATH_LOAD_H_
