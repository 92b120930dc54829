// PlacementService: membership, reports, limits and start-up
// (server/placement_service_test_fixture.h says how the service is run).
#include "server/placement_service_test_fixture.h"

namespace kvfabric::placement_service_test {
namespace {

// ---------------------------------------------------------------- membership

TEST_F(PlacementServiceTest, RegisterGrantsALeaseWithTheLimitsAndListHostsShowsTheTiers) {
  v1::RegisterRequest req = RegisterOf("a");
  *req.add_tiers() = Usage(v1::TIER_NVME, 100 * kGiB, 60 * kGiB);
  v1::RegisterResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Register, req, &resp).ok());
  EXPECT_NE(resp.membership_lease_id(), 0u);
  EXPECT_EQ(resp.ttl_ms(), 30000u);  // ttl_ms 0: default_ttl_ms
  EXPECT_EQ(resp.heartbeat_interval_ms(), 10000u);
  EXPECT_TRUE(resp.full_report_requested());
  EXPECT_EQ(resp.placement_incarnation(), node_->incarnation());
  EXPECT_EQ(resp.limits().max_chain_blocks(), 65536u);
  EXPECT_EQ(resp.limits().max_keys_per_batch(), 4096u);
  Join("c");
  Join("b");

  const v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 3);
  EXPECT_EQ(hosts.hosts(0).host().host_id(), "a");  // sorted by host_id
  EXPECT_EQ(hosts.hosts(1).host().host_id(), "b");
  EXPECT_EQ(hosts.hosts(2).host().host_id(), "c");
  const v1::HostStatus& a = hosts.hosts(0);
  EXPECT_EQ(a.host().incarnation(), 1u);
  EXPECT_EQ(a.host().grpc_address(), "a.example:7000");
  EXPECT_EQ(a.host().transport_address(), "a.example:7001");
  EXPECT_EQ(a.host().node_name(), "node-a");
  EXPECT_EQ(a.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(a.lease_remaining_ms(), 30000u);
  EXPECT_EQ(a.directory_blocks(), 0u);
  ASSERT_EQ(a.tiers_size(), 2);
  EXPECT_EQ(a.tiers(0).tier(), v1::TIER_HOST);
  EXPECT_EQ(a.tiers(0).capacity_bytes(), 16 * kGiB);
  EXPECT_EQ(a.tiers(0).free_bytes(), 8 * kGiB);
  EXPECT_EQ(a.tiers(1).tier(), v1::TIER_NVME);
  EXPECT_EQ(a.tiers(1).capacity_bytes(), 100 * kGiB);
  EXPECT_EQ(a.tiers(1).free_bytes(), 60 * kGiB);
  EXPECT_EQ(hosts.hosts(1).tiers_size(), 1);  // no NVMe tier registered
}

TEST_F(PlacementServiceTest, HeartbeatUpdatesFreeBytesAndServingStateButKeepsAddresses) {
  Join("a");
  Join("b");
  env_.Advance(5'000'000);
  v1::HeartbeatRequest beat = HeartbeatOf("a");
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 1 * kGiB);
  beat.set_status(v1::SERVING_STATUS_DRAINING);
  v1::HeartbeatResponse resp;
  const grpc::Status s = Call(&PlacementService::Heartbeat, beat, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.ttl_ms(), 30000u);

  v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 2);
  const v1::HostStatus& a = hosts.hosts(0);
  EXPECT_EQ(a.status(), v1::SERVING_STATUS_DRAINING);
  EXPECT_EQ(a.tiers(0).free_bytes(), 1 * kGiB);
  EXPECT_EQ(a.host().grpc_address(), "a.example:7000");
  EXPECT_EQ(a.host().transport_address(), "a.example:7001");
  EXPECT_EQ(a.lease_remaining_ms(), 30000u);  // renewed
  EXPECT_EQ(hosts.hosts(1).lease_remaining_ms(), 25000u);

  // A draining host gets no new blocks.
  v1::PlaceRequest place;
  place.set_namespace_(kNs);
  place.add_keys(Key(1));
  place.set_payload_bytes(kBlockBytes);
  v1::PlaceResponse placed;
  ASSERT_TRUE(Call(&PlacementService::Place, place, &placed).ok());
  ASSERT_EQ(placed.results_size(), 1);
  ASSERT_EQ(placed.results(0).host_indices_size(), 1);
  EXPECT_EQ(placed.hosts(placed.results(0).host_indices(0)).host_id(), "b");

  // Serving again; a heartbeat without tiers or status only renews the lease.
  beat.clear_tiers();
  beat.set_status(v1::SERVING_STATUS_SERVING);
  ASSERT_TRUE(Call(&PlacementService::Heartbeat, beat, &resp).ok());
  ASSERT_TRUE(Call(&PlacementService::Heartbeat, HeartbeatOf("a"), &resp).ok());
  hosts = Hosts();
  EXPECT_EQ(hosts.hosts(0).status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(hosts.hosts(0).tiers(0).free_bytes(), 1 * kGiB);
}

