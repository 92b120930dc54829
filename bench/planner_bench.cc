// planner_bench: kvfabric's fetch-or-recompute plans against always-fetch, always-recompute and
// an oracle, on a synthetic trace; and planner throughput on 2,048-block chains.
//
// Trace: 10,000 requests over 200 shared prefixes (documents), chains of 64..2,048 blocks of 16
// tokens (long histories), a cached prefix of 0..100% of the chain, each cached block on 1-2 of
// 4 daemons, on the host or the NVMe tier; daemon 3's transport is slow (0.3 GB/s).
// Ground truth: a fixed model. kvfabric plans with a *fitted* model: the truth with every
// parameter perturbed by 5% Gaussian noise. "Executed" time = the chosen plan's runs timed
// under the ground truth. Oracle = planning with the ground truth itself. Always-fetch = the
// fetch-all alternative under the truth (with the truth-optimal replicas: favours the baseline);
// always-recompute = recompute-all under the truth. No load accounting (requests independent).
//
// Usage: planner_bench [seed]. Prints a table; not a test (no assertions).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "server/placement/planner.h"

namespace kvfabric {
namespace {

constexpr uint32_t kTokens = 16;
constexpr uint64_t kBlockBytes = 2 << 20;  // e.g. 8B model, 32 layers, 8 KV heads, fp16

PlannerInput TruthModel() {
  PlannerInput in;
  for (int h = 0; h < 4; ++h) {
    in.hosts.push_back({"cache-" + std::to_string(h),
                        false,
                        {25.0, h == 3 ? 0.3e9 : 12e9},  // remote→local
                        {90.0, 2.0e9}});                // nvme→host
  }
  in.client_id = "client";
  in.host_to_device = {10.0, 25e9};
  in.recompute = {15000.0, 40.0, 0.0004};  // ≈ an 8B model on one GPU, µs
  return in;
}

PlannerInput Perturb(const PlannerInput& truth, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, 0.05);
  auto p = [&](double v) { return v * std::max(0.5, 1 + n(rng)); };
  PlannerInput f = truth;
  for (auto& h : f.hosts) {
    h.transfer = {p(h.transfer.alpha_us), p(h.transfer.beta_bytes_per_s)};
    h.nvme = {p(h.nvme.alpha_us), p(h.nvme.beta_bytes_per_s)};
  }
  f.host_to_device = {p(f.host_to_device.alpha_us), p(f.host_to_device.beta_bytes_per_s)};
  f.recompute = {p(f.recompute.c0_us), p(f.recompute.c1_us_per_token),
                 p(f.recompute.c2_us_per_token2)};
  return f;
}

// Time of `plan`'s runs under the model in `truth` (same chain).
double Executed(const Plan& plan, const PlannerInput& truth) {
  const auto& blocks = truth.blocks;
  const uint64_t total = blocks.back().prefix_tokens + blocks.back().tokens;
  auto rec = [&](uint64_t n, uint64_t p) {
    return RecomputeMicros(truth.recompute, static_cast<double>(n), static_cast<double>(p));
  };
  // The FETCH MODEL of server/placement/planner.h under the true parameters: one stream per
  // source (its runs one after another), the streams side by side, every byte through the
  // client's ingest and host->device link.
  std::map<std::pair<uint32_t, Tier>, double> streams;
  double front = 0, bytes = 0;
  uint32_t fetched_end = 0;
  for (const PlanRun& r : plan.runs) {
    if (r.action == RunAction::kFetch) {
      const PlannerHost& h = truth.hosts[r.host_index];
      double fixed = h.transfer.alpha_us;
      double per_byte = 1e6 / h.transfer.beta_bytes_per_s;
      if (r.tier == Tier::kNvme) {
        fixed += h.nvme.alpha_us;
        per_byte = std::max(per_byte, 1e6 / h.nvme.beta_bytes_per_s);
      }
      streams[{r.host_index, r.tier}] += fixed + static_cast<double>(r.payload_bytes) * per_byte;
      bytes += static_cast<double>(r.payload_bytes);
      fetched_end = r.first_block + r.block_count;
    } else if (r.first_block == 0 && plan.kind == PlanKind::kSplit) {
      front = rec(uint64_t{r.block_count} * kTokens, 0);
    }
  }
  double fetch = 0;
  if (bytes > 0) {
    for (const auto& [source, t] : streams) fetch = std::max(fetch, t);
    fetch = std::max(
        {fetch, truth.client_ingest.alpha_us + bytes * 1e6 / truth.client_ingest.beta_bytes_per_s,
         bytes * 1e6 / truth.host_to_device.beta_bytes_per_s});
    fetch += truth.host_to_device.alpha_us;
  }
  if (plan.kind == PlanKind::kRecomputeAll) return rec(total + truth.suffix_tokens, 0);
  const uint64_t p = fetched_end < blocks.size() ? blocks[fetched_end].prefix_tokens : total;
  return std::max(front, fetch) + rec(total - p + truth.suffix_tokens, p);
}

int Main(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  const PlannerInput truth_model = TruthModel();
  const PlannerInput fitted_model = Perturb(truth_model, rng);
  Planner planner(nullptr);

  // 200 documents: for each, the replica layout of its blocks (shared by every request on it).
  struct Doc {
    std::vector<std::vector<BlockReplica>> replicas;
  };
  std::vector<Doc> docs(200);
  for (Doc& d : docs) {
    d.replicas.resize(2048);
    const double nvme_share = u(rng);
    for (auto& reps : d.replicas) {
      const uint32_t h = static_cast<uint32_t>(u(rng) * 4);
      reps.push_back({h, u(rng) < nvme_share ? Tier::kNvme : Tier::kHost});
      if (u(rng) < 0.3) reps.push_back({(h + 1) % 4, Tier::kHost});
    }
  }
  double sum_kvf = 0, sum_fetch = 0, sum_recompute = 0, sum_oracle = 0, sum_predicted = 0;
  int kinds[5] = {};
  for (int req = 0; req < 10000; ++req) {
    const Doc& d = docs[static_cast<size_t>(u(rng) * docs.size())];
    const uint32_t n = 64 + static_cast<uint32_t>(u(rng) * (2048 - 64));
    const uint32_t cached = static_cast<uint32_t>(u(rng) * 1.1 * n);
    PlannerInput truth = truth_model;
    for (uint32_t i = 0; i < n; ++i) {
      truth.blocks.push_back({kTokens, uint64_t{i} * kTokens, kBlockBytes,
                              i < cached ? d.replicas[i] : std::vector<BlockReplica>{}});
    }
    truth.suffix_tokens = static_cast<uint64_t>(u(rng) * 512);
    PlannerInput fitted = fitted_model;
    fitted.blocks = truth.blocks;
    fitted.suffix_tokens = truth.suffix_tokens;
    auto plan = planner.MakePlan(fitted);
    auto oracle = planner.MakePlan(truth);
    if (!plan.ok() || !oracle.ok()) {
      std::fprintf(stderr, "plan failed: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    ++kinds[static_cast<int>(plan->kind)];
    sum_predicted += plan->predicted_total_us;
    sum_kvf += Executed(*plan, truth);
    sum_oracle += oracle->predicted_total_us;
    double fetch_all = 0;
    for (const auto& a : oracle->alternatives) {
      if (a.kind == PlanKind::kRecomputeAll) sum_recompute += a.predicted_us;
      if (a.kind == PlanKind::kFetchAll) fetch_all = a.predicted_us;
    }
    sum_fetch += fetch_all > 0 ? fetch_all : oracle->alternatives[0].predicted_us;
  }
  std::printf("planner_bench (seed %llu): 10,000 requests, 64..2048 blocks of 16 tokens, 2 MiB\n",
              static_cast<unsigned long long>(seed));
  std::printf("%-28s %14s %14s\n", "policy", "total (s)", "vs oracle");
  auto row = [&](const char* name, double us) {
    std::printf("%-28s %14.2f %14.3f\n", name, us / 1e6, us / sum_oracle);
  };
  row("oracle (true model)", sum_oracle);
  row("kvfabric (executed)", sum_kvf);
  row("kvfabric (predicted)", sum_predicted);
  row("always fetch cached prefix", sum_fetch);
  row("always recompute", sum_recompute);
  std::printf("kvfabric plans: recompute-all %d, fetch-all %d, split %d, fetch-prefix %d\n",
              kinds[1], kinds[2], kinds[3], kinds[4]);

  // Throughput: fully cached 2,048-block chains, two replicas each, no explanation.
  PlannerInput big = fitted_model;
  for (uint32_t i = 0; i < 2048; ++i) {
    big.blocks.push_back({kTokens, uint64_t{i} * kTokens, kBlockBytes, docs[0].replicas[i]});
  }
  int plans = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  double sink = 0;
  while (elapsed < 1.0) {
    for (int i = 0; i < 100; ++i) sink += planner.MakePlan(big)->predicted_total_us;
    plans += 100;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("throughput: %.0f plans/s on 2048-block chains (%.1f µs/plan; checksum %.3g)\n",
              plans / elapsed, elapsed / plans * 1e6, sink);
  return 0;
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  return kvfabric::Main(seed);
}
