#include "cli/status_command.h"

#include <gtest/gtest.h>

namespace kvfabric::cli {
namespace {

DaemonStatus Healthy() {
  DaemonStatus d;
  d.host_id = "cache-0";
  d.grpc_address = "10.0.0.1:7440";
  v1::StatsResponse s;
  s.set_status(v1::SERVING_STATUS_SERVING);
  v1::TierUsage* host = s.add_tiers();
  host->set_tier(v1::TIER_HOST);
  host->set_capacity_bytes(8ull << 30);
  host->set_committed_bytes(3ull << 30);
  v1::TierUsage* nvme = s.add_tiers();
  nvme->set_tier(v1::TIER_NVME);
  nvme->set_capacity_bytes(1ull << 40);
  nvme->set_committed_bytes(5ull << 30);
  s.set_blocks(1234);
  s.set_active_read_leases(3);
  s.set_active_reservations(1);
  s.set_hits_total(900);
  s.set_misses_total(100);
  d.stats = s;
  v1::HostStatus m;
  m.set_directory_blocks(1200);
  m.set_lease_remaining_ms(7000);
  d.membership = m;
  return d;
}

TEST(StatusCommandTest, TableShowsEveryDaemonWithItsTiersAndLeases) {
  StatusArgs args;
  args.placement = "127.0.0.1:7450";
  DaemonStatus down;
  down.host_id = "cache-1";
  down.error = "Unavailable: connection refused";
  const std::string out = FormatStatus(args, {Healthy(), down});
  EXPECT_NE(out.find("2 live cache hosts (placement 127.0.0.1:7450)"), std::string::npos) << out;
  EXPECT_NE(out.find("3 GiB / 8 GiB"), std::string::npos) << out;
  EXPECT_NE(out.find("5 GiB / 1 TiB"), std::string::npos) << out;
  EXPECT_NE(out.find("3/1"), std::string::npos) << out;
  EXPECT_NE(out.find("900/100"), std::string::npos) << out;
  EXPECT_NE(out.find("unreachable: Unavailable: connection refused"), std::string::npos) << out;
  EXPECT_NE(out.find("cache-0          serving     7.0s "), std::string::npos) << out;
}

v1::ListHostsResponse Sample(std::uint64_t fetch_all, std::uint64_t bytes, double seconds) {
  v1::ListHostsResponse r;
  v1::ClusterSummary* s = r.mutable_summary();
  s->set_uptime_us(120'000'000);
  s->set_plans_in_flight(2);
  v1::PlanKindCount* k = s->add_plans();
  k->set_kind("fetch_all");
  k->set_plans(fetch_all);
  v1::PathTrafficSummary* p = s->add_paths();
  p->set_path(v1::BUS_PATH_REMOTE_HOST_TO_LOCAL_HOST);
  p->set_transfers(10);
  p->set_bytes(bytes);
  p->set_observed_seconds(seconds);
  return r;
}

TEST(StatusCommandTest, ClusterSummaryShowsRatesOverTheIntervalAndAverages) {
  StatusArgs args;
  args.placement = "127.0.0.1:7450";
  ClusterReport c;
  c.first = Sample(100, 1ull << 30, 1.0);
  c.last = Sample(110, 3ull << 30, 2.0);
  c.interval_s = 2.0;
  const std::string out = FormatStatus(args, {Healthy()}, c);
  EXPECT_NE(out.find("up 120 s; plans in flight 2"), std::string::npos) << out;
  EXPECT_NE(out.find("fetch_all 110 (5.0/s)"), std::string::npos) << out;
  // Now: 2 GiB over 2 s; average: 3 GiB over 2 s of observed transfer time.
  EXPECT_NE(out.find("remote_host_to_local_host"), std::string::npos) << out;
  EXPECT_NE(out.find("1 GiB/s"), std::string::npos) << out;
  EXPECT_NE(out.find("1.5 GiB/s"), std::string::npos) << out;

  args.json = true;
  const std::string json = FormatStatus(args, {Healthy()}, c);
  EXPECT_NE(json.find("\"plans\":{\"fetch_all\":110}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"interval_bytes_per_second\":1073741824"), std::string::npos) << json;
}

TEST(StatusCommandTest, DepartedHostsAndExpiringLeasesAreFlagged) {
  StatusArgs args;
  args.placement = "127.0.0.1:7450";
  ClusterReport c;
  c.last = Sample(0, 0, 0);
  c.last->mutable_summary()->clear_paths();
  c.now_unix_us = 1'000'000'000'000;
  v1::DepartedHost* d = c.last->add_departed();
  d->mutable_host()->set_host_id("cache-9");
  d->mutable_host()->set_grpc_address("10.0.0.9:7440");
  d->set_reason("lease_expired");
  d->set_departed_unix_us(c.now_unix_us - 42'000'000);
  d->set_directory_blocks_dropped(777);
  DaemonStatus late = Healthy();
  // 7 s of lease left, but the last heartbeat came 8 s ago: more than half gone.
  late.membership->set_last_heartbeat_unix_us(c.now_unix_us - 8'000'000);
  DaemonStatus fresh = Healthy();
  fresh.host_id = "cache-1";
  fresh.membership->set_last_heartbeat_unix_us(c.now_unix_us - 1'000'000);
  const std::string out = FormatStatus(args, {late, fresh}, c);
  EXPECT_NE(out.find("7.0s EXPIRING"), std::string::npos) << out;
  EXPECT_EQ(out.find("EXPIRING", out.find("EXPIRING") + 1), std::string::npos) << out;
  EXPECT_NE(out.find("departed lately"), std::string::npos) << out;
  EXPECT_NE(out.find("cache-9"), std::string::npos) << out;
  EXPECT_NE(out.find("lease_expired"), std::string::npos) << out;
  EXPECT_NE(out.find("42 s ago"), std::string::npos) << out;
  EXPECT_NE(out.find("777 directory entries dropped"), std::string::npos) << out;
  EXPECT_NE(out.find("no transfers reported yet"), std::string::npos) << out;
}

TEST(StatusCommandTest, JsonCarriesTheNumbersAndErrors) {
  StatusArgs args;
  args.json = true;
  DaemonStatus down;
  down.host_id = "cache-\"1\"";
  down.error = "Unavailable";
  const std::string out = FormatStatus(args, {Healthy(), down});
  EXPECT_NE(out.find("\"committed_bytes\":3221225472"), std::string::npos) << out;
  EXPECT_NE(out.find("\"directory_blocks\":1200"), std::string::npos) << out;
  EXPECT_NE(out.find("\"host_id\":\"cache-\\\"1\\\"\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"error\":\"Unavailable\""), std::string::npos) << out;
}

TEST(StatusCommandTest, NeedsPlacementOrACacheHost) {
  EXPECT_TRUE(RunStatus(StatusArgs()).IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric::cli