TEST_F(PlacementServiceTest, HeartbeatUnderAnotherHostsLeaseIsRefused) {
  Join("a");
  Join("b");
  v1::HeartbeatRequest beat = HeartbeatOf("a");
  beat.set_membership_lease_id(leases_["b"]);
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 1 * kGiB);
  v1::HeartbeatResponse resp;
  // With a's token, b's lease is unknown; with b's, it is b's and not a's.
  EXPECT_EQ(Call(&PlacementService::Heartbeat, beat, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  beat.set_membership_token(tokens_["b"]);
  EXPECT_EQ(Call(&PlacementService::Heartbeat, beat, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Hosts().hosts(1).tiers(0).free_bytes(), 8 * kGiB);  // b unchanged
}

TEST_F(PlacementServiceTest, HeartbeatAndReportAfterDeregisterAreNotFound) {
  Join("a");
  Join("b");
  v1::DeregisterRequest leave;
  leave.set_host_id("a");
  leave.set_incarnation(1);
  leave.set_membership_lease_id(leases_["a"]);
  leave.set_membership_token(tokens_["a"]);
  v1::DeregisterResponse left;
  ASSERT_TRUE(Call(&PlacementService::Deregister, leave, &left).ok());
  ASSERT_TRUE(Call(&PlacementService::Deregister, leave, &left).ok());  // idempotent

  v1::HeartbeatResponse beat;
  const grpc::Status s = Call(&PlacementService::Heartbeat, HeartbeatOf("a"), &beat);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  v1::ReportBlocksResponse reported;
  EXPECT_EQ(
      Call(&PlacementService::ReportBlocks, ReportOf("a", Commits(0, 1)), &reported).error_code(),
      grpc::StatusCode::NOT_FOUND);
  const v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 1);
  EXPECT_EQ(hosts.hosts(0).host().host_id(), "b");
  EXPECT_EQ(node_->Snapshot().deregistrations, 2u);
  // The departed member and the cluster summary travel with the list.
  ASSERT_EQ(hosts.departed_size(), 1);
  EXPECT_EQ(hosts.departed(0).host().host_id(), "a");
  EXPECT_EQ(hosts.departed(0).reason(), "deregistered");
  EXPECT_GT(hosts.departed(0).departed_unix_us(), 0u);
  ASSERT_EQ(hosts.summary().plans_size(), 4);
  EXPECT_EQ(hosts.summary().plans(0).kind(), "recompute_all");
  EXPECT_EQ(hosts.summary().paths_size(), 0);  // nothing reported yet
}

TEST_F(PlacementServiceTest, DeregisterOfAnOlderIncarnationLeavesTheNewOne) {
  Join("a", 1);
  const std::uint64_t old_lease = leases_["a"];
  const std::string old_token = tokens_["a"];
  // Incarnation 1 went silent (more than two heartbeats of its 30 s TTL):
  // incarnation 2 may take its place before the lease ends.
  env_.Advance(20'001'000);
  Join("a", 2);
  // The old daemon quotes the new lease by mistake, or its own, now gone: neither removes the
  // new incarnation.
  for (std::uint64_t lease : {leases_["a"], old_lease}) {
    v1::DeregisterRequest leave;
    leave.set_host_id("a");
    leave.set_incarnation(1);
    leave.set_membership_lease_id(lease);
    leave.set_membership_token(old_token);
    v1::DeregisterResponse left;
    ASSERT_TRUE(Call(&PlacementService::Deregister, leave, &left).ok());
  }
  const v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 1);
  EXPECT_EQ(hosts.hosts(0).host().incarnation(), 2u);
}

// ---------------------------------------------------------------- directory

