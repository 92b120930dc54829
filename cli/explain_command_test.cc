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

TEST(ExplainCommandTest, PlanShowsFormulaTermsAndText) {
  ExplainPlanArgs args{"127.0.0.1:7450", 17, false};
  v1::ExplainResponse r;
  r.set_formula("max(t_recompute(first k), t_fetch(rest)) + t_recompute(suffix)");
  v1::ExplainTerm* t = r.add_terms();
  t->set_name("t_fetch");
  t->set_value(1234.5);
  t->set_unit("us");
  r.set_text("chose split k=3 \"because\" ...");
  const std::string text = FormatExplainPlan(args, r);
  EXPECT_NE(text.find("plan 17 on 127.0.0.1:7450"), std::string::npos) << text;
  EXPECT_NE(text.find("t_fetch = 1234.5 us"), std::string::npos) << text;
  args.json = true;
  const std::string json = FormatExplainPlan(args, r);
  EXPECT_NE(json.find("\"plan_id\":17"), std::string::npos) << json;
  EXPECT_NE(json.find("\\\"because\\\""), std::string::npos) << json;
}

TEST(ExplainCommandTest, PlanIdZeroIsRefusedBeforeAnyRpc) {
  ExplainPlanArgs args{"127.0.0.1:1", 0, false};
  EXPECT_TRUE(RunExplainPlan(args).IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric::cli
