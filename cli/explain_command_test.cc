#include "cli/explain_command.h"

#include <gtest/gtest.h>

namespace kvfabric::cli {
namespace {

v1::ExplainEvictionResponse TwoDecisions() {
  v1::ExplainEvictionResponse r;
  r.set_eviction_policy(v1::EVICTION_POLICY_COST_AWARE);
  v1::EvictionExplanation* d = r.add_decisions();
  d->set_sequence(42);
  d->set_time_us(1000);
  d->set_action("demote");
  d->set_step(2);
  d->set_rank(1);
  d->set_candidates(7);
  d->set_score(0.25);
  d->set_explanation("value = (t_recompute 900 us - t_fetch 100 us) / 65536 B");
  d = r.add_decisions();
  d->set_sequence(40);
  d->set_action("drop-host-copy");
  d->set_step(1);
  d->set_rank(3);
  d->set_candidates(3);
  d->set_explanation("host copy of an NVMe block: \"no I/O\"");
  return r;
}

TEST(ExplainCommandTest, TextListsEveryDecisionWithItsFormula) {
  ExplainEvictionArgs args{"127.0.0.1:7440", "tenant-a", std::string(64, 'a'), false};
  const std::string out = FormatExplainEviction(args, TwoDecisions());
  EXPECT_NE(out.find("namespace \"tenant-a\""), std::string::npos) << out;
  EXPECT_NE(out.find("policy cost-aware"), std::string::npos) << out;
  EXPECT_NE(out.find("#42 demote (step 2, rank 1 of 7): value = (t_recompute 900 us"),
            std::string::npos)
      << out;
  EXPECT_LT(out.find("#42"), out.find("#40")) << "newest first";
}

TEST(ExplainCommandTest, JsonEscapesExplanations) {
  ExplainEvictionArgs args{"h:1", "", std::string(64, 'b'), true};
  const std::string out = FormatExplainEviction(args, TwoDecisions());
  EXPECT_EQ(out.front(), '{');
  EXPECT_NE(out.find("\"action\":\"demote\""), std::string::npos) << out;
  EXPECT_NE(out.find("\\\"no I/O\\\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"score\":0.25"), std::string::npos) << out;
}

TEST(ExplainCommandTest, SaysSoWhenTheLogHasNothing) {
  ExplainEvictionArgs args{"h:1", "t", std::string(64, 'c'), false};
  const std::string out = FormatExplainEviction(args, v1::ExplainEvictionResponse());
  EXPECT_NE(out.find("no eviction decision"), std::string::npos) << out;
}

TEST(ExplainCommandTest, RefusesAMalformedKeyBeforeAnyRpc) {
  ExplainEvictionArgs args{"127.0.0.1:1", "t", "xyz", false};
  EXPECT_TRUE(RunExplainEviction(args).IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric::cli
