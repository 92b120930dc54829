// Eviction and demotion of host-pool blocks: which blocks leave the pool, in
// what order, and why (ARCHITECTURE.md §3.5).
//
// An EvictionPolicy only scores blocks; PlanEviction turns scores into
// decisions; the LeaseTable applies them (it alone knows which pages are leased
// or reserved, and hands PlanEviction only blocks that are neither: a leased,
// reserved or demoting page is never a candidate).
//
// Two policies:
//   LruPolicy        score = last access time (µs); the least recently used
//                    block goes first.
//   CostAwarePolicy  (the default) score = value per byte of residency:
//                      value = (t_recompute(n, p) - t_fetch(host path, bytes))
//                              / resident bytes                    [µs per byte]
//                    with n = tokens the block covers, p = its token offset in
//                    its context, resident bytes = pages x page bytes, and the
//                    bus cost model's formulas (core/bus_cost_model.h). The
//                    block whose host copy saves least per byte goes first.
//                    A victim is demoted to NVMe only while that copy is still
//                    worth keeping: t_recompute > t_fetch(nvme→host) +
//                    t_fetch(host path); otherwise it is dropped.
// Ties on score break by older last access, then lower namespace id, then
// lower key, so a plan is a pure function of its inputs.
//
// PlanEviction runs when occupancy (pages not free, less pages already being
// demoted) is above the high watermark, or when a request needs more pages
// than are free; it takes victims until occupancy is at most
// min(low watermark, pages - pages needed). The order is fixed and counted:
//   step 1: host copies of blocks already on NVMe (tier both): dropped, no I/O
//           and no loss (kDropHostCopy);
//   step 2: host-only blocks: demoted (kDemote) when an NVMe tier is
//           configured and the policy says the copy is worth it, else evicted
//           (kEvict).
// Within a step, victims go in policy order.
//
// Compact copies (issue 24; CompactKeepOptions, B = --compact-keep-bytes).
// The compact copy c of an exact block x is the block of x's namespace whose
// key is CompactBlockKey(x.key, codec, version) (the lease table pairs them);
// it is smaller, and stands in for x where a request accepts it. With B > 0
// a copy is
//   held   while x has a host copy and c is not kept: c is no candidate in
//          steps 1 and 2; its fate is decided when x is a victim;
//   kept   once eviction took x's host copy and left c in the pool;
//   loose  otherwise (x deleted, or c written after x left): any block.
// K = sum of resident(k) over the kept copies k (EvictionTrigger::
// compact_kept_bytes, then as this pass changes it). When a victim x (either
// step, any action) has a held copy c that is a candidate:
//   while K + resident(c) > B and the kept copy k the policy evicts first
//     evicts before c (same order as the steps): k leaves, over budget;
//   K + resident(c) <= B:  c stays, kept;           K += resident(c)
//   otherwise:             c leaves with x, over budget.
// x leaves exactly as it would without a copy: step 1 drops its host copy,
// step 2 demotes it (when an NVMe tier is configured, worth it and has room)
// or evicts it. So with an NVMe tier the exact block goes to NVMe as before
// and the copy is kept in the host pool; a copy that leaves is treated as any
// block of its tier (host copy dropped, demoted or evicted).
//   step 3: kept and held copies, in policy order, only when steps 1 and 2
//           ran out of candidates: B never keeps the pool from freeing pages.
// Hence K <= B after every pass that starts with K <= B (a held copy that is
// no candidate when x leaves, being leased or demoted, is left loose: never
// kept, so never counted), and a held copy never leaves before its exact
// block while that block is a candidate. B = 0: no copy is held or
// kept, and the order is steps 1 and 2 alone (the behaviour before issue 24).
//
// Every decision carries one line saying why, with the formula and its
// numbers; the DecisionLog keeps the most recent ones for `kvfabric explain`.
//
// Thread safety: policies are immutable after construction and may be used
// from any thread; PlanEviction is a pure function; DecisionLog is internally
// synchronised.
#ifndef KVFABRIC_SERVER_CACHE_HOST_EVICTION_POLICY_H_
#define KVFABRIC_SERVER_CACHE_HOST_EVICTION_POLICY_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/block_key.h"
#include "core/bus_calibration.h"
#include "core/bus_cost_model.h"
#include "core/mutex.h"
#include "core/status.h"
#include "server/cache_host/block_index.h"
#include "server/cache_host/block_location.h"

