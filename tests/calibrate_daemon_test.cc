// `kvfabric calibrate` against a real kvfabric-cached on loopback, over each
// data transport (UCX, and kernel TCP with --data-transport=tcp): the fetch
// paths to and from the daemon are measured, fitted and written under the
// daemon's host id, and every probe block is deleted again.
//
// No timing assertions: the figures depend on the machine; this checks that
// the command measures the paths it claims, writes a file the services load,
// and leaves the daemon as it found it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "cli/calibrate_command.h"
#include "core/bus_calibration.h"
#include "core/env.h"
#include "tests/server_process.h"

namespace kvfabric {
namespace {

// A daemon on loopback with `transport`, and calibrate's arguments for it (up to 64 MiB, so
// that bytes, not the RPC round trips, dominate the largest probes and the fit always sees time
// grow with size).
struct Target {
  std::string dir;
  std::unique_ptr<testing::ServerProcess> daemon;
  cli::CalibrateArgs args;
};

void StartTarget(const std::string& transport, Target* t,
                 const std::string& host_id = "calib-host") {
  char tmpl[] = "/tmp/kvf_calibrate_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  t->dir = tmpl;
  auto daemon = testing::ServerProcess::Start(
      testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cached", t->dir,
      {"--host-id=" + host_id, "--insecure", "--grpc-address=127.0.0.1:0",
       "--transport-address=127.0.0.1:0", "--metrics-address=off", "--admin-address=127.0.0.1:0",
       "--lock-memory=off", "--log-level=warn", "--host-pool-bytes=384MiB",
       "--host-page-bytes=1MiB", "--data-transport=" + transport});
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  t->daemon = std::move(*daemon);
  cli::CalibrateArgs& args = t->args;
  args.out_path = t->dir + "/calibration.json";
  args.cache_hosts = {t->daemon->grpc()};
  args.security.insecure = true;
  args.cache_host_admins = {t->daemon->Get("admin")};
  args.min_bytes = 256 << 10;
  args.max_bytes = 64 << 20;
  args.repeats = 3;
  args.cache_scrub_bytes = 0;
  args.data_transport = transport;
}

// RunCalibrate without a device or a prefill probe.
StatusOr<cli::CalibrationReport> Calibrate(const cli::CalibrateArgs& args) {
  cli::CalibrateContext ctx;
  ctx.env = Env::Default();
  ctx.no_device_reason = "no GPU in this test";
  return cli::RunCalibrate(args, ctx);
}

class CalibrateDaemonTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CalibrateDaemonTest, MeasuresBothDirectionsOfADaemonAndWritesAFileServicesLoad) {
  Target t;
  ASSERT_NO_FATAL_FAILURE(StartTarget(GetParam(), &t));
  const cli::CalibrateArgs& args = t.args;
  const std::string& dir = t.dir;
  auto report = Calibrate(args);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string text = cli::FormatCalibrationText(*report);
  EXPECT_NE(text.find("calib-host"), std::string::npos) << text;

  // The read path's concurrency gain: four reads of 16 MiB (four of the largest size that fit
  // the 64 MiB staging region) at once, against one alone, written to the file.
  EXPECT_NE(text.find("concurrency gain remote_host_to_local_host calib-host: 4 at once of 16 MiB"),
            std::string::npos)
      << text;
  double measured_gain = 0;
  for (const cli::PathOutcome& p : report->paths) {
    if (p.path != BusPath::kRemoteHostToLocalHost || !p.concurrency) continue;
    EXPECT_EQ(p.concurrency->streams, 4);
    EXPECT_EQ(p.concurrency->repeats, 3);
    EXPECT_GT(p.concurrency->alone_us, 0);
    EXPECT_GT(p.concurrency->together_us, 0);
    measured_gain = p.concurrency->gain;
  }
  EXPECT_GE(measured_gain, 1) << text;
  EXPECT_LE(measured_gain, 16) << text;

  auto loaded = LoadBusCalibration(Env::Default(), args.out_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  bool get = false, put = false;
  for (const PathCalibration& p : loaded->paths) {
    if (p.host_id != "calib-host") continue;
    get = get || p.path == BusPath::kRemoteHostToLocalHost;
    put = put || p.path == BusPath::kLocalHostToRemoteHost;
    EXPECT_GT(p.parameters.beta_bytes_per_s, 0);
    EXPECT_GE(p.parameters.alpha_us, 0);
    EXPECT_DOUBLE_EQ(p.parameters.concurrency_gain,
                     p.path == BusPath::kRemoteHostToLocalHost ? measured_gain : 1.0);
  }
  EXPECT_TRUE(get) << text;
  EXPECT_TRUE(put) << text;
  std::filesystem::remove_all(dir);
}

// Two daemons over TCP, calib-a and calib-b; *args calibrates both.
void StartTwoTargets(Target* a, Target* b, cli::CalibrateArgs* args) {
  ASSERT_NO_FATAL_FAILURE(StartTarget("tcp", a, "calib-a"));
  ASSERT_NO_FATAL_FAILURE(StartTarget("tcp", b, "calib-b"));
  *args = a->args;
  args->cache_hosts.push_back(b->daemon->grpc());
  args->cache_host_admins.push_back(b->daemon->Get("admin"));
}

// A calibrate context whose stand-in prefill sleeps for t = 2 ms + 5 us n + 1 ns n (p + n/2):
// it shares nothing with the reads, so the split-overlap tests check the plumbing, not s.
cli::CalibrateContext SleepyPrefillContext() {
  cli::CalibrateContext ctx;
  ctx.env = Env::Default();
  ctx.no_device_reason = "no GPU in this test";
  ctx.prefill_model_id = "sleepy";
  ctx.prefill_options.repeats = 1;
  ctx.prefill = [](std::uint64_t n, std::uint64_t p) -> StatusOr<double> {
    const double us = 2000 + 5.0 * n + 0.001 * n * (p + n / 2.0);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<std::int64_t>(us)));
    return us;
  };
  return ctx;
}

