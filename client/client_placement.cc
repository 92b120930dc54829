// Client::Impl's calls to placement: Match (a plan, or a local recompute-all
// one when placement does not answer), the observations Finish reports, which
// replica to try, and the backoff of replicas that do not answer
// (client_impl.h, CallPlacement).
#include <algorithm>
#include <chrono>
#include <string>

#include "client/client_impl.h"
#include "client/client_log.h"
#include "proto/grpc_status.h"
#include "proto/model_proto.h"

namespace kvfabric::client {
namespace {

std::string KindName(v1::PlanKind kind) {
  switch (kind) {
    case v1::PLAN_KIND_RECOMPUTE_ALL:
      return "recompute_all";
    case v1::PLAN_KIND_FETCH_ALL:
      return "fetch_all";
    case v1::PLAN_KIND_SPLIT:
      return "split";
    case v1::PLAN_KIND_MIXED:
      return "mixed";
    default:
      return "unspecified";
  }
}

std::string TierName(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_HOST:
      return "host";
    case v1::TIER_NVME:
      return "nvme";
    default:
      return "unspecified";
  }
}

}  // namespace

// ---------------------------------------------------------------- Match

StatusOr<MatchResult> Client::Impl::Match(std::span<const BlockKey> chain,
                                          std::uint64_t suffix_tokens, bool explain) {
  MatchResult m;
  MatchOptions options;
  options.explain = explain;
  KVF_RETURN_IF_ERROR(Match(chain, suffix_tokens, options, &m));
  return m;
}

