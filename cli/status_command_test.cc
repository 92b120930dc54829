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
  EXPECT_NE(out.find("cache-1          unreachable: Unavailable: connection refused"),
            std::string::npos)
      << out;
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
