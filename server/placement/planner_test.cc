#include "server/placement/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

constexpr uint32_t kTokensPerBlock = 16;

PlannerInput Chain(uint32_t blocks, uint32_t cached, uint64_t bytes, PathParameters remote) {
  PlannerInput in;
  in.hosts.push_back({"cache-0", false, remote, {100.0, 2e9}});
  in.client_id = "client-0";
  in.host_to_device = {10.0, 25e9};
  in.recompute = {0.0, 10.0, 0.0};
  for (uint32_t i = 0; i < blocks; ++i) {
    ChainBlock b{kTokensPerBlock, uint64_t{i} * kTokensPerBlock, bytes, {}};
    if (i < cached) b.replicas.push_back({0, Tier::kHost});
    in.blocks.push_back(b);
  }
  return in;
}

double Alternative(const Plan& p, PlanKind kind) {
  for (const auto& a : p.alternatives) {
    if (a.kind == kind) return a.predicted_us;
  }
  return std::numeric_limits<double>::infinity();
}

// ---- An independent oracle: the cost model of planner.h evaluated by brute force. ----

struct OracleSource {
  double fixed = 0, per_byte = 0;
};

OracleSource SourceOf(const PlannerInput& in, const BlockReplica& r) {
  const PlannerHost& h = in.hosts[r.host_index];
  OracleSource s;
  s.fixed = h.transfer.alpha_us;
  double per_byte = 1e6 / h.transfer.beta_bytes_per_s;
  if (r.tier == Tier::kNvme) {
    s.fixed += h.nvme.alpha_us;
    per_byte = std::max(per_byte, 1e6 / h.nvme.beta_bytes_per_s);
  }
  s.per_byte = per_byte;
  return s;
}

// Fetch time of [a, b) under one assignment (choice[i - a] = replica index), no load: each
// source's stream pays its alphas once and then its blocks' bytes; the streams overlap; the
// client's ingest and host→device link carry every byte.
double OracleFetch(const PlannerInput& in, uint32_t a, uint32_t b, const std::vector<int>& choice) {
  if (a == b) return 0;
  std::map<std::pair<uint32_t, Tier>, double> stream;
  double bytes = 0;
  for (uint32_t i = a; i < b; ++i) {
    const BlockReplica& r = in.blocks[i].replicas[choice[i - a]];
    const OracleSource s = SourceOf(in, r);
    // A stream pays its source's alphas once, whatever its runs.
    auto [it, fresh] = stream.try_emplace({r.host_index, r.tier}, s.fixed);
    it->second += static_cast<double>(in.blocks[i].bytes) * s.per_byte;
    bytes += static_cast<double>(in.blocks[i].bytes);
  }
  double longest = 0;
  for (const auto& [source, t] : stream) longest = std::max(longest, t);
  const double ingest = in.client_ingest.alpha_us + bytes * 1e6 / in.client_ingest.beta_bytes_per_s;
  const double h2d = bytes * 1e6 / in.host_to_device.beta_bytes_per_s;
  return in.host_to_device.alpha_us + std::max({longest, ingest, h2d});
}

