// Planner: for one request's block chain, whether to fetch each run of cached blocks or to
// recompute it, with the predicted time of the plan and of its alternatives, and the formula with
// the numbers filled in. Pure logic over a snapshot of the cost model (core/bus_cost_model.h)
// and of the path load (path_load.h); the gRPC adapter converts PlannerInput/Plan to and from
// kvfabric.v1.PlanRequest/PlanResponse (enum values below equal the proto's).
//
// WHICH CACHED BLOCKS ARE USABLE. Block i's KV depends on every token before it, and its key
// chains over its parent's, so a cached block after a gap holds exactly the right KV for this
// chain. Using it would need the gap recomputed with the earlier blocks' KV present and the
// fetched block's KV injected between two prefill calls; serving engines prefill one contiguous
// range after their cached prefix and cannot do that, and each extra prefill call pays c0 again.
// So the usable cached part is the longest cached prefix: blocks [0, m) where every block has a
// replica (PlanKind::kMixed is reserved for gap plans). Everything after m is recomputed, in one
// prefill of n = tokens after m (+ suffix_tokens) with p = tokens before m.
//
// PLANS CONSIDERED, with P_i = tokens before block i, T = all chain tokens, S = suffix_tokens,
// rest(j) = t_recompute(T - P_j + S, P_j), F(k, j) = fetch time of blocks [k, j):
//   recompute-all   t_recompute(T + S, 0)
//   fetch-all       F(0, m) + rest(m)
//   split(k)        max(A, B) + s × min(A, B) + rest(m),   0 < k < m,
//                   A = t_recompute(P_k, 0), B = F(k, m), s = split_serial_fraction
//                   (the first k blocks are prefilled while blocks k..m-1 are fetched; both
//                   finish before the rest runs; s is the part of the shorter side that does not
//                   overlap, 0 for separate resources, fitted from finished split plans)
//   fetch-prefix(j) F(0, j) + rest(j),   0 < j < m  (use a shorter prefix when the tail of the
//                   cached prefix is slow to fetch; reported as PlanKind::kMixed)
// The chosen plan is the minimum, so it is never predicted slower than recompute-all or
// fetch-all. Plans that both recompute a front and drop a tail (k > 0 and j < m) are not
// considered: choosing both is O(m^2) and neither the issue nor the field reports ask for it.
//
// FETCH MODEL. A source is (host, tier). The client fetches from every daemon of a plan at once
// (client/client_io.cc): one stream per source, its blocks one after another, the streams side
// by side. A stream's blocks pass the daemon stages [NVMe→host on the daemon, if tier NVMe] →
// [daemon→client host: remote→local over the transport, or memcpy for a daemon on the client's
// node], which pipeline. The client sends every block a plan fetches from one source as one list,
// in full batches, whatever the plan's runs (client/client_io.cc, FetchRuns), and reports the
// stream's bytes and wall time as one observation, so the fitted alpha is a per-stream cost: the
// stream of s, moving B(s) bytes in all, ends at
//   T(s) = sum of alpha over the daemon stages
//          + max over those stages of Stretched_stage(B(s)) / beta_stage,
// Stretched_stage(B) being B stretched by the other admitted plans, which still have r_i bytes
// to move through the stage: every stage serves the plans on it in equal shares, each at most
// beta, together at most concurrency_gain × beta (PathLoad, SharedBacklog::Stretched); with
// gain 1, Stretched(B) = B + Σ min(r_i, B). All streams land in the client,
// through two stages they share: its ingest (client_ingest: every daemon→client byte of the plan
// crosses one NIC or one memory bus, BusPath::kClientIngest) and its host→device link. So a plan
// that fetches B bytes in all takes
//   F = alpha_h2d + max( max over sources used of T(s),
//                        alpha_ingest + Stretched_ingest(B) / beta_ingest,
//                        Stretched_h2d(B) / beta_h2d ).
// (Until 2026-12-07 a stage was a FIFO: a stream first waited Σ r_i / beta. Loads started
// together end together, and a small load beside a large one ends early; a FIFO predicted
// neither.)
// With one source this is the old pipeline formula plus the ingest term; with several it is the
// overlap: two equal daemons holding half each take half as long as one holding all, unless
// the client's ingest (or its host→device link) is the limit, as on every machine measured so
// far (docs/benchmarks.md). The per-source betas are what a daemon's stream delivered beside the
// plan's other streams (the client reports each source's own wall time, RecordTransfers: a
// daemon's host-pool part as remote→local, its NVMe part, staged by Lease, as nvme→host, so the
// NVMe source's per-byte cost max(1/beta_nvme, 1/beta_transfer) learns the staged path's rate);
// the ingest beta is what all streams delivered together (reported for loads with two or more).
//
// A run is a maximal stretch of consecutive blocks fetched from one source; runs only order the
// stream's bytes (a run's predicted start and end), they pay no alpha of their own. (Until
// 2026-12-07 each run paid its source's alphas: a chain spread block by block over two daemons,
// as rendezvous hashing spreads it, was charged alpha 20-40 times per stream, and placement
// predicted fetches 1.3x slower than they ran and chose splits that lost to fetching
// everything, cluster_planner_bench.) The replica of each block is chosen for the whole cached
// prefix [0, m) from two candidate assignments, priced with F above:
//   serial:   a dynamic program over blocks × replicas minimising the sum of run costs, each run
//             charged its source's alphas and the whole backlog of its stages (Σ r_i / beta) as
//             if it were a stream of its own (a heuristic: it avoids loaded daemons, and puts
//             every block on its cheapest source);
//   balanced: blocks in chain order, each on the replica whose stream would end first
//             (earliest finish time), which spreads replicated blocks over equal daemons.
// Every alternative (fetch-all, each split k, each fetch-prefix j) takes the cheaper candidate
// restricted to its blocks. F over a fixed assignment is exact; the choice between assignments
// is a heuristic (the best assignment under a max of streams is a partition problem): the plan
// is never predicted slower than either candidate, and planner_test compares it with the brute-
// force optimum on random chains.
//
// REPRESENTATIONS (docs/compact.md). A block may also have a compact copy (its own key, its own
// replicas, fewer bytes), offered by the caller only where the request's accuracy policy allows it
// (ChainBlock::compact_*; a request in `exact` mode offers none, so it can never be planned onto a
// compact copy). Fetching a block's compact copy moves compact_bytes instead of bytes and costs
// compact_penalty_us after the load (the client's extra decode time over the copy's tokens for the
// request's decode steps), added to every alternative that fetches it:
//   fetch-all += Pen(0, m), split(k) += Pen(k, m), fetch-prefix(j) += Pen(0, j),
//   Pen(a, b) = sum over the blocks of [a, b) fetched compact of compact_penalty_us.
// The plan is made under up to three representation choices and the cheapest total wins (ties
// go to the one listed first):
//   exact              every block by its exact copy (compact copies ignored);
//   compact-where-gone compact only for blocks with no exact replica (the cached prefix grows
//                      where eviction kept only the compact copy);
//   compact            the compact copy wherever there is one.
// A block is cached when it has a usable replica under the choice. A run (below) is also cut
// where the representation changes, so each run has one; the source's stream still pays its
// alphas once.
//
// COST. O(m × R + H) time and memory for m cached blocks, R replicas per block (R <= 8) and H
// hosts: one backward pass for the serial candidate, one forward pass for the balanced one, and
// per candidate one backward sweep for F(k, m) of every k and one forward sweep for F(0, j) of
// every j (stream ends only grow as blocks are added, so the max is carried along); every
// alternative is then O(1).
//
// Thread safety: a Planner is immutable after construction; Plan() may be called from any
// number of threads at once. PathLoad synchronises itself.
#ifndef KVFABRIC_SERVER_PLACEMENT_PLANNER_H_
#define KVFABRIC_SERVER_PLACEMENT_PLANNER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/bus_cost_model.h"
#include "core/statusor.h"
#include "server/placement/path_load.h"