// With an engine's prefill, calibrate also measures how much the prefill and reads from the
// daemon slow each other, and writes s as the model's split_serial_fraction.
TEST(CalibrateDaemonSplitOverlapTest, IsMeasuredBesideReadsAndWrittenWithThePrefillFit) {
  Target t;
  ASSERT_NO_FATAL_FAILURE(StartTarget("tcp", &t));
  const cli::CalibrateContext ctx = SleepyPrefillContext();
  auto report = cli::RunCalibrate(t.args, ctx);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->split_overlap.has_value());
  const SplitOverlapReport& o = *report->split_overlap;
  EXPECT_GE(o.fetches, 1u);
  EXPECT_GT(o.prefill_us, 0);
  EXPECT_GT(o.fetch_us, 0);
  EXPECT_GE(o.serial_fraction, 0);
  EXPECT_LE(o.serial_fraction, 1);
  const std::string text = cli::FormatCalibrationText(*report);
  EXPECT_NE(text.find("split overlap sleepy: s = "), std::string::npos) << text;
  EXPECT_EQ(report->split_overlap_from, "calib-host");
  auto loaded = LoadBusCalibration(Env::Default(), t.args.out_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_EQ(loaded->recompute.size(), 1u);
  EXPECT_EQ(loaded->recompute[0].model_id, "sleepy");
  EXPECT_DOUBLE_EQ(loaded->recompute[0].parameters.split_serial_fraction, o.serial_fraction);
  std::printf("%s", text.c_str());
  std::filesystem::remove_all(t.dir);
}

// With two daemons, calibrate also measures the client's ingest: every probe size read from both
// at once, fitted over the totals and written as client_ingest with no host id (the default
// placement plans every client with). Each read lands in its own slice of the staging region and
// is CRC-checked there, so a probe that overlapped the two would fail the run.
TEST(CalibrateDaemonIngestTest, TwoDaemonsReadAtOnceAreTheClientIngest) {
  Target a, b;
  cli::CalibrateArgs args;
  ASSERT_NO_FATAL_FAILURE(StartTwoTargets(&a, &b, &args));
  args.max_bytes = 16 << 20;
  auto report = Calibrate(args);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string text = cli::FormatCalibrationText(*report);
  EXPECT_EQ(text.find("not measured: fewer than two --cache-host"), std::string::npos) << text;
  auto loaded = LoadBusCalibration(Env::Default(), args.out_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  int ingest = 0;
  for (const PathCalibration& p : loaded->paths) {
    if (p.path != BusPath::kClientIngest) continue;
    ++ingest;
    EXPECT_EQ(p.host_id, "");
    EXPECT_GT(p.parameters.beta_bytes_per_s, 0);
  }
  EXPECT_EQ(ingest, 1) << text;
  std::printf("%s", text.c_str());
  std::filesystem::remove_all(a.dir);
  std::filesystem::remove_all(b.dir);
}

// With two daemons, the split-overlap probe's fetch side reads from both at once, as a plan's
// fetch does (a fetch from one daemon left the CPUs half as busy as a real split's: the demo's
// first splits ran 1.17-1.23x their prediction until placement refitted s).
TEST(CalibrateDaemonSplitOverlapTest, ReadsFromEveryDaemonAtOnceBesideThePrefill) {
  Target a, b;
  cli::CalibrateArgs args;
  ASSERT_NO_FATAL_FAILURE(StartTwoTargets(&a, &b, &args));
  args.max_bytes = 4 << 20;
  const cli::CalibrateContext ctx = SleepyPrefillContext();
  auto report = cli::RunCalibrate(args, ctx);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->split_overlap.has_value());
  EXPECT_EQ(report->split_overlap_from, "2 daemons at once");
  EXPECT_GE(report->split_overlap->fetches, 1u);
  EXPECT_GT(report->split_overlap->fetch_us, 0);
  const std::string text = cli::FormatCalibrationText(*report);
  EXPECT_NE(text.find("(fetch side: reads from 2 daemons at once)"), std::string::npos) << text;
  std::filesystem::remove_all(a.dir);
  std::filesystem::remove_all(b.dir);
}

// With one daemon there is nothing to read at once: the ingest is not measured, and says why.
TEST(CalibrateDaemonIngestTest, OneDaemonLeavesTheIngestUnmeasuredWithAReason) {
  Target t;
  ASSERT_NO_FATAL_FAILURE(StartTarget("tcp", &t));
  t.args.max_bytes = 4 << 20;
  auto report = Calibrate(t.args);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string text = cli::FormatCalibrationText(*report);
  EXPECT_NE(text.find("fewer than two --cache-host"), std::string::npos) << text;
  std::filesystem::remove_all(t.dir);
}

INSTANTIATE_TEST_SUITE_P(DataTransports, CalibrateDaemonTest, ::testing::Values("ucx", "tcp"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace kvfabric