// Minimum over every replica assignment of [a, b).
double OracleBestFetch(const PlannerInput& in, uint32_t a, uint32_t b) {
  std::vector<int> choice(b - a, 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(uint32_t)> rec = [&](uint32_t i) {
    if (i == b) {
      best = std::min(best, OracleFetch(in, a, b, choice));
      return;
    }
    for (size_t r = 0; r < in.blocks[i].replicas.size(); ++r) {
      choice[i - a] = static_cast<int>(r);
      rec(i + 1);
    }
  };
  rec(a);
  return best;
}

// The best plan over every alternative and every assignment: a lower bound for the planner, whose
// choice of assignment is a heuristic (planner.h).
double OracleBest(const PlannerInput& in) {
  const uint32_t n = static_cast<uint32_t>(in.blocks.size());
  uint32_t m = 0;
  while (m < n && !in.blocks[m].replicas.empty()) ++m;
  auto tokens_before = [&](uint32_t i) { return double{kTokensPerBlock} * i; };
  const double total = tokens_before(n);
  const double s = static_cast<double>(in.suffix_tokens);
  auto rest = [&](uint32_t j) {
    return RecomputeMicros(in.recompute, total - tokens_before(j) + s, tokens_before(j));
  };
  double best = RecomputeMicros(in.recompute, total + s, 0);
  for (uint32_t j = 1; j <= m; ++j) best = std::min(best, OracleBestFetch(in, 0, j) + rest(j));
  for (uint32_t k = 1; k < m; ++k) {
    const double a = RecomputeMicros(in.recompute, tokens_before(k), 0);
    const double b = OracleBestFetch(in, k, m);
    best = std::min(best,
                    std::max(a, b) + in.recompute.split_serial_fraction * std::min(a, b) + rest(m));
  }
  return best;
}

// The plan's own prediction recomputed from its runs: the assignment they name, priced by the
// oracle's formula.
double OraclePriceOf(const PlannerInput& in, const Plan& plan) {
  const uint32_t n = static_cast<uint32_t>(in.blocks.size());
  auto tokens_before = [&](uint32_t i) { return double{kTokensPerBlock} * i; };
  const double total = tokens_before(n);
  const double s = static_cast<double>(in.suffix_tokens);
  uint32_t front = 0, first = n, end = 0;
  std::vector<int> choice(n, -1);
  for (const PlanRun& run : plan.runs) {
    if (run.action == RunAction::kRecompute) {
      if (run.first_block == 0) front = run.block_count;
      continue;
    }
    first = std::min(first, run.first_block);
    end = std::max(end, run.first_block + run.block_count);
    for (uint32_t i = run.first_block; i < run.first_block + run.block_count; ++i) {
      const auto& reps = in.blocks[i].replicas;
      for (size_t r = 0; r < reps.size(); ++r) {
        if (reps[r].host_index == run.host_index && reps[r].tier == run.tier) {
          choice[i] = static_cast<int>(r);
        }
      }
    }
  }
  if (end == 0) return RecomputeMicros(in.recompute, total + s, 0);
  const std::vector<int> sub(choice.begin() + first, choice.begin() + end);
  const double fetch = OracleFetch(in, first, end, sub);
  const double rest =
      RecomputeMicros(in.recompute, total - tokens_before(end) + s, tokens_before(end));
  if (front == 0) return fetch + rest;
  const double a = RecomputeMicros(in.recompute, tokens_before(front), 0);
  return std::max(a, fetch) + in.recompute.split_serial_fraction * std::min(a, fetch) + rest;
}

PlannerInput RandomChain(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  auto log_uniform = [&](double lo, double hi) { return lo * std::pow(hi / lo, u(rng)); };
  PlannerInput in;
  for (int h = 0; h < 3; ++h) {
    in.hosts.push_back({"cache-" + std::to_string(h),
                        u(rng) < 0.2,
                        {u(rng) * 200, log_uniform(1e9, 50e9)},
                        {u(rng) * 300, log_uniform(0.5e9, 7e9)}});
  }
  in.client_id = "client";
  in.host_to_device = {u(rng) * 20, log_uniform(10e9, 50e9)};
  if (u(rng) < 0.5) in.client_ingest = {u(rng) * 50, log_uniform(2e9, 60e9)};
  in.recompute = {u(rng) * 5000, log_uniform(1, 50), u(rng) < 0.5 ? 0.0 : log_uniform(1e-4, 1e-1),
                  u(rng) < 0.5 ? 0.0 : u(rng)};
  const uint32_t n = 1 + static_cast<uint32_t>(u(rng) * 7);
  const uint64_t bytes = static_cast<uint64_t>(log_uniform(64 << 10, 16 << 20));
  const double gap_chance = u(rng) * 0.3;
  for (uint32_t i = 0; i < n; ++i) {
    ChainBlock b{kTokensPerBlock, uint64_t{i} * kTokensPerBlock, bytes, {}};
    if (u(rng) >= gap_chance) {
      for (uint32_t h = 0; h < 3 && b.replicas.size() < 3; ++h) {
        for (Tier t : {Tier::kHost, Tier::kNvme}) {
          if (u(rng) < 0.3 && b.replicas.size() < 3) b.replicas.push_back({h, t});
        }
      }
    }
    in.blocks.push_back(b);
  }
  in.suffix_tokens = u(rng) < 0.5 ? 0 : static_cast<uint64_t>(u(rng) * 200);
  return in;
}

// The planner prices its own plan exactly (the oracle's formula over the runs it returns), is
// never better than the brute-force optimum over every assignment (a lower bound), and its two
// candidate assignments stay close to that optimum.
TEST(PlannerTest, PricesItsPlanExactlyAndStaysNearTheBruteForceOptimum) {
  std::mt19937_64 rng(TestSeed("PlannerTest.PricesItsPlanExactlyAndStaysNearTheBruteForceOptimum"));
  Planner planner(nullptr);
  int kinds[5] = {};
  double worst = 1, sum = 0;
  int above = 0;
  constexpr int kTrials = 3000;
  for (int trial = 0; trial < kTrials; ++trial) {
    const PlannerInput in = RandomChain(rng);
    auto plan = planner.MakePlan(in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const double own = OraclePriceOf(in, *plan);
    ASSERT_NEAR(plan->predicted_total_us, own, 1e-9 * own) << "trial " << trial;
    const double oracle = OracleBest(in);
    ASSERT_GE(plan->predicted_total_us, oracle * (1 - 1e-9)) << "trial " << trial;
    const double ratio = plan->predicted_total_us / oracle;
    worst = std::max(worst, ratio);
    sum += ratio;
    above += ratio > 1 + 1e-9;
    // Never slower than the better pure plan.
    EXPECT_LE(plan->predicted_total_us, std::min(Alternative(*plan, PlanKind::kRecomputeAll),
                                                 Alternative(*plan, PlanKind::kFetchAll)));
    // Runs cover every block once, in order, and fetch runs use replicas that exist.
    uint32_t next = 0;
    for (const PlanRun& run : plan->runs) {
      ASSERT_EQ(run.first_block, next);
      ASSERT_GE(run.block_count, 1u);
      next += run.block_count;
      if (run.action == RunAction::kFetch) {
        for (uint32_t i = run.first_block; i < next; ++i) {
          const auto& reps = in.blocks[i].replicas;
          EXPECT_TRUE(std::any_of(reps.begin(), reps.end(), [&](const BlockReplica& r) {
            return r.host_index == run.host_index && r.tier == run.tier;
          }));
        }
      }
      EXPECT_LE(run.predicted_start_us, run.predicted_end_us);
      EXPECT_LE(run.predicted_end_us, plan->predicted_total_us * (1 + 1e-12));
    }
    ASSERT_EQ(next, in.blocks.size());
    ++kinds[static_cast<int>(plan->kind)];
  }
  std::printf("planner / brute-force optimum over %d chains: mean %.4f, worst %.4f, %d above\n",
              kTrials, sum / kTrials, worst, above);
  // The choice of assignment is a heuristic (the optimum under a max of streams is a partition
  // problem). Over 35 seeds of 3000 chains when this was written: mean ratio <= 1.0004, at most 10
  // chains above the optimum, worst 1.66 (small chains whose runs cost mostly alphas). The bounds
  // leave room for other seeds; the exact checks above are the hard ones.
  EXPECT_LT(sum / kTrials, 1.005);
  EXPECT_LE(above, kTrials / 100);
  EXPECT_LT(worst, 2.5);
  // The random space exercises every kind, so the comparison above covered each.
  EXPECT_GT(kinds[static_cast<int>(PlanKind::kRecomputeAll)], 0);
  EXPECT_GT(kinds[static_cast<int>(PlanKind::kFetchAll)], 0);
  EXPECT_GT(kinds[static_cast<int>(PlanKind::kSplit)], 0);
  EXPECT_GT(kinds[static_cast<int>(PlanKind::kMixed)], 0);
}

TEST(PlannerTest, SplitBeatsBothPurePlansWhenFetchAndRecomputeAreComparable) {
  Planner planner(nullptr);
  auto plan = planner.MakePlan(Chain(64, 64, 1 << 20, {20.0, 6.4e9}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, PlanKind::kSplit);
  const double pure = std::min(Alternative(*plan, PlanKind::kRecomputeAll),
                               Alternative(*plan, PlanKind::kFetchAll));
  EXPECT_LT(plan->predicted_total_us, 0.6 * pure);
  ASSERT_GE(plan->runs.size(), 2u);
  EXPECT_EQ(plan->runs[0].action, RunAction::kRecompute);
  EXPECT_EQ(plan->runs[1].action, RunAction::kFetch);
  EXPECT_EQ(plan->runs[1].first_block, plan->runs[0].block_count);
}

// The same chain for an engine that takes only a loaded prefix (prefix_plans_only, vLLM's
// connector): no split is considered, and the plan's fetch runs, if any, lead the chain.
TEST(PlannerTest, PrefixPlansOnlyNeverSplitsAndFetchesALeadingPrefix) {
  Planner planner(nullptr);
  PlannerInput in = Chain(64, 64, 1 << 20, {20.0, 6.4e9});
  in.prefix_plans_only = true;
  in.include_explanation = true;
  auto plan = planner.MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->explanation.find("prefix plans only"), std::string::npos) << plan->explanation;
  EXPECT_NE(plan->kind, PlanKind::kSplit);
  for (const PlanAlternative& a : plan->alternatives) EXPECT_NE(a.kind, PlanKind::kSplit);
  bool recomputing = false;
  for (const PlanRun& r : plan->runs) {
    if (r.action == RunAction::kRecompute) recomputing = true;
    EXPECT_FALSE(recomputing && r.action == RunAction::kFetch) << "a fetch after a recompute";
  }
  const double pure = std::min(Alternative(*plan, PlanKind::kRecomputeAll),
                               Alternative(*plan, PlanKind::kFetchAll));
  EXPECT_LE(plan->predicted_total_us, pure);
}

// The same chain on a host where the prefill and the fetch share the cores (s = 1): a split
// costs both sides one after the other, so a pure plan wins, and the split alternative is
// predicted as the sum of its sides.
TEST(PlannerTest, ASerialSplitCostsBothSidesAndLosesToAPurePlan) {
  Planner planner(nullptr);
  PlannerInput in = Chain(64, 64, 1 << 20, {20.0, 6.4e9});
  in.recompute.split_serial_fraction = 1;
  in.include_explanation = true;
  auto plan = planner.MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->kind, PlanKind::kSplit);
  const PlanAlternative* split = nullptr;
  for (const PlanAlternative& a : plan->alternatives) {
    if (a.kind == PlanKind::kSplit) split = &a;
  }
  ASSERT_NE(split, nullptr);
  EXPECT_GT(split->front_us, 0);
  EXPECT_GT(split->fetch_us, 0);
  EXPECT_NEAR(split->predicted_us, split->front_us + split->fetch_us + split->rest_us,
              1e-9 * split->predicted_us);
  EXPECT_NE(plan->explanation.find("s = 1.00"), std::string::npos) << plan->explanation;
  // Half serial: between the overlapped and the serial prediction.
  in.recompute.split_serial_fraction = 0.5;
  auto half = planner.MakePlan(in);
  ASSERT_TRUE(half.ok());
  for (const PlanAlternative& a : half->alternatives) {
    if (a.kind != PlanKind::kSplit) continue;
    EXPECT_NEAR(
        a.predicted_us,
        std::max(a.front_us, a.fetch_us) + 0.5 * std::min(a.front_us, a.fetch_us) + a.rest_us,
        1e-9 * a.predicted_us);
  }
  in.recompute.split_serial_fraction = 1.5;
  auto bad = planner.MakePlan(in);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("split_serial_fraction"), std::string_view::npos);
}

