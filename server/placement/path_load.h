// PathLoad: what the plans placement admitted still have to move on each path, so that two plans
// do not both assume a path's whole bandwidth.
//
// Model: every path resource (a BusPath on one daemon, or a stage of one client) serves the plans
// charged to it at once, in equal shares (processor sharing): n plans moving bytes over a
// resource of rate beta each receive beta × min(1, gain / n) until one of them has moved all its
// bytes, gain being the resource's concurrency gain (PathParameters::concurrency_gain: together
// they move up to gain × beta, each at most beta; 1 on a path learned to be shared as it is). That
// is what the daemons and the client do with concurrent loads (each load's requests are admitted
// earliest layer first and served side by side, docs/client.md), and it is what the last byte of
// a load measures: two loads started together end together.
//
// The model drains: a plan's bytes start moving when it is admitted, at the rate its plan assumed
// for the resource (PathCharge::beta_bytes_per_s, the newest charge's rate for the whole
// resource), so a plan admitted long ago and nearly done holds little. A charge with no rate
// (0) never drains: it holds its bytes until released, as every charge did before 2026-12-07.
//
// What a new stream of B bytes pays for sharing: it ends SharedBacklog::Stretched(B) / beta
// after it starts, which is (B + Σ min(r_i, B)) / beta with gain 1, r_i being what each admitted
// plan still has to move there (Backlog). What an admitted plan pays for the plans admitted
// after it: each one that arrives while it still has bytes to move pushes its end back (by
// min(r, b) / beta with gain 1; in general the difference of its end with and without the new
// plan, no later arrivals assumed). The sum is AddedDelayUs, which placement reports beside the
// plan's prediction once it finished: the plan was priced with the loads that were there, and
// the ones that joined it explain the rest.
//
// Bytes leave the model when they have drained, when the plan is released (the client reported
// it finished) or when its deadline (its predicted end plus a margin the caller picks) passes,
// so a client that never reports cannot inflate a path forever.
//
// Memory: one entry per admitted, unreleased plan, and one per charge of it on a resource still
// moving bytes; at most `max_plans` plans are admitted at once (a plan made past that is not
// charged: Admit returns 0), and admitting one costs O(n log n) in the n plans on each of its
// resources.
//
// Thread safety: every method may be called from any thread (one mutex). Times are on the
// caller's monotonic clock (Env::NowMicros) and must not go backwards between calls; an earlier
// time is treated as the latest one seen.
#ifndef KVFABRIC_SERVER_PLACEMENT_PATH_LOAD_H_
#define KVFABRIC_SERVER_PLACEMENT_PATH_LOAD_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/bus_cost_model.h"
#include "core/mutex.h"

namespace kvfabric {

// Bytes a plan moves over one path resource. `resource` is the daemon's host_id for daemon
// paths (remote, NVMe, memcpy from a local daemon) and the client's id for its ingest and
// host→device stages.
struct PathCharge {
  BusPath path = BusPath::kUnspecified;
  std::string resource;
  uint64_t bytes = 0;
  // The rate the plan assumed for this resource, bytes/s; 0: the bytes do not drain.
  double beta_bytes_per_s = 0;
  // The resource's concurrency gain the plan assumed (PathParameters::concurrency_gain).
  double concurrency_gain = 1;
};

// What other plans still have to move on one resource, and how long a new transfer takes
// beside them.
class SharedBacklog {
 public:
  SharedBacklog() = default;
  // `remaining`: any order, entries <= 0 dropped. `gain`: the resource's concurrency gain
  // (PathParameters::concurrency_gain; below 1 is taken as 1).
  explicit SharedBacklog(std::vector<double> remaining, double gain = 1);

  // Σ r_i.
  double Total() const { return total_; }
  size_t plans() const { return remaining_.size(); }
  double gain() const { return gain_; }
  // How long a new transfer of `bytes` takes beside the plans, in bytes at the resource's
  // single-transfer rate beta (divide by beta for the time): while n transfers move (it and the
  // plans with bytes left), each moves at beta × min(1, gain / n), and no plan arrives after
  // it. With gain 1: bytes + Σ min(r_i, bytes).
  double Stretched(double bytes) const;

