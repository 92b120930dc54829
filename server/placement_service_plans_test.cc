// PlacementService: Locate, Plan, Explain, ListPlans, observations and Place
// (server/placement_service_test_fixture.h says how the service is run).
#include <set>
#include <string>

#include "server/placement_service_test_fixture.h"

namespace kvfabric::placement_service_test {
namespace {

// ---------------------------------------------------------------- plans

TEST_F(PlacementServiceTest, PlanFetchesTheCachedPrefixWithFallbacksAndExplainGivesItsFormula) {
  JoinThreeHostsAndReport();
  v1::PlanRequest req = PlanOf(6);
  req.set_include_explanation(true);
  v1::PlanResponse plan;
  const grpc::Status s = Call(&PlacementService::Plan, req, &plan);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(plan.plan_id(), 0u);
  EXPECT_EQ(plan.kind(), v1::PLAN_KIND_FETCH_ALL);
  EXPECT_FALSE(plan.explanation().empty());
  EXPECT_EQ(plan.locations().cached_prefix_blocks(), 4u);
  ASSERT_EQ(plan.locations().hosts_size(), 3);

  // The runs cover the chain once, in order: the cached prefix fetched, the rest recomputed.
  std::uint32_t next = 0;
  for (const v1::PlanRun& run : plan.runs()) {
    EXPECT_EQ(run.first_block(), next);
    EXPECT_GE(run.block_count(), 1u);
    EXPECT_LE(run.predicted_start_us(), run.predicted_end_us());
    next += run.block_count();
  }
  EXPECT_EQ(next, 6u);
  // a and b hold blocks 0..3 on host memory, c holds 2 and 3 on NVMe (and 5). The fetch may
  // spread the prefix over a and b (their streams overlap); every fetch run names as fallbacks
  // the other hosts that hold the whole run.
  ASSERT_GE(plan.runs_size(), 2);
  std::uint64_t fetched = 0;
  for (int r = 0; r + 1 < plan.runs_size(); ++r) {
    const v1::PlanRun& fetch = plan.runs(r);
    ASSERT_EQ(fetch.action(), v1::RUN_ACTION_FETCH);
    EXPECT_EQ(fetch.tier(), v1::TIER_HOST);
    fetched += fetch.payload_bytes();
    const std::string source = plan.locations().hosts(fetch.host_index()).host_id();
    EXPECT_TRUE(source == "a" || source == "b") << source;
    std::set<std::string> fallbacks, want{source == "a" ? "b" : "a"};
    if (fetch.first_block() >= 2) want.insert("c");
    for (std::uint32_t h : fetch.fallback_host_indices()) {
      fallbacks.insert(plan.locations().hosts(h).host_id());
    }
    EXPECT_EQ(fallbacks, want) << "run " << r;
  }
  EXPECT_EQ(fetched, 4 * kBlockBytes);
  const v1::PlanRun& rest = plan.runs(plan.runs_size() - 1);
  EXPECT_EQ(rest.action(), v1::RUN_ACTION_RECOMPUTE);
  EXPECT_EQ(rest.first_block(), 4u);
  EXPECT_EQ(rest.fallback_host_indices_size(), 0);

  int chosen = 0;
  bool recompute_all = false;
  for (const v1::PlanAlternative& a : plan.alternatives()) {
    chosen += a.chosen() ? 1 : 0;
    if (a.kind() == v1::PLAN_KIND_RECOMPUTE_ALL) {
      recompute_all = true;
      EXPECT_GE(a.predicted_us(), plan.predicted_total_us());
    }
    if (a.chosen()) {
      EXPECT_EQ(a.predicted_us(), plan.predicted_total_us());
    }
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_TRUE(recompute_all);

  v1::ExplainRequest explain;
  explain.set_plan_id(plan.plan_id());
  v1::ExplainResponse why;
  ASSERT_TRUE(Call(&PlacementService::Explain, explain, &why).ok());
  EXPECT_EQ(why.kind(), v1::EXPLAIN_KIND_PLAN);
  EXPECT_NE(why.formula().find("t_fetch(path, bytes) = alpha_us + bytes / beta_bytes_per_s * 1e6"),
            std::string::npos)
      << why.formula();
  // The inputs as the plan saw them, then the plan's own explanation.
  EXPECT_EQ(why.text().rfind("inputs (as the plan was made):", 0), 0u) << why.text();
  ASSERT_GE(why.text().size(), plan.explanation().size());
  EXPECT_EQ(why.text().substr(why.text().size() - plan.explanation().size()), plan.explanation());
  EXPECT_EQ(why.decided_unix_us(), env_.WallMicros());
  bool predicted = false;
  for (const v1::ExplainTerm& t : why.terms()) {
    if (t.name() == "t_predicted") {
      predicted = true;
      EXPECT_EQ(t.value(), plan.predicted_total_us());
      EXPECT_EQ(t.unit(), "us");
    }
  }
  EXPECT_TRUE(predicted);
}

TEST_F(PlacementServiceTest, ListPlansGivesTheNewestPlansWithTheirIdsAndNamespaces) {
  JoinThreeHostsAndReport();
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    v1::PlanResponse plan;
    ASSERT_TRUE(Call(&PlacementService::Plan, PlanOf(6), &plan).ok());
    ids.push_back(plan.plan_id());
  }
  v1::ListPlansRequest req;
  req.set_limit(2);
  v1::ListPlansResponse list;
  ASSERT_TRUE(Call(&PlacementService::ListPlans, req, &list).ok());
  ASSERT_EQ(list.plans_size(), 2);
  EXPECT_EQ(list.plans(0).plan_id(), ids[2]);
  EXPECT_EQ(list.plans(1).plan_id(), ids[1]);
  EXPECT_EQ(list.plans(0).kind(), v1::PLAN_KIND_FETCH_ALL);
  EXPECT_EQ(list.plans(0).chain_blocks(), 6u);
  EXPECT_EQ(list.plans(0).cached_prefix_blocks(), 4u);
  EXPECT_GT(list.plans(0).predicted_total_us(), 0.0);
  EXPECT_FALSE(list.plans(0).finished());
  EXPECT_EQ(list.history_plans(), 3u);
  const std::string ns = list.plans(0).namespace_();

  req.set_namespace_(ns + "-other");
  v1::ListPlansResponse other;
  ASSERT_TRUE(Call(&PlacementService::ListPlans, req, &other).ok());
  EXPECT_EQ(other.plans_size(), 0);
  req.set_namespace_(ns);
  req.set_limit(0);  // the default, 20
  v1::ListPlansResponse mine;
  ASSERT_TRUE(Call(&PlacementService::ListPlans, req, &mine).ok());
  EXPECT_EQ(mine.plans_size(), 3);

  req.set_limit(kMaxListedDecisions + 1);
  const grpc::Status s = Call(&PlacementService::ListPlans, req, &list);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("kMaxListedDecisions 1000"), std::string::npos)
      << s.error_message();
}

TEST_F(PlacementServiceTest, ExplainOfAnUnknownPlanIsNotFoundAndEvictionsPointAtTheDaemon) {
  v1::ExplainRequest explain;
  explain.set_plan_id(42);
  v1::ExplainResponse why;
  EXPECT_EQ(Call(&PlacementService::Explain, explain, &why).error_code(),
            grpc::StatusCode::NOT_FOUND);

  explain.mutable_eviction()->set_host_id("a");
  explain.mutable_eviction()->set_decision_id(3);
  grpc::Status s = Call(&PlacementService::Explain, explain, &why);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(s.error_message().find("kvfabric explain eviction"), std::string::npos)
      << s.error_message();
  explain.mutable_block()->set_key(Key(0));
  EXPECT_EQ(Call(&PlacementService::Explain, explain, &why).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  ExpectInvalid(Call(&PlacementService::Explain, v1::ExplainRequest(), &why),
                "target: unset; name a plan_id");
}

TEST_F(PlacementServiceTest, PlanOnTheClientsLocationsUsesOnlyThose) {
  JoinThreeHostsAndReport();
  v1::LocateResponse located;
  ASSERT_TRUE(Call(&PlacementService::Locate, LocateOf(6), &located).ok());
  // The client saw only c's copy of blocks 2 and 3, and nothing before them.
  v1::PlanRequest req = PlanOf(6);
  v1::ChainLocations* loc = req.mutable_locations();
  *loc = located.locations();
  for (int i = 0; i < 6; ++i) {
    auto* replicas = loc->mutable_blocks(i)->mutable_replicas();
    for (int r = replicas->size() - 1; r >= 0; --r) {
      if (loc->hosts(replicas->Get(r).host_index()).host_id() != "c")
        replicas->DeleteSubrange(r, 1);
    }
  }
  v1::PlanResponse plan;
  ASSERT_TRUE(Call(&PlacementService::Plan, req, &plan).ok());
  EXPECT_EQ(plan.locations().cached_prefix_blocks(), 0u);
  EXPECT_EQ(plan.kind(), v1::PLAN_KIND_RECOMPUTE_ALL);

  // A replica naming a host outside the table is refused whole.
  loc->mutable_blocks(0)->add_replicas()->set_host_index(3);
  loc->mutable_blocks(0)->mutable_replicas(0)->set_tier(v1::TIER_HOST);
  ExpectInvalid(Call(&PlacementService::Plan, req, &plan),
                "locations.blocks[0].replicas[0].host_index: 3 >= 3 hosts");
}

TEST_F(PlacementServiceTest, ObservationsFinishThePlanAndDropStaleEntries) {
  JoinThreeHostsAndReport();
  v1::PlanResponse plan;
  ASSERT_TRUE(Call(&PlacementService::Plan, PlanOf(6), &plan).ok());
  EXPECT_EQ(node_->Snapshot().plans_admitted, 1u);

  v1::ReportObservationsRequest obs;
  obs.set_namespace_(kNs);
  obs.set_plan_id(plan.plan_id());
  *obs.mutable_fingerprint() = TestFingerprint();
  v1::TransferObservation* t = obs.add_transfers();
  t->set_path(v1::BUS_PATH_REMOTE_HOST_TO_LOCAL_HOST);
  t->set_host_id("a");
  t->set_bytes(4 * kBlockBytes);
  t->set_observed_us(30.0);
  v1::RecomputeObservation* r = obs.add_recomputes();
  r->set_tokens(32);
  r->set_prefix_tokens(64);
  r->set_observed_us(4000.0);
  v1::StaleEntry* stale = obs.add_stale_entries();
  stale->set_host_id("a");
  stale->set_key(Key(0));
  obs.add_fallback_runs(0);
  obs.set_plan_finished(true);
  obs.set_observed_total_us(1500.0);
  v1::ReportObservationsResponse done;
  const grpc::Status s = Call(&PlacementService::ReportObservations, obs, &done);
  ASSERT_TRUE(s.ok()) << s.error_message();

  const placement::PlacementSnapshot snap = node_->Snapshot();
  EXPECT_EQ(snap.plans_finished, 1u);
  EXPECT_EQ(snap.plans_admitted, 0u);
  EXPECT_EQ(snap.fallback_runs, 1u);
  EXPECT_EQ(snap.stale_reports, 1u);
  v1::LocateResponse located;
  ASSERT_TRUE(Call(&PlacementService::Locate, LocateOf(1), &located).ok());
  EXPECT_EQ(Holders(located.locations())[0], (std::vector<std::string>{"b"}));

  v1::ExplainRequest explain;
  explain.set_plan_id(plan.plan_id());
  v1::ExplainResponse why;
  ASSERT_TRUE(Call(&PlacementService::Explain, explain, &why).ok());
  bool observed = false;
  for (const v1::ExplainTerm& term : why.terms()) {
    if (term.name() == "t_observed") observed = term.value() == 1500.0;
  }
  EXPECT_TRUE(observed);
}

// ---------------------------------------------------------------- place

TEST_F(PlacementServiceTest, PlaceChoosesLiveHostsAndNamesThoseHoldingTheKeyAlready) {
  JoinThreeHostsAndReport();
  v1::PlaceRequest req;
  req.set_namespace_(kNs);
  *req.mutable_fingerprint() = TestFingerprint();
  req.add_keys(Key(0));
  req.add_keys(Key(9));
  req.set_payload_bytes(kBlockBytes);
  req.set_replicas(2);
  v1::PlaceResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Place, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 2);
  for (const v1::PlaceResult& r : resp.results()) {
    EXPECT_FALSE(r.has_status() && r.status().code() != 0) << r.status().message();
    ASSERT_EQ(r.host_indices_size(), 2);
    ASSERT_EQ(r.scores_size(), 2);
    EXPECT_NE(r.host_indices(0), r.host_indices(1));
    EXPECT_GE(r.scores(0), r.scores(1));
    for (std::uint32_t h : r.host_indices())
      ASSERT_LT(h, static_cast<std::uint32_t>(resp.hosts_size()));
  }
  std::vector<std::string> existing;
  for (std::uint32_t h : resp.results(0).existing_host_indices()) {
    existing.push_back(resp.hosts(h).host_id());
  }
  std::sort(existing.begin(), existing.end());
  EXPECT_EQ(existing, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(resp.results(1).existing_host_indices_size(), 0);

  // Every host excluded: no live host, per key.
  for (const char* id : {"a", "b", "c"}) req.add_exclude_host_ids(id);
  v1::PlaceResponse none;
  ASSERT_TRUE(Call(&PlacementService::Place, req, &none).ok());
  ASSERT_EQ(none.results_size(), 2);
  EXPECT_EQ(none.results(0).status().code(), static_cast<int>(StatusCode::kUnavailable));
  EXPECT_EQ(none.results(0).host_indices_size(), 0);
}

TEST_F(PlacementServiceTest, PlaceWithoutRoomAnywhereIsResourceExhaustedPerKey) {
  Join("a");
  v1::HeartbeatRequest beat = HeartbeatOf("a");
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, kBlockBytes - 1);
  v1::HeartbeatResponse beaten;
  ASSERT_TRUE(Call(&PlacementService::Heartbeat, beat, &beaten).ok());
  v1::PlaceRequest req;
  req.add_keys(Key(1));
  req.set_payload_bytes(kBlockBytes);
  v1::PlaceResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Place, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).status().code(), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_FALSE(resp.results(0).status().message().empty());
}

}  // namespace
}  // namespace kvfabric::placement_service_test