namespace kvfabric::cache_host {

// A compact copy's part in eviction (see "Compact copies"), set by the caller.
enum class CompactRole : std::uint8_t {
  kNone = 0,  // an exact block, a loose copy, or B = 0
  kHeld = 1,  // its exact block has a host copy
  kKept = 2,  // kept in the pool after its exact block's host copy left
};

// EvictionCandidate::held_copy when there is none.
inline constexpr std::size_t kNoHeldCopy = ~std::size_t{0};

// What eviction keeps for compact copies (--compact-keep-bytes).
struct CompactKeepOptions {
  // --compact-keep-bytes: host bytes (whole pages) that compact copies may
  // hold while eviction has taken their exact blocks' host copies (B above).
  // Default 0: no preference, compact copies are blocks like any other. The
  // daemon's default is 25% of --host-pool-bytes with --compact-threads > 0
  // (0 without): a quarter of the pool for old history at ~0.56x the bytes,
  // three quarters for exact blocks. At most the pool.
  std::uint64_t budget_bytes = 0;
  // The codec whose copies are paired with their exact blocks:
  // CompactBlockKey(exact key, codec, codec_version). The daemon sets the
  // converter's (compact_int8's, gpu/kernels/compact_int8.h).
  std::string codec;
  std::uint32_t codec_version = 0;
  // InvalidArgument naming --compact-keep-bytes: a budget above the pool, or
  // a budget without a codec.
  Status Validate(std::uint64_t pool_bytes) const;
};

// A block the policy may choose: committed, in the host pool, not pinned by a
// read lease, not being demoted.
struct EvictionCandidate {
  NamespaceId ns = 0;
  BlockKey key;
  BlockTier tier = BlockTier::kHost;  // kHost or kBoth
  std::uint64_t bytes = 0;            // payload bytes
  std::uint64_t pages = 0;            // host pages it holds
  std::uint64_t resident_bytes = 0;   // pages x page bytes
  std::uint32_t tokens = 0;
  std::uint64_t token_offset = 0;
  std::uint64_t last_access_us = 0;
  std::uint64_t hit_count = 0;
  // Compact copies ("Compact copies"): this block's role as a copy, and for
  // an exact block whose held copy is a candidate too, that copy's index in
  // the candidates handed to PlanEviction.
  CompactRole compact_role = CompactRole::kNone;
  std::size_t held_copy = kNoHeldCopy;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // "lru", "cost-aware".
  virtual std::string_view name() const = 0;
  // Lower scores leave first.
  virtual double Score(const EvictionCandidate& c) const = 0;
  // The score's formula with its numbers filled in.
  virtual std::string ExplainScore(const EvictionCandidate& c) const = 0;
  // Whether a host-only victim should be copied to NVMe rather than dropped
  // (when an NVMe tier exists). Sets *why to the reason with its numbers.
  virtual bool WorthDemoting(const EvictionCandidate& c, std::string* why) const = 0;
};

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  double Score(const EvictionCandidate& c) const override {
    return static_cast<double>(c.last_access_us);
  }
  std::string ExplainScore(const EvictionCandidate& c) const override;
  // Always true: LRU keeps every block it can.
  bool WorthDemoting(const EvictionCandidate& c, std::string* why) const override;
};

