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

ExplainEvictionArgs EvictionArgs(std::string host, std::string tenant, std::string key, bool json) {
  ExplainEvictionArgs a;
  a.cache_host = std::move(host);
  a.tenant = std::move(tenant);
  a.key_hex = std::move(key);
  a.json = json;
  return a;
}

TEST(ExplainCommandTest, TextListsEveryDecisionWithItsFormula) {
  ExplainEvictionArgs args =
      EvictionArgs("127.0.0.1:7440", "tenant-a", std::string(64, 'a'), false);
  const std::string out = FormatExplainEviction(args, TwoDecisions());
  EXPECT_NE(out.find("namespace \"tenant-a\""), std::string::npos) << out;
  EXPECT_NE(out.find("policy cost-aware"), std::string::npos) << out;
  EXPECT_NE(out.find("#42 demote (step 2, rank 1 of 7): value = (t_recompute 900 us"),
            std::string::npos)
      << out;
  EXPECT_LT(out.find("#42"), out.find("#40")) << "newest first";
}

TEST(ExplainCommandTest, JsonEscapesExplanations) {
  ExplainEvictionArgs args = EvictionArgs("h:1", "", std::string(64, 'b'), true);
  const std::string out = FormatExplainEviction(args, TwoDecisions());
  EXPECT_EQ(out.front(), '{');
  EXPECT_NE(out.find("\"action\":\"demote\""), std::string::npos) << out;
  EXPECT_NE(out.find("\\\"no I/O\\\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"score\":0.25"), std::string::npos) << out;
}

TEST(ExplainCommandTest, SaysSoWhenTheLogHasNothing) {
  ExplainEvictionArgs args = EvictionArgs("h:1", "t", std::string(64, 'c'), false);
  const std::string out = FormatExplainEviction(args, v1::ExplainEvictionResponse());
  EXPECT_NE(out.find("no eviction decision"), std::string::npos) << out;
}

TEST(ExplainCommandTest, RefusesAMalformedKeyBeforeAnyRpc) {
  ExplainEvictionArgs args = EvictionArgs("127.0.0.1:1", "t", "xyz", false);
  EXPECT_TRUE(RunExplainEviction(args).IsInvalidArgument());
}

TEST(ExplainCommandTest, PlanShowsFormulaTermsAndText) {
  ExplainPlanArgs args;
  args.placement = "127.0.0.1:7450";
  args.plan_id = 17;
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

TEST(ExplainCommandTest, RecentEvictionsListKeysAndExplanationsNewestFirst) {
  ExplainEvictionArgs args = EvictionArgs("127.0.0.1:7441", "", "", false);
  args.all_namespaces = true;
  v1::ListEvictionsResponse r;
  r.set_eviction_policy(v1::EVICTION_POLICY_LRU);
  r.set_log_capacity(4096);
  v1::ListedEviction* e = r.add_decisions();
  e->set_namespace_("tenant-b");
  e->set_key(std::string(32, '\x01'));
  e->set_pages(2);
  e->mutable_decision()->set_sequence(9);
  e->mutable_decision()->set_action("evict");
  e->mutable_decision()->set_explanation("lru: last access 12 s ago");
  const std::string out = FormatEvictionList(args, r);
  EXPECT_NE(out.find("every namespace"), std::string::npos) << out;
  EXPECT_NE(out.find("policy lru"), std::string::npos) << out;
  EXPECT_NE(out.find("last 4096 of all namespaces (--eviction-log-capacity)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("#9 evict"), std::string::npos) << out;
  EXPECT_NE(out.find("namespace \"tenant-b\""), std::string::npos) << out;
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "01";
  EXPECT_NE(out.find("key " + hex), std::string::npos) << out;
  EXPECT_NE(out.find("lru: last access 12 s ago"), std::string::npos) << out;
  args.json = true;
  const std::string json = FormatEvictionList(args, r);
  EXPECT_NE(json.find("\"key\":\"" + hex + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"pages\":2"), std::string::npos) << json;
  args.json = false;
  EXPECT_NE(FormatEvictionList(args, v1::ListEvictionsResponse()).find("none in the log"),
            std::string::npos);
}

TEST(ExplainCommandTest, RecentPlansShowKindAgeAndObservedOverPredicted) {
  ExplainPlanArgs args;
  args.placement = "127.0.0.1:7450";
  v1::ListPlansResponse r;
  r.set_history_plans(4096);
  v1::PlanSummary* p = r.add_plans();
  p->set_plan_id(31);
  p->set_decided_unix_us(10'000'000);
  p->set_kind(v1::PLAN_KIND_SPLIT);
  p->set_namespace_("t");
  p->set_model_id("llama");
  p->set_chain_blocks(64);
  p->set_cached_prefix_blocks(48);
  p->set_suffix_tokens(12);
  p->set_predicted_total_us(2000);
  p->set_finished(true);
  p->set_observed_total_us(2500);
  // Plans admitted after it, sharing its paths, made it 500 us later.
  p->set_later_plans_delay_us(500);
  p = r.add_plans();
  p->set_plan_id(30);
  p->set_kind(v1::PLAN_KIND_FETCH_ALL);
  p->set_predicted_total_us(1000);
  const std::string out = FormatPlanList(args, r, 12'500'000);
  EXPECT_NE(out.find("keeps the last 4096"), std::string::npos) << out;
  EXPECT_NE(out.find("31         2.5 s     split"), std::string::npos) << out;
  EXPECT_NE(out.find("48/64"), std::string::npos) << out;
  EXPECT_NE(out.find("2.00 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("2.50 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("1.25x"), std::string::npos) << out;
  EXPECT_NE(out.find("1.00x with the 0.50 ms later plans added"), std::string::npos) << out;
  EXPECT_NE(out.find("running"), std::string::npos) << out;
  EXPECT_LT(out.find("31 "), out.find("30 ")) << "newest first";
  args.json = true;
  const std::string json = FormatPlanList(args, r, 0);
  EXPECT_NE(json.find("\"kind\":\"split\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"observed_total_us\":2500.0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"later_plans_delay_us\":500.0"), std::string::npos) << json;
}

TEST(ExplainCommandTest, AllNamespacesWithAKeyIsRefusedBeforeAnyRpc) {
  ExplainEvictionArgs args = EvictionArgs("127.0.0.1:1", "t", std::string(64, 'a'), false);
  args.all_namespaces = true;
  EXPECT_TRUE(RunExplainEviction(args).IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric::cli