namespace kvfabric {

// Where a block rests on a daemon. Values equal kvfabric.v1.Tier.
enum class Tier : int {
  kUnspecified = 0,
  kHost = 1,
  kNvme = 2,
};

// Values equal kvfabric.v1.PlanKind.
enum class PlanKind : int {
  kUnspecified = 0,
  kRecomputeAll = 1,
  kFetchAll = 2,
  kSplit = 3,
  kMixed = 4,
};

// Values equal kvfabric.v1.RunAction.
enum class RunAction : int {
  kUnspecified = 0,
  kFetch = 1,
  kRecompute = 2,
};

std::string_view PlanKindName(PlanKind kind);
// The label of a kind in metrics and summaries, as the client names it:
// "recompute_all", "fetch_all", "split", "mixed" (the wire enum's name, so
// the planner's fetch-prefix plans are "mixed"), "unspecified".
std::string_view PlanKindLabel(PlanKind kind);

// A rate that limits nothing (1 EB/s): PlannerInput::client_ingest when the caller has none.
inline constexpr double kUnlimitedBytesPerSecond = 1e18;

// A daemon as the planner sees it: the parameters of its paths to this client.
struct PlannerHost {
  std::string host_id;
  // On the client's node: blocks come over memcpy (`transfer` is then the memcpy path).
  bool local = false;
  // Daemon host memory → client host memory: remote→local over the transport, or memcpy.
  PathParameters transfer;
  // Daemon NVMe → daemon host memory.
  PathParameters nvme;
  // The planner prices every path with alpha and beta alone (its per-byte terms stay linear);
  // a caller whose parameters carry a size curve resolves it first (AtSize, core/
  // bus_cost_model.h) at the bytes the plan is expected to move over the path. These record
  // that, for explanations only: the bytes, and the factors k(bytes) applied (1: flat curve).
  uint64_t expected_bytes = 0;
  double transfer_size_factor = 1;
  uint64_t expected_nvme_bytes = 0;
  double nvme_size_factor = 1;
};

struct BlockReplica {
  // Index into PlannerInput::hosts.
  uint32_t host_index = 0;
  Tier tier = Tier::kUnspecified;
};

struct ChainBlock {
  // Tokens in the block, >= 1.
  uint32_t tokens = 0;
  // Tokens before it in the chain; must equal the sum of the earlier blocks' tokens.
  uint64_t prefix_tokens = 0;
  // Payload bytes, >= 1.
  uint64_t bytes = 0;
  // Live copies; empty = not cached. At most one per (host, tier).
  std::vector<BlockReplica> replicas;
  // The block's compact copy (REPRESENTATIONS), offered only where the accuracy policy allows it:
  // its payload bytes (>= 1 when compact_replicas is not empty), its live copies (at most one per
  // (host, tier)), and the decode time fetching it adds, in µs (finite, >= 0).
  uint64_t compact_bytes = 0;
  std::vector<BlockReplica> compact_replicas;
  double compact_penalty_us = 0;
};

// Values equal kvfabric.v1.RepresentationChoice.
enum class RepresentationChoice : int {
  kExact = 0,
  kCompactWhereGone = 1,
  kCompact = 2,
};
std::string_view RepresentationChoiceName(RepresentationChoice choice);

struct PlannerInput {
  std::vector<PlannerHost> hosts;
  // The client's id: the resource its ingest and host→device stages are charged to in PathLoad.
  std::string client_id;
  // When the plan is made, on PathLoad's clock (Env::NowMicros): what admitted plans still have
  // to move is read at this time.
  uint64_t now_us = 0;
  PathParameters host_to_device;
  // Every daemon→client byte of the plan, all streams together (BusPath::kClientIngest). The
  // default does not limit anything.
  PathParameters client_ingest{0.0, kUnlimitedBytesPerSecond};
  // As PlannerHost::expected_bytes, for host_to_device and client_ingest (the cached prefix's
  // bytes).
  uint64_t expected_bytes = 0;
  double host_to_device_size_factor = 1;
  double client_ingest_size_factor = 1;
  RecomputeParameters recompute;
  // 1..kMaxPlannerChainBlocks blocks, block 0 first.
  std::vector<ChainBlock> blocks;
  // Tokens after the chain every alternative prefills anyway.
  uint64_t suffix_tokens = 0;
  // Only prefix-shaped alternatives (recompute-all, fetch-all, fetch-prefix):
  // the split is not considered (kvfabric.v1.PlanRequest.prefix_plans_only).
  bool prefix_plans_only = false;
  // Fill Plan::explanation.
  bool include_explanation = false;
  // Cap on the explanation's length, in bytes (kvfabric.v1.Limits.max_explanation_bytes).
  size_t max_explanation_bytes = 65536;
};

inline constexpr size_t kMaxPlannerChainBlocks = 65536;

struct PlanRun {
  uint32_t first_block = 0;
  uint32_t block_count = 0;
  RunAction action = RunAction::kUnspecified;
  // kFetch only.
  uint32_t host_index = 0;
  Tier tier = Tier::kUnspecified;
  uint64_t payload_bytes = 0;
  // Microseconds after the plan starts. A fetch run's times are those of its source's stream
  // (streams of different sources overlap); the plan's fetch ends at F, which may be later than
  // every run's end when the client's shared stages are the limit (FETCH MODEL).
  double predicted_start_us = 0;
  double predicted_end_us = 0;
  // kFetch only: the run reads the blocks' compact copies (REPRESENTATIONS), not the exact ones.
  bool compact = false;
};

struct PlanAlternative {
  PlanKind kind = PlanKind::kUnspecified;
  double predicted_us = 0;
  // kSplit: blocks recomputed at the front (k).
  uint32_t split_blocks = 0;
  // Blocks of the cached prefix used (fetched or recomputed alongside): m for fetch-all and
  // split, j for fetch-prefix, 0 for recompute-all.
  uint32_t prefix_blocks = 0;
  bool chosen = false;
  // kSplit: the sides as predicted (A, B and rest(m) above), for fitting s from the measured
  // plan time (CalibratedCostModel::ObserveSplit).
  double front_us = 0;
  double fetch_us = 0;
  double rest_us = 0;
};

struct Plan {
  PlanKind kind = PlanKind::kUnspecified;
  // Cover every block exactly once, in chain order.
  std::vector<PlanRun> runs;
  double predicted_total_us = 0;
  // Recompute-all always; fetch-all when m > 0; the best split and the best fetch-prefix when
  // m > 1. Exactly one is chosen.
  std::vector<PlanAlternative> alternatives;
  uint32_t cached_prefix_blocks = 0;
  // Bytes the plan moves per path resource, for PathLoad::Admit.
  std::vector<PathCharge> charges;
  // Which representation choice the plan was made under, and the best total of each choice
  // considered (REPRESENTATIONS; only kExact when no block offered a compact copy).
  RepresentationChoice representation = RepresentationChoice::kExact;
  std::vector<std::pair<RepresentationChoice, double>> representation_totals;
  // Blocks the plan fetches as compact copies, and the decode time they add (Pen), µs.
  // predicted_total_us is the load's time alone; the choice between plans (alternatives'
  // predicted_us, representation_totals) is by load time + Pen.
  uint32_t compact_blocks = 0;
  double compact_penalty_us = 0;
  std::string explanation;
};

class Planner {
 public:
  // `load` may be null (no load accounting); otherwise it must outlive the Planner. The planner
  // reads it (PathLoad::Backlog); the caller admits plans to it.
  explicit Planner(PathLoad* load) : load_(load) {}

  // InvalidArgument naming the field for malformed input: no blocks or more than
  // kMaxPlannerChainBlocks, a block with 0 tokens or bytes, a prefix_tokens that is not the running sum,
  // a replica naming an unknown host or tier or repeating a (host, tier), parameters that are not
  // finite or a beta <= 0.
  StatusOr<Plan> MakePlan(const PlannerInput& input) const;

 private:
  // One plan with block i read compact where compact[i] (the exact copy otherwise).
  StatusOr<Plan> MakeOnePlan(const PlannerInput& input, const std::vector<uint8_t>& compact) const;

  PathLoad* const load_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_PLACEMENT_PLANNER_H_