// Fetching 64 MiB takes ≈2.7 ms (host→device at 25 GB/s is the bottleneck); recomputing even one
// block costs a 5 ms prefill call, so no split can help.
TEST(PlannerTest, FastFetchPathFetchesEverything) {
  Planner planner(nullptr);
  PlannerInput in = Chain(64, 64, 1 << 20, {5.0, 400e9});
  in.recompute.c0_us = 5000;
  auto plan = planner.MakePlan(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->kind, PlanKind::kFetchAll);
  ASSERT_EQ(plan->runs.size(), 1u);
  EXPECT_EQ(plan->runs[0].action, RunAction::kFetch);
}

TEST(PlannerTest, VerySlowFetchPathRecomputesEverything) {
  Planner planner(nullptr);
  auto plan = planner.MakePlan(Chain(64, 64, 1 << 20, {20.0, 0.1e9}));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->kind, PlanKind::kRecomputeAll);
  ASSERT_EQ(plan->runs.size(), 1u);
  EXPECT_EQ(plan->runs[0].action, RunAction::kRecompute);
  EXPECT_EQ(plan->runs[0].block_count, 64u);
}

TEST(PlannerTest, OnlyTheCachedPrefixIsUsedAfterAGap) {
  PlannerInput in = Chain(8, 8, 1 << 20, {5.0, 400e9});
  in.blocks[3].replicas.clear();
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->cached_prefix_blocks, 3u);
  ASSERT_EQ(plan->runs.size(), 2u);
  EXPECT_EQ(plan->runs[0].action, RunAction::kFetch);
  EXPECT_EQ(plan->runs[0].block_count, 3u);
  EXPECT_EQ(plan->runs[1].action, RunAction::kRecompute);
  EXPECT_EQ(plan->runs[1].first_block, 3u);
  EXPECT_EQ(plan->runs[1].block_count, 5u);
}

