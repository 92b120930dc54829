#include "server/placement/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "core/units.h"
#include "server/placement/planner_candidates.h"

namespace kvfabric {
namespace {

using planner_internal::CandidateName;
using planner_internal::ComputeSources;
using planner_internal::kCandidates;
using planner_internal::kSerial;
using planner_internal::ReplicaAt;
using planner_internal::RunPasses;
using planner_internal::SourceCost;
using planner_internal::SourceId;
using planner_internal::TierName;
using planner_internal::Work;

constexpr double kInf = std::numeric_limits<double>::infinity();

bool GoodParameters(const PathParameters& p) {
  return std::isfinite(p.alpha_us) && p.alpha_us >= 0 && std::isfinite(p.beta_bytes_per_s) &&
         p.beta_bytes_per_s > 0;
}

Status Validate(const PlannerInput& in) {
  if (in.blocks.empty() || in.blocks.size() > kMaxPlannerChainBlocks) {
    return Status::InvalidArgument("blocks: " + std::to_string(in.blocks.size()) +
                                   " not in 1..max_chain_blocks " +
                                   std::to_string(kMaxPlannerChainBlocks));
  }
  if (!GoodParameters(in.host_to_device)) {
    return Status::InvalidArgument(
        "host_to_device: alpha_us must be finite and >= 0, "
        "beta_bytes_per_s finite and > 0");
  }
  if (!GoodParameters(in.client_ingest)) {
    return Status::InvalidArgument(
        "client_ingest: alpha_us must be finite and >= 0, "
        "beta_bytes_per_s finite and > 0");
  }
  const RecomputeParameters& r = in.recompute;
  for (double v : {r.c0_us, r.c1_us_per_token, r.c2_us_per_token2}) {
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument("recompute: c0, c1, c2 must be finite and >= 0");
    }
  }
  if (!(r.split_serial_fraction >= 0 && r.split_serial_fraction <= 1)) {
    return Status::InvalidArgument("recompute: split_serial_fraction must be in [0, 1], got " +
                                   std::to_string(r.split_serial_fraction));
  }
  for (size_t h = 0; h < in.hosts.size(); ++h) {
    if (!GoodParameters(in.hosts[h].transfer) || !GoodParameters(in.hosts[h].nvme)) {
      return Status::InvalidArgument("hosts[" + std::to_string(h) +
                                     "]: path parameters must be finite, beta > 0");
    }
  }
  uint64_t prefix = 0;
  for (size_t i = 0; i < in.blocks.size(); ++i) {
    const ChainBlock& b = in.blocks[i];
    const std::string w = "blocks[" + std::to_string(i) + "]";
    if (b.tokens == 0) return Status::InvalidArgument(w + ".tokens: must be >= 1");
    if (b.bytes == 0) return Status::InvalidArgument(w + ".bytes: must be >= 1");
    if (b.prefix_tokens != prefix) {
      return Status::InvalidArgument(w + ".prefix_tokens: " + std::to_string(b.prefix_tokens) +
                                     " != " + std::to_string(prefix) +
                                     ", the sum of the earlier blocks' tokens");
    }
    prefix += b.tokens;
    for (size_t r1 = 0; r1 < b.replicas.size(); ++r1) {
      const BlockReplica& x = b.replicas[r1];
      if (x.host_index >= in.hosts.size()) {
        return Status::InvalidArgument(w + ".replicas[" + std::to_string(r1) +
                                       "].host_index: " + std::to_string(x.host_index) +
                                       " >= " + std::to_string(in.hosts.size()) + " hosts");
      }
      if (x.tier != Tier::kHost && x.tier != Tier::kNvme) {
        return Status::InvalidArgument(w + ".replicas[" + std::to_string(r1) +
                                       "].tier: must be host or nvme");
      }
      for (size_t r2 = 0; r2 < r1; ++r2) {
        if (b.replicas[r2].host_index == x.host_index && b.replicas[r2].tier == x.tier) {
          return Status::InvalidArgument(w + ".replicas[" + std::to_string(r1) +
                                         "]: repeats replicas[" + std::to_string(r2) + "]");
        }
      }
    }
  }
  return Status::OK();
}

// One fetch of blocks [first, end) under candidate `c`, stream by stream.
struct FetchShape {
  std::vector<PlanRun> runs;
  // Per source used: its id and its stream's end (µs after the plan starts).
  std::vector<std::pair<int, double>> streams;
  double bytes = 0;
  double longest_us = 0;  // plan_fixed + the latest stream end
  double shared_us = 0;   // plan_fixed + Shared(bytes)
  double total_us = 0;    // F
};

FetchShape ShapeFetch(const Work& w, uint32_t first, uint32_t end, uint8_t c) {
  FetchShape out;
  const std::vector<int32_t>& a = w.assign[c];
  std::vector<double> stream(w.SourceCount(), 0);
  std::vector<uint8_t> used(w.SourceCount(), 0);
  for (uint32_t i = first; i < end;) {
    const BlockReplica& r = ReplicaAt(w, i, a[i]);
    const int s = SourceId(r);
    uint32_t j = i + 1;
    while (j < end && SourceId(ReplicaAt(w, j, a[j])) == s) ++j;
    const SourceCost& sc = w.Source(r);
    if (!used[s]) {
      used[s] = 1;
      stream[s] = w.plan_fixed_us + sc.wait_us;
    }
    PlanRun run;
    run.first_block = i;
    run.block_count = j - i;
    run.action = RunAction::kFetch;
    run.host_index = r.host_index;
    run.tier = r.tier;
    for (uint32_t x = i; x < j; ++x) run.payload_bytes += w.in->blocks[x].bytes;
    run.predicted_start_us = stream[s];
    stream[s] += sc.alpha_us + static_cast<double>(run.payload_bytes) * sc.per_byte_us;
    run.predicted_end_us = stream[s];
    out.bytes += static_cast<double>(run.payload_bytes);
    out.runs.push_back(run);
    i = j;
  }
  out.longest_us = w.plan_fixed_us;
  for (size_t s = 0; s < stream.size(); ++s) {
    if (!used[s]) continue;
    out.streams.emplace_back(static_cast<int>(s), stream[s]);
    out.longest_us = std::max(out.longest_us, stream[s]);
  }
  out.shared_us = w.plan_fixed_us + w.Shared(out.bytes);
  out.total_us = std::max(out.longest_us, out.shared_us);
  // When a shared stage is the limit every stream is slowed by it: their times stretch evenly
  // so that the last run ends when the fetch does.
  if (out.total_us > out.longest_us && out.longest_us > 0) {
    const double stretch = out.total_us / out.longest_us;
    for (PlanRun& run : out.runs) {
      run.predicted_start_us *= stretch;
      run.predicted_end_us *= stretch;
    }
  }
  return out;
}

PlanRun RecomputeRun(const Work& w, uint32_t first, uint32_t end, double start, double finish) {
  PlanRun run;
  run.first_block = first;
  run.block_count = end - first;
  run.action = RunAction::kRecompute;
  for (uint32_t i = first; i < end; ++i) run.payload_bytes += w.in->blocks[i].bytes;
  run.predicted_start_us = start;
  run.predicted_end_us = finish;
  return run;
}

void AddCharges(const Work& w, const std::vector<PlanRun>& runs, std::vector<PathCharge>* out) {
  std::map<std::pair<int, std::string>, uint64_t> sum;
  uint64_t h2d = 0;
  for (const PlanRun& run : runs) {
    if (run.action != RunAction::kFetch) continue;
    const PlannerHost& host = w.in->hosts[run.host_index];
    const BusPath tp = host.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost;
    sum[{static_cast<int>(tp), host.host_id}] += run.payload_bytes;
    if (run.tier == Tier::kNvme) {
      sum[{static_cast<int>(BusPath::kNvmeToHost), host.host_id}] += run.payload_bytes;
    }
    h2d += run.payload_bytes;
  }
  for (const auto& [key, bytes] : sum) {
    out->push_back({static_cast<BusPath>(key.first), key.second, bytes});
  }
  if (h2d > 0) {
    out->push_back({BusPath::kClientIngest, w.in->client_id, h2d});
    out->push_back({BusPath::kHostToDevice, w.in->client_id, h2d});
  }
}

std::string Blocks(uint32_t first, uint32_t end) {
  return "blocks " + std::to_string(first) + ".." + std::to_string(end == 0 ? 0 : end - 1);
}

std::string RecomputeText(const Work& w, uint64_t n, uint64_t p) {
  return ExplainRecompute(w.in->recompute, n, p);
}

std::string RestText(const Work& w, uint32_t j) {
  const uint64_t p = static_cast<uint64_t>(w.PrefixTokens(j));
  const uint64_t n = w.total_tokens - p + w.in->suffix_tokens;
  return RecomputeText(w, n, p);
}

std::string FormatFraction(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", v);
  return b;
}

std::string FetchText(uint32_t first, uint32_t end, double us) {
  return "t_fetch(" + Blocks(first, end) + ") = " + FormatMicros(us);
}

std::string SourceText(const Work& w, const PlanRun& run) {
  const PlannerHost& host = w.in->hosts[run.host_index];
  const SourceCost& s = w.Source({run.host_index, run.tier});
  std::string out = "fetch " + Blocks(run.first_block, run.first_block + run.block_count) +
                    " from " + host.host_id + " (" + std::string(TierName(run.tier)) + ", " +
                    FormatBytes(run.payload_bytes) + "): " + FormatMicros(host.transfer.alpha_us) +
                    " (" +
                    std::string(BusPathArrowName(host.local ? BusPath::kLocalMemcpy
                                                            : BusPath::kRemoteHostToLocalHost)) +
                    ")";
  if (run.tier == Tier::kNvme) out += " + " + FormatMicros(host.nvme.alpha_us) + " (nvme→host)";
  out += " + " + std::to_string(run.payload_bytes) + " B / " + FormatRate(s.bottleneck_beta) +
         " (" + std::string(BusPathArrowName(s.bottleneck)) + " bottleneck) = " +
         FormatMicros(s.alpha_us + static_cast<double>(run.payload_bytes) * s.per_byte_us) +
         " (queue wait " + FormatMicros(s.wait_us) + ", paid once per stream)" + "; " +
         FormatMicros(run.predicted_start_us) + " → " + FormatMicros(run.predicted_end_us);
  return out;
}

}  // namespace