TEST_F(PlacementServiceTest, LocateReturnsReportedReplicasBestFirstWithTheirHosts) {
  JoinThreeHostsAndReport();
  v1::LocateResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Locate, LocateOf(6), &resp).ok());
  const v1::ChainLocations& loc = resp.locations();
  EXPECT_EQ(loc.cached_prefix_blocks(), 4u);
  ASSERT_EQ(loc.blocks_size(), 6);
  const auto holders = Holders(loc);
  EXPECT_EQ(holders[0], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(holders[2], (std::vector<std::string>{"a", "b", "c"}));  // host tier before NVMe
  EXPECT_TRUE(holders[4].empty());
  EXPECT_EQ(holders[5], (std::vector<std::string>{"c"}));  // cached after the gap: listed
  EXPECT_EQ(loc.blocks(2).replicas(2).tier(), v1::TIER_NVME);
  EXPECT_EQ(loc.blocks(0).replicas(0).tier(), v1::TIER_HOST);
  EXPECT_EQ(loc.blocks(0).replicas(0).payload_bytes(), kBlockBytes);
  EXPECT_EQ(loc.blocks(0).replicas(0).representation(), v1::REPRESENTATION_EXACT);
  ASSERT_EQ(loc.hosts_size(), 3);
  for (const v1::HostRef& h : loc.hosts()) {
    EXPECT_EQ(h.grpc_address(), h.host_id() + ".example:7000");
    EXPECT_EQ(h.transport_address(), h.host_id() + ".example:7001");
    EXPECT_EQ(h.incarnation(), 1u);
  }
  EXPECT_EQ(Hosts().hosts(0).directory_blocks(), 4u);
}

TEST_F(PlacementServiceTest, ReportBlocksAcksRepeatedSequencesAndAsksForASnapshotAfterAGap) {
  Join("a");
  v1::ReportBlocksRequest first = ReportOf("a", Commits(0, 2));
  v1::ReportBlocksResponse resp;
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, first, &resp).ok());
  EXPECT_EQ(resp.acked_sequence(), 1u);
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, first, &resp).ok());  // a retry
  EXPECT_EQ(resp.acked_sequence(), 1u);

  // A full snapshot of one chunk clears the full-report request.
  v1::ReportBlocksRequest snapshot = ReportOf("a", Commits(0, 1));
  snapshot.mutable_events(0)->set_kind(v1::BLOCK_EVENT_KIND_PRESENT);
  snapshot.set_snapshot_id(7);
  snapshot.set_snapshot_last(true);
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, snapshot, &resp).ok());
  EXPECT_EQ(resp.acked_sequence(), 2u);
  EXPECT_FALSE(resp.full_report_requested());
  EXPECT_EQ(Hosts().hosts(0).directory_blocks(), 1u);  // block 1 was not in the snapshot

  v1::ReportBlocksRequest gap = ReportOf("a", Commits(3, 4));
  gap.set_sequence(5);
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, gap, &resp).ok());
  EXPECT_EQ(resp.acked_sequence(), 5u);
  EXPECT_TRUE(resp.full_report_requested());
}

// ---------------------------------------------------------------- limits