TEST(PlannerTest, ChoosesTheFasterReplicaPerBlock) {
  PlannerInput in = Chain(8, 8, 1 << 20, {20.0, 2e9});
  in.hosts.push_back({"cache-fast", false, {20.0, 40e9}, {100.0, 2e9}});
  for (uint32_t i = 4; i < 8; ++i) in.blocks[i].replicas.push_back({1, Tier::kHost});
  in.recompute = {0, 1000.0, 0};  // recompute is hopeless: fetch everything
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->runs.size(), 2u);
  EXPECT_EQ(plan->runs[0].host_index, 0u);
  EXPECT_EQ(plan->runs[0].block_count, 4u);
  EXPECT_EQ(plan->runs[1].host_index, 1u);
  EXPECT_EQ(plan->runs[1].first_block, 4u);
}

// Even blocks live only on cache-0, odd ones only on cache-1, so a fetch alternates between 8
// runs in two streams. Plans admitted before share each stream's daemon once, not once per run:
// each 4 MiB stream moves beside 10 MB (cache-0) and 5 MB (cache-1) still to move, which take
// min(r, 4 MiB) = 4 MiB from it at 1 GB/s in equal shares.
TEST(PlannerTest, AdmittedPlansShareAStreamsDaemonOnceNotOncePerRun) {
  PathLoad load;
  Planner planner(&load);
  PlannerInput in = Chain(8, 8, 1 << 20, {20.0, 1e9});
  in.hosts.push_back({"cache-1", false, {20.0, 1e9}, {100.0, 2e9}});
  for (uint32_t i = 0; i < 8; ++i) in.blocks[i].replicas = {{i % 2, Tier::kHost}};
  auto idle = planner.MakePlan(in);
  ASSERT_TRUE(idle.ok()) << idle.status();
  const uint64_t ticket = load.Admit({{BusPath::kRemoteHostToLocalHost, "cache-0", 10'000'000},
                                      {BusPath::kRemoteHostToLocalHost, "cache-1", 5'000'000}},
                                     /*now_us=*/0, /*deadline_us=*/1'000'000);
  auto busy = planner.MakePlan(in);
  ASSERT_TRUE(busy.ok()) << busy.status();
  // 4 MiB more at 1 GB/s per stream, once: 4194.304 us.
  EXPECT_NEAR(Alternative(*busy, PlanKind::kFetchAll) - Alternative(*idle, PlanKind::kFetchAll),
              4194.304, 1e-6);
  if (busy->kind == PlanKind::kFetchAll) {
    // The streams' last runs end with the fetch.
    double last = 0;
    for (const PlanRun& run : busy->runs) last = std::max(last, run.predicted_end_us);
    EXPECT_NEAR(last, busy->predicted_total_us, 1e-9 * busy->predicted_total_us);
  }
  EXPECT_TRUE(load.Release(ticket, 0));
}

