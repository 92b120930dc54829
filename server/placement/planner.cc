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

namespace kvfabric {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The cost of fetching from one source (host, tier); see the FETCH MODEL in planner.h.
struct SourceCost {
  double alpha_us = 0;     // alphas of the daemon stages: paid per run
  double wait_us = 0;      // queue wait: once per stream (the serial choice pays it per run)
  double fixed_us = 0;     // alpha_us + wait_us: what the serial choice pays per run
  double per_byte_us = 0;  // 1 / bottleneck beta of the daemon stages, in µs per byte
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

int SourceId(const BlockReplica& r) {
  return static_cast<int>(r.host_index) * 2 + (r.tier == Tier::kNvme);
}

std::string_view TierName(Tier t) { return t == Tier::kNvme ? "nvme" : "host"; }

// The candidate assignments of the cached prefix (FETCH MODEL in planner.h).
enum Candidate : uint8_t { kSerial = 0, kBalanced = 1, kSerialImproved = 2, kCandidates = 3 };

std::string_view CandidateName(uint8_t c) {
  return c == kSerial ? "serial" : c == kBalanced ? "balanced" : "serial, improved";
}

// Everything one MakePlan call computes, kept together for reconstruction and explanation.
struct Work {
  const PlannerInput* in = nullptr;
  std::vector<std::array<SourceCost, 2>> sources;  // [host][tier - 1]
  double plan_fixed_us = 0;                        // alpha_h2d + wait_h2d
  double h2d_wait_us = 0;
  double h2d_per_byte_us = 0;
  double ingest_per_byte_us = 0;
  double ingest_wait_us = 0;  // bytes this client's other plans have queued at its ingest
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
  // What block i's bytes add to a stream of `source`.
  double BytesUs(uint32_t i, const SourceCost& source) const {
    return static_cast<double>(in->blocks[i].bytes) * source.per_byte_us;
  }
  double PrefixTokens(uint32_t i) const {
    return i == in->blocks.size() ? static_cast<double>(total_tokens)
                                  : static_cast<double>(in->blocks[i].prefix_tokens);
  }
  // The client's shared stages for `bytes` fetched in all: max(ingest, host→device).
  double Shared(double bytes) const {
    if (bytes <= 0) return 0;
    return std::max(in->client_ingest.alpha_us + ingest_wait_us + bytes * ingest_per_byte_us,
                    bytes * h2d_per_byte_us);
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

const BlockReplica& ReplicaAt(const Work& w, uint32_t block, int32_t flat) {
  return w.in->blocks[block].replicas[flat - w.offset[block]];
}

void ComputeSources(const PlannerInput& in, const PathLoad* load, Work* w) {
  w->h2d_per_byte_us = 1e6 / in.host_to_device.beta_bytes_per_s;
  w->ingest_per_byte_us = 1e6 / in.client_ingest.beta_bytes_per_s;
  const uint64_t q_h2d = load ? load->QueuedBytes(BusPath::kHostToDevice, in.client_id) : 0;
  w->h2d_wait_us = static_cast<double>(q_h2d) * w->h2d_per_byte_us;
  w->plan_fixed_us = in.host_to_device.alpha_us + w->h2d_wait_us;
  const uint64_t q_ingest = load ? load->QueuedBytes(BusPath::kClientIngest, in.client_id) : 0;
  w->ingest_wait_us = static_cast<double>(q_ingest) * w->ingest_per_byte_us;
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
    hs.per_byte_us = t_per_byte;
    hs.bottleneck = tp;
    hs.bottleneck_beta = host.transfer.beta_bytes_per_s;
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

// The queue wait of source `id` (SourceId).
double SourceWait(const Work& w, int id) {
  return w.sources[static_cast<size_t>(id / 2)][id % 2].wait_us;
}

// The serial candidate: a dynamic program over blocks × replicas minimising the sum of run costs
// of [0, m).
void SerialCandidate(Work* w) {
  const PlannerInput& in = *w->in;
  const uint32_t m = w->m;
  w->offset.assign(m + 1, 0);
  for (uint32_t i = 0; i < m; ++i) {
    w->offset[i + 1] = w->offset[i] + static_cast<uint32_t>(in.blocks[i].replicas.size());
  }
  const size_t total = w->offset[m];
  w->cost.resize(total);
  w->fixed.resize(total);
  w->next_same.assign(total, -1);
  for (uint32_t i = 0; i < m; ++i) {
    const ChainBlock& b = in.blocks[i];
    for (size_t r = 0; r < b.replicas.size(); ++r) {
      const SourceCost& s = w->Source(b.replicas[r]);
      const size_t idx = w->offset[i] + r;
      w->cost[idx] = static_cast<double>(b.bytes) * s.per_byte_us;
      w->fixed[idx] = s.fixed_us;
      if (i + 1 < m) {
        const int id = SourceId(b.replicas[r]);
        const ChainBlock& nb = in.blocks[i + 1];
        for (size_t r2 = 0; r2 < nb.replicas.size(); ++r2) {
          if (SourceId(nb.replicas[r2]) == id) {
            w->next_same[idx] = static_cast<int32_t>(w->offset[i + 1] + r2);
            break;
          }
        }
      }
    }
  }
  w->g.resize(total);
  w->keeps_source.assign(total, 0);
  w->best_start.assign(m + 1, 0);
  w->best_start_arg.assign(m + 1, -1);
  for (int64_t i = static_cast<int64_t>(m) - 1; i >= 0; --i) {
    double best = kInf;
    int32_t arg = -1;
    for (uint32_t idx = w->offset[i]; idx < w->offset[i + 1]; ++idx) {
      double tail = 0;
      if (static_cast<uint32_t>(i) + 1 < m) {
        const double fresh = w->best_start[i + 1];
        const int32_t same = w->next_same[idx];
        if (same >= 0 && w->g[same] <= fresh) {
          tail = w->g[same];
          w->keeps_source[idx] = 1;
        } else {
          tail = fresh;
        }
      }
      w->g[idx] = w->cost[idx] + tail;
      const double start = w->fixed[idx] + w->g[idx];
      if (start < best) {
        best = start;
        arg = static_cast<int32_t>(idx);
      }
    }
    w->best_start[i] = best;
    w->best_start_arg[i] = arg;
  }
  std::vector<int32_t>& out = w->assign[kSerial];
  out.clear();
  if (m == 0) return;
  int32_t idx = w->best_start_arg[0];
  for (uint32_t i = 0; i < m; ++i) {
    out.push_back(idx);
    if (i + 1 < m) idx = w->keeps_source[idx] ? w->next_same[idx] : w->best_start_arg[i + 1];
  }
}

// Passes of local moves on an assignment of [0, m), with exact deltas: each block goes to
// another of its replicas whenever that lowers the later end of the two streams involved (the
// sorted stream ends fall lexicographically with every move, so the passes end; at most
// kImprovePasses).
constexpr int kImprovePasses = 8;

void Improve(const Work* w, std::vector<int32_t>* assignment) {
  const PlannerInput& in = *w->in;
  const uint32_t m = w->m;
  std::vector<int32_t>& out = *assignment;
  std::vector<double> stream(w->SourceCount(), 0);
  std::vector<uint32_t> count(w->SourceCount(), 0);
  std::vector<int> src(m);
  for (uint32_t i = 0; i < m; ++i) src[i] = SourceId(ReplicaAt(*w, i, out[i]));
  auto source_at = [&](int64_t i) {
    return i < 0 || i >= static_cast<int64_t>(m) ? -1 : src[static_cast<size_t>(i)];
  };
  for (uint32_t i = 0; i < m; ++i) {
    const BlockReplica& r = ReplicaAt(*w, i, out[i]);
    const SourceCost& sc = w->Source(r);
    const int s = src[i];
    stream[s] += (count[s] == 0 ? sc.wait_us : 0) + (source_at(i - 1) == s ? 0 : sc.alpha_us) +
                 w->BytesUs(i, sc);
    ++count[s];
  }
  for (int pass = 0; pass < kImprovePasses; ++pass) {
    bool moved = false;
    for (uint32_t i = 0; i < m; ++i) {
      const ChainBlock& b = in.blocks[i];
      if (b.replicas.size() < 2) continue;
      const BlockReplica& from = ReplicaAt(*w, i, out[i]);
      const int s = src[i];
      const SourceCost& fs = w->Source(from);
      const int p = source_at(static_cast<int64_t>(i) - 1),
                q = source_at(static_cast<int64_t>(i) + 1);
      // Stream s without block i: a run split in two pays one more alpha, a run of i alone one
      // fewer; the last block takes the queue wait with it.
      double s_after = stream[s] - w->BytesUs(i, fs) +
                       (p == s && q == s   ? fs.alpha_us
                        : p != s && q != s ? -fs.alpha_us
                                           : 0);
      if (count[s] == 1) s_after = 0;
      int32_t best_arg = -1;
      double best_t = 0, best_gain = 0;
      for (size_t r = 0; r < b.replicas.size(); ++r) {
        const int t = SourceId(b.replicas[r]);
        if (t == s) continue;
        const SourceCost& ts = w->Source(b.replicas[r]);
        const double t_after = stream[t] + (count[t] == 0 ? ts.wait_us : 0) + w->BytesUs(i, ts) +
                               (p == t && q == t   ? -ts.alpha_us
                                : p != t && q != t ? ts.alpha_us
                                                   : 0);
        const double before = std::max(stream[s], stream[t]);
        const double gain = before - std::max(s_after, t_after);
        if (gain > best_gain && gain > 1e-12 * before) {
          best_gain = gain;
          best_arg = static_cast<int32_t>(w->offset[i] + r);
          best_t = t_after;
        }
      }
      if (best_arg < 0) continue;
      const int t = SourceId(ReplicaAt(*w, i, best_arg));
      stream[s] = s_after;
      stream[t] = best_t;
      --count[s];
      ++count[t];
      out[i] = best_arg;
      src[i] = t;
      moved = true;
    }
    if (!moved) break;
  }
}

// The balanced candidate (planner.h): blocks with one replica are placed first; then the others
// in chain order, each on the replica whose stream would end first (earliest finish time); then
// Improve.
void BalancedCandidate(Work* w) {
  const PlannerInput& in = *w->in;
  const uint32_t m = w->m;
  std::vector<double> stream(w->SourceCount(), 0);
  std::vector<uint32_t> count(w->SourceCount(), 0);
  std::vector<int32_t>& out = w->assign[kBalanced];
  out.assign(m, -1);
  for (uint32_t i = 0; i < m; ++i) {
    if (in.blocks[i].replicas.size() != 1) continue;
    const BlockReplica& r = in.blocks[i].replicas[0];
    const int s = SourceId(r);
    const SourceCost& sc = w->Source(r);
    const bool continues =
        i > 0 && out[i - 1] >= 0 && SourceId(ReplicaAt(*w, i - 1, out[i - 1])) == s;
    stream[s] +=
        (count[s] == 0 ? sc.wait_us : 0) + (continues ? 0 : sc.alpha_us) + w->BytesUs(i, sc);
    ++count[s];
    out[i] = static_cast<int32_t>(w->offset[i]);
  }
  for (uint32_t i = 0; i < m; ++i) {
    if (out[i] >= 0) continue;
    const int prev = i > 0 ? SourceId(ReplicaAt(*w, i - 1, out[i - 1])) : -1;
    const ChainBlock& b = in.blocks[i];
    double best = kInf;
    int32_t arg = -1;
    for (size_t r = 0; r < b.replicas.size(); ++r) {
      const int s = SourceId(b.replicas[r]);
      const SourceCost& sc = w->Source(b.replicas[r]);
      const double end = stream[s] + (count[s] == 0 ? sc.wait_us : 0) +
                         (s == prev ? 0 : sc.alpha_us) + w->BytesUs(i, sc);
      if (end < best) {
        best = end;
        arg = static_cast<int32_t>(w->offset[i] + r);
      }
    }
    const int s = SourceId(ReplicaAt(*w, i, arg));
    stream[s] = best;
    ++count[s];
    out[i] = arg;
  }
  Improve(w, &out);
}

// Prices every suffix [k, m) and prefix [0, j) of candidate `c` with F, keeping the cheaper
// candidate per k and j. Stream ends only grow as blocks are added, so one sweep each way
// carries their max.
void PriceCandidate(Work* w, uint8_t c) {
  const PlannerInput& in = *w->in;
  const uint32_t m = w->m;
  const std::vector<int32_t>& a = w->assign[c];
  // Per block: its source, and what it adds to that source's stream as a run's first block
  // (alphas + bytes) or as a later one (bytes).
  std::vector<int> source(m);
  std::vector<double> first_us(m), more_us(m);
  for (uint32_t i = 0; i < m; ++i) {
    const BlockReplica& r = ReplicaAt(*w, i, a[i]);
    const SourceCost& sc = w->Source(r);
    source[i] = SourceId(r);
    more_us[i] = w->BytesUs(i, sc);
    first_us[i] = sc.alpha_us + more_us[i];
  }
  std::vector<double> stream(w->SourceCount(), -1);  // -1: not used yet
  auto add = [&](uint32_t i, bool continues) {
    double& t = stream[source[i]];
    if (t < 0) t = SourceWait(*w, source[i]);
    t += continues ? more_us[i] : first_us[i];
    return t;
  };
  auto keep = [&](std::vector<double>* us, std::vector<uint8_t>* arg, uint32_t at, double f) {
    if (c == 0 || f < (*us)[at]) {
      (*us)[at] = f;
      (*arg)[at] = c;
    }
  };
  double longest = 0, bytes = 0;
  for (int64_t i = static_cast<int64_t>(m) - 1; i >= 0; --i) {
    const auto b = static_cast<uint32_t>(i);
    // Prepending a block of the same source extends the run [b + 1, ...) (its alphas stay
    // paid once); another source starts a run.
    longest = std::max(longest, add(b, b + 1 < m && source[b + 1] == source[b]));
    bytes += static_cast<double>(in.blocks[b].bytes);
    keep(&w->suffix_us, &w->suffix_arg, b, w->plan_fixed_us + std::max(longest, w->Shared(bytes)));
  }
  std::fill(stream.begin(), stream.end(), -1);
  longest = 0;
  bytes = 0;
  for (uint32_t i = 0; i < m; ++i) {
    longest = std::max(longest, add(i, i > 0 && source[i - 1] == source[i]));
    bytes += static_cast<double>(in.blocks[i].bytes);
    keep(&w->prefix_us, &w->prefix_arg, i + 1,
         w->plan_fixed_us + std::max(longest, w->Shared(bytes)));
  }
}

void RunPasses(Work* w) {
  SerialCandidate(w);
  BalancedCandidate(w);
  w->assign[kSerialImproved] = w->assign[kSerial];
  Improve(w, &w->assign[kSerialImproved]);
  w->suffix_us.assign(w->m + 1, 0);
  w->prefix_us.assign(w->m + 1, 0);
  w->suffix_arg.assign(w->m + 1, kSerial);
  w->prefix_arg.assign(w->m + 1, kSerial);
  for (uint8_t c = 0; c < kCandidates; ++c) {
    // A candidate equal to an earlier one (often: no move improved it) prices the same.
    bool repeat = false;
    for (uint8_t e = 0; e < c && !repeat; ++e) repeat = w->assign[e] == w->assign[c];
    if (!repeat) PriceCandidate(w, c);
  }
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