std::string_view PlanKindName(PlanKind kind) {
  switch (kind) {
    case PlanKind::kRecomputeAll:
      return "recompute-all";
    case PlanKind::kFetchAll:
      return "fetch-all";
    case PlanKind::kSplit:
      return "split";
    case PlanKind::kMixed:
      return "fetch-prefix";
    default:
      return "unspecified";
  }
}

std::string_view PlanKindLabel(PlanKind kind) {
  switch (kind) {
    case PlanKind::kRecomputeAll:
      return "recompute_all";
    case PlanKind::kFetchAll:
      return "fetch_all";
    case PlanKind::kSplit:
      return "split";
    case PlanKind::kMixed:
      return "mixed";
    default:
      return "unspecified";
  }
}

StatusOr<Plan> Planner::MakePlan(const PlannerInput& in) const {
  KVF_RETURN_IF_ERROR(Validate(in));
  Work w;
  w.in = &in;
  const uint32_t n = static_cast<uint32_t>(in.blocks.size());
  w.total_tokens = in.blocks.back().prefix_tokens + in.blocks.back().tokens;
  while (w.m < n && !in.blocks[w.m].replicas.empty()) ++w.m;
  ComputeSources(in, load_, &w);
  RunPasses(&w);

  Plan plan;
  plan.cached_prefix_blocks = w.m;
  const double recompute_all =
      RecomputeMicros(in.recompute, static_cast<double>(w.total_tokens + in.suffix_tokens), 0);
  plan.alternatives.push_back({PlanKind::kRecomputeAll, recompute_all, 0, 0, false});
  if (w.m >= 1) {
    plan.alternatives.push_back(
        {PlanKind::kFetchAll, w.FetchSuffix(0) + w.Rest(w.m), 0, w.m, false});
  }
  if (w.m >= 2) {
    const double rest_m = w.Rest(w.m);
    double best_split = kInf;
    uint32_t best_k = 1;
    for (uint32_t k = 1; k < w.m; ++k) {
      const double t = SplitSidesMicros(in.recompute, w.Front(k), w.FetchSuffix(k)) + rest_m;
      if (t < best_split) {
        best_split = t;
        best_k = k;
      }
    }
    PlanAlternative split{PlanKind::kSplit, best_split, best_k, w.m, false};
    split.front_us = w.Front(best_k);
    split.fetch_us = w.FetchSuffix(best_k);
    split.rest_us = rest_m;
    plan.alternatives.push_back(split);
    double best_prefix = kInf;
    uint32_t best_j = 1;
    for (uint32_t j = 1; j < w.m; ++j) {
      const double t = w.FetchPrefix(j) + w.Rest(j);
      if (t < best_prefix) {
        best_prefix = t;
        best_j = j;
      }
    }
    plan.alternatives.push_back({PlanKind::kMixed, best_prefix, 0, best_j, false});
  }
  // Strictly better only: ties go to the simpler plan listed first.
  size_t chosen = 0;
  for (size_t a = 1; a < plan.alternatives.size(); ++a) {
    if (plan.alternatives[a].predicted_us < plan.alternatives[chosen].predicted_us) chosen = a;
  }
  PlanAlternative& c = plan.alternatives[chosen];
  c.chosen = true;
  plan.kind = c.kind;
  plan.predicted_total_us = c.predicted_us;

  // The chosen plan's fetch, under the candidate its alternative was priced with.
  std::optional<FetchShape> fetch;
  uint8_t fetch_candidate = kSerial;
  switch (c.kind) {
    case PlanKind::kRecomputeAll:
      plan.runs.push_back(RecomputeRun(w, 0, n, 0, recompute_all));
      break;
    case PlanKind::kFetchAll:
    case PlanKind::kMixed: {
      const uint32_t j = c.prefix_blocks;
      fetch_candidate = j == w.m ? w.suffix_arg[0] : w.prefix_arg[j];
      fetch = ShapeFetch(w, 0, j, fetch_candidate);
      plan.runs.insert(plan.runs.end(), fetch->runs.begin(), fetch->runs.end());
      if (j < n) plan.runs.push_back(RecomputeRun(w, j, n, fetch->total_us, c.predicted_us));
      break;
    }
    case PlanKind::kSplit: {
      const uint32_t k = c.split_blocks;
      plan.runs.push_back(RecomputeRun(w, 0, k, 0, w.Front(k)));
      fetch_candidate = w.suffix_arg[k];
      fetch = ShapeFetch(w, k, w.m, fetch_candidate);
      plan.runs.insert(plan.runs.end(), fetch->runs.begin(), fetch->runs.end());
      if (w.m < n) {
        plan.runs.push_back(
            RecomputeRun(w, w.m, n, SplitSidesMicros(in.recompute, w.Front(k), fetch->total_us),
                         c.predicted_us));
      }
      break;
    }
    default:
      return Status::Internal("planner chose an unknown plan kind");
  }
  AddCharges(w, plan.runs, &plan.charges);

  if (in.include_explanation) {
    std::string& x = plan.explanation;
    x = "chain: " + std::to_string(n) + " blocks, " + std::to_string(w.total_tokens) +
        " tokens (+" + std::to_string(in.suffix_tokens) + " suffix tokens); cached prefix " +
        std::to_string(w.m) + " blocks (" +
        std::to_string(static_cast<uint64_t>(w.PrefixTokens(w.m))) + " tokens)\n";
    x += "fetch: F = " + FormatMicros(in.host_to_device.alpha_us) + " (host→device alpha) + wait " +
         FormatMicros(w.h2d_wait_us) +
         " + max(latest stream end, client ingest, host→device); a stream per source: its queue "
         "wait once, per run alpha of each stage + bytes / bottleneck beta; client ingest " +
         FormatMicros(in.client_ingest.alpha_us) + " + wait " + FormatMicros(w.ingest_wait_us) +
         " + bytes / " + FormatRate(in.client_ingest.beta_bytes_per_s) + "; host→device bytes / " +
         FormatRate(in.host_to_device.beta_bytes_per_s) + "\n";
    for (const PlanAlternative& a : plan.alternatives) {
      x += a.chosen ? "* " : "  ";
      x += std::string(PlanKindName(a.kind));
      switch (a.kind) {
        case PlanKind::kRecomputeAll:
          x += ": " + RecomputeText(w, w.total_tokens + in.suffix_tokens, 0);
          break;
        case PlanKind::kFetchAll:
          x += ": " + FetchText(0, w.m, w.FetchSuffix(0)) + ", then " + RestText(w, w.m);
          break;
        case PlanKind::kSplit:
          x += " k=" + std::to_string(a.split_blocks) + ": max(A, B) + s × min(A, B), A = " +
               RecomputeText(w, static_cast<uint64_t>(w.PrefixTokens(a.split_blocks)), 0) +
               ", B = " + FetchText(a.split_blocks, w.m, w.FetchSuffix(a.split_blocks)) +
               ", s = " + FormatFraction(in.recompute.split_serial_fraction) + "; then " +
               RestText(w, w.m);
          break;
        case PlanKind::kMixed:
          x += " j=" + std::to_string(a.prefix_blocks) + ": " +
               FetchText(0, a.prefix_blocks, w.FetchPrefix(a.prefix_blocks)) + ", then " +
               RestText(w, a.prefix_blocks);
          break;
        default:
          break;
      }
      x += " => " + FormatMicros(a.predicted_us) + "\n";
    }
    const double pure =
        std::min(recompute_all, w.m >= 1 ? plan.alternatives[1].predicted_us : recompute_all);
    x += "chosen: " + std::string(PlanKindName(plan.kind)) + " " +
         FormatMicros(plan.predicted_total_us) + " (better pure plan " + FormatMicros(pure) + ")\n";
    if (fetch && !fetch->runs.empty()) {
      const FetchShape& shape = *fetch;
      const uint32_t first = shape.runs.front().first_block;
      const uint32_t end = shape.runs.back().first_block + shape.runs.back().block_count;
      x += "fetch " + Blocks(first, end) + " (" + std::string(CandidateName(fetch_candidate)) +
           " assignment), streams:";
      for (const auto& [id, end_us] : shape.streams) {
        const PlannerHost& host = in.hosts[static_cast<size_t>(id / 2)];
        x += " " + host.host_id + "/" + std::string(TierName(id % 2 ? Tier::kNvme : Tier::kHost)) +
             " ends " + FormatMicros(end_us) + ";";
      }
      x += " client stages for " + FormatBytes(static_cast<uint64_t>(shape.bytes)) + " end " +
           FormatMicros(shape.shared_us) + "; F = " + FormatMicros(shape.total_us) + " (" +
           (shape.shared_us > shape.longest_us ? "the client's ingest or host→device is the limit"
                                               : "the latest stream is the limit") +
           ")\n";
    }
    size_t listed = 0;
    for (const PlanRun& run : plan.runs) {
      std::string line = run.action == RunAction::kFetch
                             ? SourceText(w, run)
                             : "recompute " +
                                   Blocks(run.first_block, run.first_block + run.block_count) +
                                   ": " + FormatMicros(run.predicted_start_us) + " → " +
                                   FormatMicros(run.predicted_end_us);
      if (x.size() + line.size() + 64 > in.max_explanation_bytes) {
        x += "... (" + std::to_string(plan.runs.size() - listed) + " more runs)\n";
        break;
      }
      x += "  " + line + "\n";
      ++listed;
    }
    if (x.size() > in.max_explanation_bytes) x.resize(in.max_explanation_bytes);
  }
  return plan;
}

}  // namespace kvfabric
