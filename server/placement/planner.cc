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
using planner_internal::SharedStage;
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
  for (double v : {r.c0_us, r.c1_us_per_token, r.c2_us_per_token2, r.c3_us_per_prefix_token}) {
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument("recompute: c0, c1, c2, c3 must be finite and >= 0");
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
    auto check = [&](const std::vector<BlockReplica>& list, const char* field) -> Status {
      for (size_t r1 = 0; r1 < list.size(); ++r1) {
        const BlockReplica& x = list[r1];
        const std::string at = w + "." + field + "[" + std::to_string(r1) + "]";
        if (x.host_index >= in.hosts.size()) {
          return Status::InvalidArgument(at + ".host_index: " + std::to_string(x.host_index) +
                                         " >= " + std::to_string(in.hosts.size()) + " hosts");
        }
        if (x.tier != Tier::kHost && x.tier != Tier::kNvme) {
          return Status::InvalidArgument(at + ".tier: must be host or nvme");
        }
        for (size_t r2 = 0; r2 < r1; ++r2) {
          if (list[r2].host_index == x.host_index && list[r2].tier == x.tier) {
            return Status::InvalidArgument(at + ": repeats " + field + "[" + std::to_string(r2) +
                                           "]");
          }
        }
      }
      return Status::OK();
    };
    KVF_RETURN_IF_ERROR(check(b.replicas, "replicas"));
    KVF_RETURN_IF_ERROR(check(b.compact_replicas, "compact_replicas"));
    if (!b.compact_replicas.empty() && b.compact_bytes == 0) {
      return Status::InvalidArgument(w + ".compact_bytes: must be >= 1 with compact replicas");
    }
    if (!std::isfinite(b.compact_penalty_us) || b.compact_penalty_us < 0) {
      return Status::InvalidArgument(w + ".compact_penalty_us: must be finite and >= 0");
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
  std::vector<double> stream(w.SourceCount(), 0);  // µs after the plan starts
  std::vector<double> moved(w.SourceCount(), 0);   // bytes
  std::vector<uint8_t> used(w.SourceCount(), 0);
  for (uint32_t i = first; i < end;) {
    const BlockReplica& r = ReplicaAt(w, i, a[i]);
    const int s = SourceId(r);
    const uint8_t compact = w.Compact(i);
    uint32_t j = i + 1;
    while (j < end && SourceId(ReplicaAt(w, j, a[j])) == s && w.Compact(j) == compact) ++j;
    const SourceCost& sc = w.Source(r);
    // A stream pays its source's alphas once, before its first run: the client sends all of a
    // source's blocks as one list in full batches (FETCH MODEL). Its runs end where its bytes
    // so far end, beside the other plans' (SourceCost::StreamUs).
    if (!used[s]) {
      used[s] = 1;
      stream[s] = w.plan_fixed_us + sc.alpha_us;
    }
    PlanRun run;
    run.first_block = i;
    run.block_count = j - i;
    run.action = RunAction::kFetch;
    run.host_index = r.host_index;
    run.tier = r.tier;
    run.compact = compact != 0;
    for (uint32_t x = i; x < j; ++x) run.payload_bytes += w.in->blocks[x].bytes;
    run.predicted_start_us = stream[s];
    moved[s] += static_cast<double>(run.payload_bytes);
    stream[s] = w.plan_fixed_us + sc.StreamUs(moved[s]);
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
  // (path, resource) → its charge: the bytes, and the rate and gain this plan assumed there
  // (PathLoad drains by them).
  std::map<std::pair<int, std::string>, PathCharge> sum;
  auto add = [&](BusPath path, const std::string& resource, uint64_t bytes,
                 const PathParameters& p) {
    PathCharge& c = sum[{static_cast<int>(path), resource}];
    c.path = path;
    c.resource = resource;
    c.bytes += bytes;
    c.beta_bytes_per_s = p.beta_bytes_per_s;
    c.concurrency_gain = p.concurrency_gain;
  };
  uint64_t fetched = 0;
  for (const PlanRun& run : runs) {
    if (run.action != RunAction::kFetch) continue;
    const PlannerHost& host = w.in->hosts[run.host_index];
    add(host.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost, host.host_id,
        run.payload_bytes, host.transfer);
    if (run.tier == Tier::kNvme)
      add(BusPath::kNvmeToHost, host.host_id, run.payload_bytes, host.nvme);
    fetched += run.payload_bytes;
  }
  if (fetched > 0) {
    add(BusPath::kClientIngest, w.in->client_id, fetched, w.in->client_ingest);
    add(BusPath::kHostToDevice, w.in->client_id, fetched, w.in->host_to_device);
  }
  for (auto& [key, charge] : sum) out->push_back(std::move(charge));
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

// `first`: the run is its stream's first, which pays the stream's alphas and shares its stages.
std::string SourceText(const Work& w, const PlanRun& run, bool first) {
  const PlannerHost& host = w.in->hosts[run.host_index];
  const SourceCost& s = w.Source({run.host_index, run.tier});
  std::string out = "fetch " + Blocks(run.first_block, run.first_block + run.block_count) +
                    (run.compact ? " compact" : " exact") + " from " + host.host_id + " (" +
                    std::string(TierName(run.tier)) + ", " + FormatBytes(run.payload_bytes) + "): ";
  if (first) {
    out += "the stream's alphas " + FormatMicros(host.transfer.alpha_us) + " (" +
           std::string(BusPathArrowName(host.local ? BusPath::kLocalMemcpy
                                                   : BusPath::kRemoteHostToLocalHost)) +
           ")";
    if (run.tier == Tier::kNvme) out += " + " + FormatMicros(host.nvme.alpha_us) + " (nvme→host)";
    out += " first";
    // The stage with more left to move by the plans admitted before this one.
    const SharedStage* busy = s.transfer;
    if (s.nvme != nullptr &&
        s.nvme->backlog.Total() * s.nvme->per_byte_us > busy->backlog.Total() * busy->per_byte_us) {
      busy = s.nvme;
    }
    if (busy->backlog.plans() > 0) {
      out += ", sharing " + std::string(busy == s.nvme ? "nvme→host" : "the transfer") + " with " +
             std::to_string(busy->backlog.plans()) + " admitted plans still moving " +
             FormatBytes(static_cast<uint64_t>(busy->backlog.Total())) + " in equal shares" +
             (busy->backlog.gain() > 1
                  ? " (concurrency gain " + FormatFraction(busy->backlog.gain()) + ")"
                  : std::string());
    }
    out += ", then ";
  }
  out += std::to_string(run.payload_bytes) + " B / " + FormatRate(s.bottleneck_beta) + " (" +
         std::string(BusPathArrowName(s.bottleneck)) +
         " bottleneck) = " + FormatMicros(static_cast<double>(run.payload_bytes) * s.per_byte_us) +
         "; " + FormatMicros(run.predicted_start_us) + " → " + FormatMicros(run.predicted_end_us);
  if (run.compact) {
    double pen = 0;
    for (uint32_t b = run.first_block; b < run.first_block + run.block_count; ++b) {
      pen += w.in->blocks[b].compact_penalty_us;
    }
    out += "; decode penalty " + FormatMicros(pen);
  }
  return out;
}

// The input as plan `compact` sees it: block i's compact copy in place of its exact one where
// compact[i].
PlannerInput WithRepresentation(const PlannerInput& in, const std::vector<uint8_t>& compact) {
  PlannerInput v;
  v.hosts = in.hosts;
  v.client_id = in.client_id;
  v.host_to_device = in.host_to_device;
  v.client_ingest = in.client_ingest;
  v.recompute = in.recompute;
  v.suffix_tokens = in.suffix_tokens;
  v.include_explanation = in.include_explanation;
  v.max_explanation_bytes = in.max_explanation_bytes;
  v.blocks.resize(in.blocks.size());
  for (size_t i = 0; i < in.blocks.size(); ++i) {
    const ChainBlock& b = in.blocks[i];
    ChainBlock& o = v.blocks[i];
    o.tokens = b.tokens;
    o.prefix_tokens = b.prefix_tokens;
    o.bytes = compact[i] ? b.compact_bytes : b.bytes;
    o.replicas = compact[i] ? b.compact_replicas : b.replicas;
    o.compact_penalty_us = compact[i] ? b.compact_penalty_us : 0;
  }
  return v;
}

}  // namespace

std::string_view RepresentationChoiceName(RepresentationChoice choice) {
  switch (choice) {
    case RepresentationChoice::kExact:
      return "exact";
    case RepresentationChoice::kCompactWhereGone:
      return "compact-where-gone";
    case RepresentationChoice::kCompact:
      return "compact";
  }
  return "unknown";
}

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
  const size_t n = in.blocks.size();
  std::vector<uint8_t> gone(n, 0), all(n, 0);
  bool any = false, any_gone = false, any_both = false;
  for (size_t i = 0; i < n; ++i) {
    if (in.blocks[i].compact_replicas.empty()) continue;
    any = true;
    all[i] = 1;
    if (in.blocks[i].replicas.empty()) {
      gone[i] = 1;
      any_gone = true;
    } else {
      any_both = true;
    }
  }
  const std::vector<uint8_t> none(n, 0);
  if (!any) {
    KVF_ASSIGN_OR_RETURN(Plan plan, MakeOnePlan(in, none));
    plan.representation_totals.emplace_back(RepresentationChoice::kExact,
                                            plan.predicted_total_us);  // no compact: Pen = 0
    return plan;
  }
  // The choices (REPRESENTATIONS in planner.h), each planned in full; the cheapest wins.
  std::vector<std::pair<RepresentationChoice, const std::vector<uint8_t>*>> choices = {
      {RepresentationChoice::kExact, &none}};
  if (any_gone) choices.emplace_back(RepresentationChoice::kCompactWhereGone, &gone);
  if (any_both) choices.emplace_back(RepresentationChoice::kCompact, &all);
  std::optional<Plan> best;
  std::vector<std::pair<RepresentationChoice, double>> totals;
  for (const auto& [choice, compact] : choices) {
    const PlannerInput v = WithRepresentation(in, *compact);
    KVF_ASSIGN_OR_RETURN(Plan plan, MakeOnePlan(v, *compact));
    plan.representation = choice;
    const double total = plan.predicted_total_us + plan.compact_penalty_us;
    totals.emplace_back(choice, total);
    if (!best || total < best->predicted_total_us + best->compact_penalty_us) {
      best = std::move(plan);
    }
  }
  best->representation_totals = std::move(totals);
  if (in.include_explanation) {
    std::string head = "representation (accuracy policy allows compact copies of " +
                       std::to_string(std::count(all.begin(), all.end(), 1)) + " blocks, " +
                       std::to_string(std::count(gone.begin(), gone.end(), 1)) +
                       " of them without an exact copy):";
    for (const auto& [choice, total] : best->representation_totals) {
      head += std::string(choice == best->representation ? " *" : " ") +
              std::string(RepresentationChoiceName(choice)) + " " + FormatMicros(total) + ";";
    }
    head += " compact runs add Pen = decode penalty of their blocks (" +
            std::to_string(best->compact_blocks) + " blocks, " +
            FormatMicros(best->compact_penalty_us) + ")\n";
    best->explanation = head + best->explanation;
    if (best->explanation.size() > in.max_explanation_bytes) {
      best->explanation.resize(in.max_explanation_bytes);
    }
  }
  return std::move(*best);
}

StatusOr<Plan> Planner::MakeOnePlan(const PlannerInput& in,
                                    const std::vector<uint8_t>& compact) const {
  Work w;
  w.in = &in;
  w.compact = &compact;
  const uint32_t n = static_cast<uint32_t>(in.blocks.size());
  w.total_tokens = in.blocks.back().prefix_tokens + in.blocks.back().tokens;
  while (w.m < n && !in.blocks[w.m].replicas.empty()) ++w.m;
  ComputeSources(in, load_, &w);
  RunPasses(&w);
  // Pen(0, i): the decode time the compact blocks of [0, i) add when fetched (REPRESENTATIONS).
  std::vector<double> pen(n + 1, 0);
  for (uint32_t i = 0; i < n; ++i) {
    pen[i + 1] = pen[i] + (compact[i] ? in.blocks[i].compact_penalty_us : 0);
  }

  Plan plan;
  plan.cached_prefix_blocks = w.m;
  const double recompute_all =
      RecomputeMicros(in.recompute, static_cast<double>(w.total_tokens + in.suffix_tokens), 0);
  plan.alternatives.push_back({PlanKind::kRecomputeAll, recompute_all, 0, 0, false});
  if (w.m >= 1) {
    plan.alternatives.push_back(
        {PlanKind::kFetchAll, w.FetchSuffix(0) + w.Rest(w.m) + pen[w.m], 0, w.m, false});
  }
  if (w.m >= 2) {
    const double rest_m = w.Rest(w.m);
    double best_split = kInf;
    uint32_t best_k = 1;
    for (uint32_t k = 1; k < w.m && !in.prefix_plans_only; ++k) {
      const double t = SplitSidesMicros(in.recompute, w.Front(k), w.FetchSuffix(k)) + rest_m +
                       (pen[w.m] - pen[k]);
      if (t < best_split) {
        best_split = t;
        best_k = k;
      }
    }
    if (!in.prefix_plans_only) {
      PlanAlternative split{PlanKind::kSplit, best_split, best_k, w.m, false};
      split.front_us = w.Front(best_k);
      split.fetch_us = w.FetchSuffix(best_k);
      split.rest_us = rest_m;
      plan.alternatives.push_back(split);
    }
    double best_prefix = kInf;
    uint32_t best_j = 1;
    for (uint32_t j = 1; j < w.m; ++j) {
      const double t = w.FetchPrefix(j) + w.Rest(j) + pen[j];
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
  // The load's time: the alternative's total less the decode time its compact blocks add later.
  const double chosen_pen = c.kind == PlanKind::kRecomputeAll ? 0
                            : c.kind == PlanKind::kSplit      ? pen[w.m] - pen[c.split_blocks]
                                                              : pen[c.prefix_blocks];
  plan.predicted_total_us = c.predicted_us - chosen_pen;

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
      if (j < n) {
        plan.runs.push_back(RecomputeRun(w, j, n, fetch->total_us, plan.predicted_total_us));
      }
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
                         plan.predicted_total_us));
      }
      break;
    }
    default:
      return Status::Internal("planner chose an unknown plan kind");
  }
  AddCharges(w, plan.runs, &plan.charges);
  for (const PlanRun& run : plan.runs) {
    if (!run.compact) continue;
    plan.compact_blocks += run.block_count;
    plan.compact_penalty_us += pen[run.first_block + run.block_count] - pen[run.first_block];
  }

  if (in.include_explanation) {
    std::string& x = plan.explanation;
    x = "chain: " + std::to_string(n) + " blocks, " + std::to_string(w.total_tokens) +
        " tokens (+" + std::to_string(in.suffix_tokens) + " suffix tokens); cached prefix " +
        std::to_string(w.m) + " blocks (" +
        std::to_string(static_cast<uint64_t>(w.PrefixTokens(w.m))) + " tokens)\n";
    auto others = [](const SharedStage& stage) {
      return stage.backlog.plans() == 0
                 ? std::string()
                 : " (shared with " + std::to_string(stage.backlog.plans()) +
                       " admitted plans still moving " +
                       FormatBytes(static_cast<uint64_t>(stage.backlog.Total())) + ")";
    };
    x += "fetch: F = " + FormatMicros(in.host_to_device.alpha_us) +
         " (host→device alpha) + max(latest stream end, client ingest, host→device); a stream "
         "per source: its stages' alphas once, then per stage its bytes shared with the plans "
         "admitted before, n at once each at beta × min(1, gain / n) (with gain 1: (bytes + "
         "Σ min(r_i, bytes)) / beta, r_i what each still moves there); client ingest " +
         FormatMicros(in.client_ingest.alpha_us) + " + that at " +
         FormatRate(in.client_ingest.beta_bytes_per_s) + others(w.ingest) +
         "; host→device that at " + FormatRate(in.host_to_device.beta_bytes_per_s) + others(w.h2d) +
         "\n";
    if (in.prefix_plans_only) {
      x += "prefix plans only (the engine loads a prefix and computes every token after it): "
           "no split considered\n";
    }
    for (const PlanAlternative& a : plan.alternatives) {
      x += a.chosen ? "* " : "  ";
      x += std::string(PlanKindName(a.kind));
      switch (a.kind) {
        case PlanKind::kRecomputeAll:
          x += ": " + RecomputeText(w, w.total_tokens + in.suffix_tokens, 0);
          break;
        case PlanKind::kFetchAll:
          x += ": " + FetchText(0, w.m, w.FetchSuffix(0)) + ", then " + RestText(w, w.m);
          if (pen[w.m] > 0) x += ", + Pen " + FormatMicros(pen[w.m]);
          break;
        case PlanKind::kSplit:
          x += " k=" + std::to_string(a.split_blocks) + ": max(A, B) + s × min(A, B), A = " +
               RecomputeText(w, static_cast<uint64_t>(w.PrefixTokens(a.split_blocks)), 0) +
               ", B = " + FetchText(a.split_blocks, w.m, w.FetchSuffix(a.split_blocks)) +
               ", s = " + FormatFraction(in.recompute.split_serial_fraction) + "; then " +
               RestText(w, w.m);
          if (pen[w.m] > pen[a.split_blocks]) {
            x += ", + Pen " + FormatMicros(pen[w.m] - pen[a.split_blocks]);
          }
          break;
        case PlanKind::kMixed:
          x += " j=" + std::to_string(a.prefix_blocks) + ": " +
               FetchText(0, a.prefix_blocks, w.FetchPrefix(a.prefix_blocks)) + ", then " +
               RestText(w, a.prefix_blocks);
          if (pen[a.prefix_blocks] > 0) x += ", + Pen " + FormatMicros(pen[a.prefix_blocks]);
          break;
        default:
          break;
      }
      x += " => " + FormatMicros(a.predicted_us) + "\n";
    }
    const double pure =
        std::min(recompute_all, w.m >= 1 ? plan.alternatives[1].predicted_us : recompute_all);
    x += "chosen: " + std::string(PlanKindName(plan.kind)) + " " +
         FormatMicros(plan.predicted_total_us) + " to load" +
         (chosen_pen > 0 ? " + Pen " + FormatMicros(chosen_pen) + " decode" : std::string()) +
         " (better pure plan " + FormatMicros(pure) + ")\n";
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
    std::vector<uint8_t> seen(w.SourceCount(), 0);
    for (const PlanRun& run : plan.runs) {
      bool first = false;
      if (run.action == RunAction::kFetch) {
        uint8_t& s = seen[SourceId({run.host_index, run.tier})];
        first = s == 0;
        s = 1;
      }
      std::string line = run.action == RunAction::kFetch
                             ? SourceText(w, run, first)
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
