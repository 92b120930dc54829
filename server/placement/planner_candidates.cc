#include "server/placement/planner_candidates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvfabric::planner_internal {
void ComputeSources(const PlannerInput& in, PathLoad* load, Work* w) {
  // Each stage shared with the plans admitted before, by the gain the cost model has now.
  auto backlog = [&](BusPath path, const std::string& resource, const PathParameters& p) {
    return load != nullptr ? load->Backlog(path, resource, in.now_us, p.concurrency_gain)
                           : SharedBacklog({}, p.concurrency_gain);
  };
  w->plan_fixed_us = in.host_to_device.alpha_us;
  w->h2d = {1e6 / in.host_to_device.beta_bytes_per_s,
            backlog(BusPath::kHostToDevice, in.client_id, in.host_to_device)};
  w->ingest = {1e6 / in.client_ingest.beta_bytes_per_s,
               backlog(BusPath::kClientIngest, in.client_id, in.client_ingest)};
  w->sources.resize(in.hosts.size());
  w->stages.resize(in.hosts.size());
  for (size_t i = 0; i < in.hosts.size(); ++i) {
    const PlannerHost& host = in.hosts[i];
    const BusPath tp = host.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost;
    SharedStage& transfer = w->stages[i][0];
    SharedStage& nvme = w->stages[i][1];
    transfer = {1e6 / host.transfer.beta_bytes_per_s, backlog(tp, host.host_id, host.transfer)};
    nvme = {1e6 / host.nvme.beta_bytes_per_s,
            backlog(BusPath::kNvmeToHost, host.host_id, host.nvme)};
    SourceCost hs;
    hs.wait_us = transfer.backlog.Total() * transfer.per_byte_us;
    hs.alpha_us = host.transfer.alpha_us;
    hs.fixed_us = hs.alpha_us + hs.wait_us;
    hs.per_byte_us = transfer.per_byte_us;
    hs.bottleneck = tp;
    hs.bottleneck_beta = host.transfer.beta_bytes_per_s;
    hs.transfer = &transfer;
    SourceCost ns = hs;
    ns.wait_us = std::max(hs.wait_us, nvme.backlog.Total() * nvme.per_byte_us);
    ns.alpha_us = host.transfer.alpha_us + host.nvme.alpha_us;
    ns.fixed_us = ns.alpha_us + ns.wait_us;
    ns.nvme = &nvme;
    if (nvme.per_byte_us > hs.per_byte_us) {
      ns.per_byte_us = nvme.per_byte_us;
      ns.bottleneck = BusPath::kNvmeToHost;
      ns.bottleneck_beta = host.nvme.beta_bytes_per_s;
    }
    w->sources[i] = {hs, ns};
  }
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

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
  for (uint32_t i = 0; i < m; ++i) {
    const BlockReplica& r = ReplicaAt(*w, i, out[i]);
    const SourceCost& sc = w->Source(r);
    const int s = src[i];
    stream[s] += (count[s] == 0 ? sc.fixed_us : 0) + w->BytesUs(i, sc);
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
      // Stream s without block i; its last block takes the alphas and queue wait with it.
      double s_after = stream[s] - w->BytesUs(i, fs);
      if (count[s] == 1) s_after = 0;
      int32_t best_arg = -1;
      double best_t = 0, best_gain = 0;
      for (size_t r = 0; r < b.replicas.size(); ++r) {
        const int t = SourceId(b.replicas[r]);
        if (t == s) continue;
        const SourceCost& ts = w->Source(b.replicas[r]);
        const double t_after = stream[t] + (count[t] == 0 ? ts.fixed_us : 0) + w->BytesUs(i, ts);
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
    stream[s] += (count[s] == 0 ? sc.fixed_us : 0) + w->BytesUs(i, sc);
    ++count[s];
    out[i] = static_cast<int32_t>(w->offset[i]);
  }
  for (uint32_t i = 0; i < m; ++i) {
    if (out[i] >= 0) continue;
    const ChainBlock& b = in.blocks[i];
    double best = kInf;
    int32_t arg = -1;
    for (size_t r = 0; r < b.replicas.size(); ++r) {
      const int s = SourceId(b.replicas[r]);
      const SourceCost& sc = w->Source(b.replicas[r]);
      const double end = stream[s] + (count[s] == 0 ? sc.fixed_us : 0) + w->BytesUs(i, sc);
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
// candidate per k and j. Stream ends only grow as blocks are added (StreamUs grows with the
// bytes), so one sweep each way carries their max.
void PriceCandidate(Work* w, uint8_t c) {
  const PlannerInput& in = *w->in;
  const uint32_t m = w->m;
  const std::vector<int32_t>& a = w->assign[c];
  // Per block: its source; per source, the bytes its stream has so far.
  std::vector<int> source(m);
  for (uint32_t i = 0; i < m; ++i) source[i] = SourceId(ReplicaAt(*w, i, a[i]));
  std::vector<double> stream(w->SourceCount(), 0);
  auto add = [&](uint32_t i) {
    const int s = source[i];
    stream[s] += static_cast<double>(in.blocks[i].bytes);
    return w->sources[static_cast<size_t>(s / 2)][s % 2].StreamUs(stream[s]);
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
    longest = std::max(longest, add(b));
    bytes += static_cast<double>(in.blocks[b].bytes);
    keep(&w->suffix_us, &w->suffix_arg, b, w->plan_fixed_us + std::max(longest, w->Shared(bytes)));
  }
  std::fill(stream.begin(), stream.end(), 0);
  longest = 0;
  bytes = 0;
  for (uint32_t i = 0; i < m; ++i) {
    longest = std::max(longest, add(i));
    bytes += static_cast<double>(in.blocks[i].bytes);
    keep(&w->prefix_us, &w->prefix_arg, i + 1,
         w->plan_fixed_us + std::max(longest, w->Shared(bytes)));
  }
}

}  // namespace

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

}  // namespace kvfabric::planner_internal