// A daemon path with concurrency gain 2 carries a second load at full speed: beside one admitted
// plan, a fetch costs what it costs alone; at gain 1 it shares.
TEST(PlannerTest, APathWithAConcurrencyGainCarriesASecondPlanAtFullSpeed) {
  PathLoad load;
  Planner planner(&load);
  PlannerInput in = Chain(8, 8, 1 << 20, {20.0, 1e9});
  auto idle = planner.MakePlan(in);
  ASSERT_TRUE(idle.ok()) << idle.status();
  load.Admit({{BusPath::kRemoteHostToLocalHost, "cache-0", 100'000'000, 1e9, 2}}, 0, 1'000'000);
  in.hosts[0].transfer.concurrency_gain = 2;
  auto gained = planner.MakePlan(in);
  ASSERT_TRUE(gained.ok()) << gained.status();
  EXPECT_DOUBLE_EQ(Alternative(*gained, PlanKind::kFetchAll),
                   Alternative(*idle, PlanKind::kFetchAll));
  in.hosts[0].transfer.concurrency_gain = 1;
  auto shared = planner.MakePlan(in);
  ASSERT_TRUE(shared.ok()) << shared.status();
  // 8 MiB beside 100 MB at 1 GB/s in equal shares: twice its time alone on the wire.
  EXPECT_NEAR(Alternative(*shared, PlanKind::kFetchAll) - Alternative(*idle, PlanKind::kFetchAll),
              8.0 * (1 << 20) / 1e9 * 1e6, 1e-6);
}

// Fetch-all of `blocks` blocks of 2 MiB with every block on each of `daemons` equal daemons.
PlannerInput Replicated(uint32_t blocks, uint32_t daemons, PathParameters stream,
                        PathParameters ingest) {
  PlannerInput in = Chain(blocks, blocks, 2 << 20, stream);
  for (uint32_t d = 1; d < daemons; ++d) {
    in.hosts.push_back({"cache-" + std::to_string(d), false, stream, {100.0, 2e9}});
  }
  for (ChainBlock& b : in.blocks) {
    b.replicas.clear();
    for (uint32_t d = 0; d < daemons; ++d) b.replicas.push_back({d, Tier::kHost});
  }
  in.host_to_device = {10.0, 100e9};
  in.client_ingest = ingest;
  in.recompute = {0, 1000.0, 0};  // recompute is hopeless: fetch everything
  return in;
}