 private:
  // max(1, n / gain): how much slower each of n transfers moves than one alone.
  double Slowdown(size_t n) const;

  double gain_ = 1;
  double total_ = 0;
  std::vector<double> remaining_;  // ascending
  std::vector<double> at_;         // at_[k] = Stretched(remaining_[k])
};

class PathLoad {
 public:
  static constexpr size_t kDefaultMaxPlans = 16384;
  explicit PathLoad(size_t max_plans = kDefaultMaxPlans) : max_plans_(max_plans) {}
  PathLoad(const PathLoad&) = delete;
  PathLoad& operator=(const PathLoad&) = delete;

  // What each admitted plan still has to move on (path, resource) at `now_us`, priced with
  // `gain` (0: the resource's, from its newest charge).
  SharedBacklog Backlog(BusPath path, std::string_view resource, uint64_t now_us, double gain = 0);
  // Σ of Backlog, rounded up.
  uint64_t QueuedBytes(BusPath path, std::string_view resource, uint64_t now_us);

  // Adds a plan's charges at `now_us` (charges naming the same resource are summed); returns a
  // ticket (non-zero) for Release, or 0 when max_plans plans are admitted already (nothing is
  // charged). `deadline_us` is used only by ReleaseExpired.
  uint64_t Admit(const std::vector<PathCharge>& charges, uint64_t now_us, uint64_t deadline_us);
  // Removes a plan's charges. False if the ticket is unknown (released or expired). When
  // `added_delay_us` is set, it receives AddedDelayUs of the plan.
  bool Release(uint64_t ticket, uint64_t now_us, double* added_delay_us = nullptr);
  // Releases every plan whose deadline is <= now_us; returns how many.
  size_t ReleaseExpired(uint64_t now_us);
  // How much later than when it was admitted the model now expects the plan's last byte, on
  // the resource where that is most: what the plans admitted after it added there (file
  // comment). 0 for an unknown ticket.
  double AddedDelayUs(uint64_t ticket) const;
  // Plans admitted and not released.
  size_t admitted_plans() const;

 private:
  using Key = std::pair<int, std::string>;
  // One resource, served in equal shares. `served` is the virtual clock: the bytes each plan
  // still moving there has received since the resource was last idle; a plan admitted at
  // virtual time v with b bytes is done at v + b.
  struct Resource {
    double beta = 0;                               // bytes/s, the newest charge's; 0: no draining
    double gain = 1;                               // the newest charge's concurrency gain, >= 1
    uint64_t clock_us = 0;                         // the time `served` is at
    double served = 0;                             // virtual bytes
    std::set<std::pair<double, uint64_t>> active;  // (virtual end, ticket)
  };
  struct Charge {
    Key key;
    double virtual_end = 0;  // in its resource's `served` units
    double delay_us = 0;     // added by plans admitted after this one
    bool active = false;     // still in the resource's `active`
  };
  struct Admitted {
    std::vector<Charge> charges;
    uint64_t deadline_us = 0;
    // The most any of its resources' later plans added (PathLoad::AddedDelayUs).
    double AddedDelayUs() const {
      double delay = 0;
      for (const Charge& c : charges) delay = std::max(delay, c.delay_us);
      return delay;
    }
  };

  // Moves `r` to now_us: plans drain at beta / n, finishing ones leave `active`.
  void AdvanceLocked(const Key& key, Resource* r, uint64_t now_us) KVF_REQUIRES(mu_);
  void RemoveLocked(uint64_t ticket, Admitted* a, uint64_t now_us) KVF_REQUIRES(mu_);
  uint64_t ClampLocked(uint64_t now_us) KVF_REQUIRES(mu_);

  const size_t max_plans_;
  mutable Mutex mu_;
  uint64_t next_ticket_ KVF_GUARDED_BY(mu_) = 1;
  uint64_t latest_us_ KVF_GUARDED_BY(mu_) = 0;
  std::map<Key, Resource, std::less<>> resources_ KVF_GUARDED_BY(mu_);  // with active plans
  std::unordered_map<uint64_t, Admitted> plans_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_PLACEMENT_PATH_LOAD_H_
