// The candidate assignments of a plan's cached prefix, and their pricing: the
// part of Planner::MakePlan (planner.h, FETCH MODEL) that chooses which
// replica of each block a fetch reads. Internal to the planner: planner.cc
// builds plans from what RunPasses leaves in a Work.
//
//   ComputeSources   per (host, tier) source: alphas, shared stages, bottleneck;
//   RunPasses        the three candidates (serial DP, balanced, serial
//                    improved by local moves), each priced for every suffix
//                    [k, m) and prefix [0, j) of the cached prefix.
//
// Thread safety: a Work belongs to one MakePlan call.
#ifndef KVFABRIC_SERVER_PLACEMENT_PLANNER_CANDIDATES_H_
#define KVFABRIC_SERVER_PLACEMENT_PLANNER_CANDIDATES_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "server/placement/path_load.h"
#include "server/placement/planner.h"

namespace kvfabric::planner_internal {

// A stage plans share (PathLoad): its per-byte cost and what the admitted plans still have to
// move through it.
struct SharedStage {
  double per_byte_us = 0;  // 1 / beta, in µs per byte
  SharedBacklog backlog;
  // How long `bytes` take through the stage beside the backlog (equal shares, planner.h).
  double Us(double bytes) const { return backlog.Stretched(bytes) * per_byte_us; }
};

// The cost of fetching from one source (host, tier); see the FETCH MODEL in planner.h.
struct SourceCost {
  double alpha_us = 0;  // alphas of the daemon stages: once per stream
  // The whole backlog of its stages (max over them of Σ r_i / beta): what the serial and
  // balanced heuristics charge a stream for the other plans. Streams are priced with StreamUs.
  double wait_us = 0;
  double fixed_us = 0;     // alpha_us + wait_us: what the serial choice pays per run
  double per_byte_us = 0;  // 1 / bottleneck beta of the daemon stages, in µs per byte
  BusPath bottleneck = BusPath::kUnspecified;
  double bottleneck_beta = 0;
  const SharedStage* transfer = nullptr;  // the daemon→client stage
  const SharedStage* nvme = nullptr;      // the NVMe stage; null for the host tier
  // The stream of this source moving `bytes`: its alphas, then the slower of its stages, each
  // shared with the plans admitted before (0 bytes: 0, it has not started).
  double StreamUs(double bytes) const {
    if (bytes <= 0) return 0;
    double t = transfer->Us(bytes);
    if (nvme != nullptr) t = std::max(t, nvme->Us(bytes));
    return alpha_us + t;
  }
};

inline int SourceId(const BlockReplica& r) {
  return static_cast<int>(r.host_index) * 2 + (r.tier == Tier::kNvme);
}

inline std::string_view TierName(Tier t) { return t == Tier::kNvme ? "nvme" : "host"; }

// The candidate assignments of the cached prefix (FETCH MODEL in planner.h).
enum Candidate : uint8_t { kSerial = 0, kBalanced = 1, kSerialImproved = 2, kCandidates = 3 };

inline std::string_view CandidateName(uint8_t c) {
  return c == kSerial ? "serial" : c == kBalanced ? "balanced" : "serial, improved";
}

// Everything one MakePlan call computes, kept together for reconstruction and explanation.
struct Work {
  const PlannerInput* in = nullptr;
  // Per block: read as its compact copy (in->blocks already hold that copy's bytes and replicas).
  const std::vector<uint8_t>* compact = nullptr;
  std::vector<std::array<SourceCost, 2>> sources;  // [host][tier - 1]
  // Per host: its daemon→client and NVMe stages (SourceCost points into these).
  std::vector<std::array<SharedStage, 2>> stages;
  double plan_fixed_us = 0;   // alpha_h2d
  SharedStage h2d;            // the client's host→device link
  SharedStage ingest;         // the client's ingest
  uint32_t m = 0;             // cached prefix blocks
  uint64_t total_tokens = 0;
  // Flat per-(block, replica) arrays over blocks [0, m), for the serial candidate's dynamic
  // program.
  std::vector<uint32_t> offset;  // m + 1 entries
  std::vector<double> cost;      // bytes × per_byte
  std::vector<double> fixed;     // alphas + queue wait
  std::vector<int32_t> next_same;
  // Backward pass: g (cost of i..m-1 given this replica, its run already paid for) and whether
  // the best continuation keeps the source.
  std::vector<double> g;
  std::vector<uint8_t> keeps_source;
  std::vector<double> best_start;  // min over r of fixed + g
  std::vector<int32_t> best_start_arg;
  // The candidates: a flat replica index per block of [0, m).
  std::array<std::vector<int32_t>, kCandidates> assign;
  // F(k, m) for k in [0, m] and F(0, j) for j in [0, m], the cheaper candidate, and which.
  std::vector<double> suffix_us, prefix_us;
  std::vector<uint8_t> suffix_arg, prefix_arg;

  const SourceCost& Source(const BlockReplica& r) const {
    return sources[r.host_index][r.tier == Tier::kNvme ? 1 : 0];
  }
  size_t SourceCount() const { return sources.size() * 2; }
  uint8_t Compact(uint32_t i) const { return compact != nullptr ? (*compact)[i] : 0; }
  // What block i's bytes add to a stream of `source`.
  double BytesUs(uint32_t i, const SourceCost& source) const {
    return static_cast<double>(in->blocks[i].bytes) * source.per_byte_us;
  }
  double PrefixTokens(uint32_t i) const {
    return i == in->blocks.size() ? static_cast<double>(total_tokens)
                                  : static_cast<double>(in->blocks[i].prefix_tokens);
  }
  // The client's shared stages for `bytes` fetched in all: max(ingest, host→device), each
  // shared with this client's other admitted plans.
  double Shared(double bytes) const {
    if (bytes <= 0) return 0;
    return std::max(in->client_ingest.alpha_us + ingest.Us(bytes), h2d.Us(bytes));
  }
  // Fetch time of blocks [k, m) and [0, j), including the per-plan host→device cost.
  double FetchSuffix(uint32_t k) const { return k >= m ? 0 : suffix_us[k]; }
  double FetchPrefix(uint32_t j) const { return j == 0 ? 0 : prefix_us[j]; }
  double Rest(uint32_t j) const {
    const double p = PrefixTokens(j);
    return RecomputeMicros(
        in->recompute,
        static_cast<double>(total_tokens) - p + static_cast<double>(in->suffix_tokens), p);
  }
  double Front(uint32_t k) const { return RecomputeMicros(in->recompute, PrefixTokens(k), 0); }
};

inline const BlockReplica& ReplicaAt(const Work& w, uint32_t block, int32_t flat) {
  return w.in->blocks[block].replicas[flat - w.offset[block]];
}

// Fills w->sources and the client's shared-stage costs from `in` and the
// path load read at in.now_us (null: idle paths).
void ComputeSources(const PlannerInput& in, PathLoad* load, Work* w);

// Builds the three candidates of w->assign and prices them into
// w->suffix_us / prefix_us (and _arg). REQUIRES: ComputeSources, w->m set.
void RunPasses(Work* w);

}  // namespace kvfabric::planner_internal

#endif  // KVFABRIC_SERVER_PLACEMENT_PLANNER_CANDIDATES_H_