// Two daemons' streams run side by side: with each stream limited by its daemon (an ingest that
// can take both), blocks held by both are spread over them and the fetch takes about half as
// long as from one; with the client's ingest no faster than one stream, two daemons predict no
// gain, and the explanation says which limit applies.
TEST(PlannerTest, StreamsFromTwoDaemonsOverlapUnlessTheClientsIngestIsTheLimit) {
  Planner planner(nullptr);
  const PathParameters stream{30.0, 5e9};
  for (bool ingest_bound : {false, true}) {
    SCOPED_TRACE(ingest_bound ? "ingest-bound" : "stream-bound");
    const PathParameters ingest =
        ingest_bound ? PathParameters{0.0, 5e9} : PathParameters{0.0, 20e9};
    auto one = planner.MakePlan(Replicated(32, 1, stream, ingest));
    PlannerInput two_in = Replicated(32, 2, stream, ingest);
    two_in.include_explanation = true;
    auto two = planner.MakePlan(two_in);
    ASSERT_TRUE(one.ok() && two.ok());
    ASSERT_EQ(one->kind, PlanKind::kFetchAll);
    ASSERT_EQ(two->kind, PlanKind::kFetchAll);
    const double bytes = 32.0 * (2 << 20);
    // One daemon: its stream, 64 MiB at 5 GB/s (the ingest is no tighter).
    EXPECT_NEAR(one->predicted_total_us, 10 + 30 + bytes / 5e9 * 1e6, 1e-6);
    uint64_t on[2] = {};
    for (const PlanRun& run : two->runs) on[run.host_index] += run.payload_bytes;
    EXPECT_EQ(on[0] + on[1], static_cast<uint64_t>(bytes));
    if (ingest_bound) {
      // Every byte crosses the 5 GB/s ingest: no faster than one daemon.
      EXPECT_NEAR(two->predicted_total_us, 10 + bytes / 5e9 * 1e6, 1e-6);
      EXPECT_NE(two->explanation.find("the client's ingest or host→device is the limit"),
                std::string::npos)
          << two->explanation;
    } else {
      // Half each (the balanced assignment), each stream paying its alpha once.
      EXPECT_EQ(on[0], on[1]);
      EXPECT_LT(two->predicted_total_us, 0.55 * one->predicted_total_us);
      EXPECT_NE(two->explanation.find("assignment), streams: cache-0/host ends"), std::string::npos)
          << two->explanation;
      EXPECT_NE(two->explanation.find("the latest stream is the limit"), std::string::npos)
          << two->explanation;
    }
    // Runs of one daemon follow each other; the two daemons' runs overlap in time.
    double end[2] = {};
    for (const PlanRun& run : two->runs) {
      EXPECT_GE(run.predicted_start_us + 1e-9, end[run.host_index] == 0 ? 10 : end[run.host_index]);
      end[run.host_index] = run.predicted_end_us;
    }
  }
}

// A daemon whose stream is 4x slower gets about a fifth of the blocks both hold, and the plan is
// faster than fetching everything from the fast one alone.
TEST(PlannerTest, ASlowDaemonGetsItsShareOfTheBlocks) {
  PlannerInput in = Replicated(40, 2, {30.0, 8e9}, {0.0, 100e9});
  in.hosts[1].transfer = {30.0, 2e9};
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok());
  uint64_t on[2] = {};
  for (const PlanRun& run : plan->runs) on[run.host_index] += run.payload_bytes;
  const double slow_share = static_cast<double>(on[1]) / static_cast<double>(on[0] + on[1]);
  EXPECT_GT(slow_share, 0.1);
  EXPECT_LT(slow_share, 0.3);
  const double fast_alone = 10 + 30 + 40.0 * (2 << 20) / 8e9 * 1e6;
  EXPECT_LT(plan->predicted_total_us, 0.9 * fast_alone);
}

TEST(PlannerTest, AdmittedLoadSlowsTheNextPlanUntilReleased) {
  PathLoad load;
  Planner planner(&load);
  const PlannerInput in = Chain(64, 64, 1 << 20, {20.0, 6.4e9});
  auto first = planner.MakePlan(in);
  ASSERT_TRUE(first.ok());
  ASSERT_FALSE(first->charges.empty());
  const uint64_t ticket = load.Admit(first->charges, /*now_us=*/0, /*deadline_us=*/1000);
  EXPECT_GT(load.QueuedBytes(BusPath::kRemoteHostToLocalHost, "cache-0", 0), 0u);
  EXPECT_GT(load.QueuedBytes(BusPath::kHostToDevice, "client-0", 0), 0u);
  auto second = planner.MakePlan(in);
  ASSERT_TRUE(second.ok());
  EXPECT_GT(second->predicted_total_us, first->predicted_total_us);
  EXPECT_GT(Alternative(*second, PlanKind::kFetchAll), Alternative(*first, PlanKind::kFetchAll));
  // With the path busy, the second plan recomputes more of the front.
  ASSERT_EQ(second->kind, PlanKind::kSplit);
  EXPECT_GT(second->alternatives[2].split_blocks, first->alternatives[2].split_blocks);
  EXPECT_TRUE(load.Release(ticket, 0));
  EXPECT_FALSE(load.Release(ticket, 0));
  EXPECT_EQ(load.QueuedBytes(BusPath::kRemoteHostToLocalHost, "cache-0", 0), 0u);
  auto third = planner.MakePlan(in);
  ASSERT_TRUE(third.ok());
  EXPECT_DOUBLE_EQ(third->predicted_total_us, first->predicted_total_us);
}