Status Client::Impl::Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
                           const MatchOptions& options, MatchResult* out) {
  const bool explain = options.explain;
  if (chain.empty()) return Status::InvalidArgument("client: Match of an empty chain");
  // Every field is assigned in place: vectors and strings keep their memory.
  MatchResult& m = *out;
  m.chain.assign(chain.begin(), chain.end());
  m.suffix_tokens = suffix_tokens;
  m.cached_prefix_blocks = 0;
  m.plan_id = 0;
  m.predicted_us = 0;
  m.explanation.clear();
  m.hosts.clear();
  m.representation = "exact";
  m.compact_penalty_us = 0;
  const AccuracyPolicy& accuracy = options.accuracy;
  if (accuracy.compact_after_tokens && compact_bytes_ == 0) {
    return Status::InvalidArgument("client: Match with accuracy " + accuracy.ToString() +
                                   ": the model's KV dtype has no compact codec (fp16, bf16 "
                                   "and fp32 have; docs/compact.md)");
  }
  v1::PlanRequest req;
  req.set_namespace_(o_.namespace_name);
  *req.mutable_fingerprint() = fingerprint_;
  for (const BlockKey& k : chain) {
    req.add_keys(reinterpret_cast<const char*>(k.bytes().data()), BlockKey::kSize);
  }
  req.set_client_node(client_node_);
  req.set_suffix_tokens(suffix_tokens);
  req.set_include_explanation(explain);
  req.set_prefix_plans_only(options.prefix_plans_only);
  if (accuracy.compact_after_tokens) {
    v1::AccuracyPolicy* a = req.mutable_accuracy();
    a->set_allow_compact(true);
    a->set_compact_after_tokens(*accuracy.compact_after_tokens);
    a->set_compact_extra_decode_us_per_token(compact_extra_decode_us_);
    a->set_decode_steps(accuracy.decode_steps);
  }
  if (o_.prefill) {
    v1::RecomputeParameters* r = req.mutable_engine_prefill();
    r->set_c0_us(o_.prefill->c0_us);
    r->set_c1_us(o_.prefill->c1_us_per_token);
    r->set_c2_us(o_.prefill->c2_us_per_token2);
    r->set_split_serial_fraction(o_.prefill->split_serial_fraction);
    r->set_c3_us(o_.prefill->c3_us_per_prefix_token);
  }
  v1::PlanResponse resp;
  const grpc::Status g = CallPlacement([&](v1::Placement::Stub* stub, grpc::ClientContext* ctx) {
    return stub->Plan(ctx, req, &resp);
  });
  MutexLock l(&metrics_mu_);
  ++m_.matches;
  if (g.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    return FromGrpcStatus(g).WithContext("client: Match");
  }
  if (!g.ok()) {
    // Placement is down or slow: recompute everything, exactly, and say so.
    ++m_.placement_unavailable;
    ++m_.plans_recompute_all;
    Log().warn("kvfabric client: placement Plan failed ({}); recomputing {} blocks",
               g.error_message(), chain.size());
    m.kind = "recompute_all";
    m.runs.resize(1);
    MatchResult::Run& r = m.runs[0];
    r.first_block = 0;
    r.block_count = static_cast<std::uint32_t>(chain.size());
    r.fetch = false;
    r.host = 0;
    r.tier.clear();
    r.fallback_hosts.clear();
    r.predicted_start_us = 0;
    r.predicted_end_us = 0;
    r.compact = false;
    return Status::OK();
  }
  m.plan_id = resp.plan_id();
  m.kind = KindName(resp.kind());
  m.predicted_us = resp.predicted_total_us();
  m.explanation = resp.explanation();
  m.cached_prefix_blocks = resp.locations().cached_prefix_blocks();
  m.hosts.resize(resp.locations().hosts_size());
  for (int i = 0; i < resp.locations().hosts_size(); ++i) {
    const v1::HostRef& h = resp.locations().hosts(i);
    m.hosts[i].host_id = h.host_id();
    m.hosts[i].grpc_address = h.grpc_address();
    m.hosts[i].transport_address = h.transport_address();
  }
  m.runs.resize(resp.runs_size());
  std::uint32_t covered = 0;
  for (int i = 0; i < resp.runs_size(); ++i) {
    const v1::PlanRun& pr = resp.runs(i);
    MatchResult::Run& r = m.runs[i];
    r.first_block = pr.first_block();
    r.block_count = pr.block_count();
    r.fetch = pr.action() == v1::RUN_ACTION_FETCH;
    r.host = pr.host_index();
    r.tier = TierName(pr.tier());
    r.fallback_hosts.assign(pr.fallback_host_indices().begin(), pr.fallback_host_indices().end());
    r.predicted_start_us = pr.predicted_start_us();
    r.predicted_end_us = pr.predicted_end_us();
    r.compact = r.fetch && pr.representation() == v1::REPRESENTATION_COMPACT_INT8;
    // A compact run where the request did not allow one is placement's
    // error, and never reaches the history (exact mode gets exact bytes).
    if (r.compact && !accuracy.compact_after_tokens) {
      return Status::Internal("client: placement's plan " + std::to_string(m.plan_id) +
                              " fetches compact copies of blocks " + std::to_string(r.first_block) +
                              ".. for an exact request");
    }
    // Check what the network said before anything acts on it.
    bool hosts_ok = !r.fetch || r.host < m.hosts.size();
    for (std::uint32_t f : r.fallback_hosts) hosts_ok = hosts_ok && f < m.hosts.size();
    if (r.first_block != covered || r.block_count == 0 || !hosts_ok) {
      return Status::Internal("client: placement's plan " + std::to_string(m.plan_id) +
                              " is malformed at run starting at block " +
                              std::to_string(r.first_block));
    }
    covered += r.block_count;
  }
  switch (resp.representation()) {
    case v1::REPRESENTATION_CHOICE_COMPACT_WHERE_GONE:
      m.representation = "compact-where-gone";
      break;
    case v1::REPRESENTATION_CHOICE_COMPACT:
      m.representation = "compact";
      break;
    default:
      m.representation = "exact";
      break;
  }
  m.compact_penalty_us = resp.compact_penalty_us();
  if (std::any_of(m.runs.begin(), m.runs.end(),
                  [](const MatchResult::Run& r) { return r.compact; })) {
    ++m_.plans_with_compact;
  }
  if (covered != chain.size()) {
    return Status::Internal("client: placement's plan covers " + std::to_string(covered) + " of " +
                            std::to_string(chain.size()) + " blocks");
  }
  switch (resp.kind()) {
    case v1::PLAN_KIND_RECOMPUTE_ALL:
      ++m_.plans_recompute_all;
      break;
    case v1::PLAN_KIND_FETCH_ALL:
      ++m_.plans_fetch_all;
      break;
    case v1::PLAN_KIND_SPLIT:
      ++m_.plans_split;
      break;
    default:
      ++m_.plans_mixed;
      break;
  }
  return Status::OK();
}

// ---------------------------------------------------------------- observations

