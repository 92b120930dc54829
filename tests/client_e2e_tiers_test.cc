// The client end to end (tests/client_e2e_fixture.h) where a tier or a link
// misbehaves: a stream far past its prediction is cut and its blocks fall
// back; daemons over NVMe tiers serve both fetch paths.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>

#include "tests/client_e2e_fixture.h"

namespace kvfabric {
namespace {

class ClientEndToEndStragglerTest : public ClientEndToEndTest {
 protected:
  void SetUp() override {
    straggler_factor_ = 1.5;
    straggler_slack_ = std::chrono::milliseconds(0);
    ClientEndToEndTest::SetUp();
  }
};

// A plan whose streams were predicted to end after 1 µs: each stream is past
// its cut-off before (or soon after) its first requests and starts no more,
// and the blocks it did not land fall back (another replica, else
// recompute). The engine still sees every byte exactly.
TEST_F(ClientEndToEndStragglerTest, AStreamFarPastItsPredictionIsCutAndItsBlocksFallBackExactly) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());
  const ContextReport r = LoadAndCheck("cut", [](client::MatchResult* m) {
    for (auto& run : m->runs) {
      if (run.fetch) run.predicted_end_us = 1.0;
    }
  });
  std::uint32_t fetched_as_planned = 0, fell_back = 0;
  bool cut = false;
  for (const client::RunOutcome& run : r.runs) {
    if (!run.fetch) continue;
    fell_back += run.blocks_from_fallback_host + run.blocks_recomputed_after_failure;
    cut = cut || run.failure.find("stream cut after") != std::string::npos;
  }
  fetched_as_planned = r.blocks_fetched;
  std::printf("cut streams: %u blocks fetched, %u fell back\n", fetched_as_planned, fell_back);
  EXPECT_TRUE(cut);
  EXPECT_GT(fell_back, 0u);
  EXPECT_EQ(r.blocks_fetched + r.blocks_recomputed, chain_.size());
  // A plan without predictions is never cut.
  const ContextReport whole = LoadAndCheck("no predictions", [](client::MatchResult* m) {
    for (auto& run : m->runs) run.predicted_end_us = 0;
  });
  for (const client::RunOutcome& run : whole.runs) EXPECT_EQ(run.failure, "");
}

// Daemons whose host pools hold only part of what they are sent: the rest
// is demoted to NVMe. A load fetches the host-resident blocks by key over the
// data plane (kFetch) and the NVMe-only ones through the control plane's
// Lease, which stages them; the history is exact either way.
class ClientEndToEndNvmeTest : public ClientEndToEndTest {
 protected:
  void SetUp() override {
    // A prefill stated far slower than any fetch here: every plan fetches the whole prefix, so
    // its streams ran alone and are observed (a split's are not: beside_prefill).
    stated_prefill_ = RecomputeParameters{1e5, 1e4, 0};
    ClientEndToEndTest::SetUp();
  }
  std::vector<std::string> PoolFlags(int i) override {
    return {"--host-pool-bytes=8MiB",      "--nvme-dir=" + dir_ + "/nvme-" + std::to_string(i),
            "--nvme-capacity-bytes=64MiB", "--nvme-segment-bytes=32MiB",
            "--nvme-io-engine=threads",    "--eviction-policy=lru"};
  }
};

TEST_F(ClientEndToEndNvmeTest, LoadsHostAndNvmeBlocksExactly) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());
  const ContextReport r = LoadAndCheck("host and NVMe");
  std::printf("fetched %u blocks: %llu bytes from host pools, %llu from NVMe\n", r.blocks_fetched,
              static_cast<unsigned long long>(r.fetch_from_host_tier_bytes),
              static_cast<unsigned long long>(r.fetch_from_nvme_tier_bytes));
  EXPECT_GT(r.fetch_from_host_tier_bytes, 0u);
  EXPECT_GT(r.fetch_from_nvme_tier_bytes, 0u);
  EXPECT_EQ(r.fetch_from_host_tier_bytes + r.fetch_from_nvme_tier_bytes, r.bytes_fetched);
  EXPECT_EQ(client_->metrics().crc_failures, 0u);
  // Placement prices a daemon's NVMe tier as a source of its own
  // (planner.h, FETCH MODEL); the client reports what each tier delivered
  // under its own path, so the NVMe runs taught placement nvme→host for
  // their daemon (scored out of sample), and the host-pool runs remote→local.
  std::set<std::string> nvme_sources, host_sources;
  for (const client::RunOutcome& run : r.runs) {
    if (run.fetch) (run.tier == "nvme" ? nvme_sources : host_sources).insert(run.host_id);
  }
  ASSERT_FALSE(nvme_sources.empty()) << "no run planned on NVMe";
  const std::string text = ExplainFreshPlan();
  for (const std::string& host : nvme_sources) {
    const std::string l = InputLine(text, "nvme→host " + host + ":");
    EXPECT_NE(l.find("out-of-sample error"), std::string::npos) << l << "\n" << text;
    std::printf("placement: %s\n", l.c_str());
  }
  for (const std::string& host : host_sources) {
    const std::string l = InputLine(text, "remote→local " + host + ":");
    EXPECT_NE(l.find("out-of-sample error"), std::string::npos) << l << "\n" << text;
  }
}

}  // namespace
}  // namespace kvfabric