TEST(PlannerTest, ExplanationCarriesTheNumbers) {
  PlannerInput in = Chain(64, 64, 1 << 20, {20.0, 6.4e9});
  in.include_explanation = true;
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok());
  const std::string& x = plan->explanation;
  EXPECT_NE(x.find("cached prefix 64 blocks"), std::string::npos) << x;
  EXPECT_NE(x.find("t_recompute(n=1024, p=0) = 0 µs + 1024 × 10.0 µs"), std::string::npos) << x;
  EXPECT_NE(x.find("6.40 GB/s"), std::string::npos) << x;
  EXPECT_NE(x.find("cache-0"), std::string::npos) << x;
  EXPECT_NE(x.find("chosen: split " + FormatMicros(plan->predicted_total_us)), std::string::npos)
      << x;
  EXPECT_TRUE(Planner(nullptr).MakePlan(Chain(4, 4, 1, {1, 1e9}))->explanation.empty());
}

TEST(PlannerTest, ExplanationRespectsItsCap) {
  // Alternate hosts so that every block is its own run.
  PlannerInput in = Chain(2048, 2048, 1 << 20, {20.0, 400e9});
  in.hosts.push_back(in.hosts[0]);
  in.hosts[1].host_id = "cache-1";
  for (uint32_t i = 1; i < 2048; i += 2) in.blocks[i].replicas[0].host_index = 1;
  in.include_explanation = true;
  in.max_explanation_bytes = 4096;
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_LE(plan->explanation.size(), 4096u);
  EXPECT_NE(plan->explanation.find("more runs"), std::string::npos);
}

TEST(PlannerTest, RejectsMalformedInputNamingTheField) {
  Planner planner(nullptr);
  PlannerInput in = Chain(4, 4, 1 << 20, {20.0, 6.4e9});
  in.blocks[2].prefix_tokens = 5;
  auto plan = planner.MakePlan(in);
  ASSERT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("blocks[2].prefix_tokens"), std::string_view::npos);

  in = Chain(4, 4, 1 << 20, {20.0, 6.4e9});
  in.blocks[1].replicas.push_back({7, Tier::kHost});
  EXPECT_NE(planner.MakePlan(in).status().message().find("blocks[1].replicas[1].host_index"),
            std::string_view::npos);
  in = Chain(4, 4, 1 << 20, {20.0, 6.4e9});
  in.blocks[1].replicas.push_back({0, Tier::kHost});
  EXPECT_NE(planner.MakePlan(in).status().message().find("repeats"), std::string_view::npos);
  in = Chain(4, 4, 1 << 20, {20.0, 0.0});
  EXPECT_EQ(planner.MakePlan(in).status().code(), StatusCode::kInvalidArgument);
  in.blocks.clear();
  EXPECT_EQ(planner.MakePlan(in).status().code(), StatusCode::kInvalidArgument);
}

// ---- Representations (planner.h REPRESENTATIONS) ----

// Every block cached exact on cache-0 and compact (0.56x its bytes) on cache-0 too.
PlannerInput WithCompactCopies(PlannerInput in, double penalty_us) {
  for (ChainBlock& b : in.blocks) {
    b.compact_bytes = b.bytes * 9 / 16;
    b.compact_replicas.push_back({0, Tier::kHost});
    b.compact_penalty_us = penalty_us;
  }
  return in;
}

int CompactRuns(const Plan& p) {
  return static_cast<int>(
      std::count_if(p.runs.begin(), p.runs.end(), [](const PlanRun& r) { return r.compact; }));
}

TEST(PlannerTest, NoCompactCopyOfferedPlansExactOnly) {
  const PlannerInput in = Chain(8, 8, 1 << 20, {20.0, 1e8});
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->representation, RepresentationChoice::kExact);
  ASSERT_EQ(plan->representation_totals.size(), 1u);
  EXPECT_EQ(CompactRuns(*plan), 0);
  EXPECT_EQ(plan->compact_blocks, 0u);
}

