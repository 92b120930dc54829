// `kvfabric calibrate` against a real kvfabric-cached on loopback, over each
// data transport (UCX, and kernel TCP with --data-transport=tcp): the fetch
// paths to and from the daemon are measured, fitted and written under the
// daemon's host id, and every probe block is deleted again.
//
// No timing assertions: the figures depend on the machine; this checks that
// the command measures the paths it claims, writes a file the services load,
// and leaves the daemon as it found it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli/calibrate_command.h"
#include "core/bus_calibration.h"
#include "core/env.h"
#include "tests/server_process.h"

namespace kvfabric {
namespace {

class CalibrateDaemonTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CalibrateDaemonTest, MeasuresBothDirectionsOfADaemonAndWritesAFileServicesLoad) {
  char tmpl[] = "/tmp/kvf_calibrate_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto daemon = testing::ServerProcess::Start(
      testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cached", dir,
      {"--host-id=calib-host", "--insecure", "--grpc-address=127.0.0.1:0",
       "--transport-address=127.0.0.1:0", "--metrics-address=off", "--admin-address=127.0.0.1:0",
       "--lock-memory=off", "--log-level=warn", "--host-pool-bytes=384MiB",
       "--host-page-bytes=1MiB", std::string("--data-transport=") + GetParam()});
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();

  cli::CalibrateArgs args;
  args.out_path = dir + "/calibration.json";
  args.cache_hosts = {(*daemon)->grpc()};
  args.security.insecure = true;
  args.cache_host_admins = {(*daemon)->Get("admin")};
  // Up to 64 MiB, so that bytes (not the RPC round trips) dominate the
  // largest probes and the fit always sees time grow with size.
  args.min_bytes = 256 << 10;
  args.max_bytes = 64 << 20;
  args.repeats = 3;
  args.cache_scrub_bytes = 0;
  args.data_transport = GetParam();
  cli::CalibrateContext ctx;
  ctx.env = Env::Default();
  ctx.no_device_reason = "no GPU in this test";
  auto report = cli::RunCalibrate(args, ctx);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string text = cli::FormatCalibrationText(*report);
  EXPECT_NE(text.find("calib-host"), std::string::npos) << text;

  auto loaded = LoadBusCalibration(Env::Default(), args.out_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  bool get = false, put = false;
  for (const PathCalibration& p : loaded->paths) {
    if (p.host_id != "calib-host") continue;
    get = get || p.path == BusPath::kRemoteHostToLocalHost;
    put = put || p.path == BusPath::kLocalHostToRemoteHost;
    EXPECT_GT(p.parameters.beta_bytes_per_s, 0);
    EXPECT_GE(p.parameters.alpha_us, 0);
  }
  EXPECT_TRUE(get) << text;
  EXPECT_TRUE(put) << text;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(DataTransports, CalibrateDaemonTest, ::testing::Values("ucx", "tcp"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace kvfabric
