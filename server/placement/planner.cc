#include "server/placement/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "core/units.h"

namespace kvfabric {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The cost of fetching from one source (host, tier); see the FETCH MODEL in planner.h.
struct SourceCost {
  double alpha_us = 0;     // alphas of the daemon stages: paid per run
  double wait_us = 0;      // queue wait: the choice pays it per run, the price once per plan
  double fixed_us = 0;     // alpha_us + wait_us: what the choice pays per run
  double per_byte_us = 0;  // 1 / bottleneck beta, in µs per byte
  BusPath bottleneck = BusPath::kUnspecified;
  double bottleneck_beta = 0;
};

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

int SourceId(const BlockReplica& r) {
  return static_cast<int>(r.host_index) * 2 + (r.tier == Tier::kNvme);
}

std::string_view TierName(Tier t) { return t == Tier::kNvme ? "nvme" : "host"; }

// Everything one MakePlan call computes, kept together for reconstruction and explanation.
struct Work {
  const PlannerInput* in = nullptr;
  std::vector<std::array<SourceCost, 2>> sources;  // [host][tier - 1]
  double plan_fixed_us = 0;                        // alpha_h2d + wait_h2d
  double h2d_wait_us = 0;
  uint32_t m = 0;  // cached prefix blocks
  uint64_t total_tokens = 0;
  // Flat per-(block, replica) arrays over blocks [0, m).
  std::vector<uint32_t> offset;  // m + 1 entries
  std::vector<double> cost;      // bytes × per_byte
  std::vector<double> fixed;     // alphas + queue wait (the choice)
  std::vector<double> alpha;     // alphas only (the price)
  std::vector<double> wait;      // queue wait of the replica's source
  std::vector<int32_t> next_same, prev_same;
  // Backward pass: g (cost of i..m-1 given this replica, its run already paid for) and whether
  // the best continuation keeps the source.
  std::vector<double> g;
  std::vector<uint8_t> keeps_source;
  std::vector<double> best_start;  // m + 1: min over r of fixed + g; best_start[m] = 0
  std::vector<int32_t> best_start_arg;
  // The price of the chosen continuation: alphas + bytes (g_price), and the largest queue wait
  // of a source it uses (g_wait); the same per suffix start.
  std::vector<double> g_price, g_wait, start_price, start_wait;
  // Forward pass: h (cost of 0..i given this replica, including its run's fixed cost).
  std::vector<double> h;
  std::vector<int32_t> pred;  // -1: a run starts here
  std::vector<double> best_end;
  std::vector<int32_t> best_end_arg;
  std::vector<double> h_price, h_wait, end_price, end_wait;