struct CostAwareOptions {
  // The path a client reads a host-pool block over (remote daemon -> client
  // host; kLocalMemcpy for a daemon on the client's node).
  BusPath host_path = BusPath::kRemoteHostToLocalHost;
  PathParameters host_fetch;
  // NVMe -> host staging read, for the demotion decision.
  PathParameters nvme_fetch;
  RecomputeParameters recompute;
};

// The figures for daemon `host_id` serving `model_id` from a calibration file (the one
// `kvfabric calibrate` writes and placement reads): each path's entry for this host, else the
// path's default entry (host ""), else core/cost_defaults.h; the model's recompute entry, else
// the only one in the file, else the defaults. `sources` (may be null) gets a line naming where
// each figure came from, for the log.
CostAwareOptions CostAwareFromCalibration(const BusCalibration& calibration,
                                          std::string_view host_id, std::string_view model_id,
                                          std::string* sources);
// core/cost_defaults.h's figures.
CostAwareOptions DefaultCostAwareOptions();

class CostAwarePolicy final : public EvictionPolicy {
 public:
  // REQUIRES: both beta_bytes_per_s > 0.
  explicit CostAwarePolicy(CostAwareOptions options) : o_(options) {}
  std::string_view name() const override { return "cost-aware"; }
  double Score(const EvictionCandidate& c) const override;
  std::string ExplainScore(const EvictionCandidate& c) const override;
  bool WorthDemoting(const EvictionCandidate& c, std::string* why) const override;
  // Replaces the figures (a calibration file read again); later scores use them.
  // InvalidArgument (nothing changes) unless both betas are finite and > 0 and every other
  // figure finite and >= 0.
  Status Update(const CostAwareOptions& options);
  CostAwareOptions options() const;

 private:
  mutable Mutex mu_;
  CostAwareOptions o_ KVF_GUARDED_BY(mu_);
};

// Occupancy thresholds, fractions of the pool's pages.
struct Watermarks {
  // --host-high-watermark. Default 0.90: above it eviction runs; the pages
  // above it are the reserve kept free for in-flight writes.
  double high = 0.90;
  // --host-low-watermark. Default 0.80: eviction stops at or below it. The gap
  // to `high` sets how much one pass frees (fewer, larger passes).
  double low = 0.80;
  // InvalidArgument unless 0 < low <= high <= 1 (names the flags).
  Status Validate() const;
};

struct EvictionTrigger {
  std::uint64_t pool_pages = 0;
  std::uint64_t occupied_pages = 0;  // not free, less pages already being demoted
  std::uint64_t pages_needed = 0;    // a request waiting for room; 0 for a background pass
  Watermarks watermarks;
  bool nvme_enabled = false;
  // Bytes the NVMe tier can still take (capacity less what it holds and what
  // is being demoted): demotions beyond it become evictions, so a full tier
  // never turns eviction into a loop of failing demotions.
  std::uint64_t nvme_free_bytes = ~std::uint64_t{0};
  // The tier pads each record (header + payload) to this (its direct-I/O
  // unit).
  std::uint64_t nvme_record_alignment = 4096;
  // Why demotion is off while a tier exists (e.g. demotions failing and
  // backing off); explains the evictions it causes. Empty: no tier.
  std::string nvme_off_reason;
  // B and K of "Compact copies": --compact-keep-bytes (0: no preference) and
  // the resident bytes of the kept copies when the pass starts.
  std::uint64_t compact_keep_bytes = 0;
  std::uint64_t compact_kept_bytes = 0;
};

// Numbered explicitly: metric labels and explain output.
enum class EvictionAction : std::uint8_t {
  kDropHostCopy = 1,  // step 1: the NVMe copy remains
  kDemote = 2,        // step 2: copy to NVMe, then free the host pages
  kEvict = 3,         // step 2: dropped from the cache
};

// "drop-host-copy", "demote", "evict".
std::string_view EvictionActionName(EvictionAction action);