void Client::Impl::ReportObservations(Context& c) {
  if (c.match.plan_id == 0 && c.stale.empty()) return;
  // In requests of at most kPer entries per list (placement's
  // max_keys_per_batch is larger); the plan finishes with the last one.
  constexpr std::size_t kPer = 256;
  const std::size_t rounds = std::max({c.transfers.size(), c.recomputes.size(), c.stale.size(),
                                       c.fallback_runs.size(), std::size_t{1}}) +
                             kPer - 1;
  for (std::size_t round = 0; round < rounds / kPer; ++round) {
    const std::size_t from = round * kPer;
    v1::ReportObservationsRequest req;
    req.set_namespace_(o_.namespace_name);
    req.set_plan_id(c.match.plan_id);
    *req.mutable_fingerprint() = fingerprint_;
    for (std::size_t i = from; i < c.transfers.size() && i < from + kPer; ++i) {
      *req.add_transfers() = c.transfers[i];
    }
    for (std::size_t i = from; i < c.recomputes.size() && i < from + kPer; ++i) {
      *req.add_recomputes() = c.recomputes[i];
    }
    for (std::size_t i = from; i < c.stale.size() && i < from + kPer; ++i) {
      *req.add_stale_entries() = c.stale[i];
    }
    for (std::size_t i = from; i < c.fallback_runs.size() && i < from + kPer; ++i) {
      req.add_fallback_runs(c.fallback_runs[i]);
    }
    const bool last = round + 1 == rounds / kPer;
    req.set_plan_finished(last && c.match.plan_id != 0);
    if (last && c.match.plan_id != 0) req.set_observed_total_us(c.report.load_us);
    v1::ReportObservationsResponse resp;
    const grpc::Status g = CallPlacement([&](v1::Placement::Stub* stub, grpc::ClientContext* ctx) {
      return stub->ReportObservations(ctx, req, &resp);
    });
    if (!g.ok()) {
      Log().warn("kvfabric client: reporting plan {}'s observations: {}", c.match.plan_id,
                 g.error_message());
      return;
    }
    MutexLock l(&metrics_mu_);
    m_.stale_entries_reported += static_cast<std::uint64_t>(req.stale_entries_size());
  }
}

// ---------------------------------------------------------------- replicas

std::optional<std::size_t> Client::Impl::PlacementToTry(std::size_t attempt) {
  MutexLock l(&placement_mu_);
  const std::size_t i = (placement_current_ + attempt) % placement_state_.size();
  const ReplicaState& r = placement_state_[i];
  if (r.backoff.count() != 0 && std::chrono::steady_clock::now() < r.retry_at) return std::nullopt;
  return i;
}

Status Client::Impl::PlacementBackoff() {
  std::string why;
  {
    MutexLock l(&placement_mu_);
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < placement_state_.size(); ++i) {
      const ReplicaState& r = placement_state_[i];
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(r.retry_at - now);
      why += std::string(why.empty() ? "" : "; ") + "placement at " + placement_addresses_[i] +
             " did not answer (" + r.last_error + "), next try in " +
             std::to_string(std::max<std::int64_t>(0, left.count())) + " ms";
    }
  }
  MutexLock m(&metrics_mu_);
  ++m_.placement_calls_skipped;
  return Status::Unavailable(why);
}

void Client::Impl::PlacementCallDone(std::size_t replica, const grpc::Status& g) {
  MutexLock l(&placement_mu_);
  ReplicaState& r = placement_state_[replica];
  if (g.error_code() != grpc::StatusCode::UNAVAILABLE &&
      g.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    r.backoff = std::chrono::milliseconds(0);  // it answered: calls start here
    placement_current_ = replica;
    return;
  }
  r.backoff = r.backoff.count() == 0 ? std::chrono::milliseconds(1000)
                                     : std::min(r.backoff * 2, std::chrono::milliseconds(30000));
  r.last_error = g.error_message();
  // xorshift: +-25% so that clients cut off together do not come back together.
  placement_jitter_ ^= placement_jitter_ << 13;
  placement_jitter_ ^= placement_jitter_ >> 7;
  placement_jitter_ ^= placement_jitter_ << 17;
  const double factor = 0.75 + 0.5 * static_cast<double>(placement_jitter_ % 1000) / 1000.0;
  r.retry_at = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(static_cast<std::int64_t>(r.backoff.count() * factor));
}

}  // namespace kvfabric::client
