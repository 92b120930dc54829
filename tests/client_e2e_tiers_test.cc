// The client end to end (tests/client_e2e_fixture.h) where a tier or a link
// misbehaves: a stream far past its prediction is cut and its blocks fall
// back; a split's late streams are reported as their paths'; daemons over
// NVMe tiers serve both fetch paths.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

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

// A split's streams move while its front is prefilled and are reported
// beside_prefill: placement leaves them out of the paths' fits. A prefill
// can have taken at most its own time from a stream, so a stream that ended
// later past its predicted end than the load's prefills ran is reported as
// the path's. Here the front is block 0 alone (a fraction of a millisecond)
// and the streams move every other block: predicted to end far in the
// future, they did not miss (nothing scored); predicted to end after 1 µs,
// they missed by far more than the prefill took (scored out of sample).
class ClientEndToEndSplitTest : public ClientEndToEndTest {
 protected:
  void SetUp() override {
    // A prefill stated far slower than any fetch: placement plans fetch-all, and the test makes
    // the split itself (block 0 prefilled; the real prefill takes 20 µs per token).
    stated_prefill_ = RecomputeParameters{1e5, 1e4, 0};
    ClientEndToEndTest::SetUp();
  }
};

TEST_F(ClientEndToEndSplitTest, ASplitsStreamsAreThePathsWhenTheirMissOutlastsThePrefill) {
  ASSERT_NO_FATAL_FAILURE(MakeChain());
  ASSERT_NO_FATAL_FAILURE(PrefillAndSave());
  const auto as_split = [](double predicted_end_us) {
    return [predicted_end_us](client::MatchResult* m) {
      for (auto& run : m->runs) {
        if (run.fetch) run.predicted_end_us = predicted_end_us;
      }
      if (m->runs.empty() || !m->runs.front().fetch || m->runs.front().first_block != 0) return;
      client::MatchResult::Run front;  // a recompute run
      front.first_block = 0;
      front.block_count = 1;
      m->runs.front().first_block = 1;
      if (--m->runs.front().block_count == 0) m->runs.erase(m->runs.begin());
      m->runs.insert(m->runs.begin(), front);
      m->kind = "split";
    };
  };
  const auto path_lines = [this](const ContextReport& r) {
    std::set<std::string> sources;
    for (const client::RunOutcome& run : r.runs) {
      if (run.fetch) sources.insert(run.host_id);
    }
    const std::string text = ExplainFreshPlan();
    std::vector<std::string> lines;
    for (const std::string& host : sources) {
      std::string l = InputLine(text, "remote→local " + host + ":");
      if (l.empty()) l = InputLine(text, "memcpy " + host + ":");
      lines.push_back(l.empty() ? "no line for " + host + " in:\n" + text : l);
    }
    return lines;
  };
  const ContextReport explained = LoadAndCheck("split, on time", as_split(1e12));
  ASSERT_EQ(explained.runs.front().fetch, false);
  ASSERT_EQ(explained.runs.front().block_count, 1u);
  ASSERT_GT(explained.blocks_fetched, 0u);
  for (const std::string& l : path_lines(explained)) {
    EXPECT_NE(l.find("not scored yet"), std::string::npos) << l;
  }
  const ContextReport late = LoadAndCheck("split, late", as_split(1.0));
  ASSERT_GT(late.blocks_fetched, 0u);
  for (const std::string& l : path_lines(late)) {
    EXPECT_NE(l.find("out-of-sample error"), std::string::npos) << l;
  }
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