// What a decision does about a compact copy ("Compact copies"). Numbered
// explicitly: metric labels and explain output.
enum class CompactOutcome : std::uint8_t {
  kNone = 0,
  kCopyKept = 1,        // an exact block's host copy leaves, its copy stays (kept)
  kCopyOverBudget = 2,  // a copy leaves so that K stays <= B
  kCopyLastResort = 3,  // a kept or held copy leaves in step 3
};
// "none", "kept", "over_budget", "last_resort".
std::string_view CompactOutcomeName(CompactOutcome outcome);

struct EvictionDecision {
  std::uint64_t sequence = 0;  // set by DecisionLog::Record
  std::uint64_t time_us = 0;
  NamespaceId ns = 0;
  std::string tenant;  // filled in by whoever knows it (the lease table)
  BlockKey key;
  EvictionAction action = EvictionAction::kEvict;
  // 1, 2 or 3; a copy that leaves over budget has the step of the exact
  // block whose turn made it leave.
  std::uint32_t step = 0;
  std::uint64_t rank = 0;        // 1-based position in the step's order; 0 for an over-budget copy
  std::uint64_t candidates = 0;  // candidates in the step
  std::uint64_t pages = 0;
  double score = 0;
  // Compact copies: kCopyKept on an exact block's decision (compact_key is
  // the copy that stays); kCopyOverBudget / kCopyLastResort on a copy's.
  CompactOutcome compact = CompactOutcome::kNone;
  BlockKey compact_key;
  // One line: action, step, rank, policy formula, trigger, demotion reason,
  // and for compact copies which copy stays or why it leaves, with the
  // budget's arithmetic.
  std::string explanation;
};

// Chooses victims from `candidates` as described above. Returns nothing when
// no trigger holds. May return fewer pages than needed when candidates run out
// (the rest are leased, reserved or demoting): the caller refuses the write.
std::vector<EvictionDecision> PlanEviction(const EvictionPolicy& policy,
                                           std::vector<EvictionCandidate> candidates,
                                           const EvictionTrigger& trigger, std::uint64_t now_us);

// Recent decisions, newest last, at most `capacity`; older ones are dropped.
// Counts every decision ever recorded by action.
class DecisionLog {
 public:
  // --eviction-log-capacity. REQUIRES: capacity > 0.
  explicit DecisionLog(std::size_t capacity = 4096) : capacity_(capacity) {}

  void Record(EvictionDecision decision);
  // Decisions about (tenant, key) still in the log, newest first. By tenant
  // name, not namespace id: an id is reused once its namespace holds nothing
  // (BlockIndex::ReclaimIfEmpty), and its decisions must then neither vanish
  // nor show under the id's next owner.
  std::vector<EvictionDecision> Find(const std::string& tenant, const BlockKey& key) const;
  // The newest `n` decisions, newest first; only `tenant`'s if it is given.
  std::vector<EvictionDecision> Recent(std::size_t n, const std::string* tenant = nullptr) const;
  std::size_t capacity() const { return capacity_; }
  std::uint64_t Count(EvictionAction action) const;
  // Decisions ever recorded with `outcome` (kCopyKept: by the exact block's
  // action, CountCopyKept).
  std::uint64_t CountCompact(CompactOutcome outcome) const;
  std::uint64_t CountCopyKept(EvictionAction action) const;

 private:
  const std::size_t capacity_;
  mutable Mutex mu_;
  std::deque<EvictionDecision> ring_ KVF_GUARDED_BY(mu_);
  std::uint64_t next_sequence_ KVF_GUARDED_BY(mu_) = 1;
  std::uint64_t counts_[4] KVF_GUARDED_BY(mu_) = {};  // indexed by EvictionAction
  std::uint64_t compact_counts_[4] KVF_GUARDED_BY(mu_) = {};  // indexed by CompactOutcome
  std::uint64_t kept_counts_[4] KVF_GUARDED_BY(mu_) = {};     // kCopyKept, by EvictionAction
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_EVICTION_POLICY_H_