TEST_F(PlacementServiceTest, RequestsOverALimitAreRefusedWholeNamingTheLimit) {
  JoinThreeHostsAndReport();
  v1::LocateResponse located;
  ExpectInvalid(Call(&PlacementService::Locate, LocateOf(70000), &located),
                "keys: 70000 > max_chain_blocks 65536");
  ExpectInvalid(Call(&PlacementService::Locate, LocateOf(0), &located),
                "keys: 0, a chain needs at least 1 key");
  v1::LocateRequest short_key = LocateOf(2);
  short_key.mutable_keys(1)->pop_back();
  ExpectInvalid(Call(&PlacementService::Locate, short_key, &located),
                "keys[1]: 31 bytes; a block key is exactly 32");
  v1::LocateRequest long_ns = LocateOf(1);
  long_ns.set_namespace_(std::string(257, 'n'));
  ExpectInvalid(Call(&PlacementService::Locate, long_ns, &located),
                "namespace: 257 bytes > max_namespace_bytes 256");
  EXPECT_EQ(node_->Snapshot().locates, 0u);  // none reached the node

  v1::PlanResponse plan;
  ExpectInvalid(Call(&PlacementService::Plan, PlanOf(70000), &plan),
                "keys: 70000 > max_chain_blocks 65536");
  v1::PlanRequest no_fingerprint = PlanOf(2);
  no_fingerprint.clear_fingerprint();
  EXPECT_EQ(Call(&PlacementService::Plan, no_fingerprint, &plan).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::PlanRequest other_path = PlanOf(2);
  other_path.add_client_paths()->set_path(v1::BUS_PATH_NVME_TO_HOST);
  ExpectInvalid(Call(&PlacementService::Plan, other_path, &plan),
                "client_paths[0].path: BUS_PATH_NVME_TO_HOST is not a path on the client's "
                "machine (host <-> device)");
  EXPECT_EQ(node_->Snapshot().plans, 0u);

  v1::PlaceRequest place;
  for (int i = 0; i < 4097; ++i) place.add_keys(Key(i));
  place.set_payload_bytes(kBlockBytes);
  v1::PlaceResponse placed;
  ExpectInvalid(Call(&PlacementService::Place, place, &placed),
                "keys: 4097 > max_keys_per_batch 4096");
  place.clear_keys();
  place.add_keys(Key(0));
  place.set_replicas(9);
  ExpectInvalid(Call(&PlacementService::Place, place, &placed), "replicas: 9 > max_replicas 8");
  place.set_replicas(1);
  place.set_payload_bytes((std::uint64_t{64} << 20) + 1);
  ExpectInvalid(Call(&PlacementService::Place, place, &placed),
                "payload_bytes: 67108865 > max_block_bytes 67108864");
  EXPECT_EQ(node_->Snapshot().places, 0u);

  v1::RegisterRequest reg = RegisterOf("d");
  reg.set_ttl_ms(600001);
  v1::RegisterResponse registered;
  ExpectInvalid(Call(&PlacementService::Register, reg, &registered),
                "ttl_ms: 600001 > max_ttl_ms 600000");
  reg = RegisterOf(std::string(129, 'h'));
  ExpectInvalid(Call(&PlacementService::Register, reg, &registered),
                "host_id: 129 bytes > max_host_id_bytes 128");
  reg = RegisterOf("d");
  reg.set_grpc_address(std::string(257, 'x'));
  ExpectInvalid(Call(&PlacementService::Register, reg, &registered),
                "grpc_address: 257 bytes > max_address_bytes 256");
  reg = RegisterOf("d", 0);
  EXPECT_EQ(Call(&PlacementService::Register, reg, &registered).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Hosts().hosts_size(), 3);

  v1::ReportBlocksResponse reported;
  ExpectInvalid(Call(&PlacementService::ReportBlocks, ReportOf("a", Commits(0, 4097)), &reported),
                "events: 4097 > max_keys_per_batch 4096");
  v1::ReportBlocksRequest big_block = ReportOf("a", Commits(0, 2));
  big_block.mutable_events(1)->mutable_block()->set_payload_bytes(std::uint64_t{1} << 30);
  ExpectInvalid(Call(&PlacementService::ReportBlocks, big_block, &reported),
                "events[1].block.payload_bytes: 1073741824 > max_block_bytes 67108864");

  v1::ReportObservationsRequest obs;
  for (int i = 0; i < 4097; ++i) obs.add_fallback_runs(0);
  v1::ReportObservationsResponse observed;
  ExpectInvalid(Call(&PlacementService::ReportObservations, obs, &observed),
                "fallback_runs: 4097 > max_keys_per_batch 4096");
}

TEST_F(PlacementServiceTest, LowerLimitsOfTheServiceAreEnforcedAndReported) {
  PlacementServiceOptions options;
  options.limits.set_max_chain_blocks(4);
  PlacementService service(node_.get(), health_.get(), options);
  v1::LocateResponse located;
  ExpectInvalid(Call(&PlacementService::Locate, LocateOf(5), &located, &service),
                "keys: 5 > max_chain_blocks 4");
  EXPECT_TRUE(Call(&PlacementService::Locate, LocateOf(4), &located, &service).ok());
  v1::HealthResponse health;
  ASSERT_TRUE(Call(&PlacementService::Health, v1::HealthRequest(), &health, &service).ok());
  EXPECT_EQ(health.limits().max_chain_blocks(), 4u);
  EXPECT_EQ(health.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(health.server_id(), "placement-0");
}

TEST_F(PlacementServiceTest, WithoutANodeOnlyHealthIsServed) {
  PlacementService starting(nullptr, health_.get(), PlacementServiceOptions());
  v1::LocateResponse located;
  EXPECT_EQ(Call(&PlacementService::Locate, LocateOf(1), &located, &starting).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  v1::ListHostsResponse hosts;
  EXPECT_EQ(
      Call(&PlacementService::ListHosts, v1::ListHostsRequest(), &hosts, &starting).error_code(),
      grpc::StatusCode::UNAVAILABLE);
  v1::RegisterResponse registered;
  EXPECT_EQ(Call(&PlacementService::Register, RegisterOf("a"), &registered, &starting).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Whole-request checks come first.
  EXPECT_EQ(Call(&PlacementService::Locate, LocateOf(0), &located, &starting).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::HealthResponse health;
  EXPECT_TRUE(Call(&PlacementService::Health, v1::HealthRequest(), &health, &starting).ok());
}

}  // namespace
}  // namespace kvfabric::placement_service_test