  const SourceCost& Source(const BlockReplica& r) const {
    return sources[r.host_index][r.tier == Tier::kNvme ? 1 : 0];
  }
  double PrefixTokens(uint32_t i) const {
    return i == in->blocks.size() ? static_cast<double>(total_tokens)
                                  : static_cast<double>(in->blocks[i].prefix_tokens);
  }
  // Fetch time of blocks [k, m) and [0, j), including the per-plan host→device cost.
  // Priced with each source's queue wait once (the largest of them: queues at different daemons
  // drain at the same time), not once per run.
  double FetchSuffix(uint32_t k) const {
    return k >= m ? 0 : start_price[k] + start_wait[k] + plan_fixed_us;
  }
  double FetchPrefix(uint32_t j) const {
    return j == 0 ? 0 : end_price[j - 1] + end_wait[j - 1] + plan_fixed_us;
  }
  double Rest(uint32_t j) const {
    const double p = PrefixTokens(j);
    return RecomputeMicros(
        in->recompute,
        static_cast<double>(total_tokens) - p + static_cast<double>(in->suffix_tokens), p);
  }
  double Front(uint32_t k) const { return RecomputeMicros(in->recompute, PrefixTokens(k), 0); }
};

void ComputeSources(const PlannerInput& in, const PathLoad* load, Work* w) {
  const double h2d_per_byte = 1e6 / in.host_to_device.beta_bytes_per_s;
  const uint64_t q_h2d = load ? load->QueuedBytes(BusPath::kHostToDevice, in.client_id) : 0;
  w->h2d_wait_us = static_cast<double>(q_h2d) * h2d_per_byte;
  w->plan_fixed_us = in.host_to_device.alpha_us + w->h2d_wait_us;
  w->sources.resize(in.hosts.size());
  for (size_t i = 0; i < in.hosts.size(); ++i) {
    const PlannerHost& host = in.hosts[i];
    const BusPath tp = host.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost;
    const double qt = load ? static_cast<double>(load->QueuedBytes(tp, host.host_id)) : 0;
    const double qn =
        load ? static_cast<double>(load->QueuedBytes(BusPath::kNvmeToHost, host.host_id)) : 0;
    const double t_per_byte = 1e6 / host.transfer.beta_bytes_per_s;
    const double n_per_byte = 1e6 / host.nvme.beta_bytes_per_s;
    SourceCost hs;
    hs.wait_us = qt * t_per_byte;
    hs.alpha_us = host.transfer.alpha_us;
    hs.fixed_us = hs.alpha_us + hs.wait_us;
    if (t_per_byte >= h2d_per_byte) {
      hs.per_byte_us = t_per_byte;
      hs.bottleneck = tp;
      hs.bottleneck_beta = host.transfer.beta_bytes_per_s;
    } else {
      hs.per_byte_us = h2d_per_byte;
      hs.bottleneck = BusPath::kHostToDevice;
      hs.bottleneck_beta = in.host_to_device.beta_bytes_per_s;
    }
    SourceCost ns = hs;
    ns.wait_us = std::max(hs.wait_us, qn * n_per_byte);
    ns.alpha_us = host.transfer.alpha_us + host.nvme.alpha_us;
    ns.fixed_us = ns.alpha_us + ns.wait_us;
    if (n_per_byte > hs.per_byte_us) {
      ns.per_byte_us = n_per_byte;
      ns.bottleneck = BusPath::kNvmeToHost;
      ns.bottleneck_beta = host.nvme.beta_bytes_per_s;
    }
    w->sources[i] = {hs, ns};
  }
}

void RunPasses(Work* w) {
  const PlannerInput& in = *w->in;
  const uint32_t m = w->m;
  w->offset.assign(m + 1, 0);
  for (uint32_t i = 0; i < m; ++i) {
    w->offset[i + 1] = w->offset[i] + static_cast<uint32_t>(in.blocks[i].replicas.size());
  }
  const size_t total = w->offset[m];
  w->cost.resize(total);
  w->fixed.resize(total);
  w->alpha.resize(total);
  w->wait.resize(total);
  w->next_same.assign(total, -1);
  w->prev_same.assign(total, -1);
  for (uint32_t i = 0; i < m; ++i) {
    const ChainBlock& b = in.blocks[i];
    for (size_t r = 0; r < b.replicas.size(); ++r) {
      const SourceCost& s = w->Source(b.replicas[r]);
      const size_t idx = w->offset[i] + r;
      w->cost[idx] = static_cast<double>(b.bytes) * s.per_byte_us;
      w->fixed[idx] = s.fixed_us;
      w->alpha[idx] = s.alpha_us;
      w->wait[idx] = s.wait_us;
      if (i + 1 < m) {
        const int id = SourceId(b.replicas[r]);
        const ChainBlock& nb = in.blocks[i + 1];
        for (size_t r2 = 0; r2 < nb.replicas.size(); ++r2) {
          if (SourceId(nb.replicas[r2]) == id) {
            w->next_same[idx] = static_cast<int32_t>(w->offset[i + 1] + r2);
            w->prev_same[w->offset[i + 1] + r2] = static_cast<int32_t>(idx);
            break;
          }
        }
      }
    }
  }
  // Backward pass: suffixes [k, m).
  w->g.resize(total);
  w->keeps_source.assign(total, 0);
  w->best_start.assign(m + 1, 0);
  w->best_start_arg.assign(m + 1, -1);
  w->g_price.resize(total);
  w->g_wait.resize(total);
  w->start_price.assign(m + 1, 0);
  w->start_wait.assign(m + 1, 0);
  for (int64_t i = static_cast<int64_t>(m) - 1; i >= 0; --i) {
    double best = kInf;
    int32_t arg = -1;
    for (uint32_t idx = w->offset[i]; idx < w->offset[i + 1]; ++idx) {
      double tail = 0, tail_price = 0, tail_wait = 0;
      if (static_cast<uint32_t>(i) + 1 < m) {
        const double fresh = w->best_start[i + 1];
        const int32_t same = w->next_same[idx];
        if (same >= 0 && w->g[same] <= fresh) {
          tail = w->g[same];
          tail_price = w->g_price[same];
          tail_wait = w->g_wait[same];
          w->keeps_source[idx] = 1;
        } else {
          tail = fresh;
          tail_price = w->start_price[i + 1];
          tail_wait = w->start_wait[i + 1];
        }
      }
      w->g[idx] = w->cost[idx] + tail;
      w->g_price[idx] = w->cost[idx] + tail_price;
      w->g_wait[idx] = std::max(w->wait[idx], tail_wait);
      const double start = w->fixed[idx] + w->g[idx];
      if (start < best) {
        best = start;
        arg = static_cast<int32_t>(idx);
      }
    }
    w->best_start[i] = best;
    w->best_start_arg[i] = arg;
    w->start_price[i] = w->alpha[arg] + w->g_price[arg];
    w->start_wait[i] = w->g_wait[arg];
  }
  // Forward pass: prefixes [0, j).
  w->h.resize(total);
  w->pred.assign(total, -1);
  w->best_end.assign(m, 0);
  w->best_end_arg.assign(m, -1);
  w->h_price.resize(total);
  w->h_wait.resize(total);
  w->end_price.assign(m, 0);
  w->end_wait.assign(m, 0);
  for (uint32_t i = 0; i < m; ++i) {
    double best = kInf;
    int32_t arg = -1;
    for (uint32_t idx = w->offset[i]; idx < w->offset[i + 1]; ++idx) {
      double head = w->fixed[idx] + (i == 0 ? 0 : w->best_end[i - 1]);
      double head_price = w->alpha[idx] + (i == 0 ? 0 : w->end_price[i - 1]);
      double head_wait = std::max(w->wait[idx], i == 0 ? 0.0 : w->end_wait[i - 1]);
      const int32_t same = w->prev_same[idx];
      if (same >= 0 && w->h[same] <= head) {
        head = w->h[same];
        head_price = w->h_price[same];
        head_wait = w->h_wait[same];
        w->pred[idx] = same;
      }
      w->h[idx] = w->cost[idx] + head;
      w->h_price[idx] = w->cost[idx] + head_price;
      w->h_wait[idx] = head_wait;
      if (w->h[idx] < best) {
        best = w->h[idx];
        arg = static_cast<int32_t>(idx);
      }
    }
    w->best_end[i] = best;
    w->best_end_arg[i] = arg;
    w->end_price[i] = w->h_price[arg];
    w->end_wait[i] = w->h_wait[arg];
  }
}

// The replica chosen for each block of [k, m) (backward pass) or [0, j) (forward pass), as flat
// indices; out[i - first] for block i.
void ChooseSuffix(const Work& w, uint32_t k, std::vector<int32_t>* out) {
  out->clear();
  int32_t idx = w.best_start_arg[k];
  for (uint32_t i = k; i < w.m; ++i) {
    out->push_back(idx);
    if (i + 1 < w.m) idx = w.keeps_source[idx] ? w.next_same[idx] : w.best_start_arg[i + 1];
  }
}

void ChoosePrefix(const Work& w, uint32_t j, std::vector<int32_t>* out) {
  out->assign(j, -1);
  int32_t idx = w.best_end_arg[j - 1];
  for (int64_t i = static_cast<int64_t>(j) - 1; i >= 0; --i) {
    (*out)[i] = idx;
    if (i > 0) idx = w.pred[idx] >= 0 ? w.pred[idx] : w.best_end_arg[i - 1];
  }
}

const BlockReplica& ReplicaAt(const Work& w, uint32_t block, int32_t flat) {
  return w.in->blocks[block].replicas[flat - w.offset[block]];
}

// Appends fetch runs for blocks [first, first + choice.size()) starting at time 0; returns the
// end time of the last run (== the fetch time).
double AppendFetchRuns(const Work& w, uint32_t first, const std::vector<int32_t>& choice,
                       std::vector<PlanRun>* runs) {
  // The largest queue wait of a source used, once; then each run's alphas and bytes.
  double wait = 0;
  for (size_t a = 0; a < choice.size(); ++a) {
    wait = std::max(wait, w.Source(ReplicaAt(w, first + a, choice[a])).wait_us);
  }
  double t = w.plan_fixed_us + wait;
  for (size_t a = 0; a < choice.size();) {
    const BlockReplica& r = ReplicaAt(w, first + a, choice[a]);
    size_t b = a + 1;
    while (b < choice.size() && SourceId(ReplicaAt(w, first + b, choice[b])) == SourceId(r)) ++b;
    PlanRun run;
    run.first_block = first + static_cast<uint32_t>(a);
    run.block_count = static_cast<uint32_t>(b - a);
    run.action = RunAction::kFetch;
    run.host_index = r.host_index;
    run.tier = r.tier;
    for (size_t x = a; x < b; ++x) run.payload_bytes += w.in->blocks[first + x].bytes;
    run.predicted_start_us = runs->empty() || runs->back().action != RunAction::kFetch
                                 ? 0
                                 : runs->back().predicted_end_us;
    const SourceCost& s = w.Source(r);
    t += s.alpha_us + static_cast<double>(run.payload_bytes) * s.per_byte_us;
    run.predicted_end_us = t;
    runs->push_back(run);
    a = b;
  }
  return t;
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
  if (h2d > 0) out->push_back({BusPath::kHostToDevice, w.in->client_id, h2d});
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
         " (queue wait " + FormatMicros(s.wait_us) + ", paid once per plan)" + "; ends at " +
         FormatMicros(run.predicted_end_us);
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

  std::vector<int32_t> choice;
  switch (c.kind) {
    case PlanKind::kRecomputeAll:
      plan.runs.push_back(RecomputeRun(w, 0, n, 0, recompute_all));
      break;
    case PlanKind::kFetchAll:
    case PlanKind::kMixed: {
      const uint32_t j = c.prefix_blocks;
      ChoosePrefix(w, j, &choice);
      const double fetched = AppendFetchRuns(w, 0, choice, &plan.runs);
      if (j < n) plan.runs.push_back(RecomputeRun(w, j, n, fetched, c.predicted_us));
      break;
    }
    case PlanKind::kSplit: {
      const uint32_t k = c.split_blocks;
      plan.runs.push_back(RecomputeRun(w, 0, k, 0, w.Front(k)));
      ChooseSuffix(w, k, &choice);
      const double fetched = AppendFetchRuns(w, k, choice, &plan.runs);
      if (w.m < n) {
        plan.runs.push_back(RecomputeRun(
            w, w.m, n, SplitSidesMicros(in.recompute, w.Front(k), fetched), c.predicted_us));
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
    x += "fetch: once per plan " + FormatMicros(in.host_to_device.alpha_us) +
         " (host→device alpha) + wait " + FormatMicros(w.h2d_wait_us) +
         "; + the largest queue wait of a source used, once; per run alpha of each stage + "
         "bytes / bottleneck beta\n";
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