TEST(PlannerTest, CompactCopiesWinOnASlowBusWhenTheirDecodeCostIsSmall) {
  // 100 MB/s: a 1 MiB block takes 10.5 ms to fetch, its copy 5.9 ms; recompute at 100 ms per
  // token makes fetching everything the plan either way.
  PlannerInput exact_in = Chain(8, 8, 1 << 20, {20.0, 1e8});
  exact_in.recompute = {0.0, 1e5, 0.0};
  auto exact = Planner(nullptr).MakePlan(exact_in);
  ASSERT_TRUE(exact.ok());
  ASSERT_EQ(exact->kind, PlanKind::kFetchAll);
  PlannerInput in = WithCompactCopies(exact_in, 100.0);
  in.include_explanation = true;
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->representation, RepresentationChoice::kCompact);
  ASSERT_EQ(plan->representation_totals.size(), 2u);  // exact, compact (nothing is gone)
  EXPECT_LT(plan->representation_totals[1].second, plan->representation_totals[0].second);
  EXPECT_EQ(plan->compact_blocks, 8u);
  EXPECT_DOUBLE_EQ(plan->compact_penalty_us, 800.0);
  uint64_t bytes = 0;
  for (const PlanRun& r : plan->runs) {
    if (r.action != RunAction::kFetch) continue;
    EXPECT_TRUE(r.compact);
    bytes += r.payload_bytes;
  }
  EXPECT_EQ(bytes, 8u * ((1u << 20) * 9 / 16));
  // The load is predicted faster; its total excludes the decode penalty.
  EXPECT_LT(plan->predicted_total_us, exact->predicted_total_us);
  EXPECT_NE(plan->explanation.find("*compact"), std::string::npos) << plan->explanation;
  EXPECT_NE(plan->explanation.find("compact from cache-0"), std::string::npos);
  EXPECT_NE(plan->explanation.find("decode penalty"), std::string::npos);
}

TEST(PlannerTest, ADecodePenaltyLargerThanTheBytesSavedKeepsExact) {
  PlannerInput in = WithCompactCopies(Chain(8, 8, 1 << 20, {20.0, 1e8}), 1e6);
  in.recompute = {0.0, 1000.0, 0.0};
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->representation, RepresentationChoice::kExact);
  EXPECT_EQ(CompactRuns(*plan), 0);
  EXPECT_EQ(plan->compact_penalty_us, 0.0);
}

TEST(PlannerTest, CompactCopiesOfBlocksWithoutAnExactCopyExtendTheCachedPrefix) {
  // Blocks 4..7 lost their exact copies (eviction kept the compact ones); recompute is dear.
  PlannerInput in = Chain(8, 4, 1 << 20, {20.0, 6.4e9});
  in.recompute = {0.0, 1000.0, 0.0};
  for (uint32_t i = 0; i < 8; ++i) {
    in.blocks[i].compact_bytes = (1u << 20) * 9 / 16;
    in.blocks[i].compact_replicas.push_back({0, Tier::kHost});
    in.blocks[i].compact_penalty_us = 50.0;  // each compact block: 50 µs of decode
  }
  auto plan = Planner(nullptr).MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // On a fast bus the bytes saved on blocks 0..3 (~74 µs each way) do not pay 50 µs each of
  // decode plus... whichever wins, blocks 4..7 are fetched compact and nothing is recomputed.
  EXPECT_NE(plan->representation, RepresentationChoice::kExact);
  EXPECT_EQ(plan->cached_prefix_blocks, 8u);
  for (const PlanRun& r : plan->runs) {
    ASSERT_EQ(r.action, RunAction::kFetch);
    if (r.first_block >= 4) EXPECT_TRUE(r.compact);
  }
  // Runs are cut where the representation changes, even on one source.
  if (plan->representation == RepresentationChoice::kCompactWhereGone) {
    ASSERT_EQ(plan->runs.size(), 2u);
    EXPECT_FALSE(plan->runs[0].compact);
    EXPECT_EQ(plan->runs[1].first_block, 4u);
  }
  ASSERT_EQ(plan->representation_totals.size(), 3u);
  EXPECT_EQ(plan->representation_totals[1].first, RepresentationChoice::kCompactWhereGone);
}

TEST(PlannerTest, RejectsMalformedCompactCopies) {
  Planner planner(nullptr);
  PlannerInput in = WithCompactCopies(Chain(4, 4, 1 << 20, {20.0, 6.4e9}), 1.0);
  in.blocks[2].compact_bytes = 0;
  EXPECT_NE(planner.MakePlan(in).status().message().find("blocks[2].compact_bytes"),
            std::string_view::npos);
  in = WithCompactCopies(Chain(4, 4, 1 << 20, {20.0, 6.4e9}), 1.0);
  in.blocks[1].compact_penalty_us = -1;
  EXPECT_NE(planner.MakePlan(in).status().message().find("blocks[1].compact_penalty_us"),
            std::string_view::npos);
  in = WithCompactCopies(Chain(4, 4, 1 << 20, {20.0, 6.4e9}), 1.0);
  in.blocks[3].compact_replicas.push_back({5, Tier::kHost});
  EXPECT_NE(planner.MakePlan(in).status().message().find("blocks[3].compact_replicas[1]"),
            std::string_view::npos);
}

}  // namespace
}  // namespace kvfabric
