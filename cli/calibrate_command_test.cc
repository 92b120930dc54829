#include "cli/calibrate_command.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/bus_calibration.h"
#include "core/env.h"
#include "gpu/device.h"

namespace kvfabric::cli {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * 1024;

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// Small, quick arguments: 64 KiB, 256 KiB, 1 MiB; 3 repeats; a 1 MiB cache scrub.
CalibrateArgs TinyArgs(const std::string& out) {
  CalibrateArgs a;
  a.out_path = out;
  a.min_bytes = 64 * kKiB;
  a.max_bytes = 1 * kMiB;
  a.repeats = 3;
  a.cache_scrub_bytes = 1 * kMiB;
  a.machine = "test-machine";
  a.security.insecure = true;
  return a;
}

const PathOutcome* Find(const CalibrationReport& r, BusPath path) {
  for (const PathOutcome& p : r.paths) {
    if (p.path == path) return &p;
  }
  return nullptr;
}

// Parses `argv` (after the program name) with a fresh App; returns the parse error's name, or
// "" when it parsed.
std::string Parse(std::vector<std::string> argv, CalibrateArgs* args) {
  CLI::App app{"test"};
  AddCalibrateSubcommand(app, args);
  std::vector<const char*> c = {"kvfabric"};
  for (const std::string& a : argv) c.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(c.size()), c.data());
  } catch (const CLI::ParseError& e) {
    return e.get_name();
  }
  return "";
}

TEST(CalibrateArgsTest, ParsesEveryFlag) {
  CalibrateArgs a;
  EXPECT_EQ(Parse({"calibrate", "--out", "/tmp/c.json", "--cache-host", "h1:7440", "--cache-host",
                   "h2:7440", "--cache-host-admin", "unix:/run/a", "--cache-host-admin",
                   "h2:7441", "--nvme-dir", "/nvme", "--min-bytes", "4KiB", "--max-bytes", "16MiB",
                   "--repeats", "7", "--json", "--cache-scrub-bytes", "0", "--data-transport",
                   "tcp"},
                  &a),
            "");
  EXPECT_EQ(a.out_path, "/tmp/c.json");
  EXPECT_EQ(a.cache_hosts, (std::vector<std::string>{"h1:7440", "h2:7440"}));
  EXPECT_EQ(a.cache_host_admins, (std::vector<std::string>{"unix:/run/a", "h2:7441"}));
  EXPECT_EQ(a.nvme_dir, "/nvme");
  EXPECT_EQ(a.min_bytes, 4 * kKiB);
  EXPECT_EQ(a.max_bytes, 16 * kMiB);
  EXPECT_EQ(a.repeats, 7);
  EXPECT_TRUE(a.json);
  EXPECT_EQ(a.cache_scrub_bytes, 0u);
  EXPECT_EQ(a.data_transport, "tcp");
  EXPECT_TRUE(ValidateCalibrateArgs(a).ok());
  a.data_transport = "rdma";
  const Status bad = ValidateCalibrateArgs(a).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--data-transport=\"rdma\""), std::string::npos) << bad;
}

TEST(CalibrateArgsTest, DefaultsAre64KiBTo256MiBWithFiveRepeats) {
  CalibrateArgs a;
  ASSERT_EQ(Parse({"calibrate", "--out", "x.json"}, &a), "");
  EXPECT_EQ(a.min_bytes, 64 * kKiB);
  EXPECT_EQ(a.max_bytes, 256 * kMiB);
  EXPECT_EQ(a.repeats, 5);
  EXPECT_FALSE(a.json);
  EXPECT_TRUE(a.cache_hosts.empty());
  EXPECT_EQ(a.data_transport, "ucx");
  auto sizes = ValidateCalibrateArgs(a);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->size(), 7u);
}

TEST(CalibrateArgsTest, CommandLineRefusesMissingOutAndUnparsableSizes) {
  CalibrateArgs a;
  EXPECT_EQ(Parse({"calibrate", "--max-bytes", "1MiB"}, &a), "RequiredError");
  EXPECT_EQ(Parse({"calibrate", "--out", "x", "--min-bytes", "64QB"}, &a), "ValidationError");
}

TEST(CalibrateArgsTest, ValidationNamesTheFlagThatIsWrong) {
  struct Case {
    std::function<void(CalibrateArgs&)> edit;
    const char* flag;
  };
  const std::vector<Case> cases = {
      {[](CalibrateArgs& a) { a.out_path.clear(); }, "--out"},
      {[](CalibrateArgs& a) { a.min_bytes = 1000; }, "--min-bytes"},
      {[](CalibrateArgs& a) { a.max_bytes = a.min_bytes; }, "--max-bytes"},
      {[](CalibrateArgs& a) { a.max_bytes = 8192 * kMiB; }, "--max-bytes"},
      {[](CalibrateArgs& a) { a.repeats = 0; }, "--repeats"},
      {[](CalibrateArgs& a) {
         a.cache_hosts = {"h:1", "h:1"};
       },
       "--cache-host h:1"},
      {[](CalibrateArgs& a) { a.cache_hosts = {""}; }, "--cache-host"},
      {[](CalibrateArgs& a) { a.cache_hosts = {"h:1"}; }, "--cache-host-admin: 0 given for 1"},
  };
  for (const Case& c : cases) {
    CalibrateArgs a = TinyArgs("x.json");
    c.edit(a);
    auto v = ValidateCalibrateArgs(a);
    ASSERT_TRUE(v.status().IsInvalidArgument()) << c.flag;
    EXPECT_NE(v.status().message().find(c.flag), std::string_view::npos) << v.status();
    // RunCalibrate refuses the same arguments before measuring or writing anything.
    CalibrateContext ctx;
    EXPECT_TRUE(RunCalibrate(a, ctx).status().IsInvalidArgument()) << c.flag;
  }
}

TEST(CalibrateCommandTest, MemcpyOnlyRunWritesAFileThatLoadsBack) {
  Env* env = Env::Default();
  const std::string out = TempPath("calibrate_memcpy.json");
  env->DeleteFile(out).IgnoreError();  // a leftover from an earlier run
  std::vector<std::string> progress;
  CalibrateContext ctx;
  ctx.progress = [&](const std::string& line) { progress.push_back(line); };
  auto report = RunCalibrate(TinyArgs(out), ctx);
  ASSERT_TRUE(report.ok()) << report.status();

  auto loaded = LoadBusCalibration(env, out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->machine, "test-machine");
  EXPECT_GT(loaded->created_unix_us, 0u);
  ASSERT_EQ(loaded->paths.size(), 1u);
  const PathCalibration& p = loaded->paths[0];
  EXPECT_EQ(p.path, BusPath::kLocalMemcpy);
  EXPECT_EQ(p.host_id, "");
  EXPECT_EQ(p.min_bytes, 64 * kKiB);
  EXPECT_EQ(p.max_bytes, 1 * kMiB);
  EXPECT_EQ(p.samples, 2u * 3 * 3);  // 2 runs x 3 repeats x 3 sizes
  EXPECT_GT(p.parameters.beta_bytes_per_s, 0);
  EXPECT_GE(p.parameters.alpha_us, 0);
  EXPECT_EQ(BusCalibrationToJson(*loaded), BusCalibrationToJson(report->calibration));

  // Everything else is listed as not measured, with the reason, and is not in the file.
  const PathOutcome* nvme = Find(*report, BusPath::kNvmeToHost);
  ASSERT_NE(nvme, nullptr);
  EXPECT_FALSE(nvme->measured);
  EXPECT_EQ(nvme->not_measured_reason, "no --nvme-dir");
  for (BusPath path : {BusPath::kHostToDevice, BusPath::kDeviceToHost}) {
    const PathOutcome* d = Find(*report, path);
    ASSERT_NE(d, nullptr);
    EXPECT_FALSE(d->measured);
    EXPECT_EQ(d->not_measured_reason, "no GPU");
  }
  ASSERT_NE(Find(*report, BusPath::kRemoteHostToLocalHost), nullptr);
  EXPECT_FALSE(Find(*report, BusPath::kRemoteHostToLocalHost)->measured);
  EXPECT_EQ(report->measured_paths(), 1);

  // One progress line per size and run, plus the phases.
  int per_size = 0;
  for (const std::string& line : progress) {
    if (line.rfind("memcpy run ", 0) == 0) ++per_size;
  }
  EXPECT_EQ(per_size, 6) << "3 sizes x 2 runs";

  const std::string text = FormatCalibrationText(*report);
  EXPECT_NE(text.find("local_memcpy"), std::string::npos) << text;
  EXPECT_NE(text.find("host_to_device             -                not measured: no GPU"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("wrote " + out + ": 1 paths"), std::string::npos) << text;

  const auto json = nlohmann::json::parse(FormatCalibrationJson(*report));
  EXPECT_EQ(json["out"], out);
  EXPECT_EQ(json["sizes_bytes"].size(), 3u);
  EXPECT_EQ(json["measured_paths"], 1);
  EXPECT_EQ(json["paths"][0]["path"], "local_memcpy");
  EXPECT_EQ(json["paths"][0]["measured"], true);
  EXPECT_EQ(json["paths"][0]["run_b"].size(), 3u);
  EXPECT_EQ(json["paths"][0]["worst_error_ratio"].get<double>(), p.worst_error_ratio);
  bool saw_no_gpu = false;
  for (const auto& e : json["paths"]) {
    if (e["path"] == "host_to_device")
      saw_no_gpu = e["measured"] == false && e["reason"] == "no GPU";
  }
  EXPECT_TRUE(saw_no_gpu) << json.dump();
  EXPECT_TRUE(env->DeleteFile(out).ok());
}

TEST(CalibrateCommandTest, APrefillProbeWritesTheModelsRecomputeEntry) {
  Env* env = Env::Default();
  const std::string out = TempPath("calibrate_prefill.json");
  env->DeleteFile(out).IgnoreError();
  CalibrateContext ctx;
  // An engine whose prefill costs exactly 800 us + 20 us n + 0.01 us n (p + n/2).
  const RecomputeParameters truth{800.0, 20.0, 0.01};
  ctx.prefill = [&](std::uint64_t n, std::uint64_t p) -> StatusOr<double> {
    return RecomputeMicros(truth, static_cast<double>(n), static_cast<double>(p));
  };
  ctx.prefill_model_id = "engine/m1";
  ctx.prefill_options.repeats = 1;
  auto report = RunCalibrate(TinyArgs(out), ctx);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(report->prefill.has_value());
  EXPECT_LT(report->prefill->worst_abs_error, 1e-6);
  EXPECT_NE(FormatCalibrationText(*report).find("prefill engine/m1"), std::string::npos);
  EXPECT_NE(FormatCalibrationJson(*report).find("\"prefill\""), std::string::npos);
  auto loaded = LoadBusCalibration(env, out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->recompute.size(), 1u);
  EXPECT_EQ(loaded->recompute[0].model_id, "engine/m1");
  EXPECT_NEAR(loaded->recompute[0].parameters.c1_us_per_token, 20.0, 1e-6);
  EXPECT_NEAR(loaded->recompute[0].parameters.c2_us_per_token2, 0.01, 1e-9);
  ASSERT_TRUE(env->DeleteFile(out).ok());
}

TEST(CalibrateCommandTest, MeasuresNvmeReadsWhenGivenADirectory) {
  Env* env = Env::Default();
  const std::string dir = TempPath("calibrate_nvme");
  ASSERT_TRUE(env->CreateDirIfMissing(dir).ok());
  const std::string out = TempPath("calibrate_nvme.json");
  CalibrateArgs args = TinyArgs(out);
  args.nvme_dir = dir;
  auto report = RunCalibrate(args, CalibrateContext{});
  if (report.status().IsInvalidArgument() &&
      report.status().message().find("O_DIRECT") != std::string_view::npos) {
    GTEST_SKIP() << "the test's temporary directory refuses O_DIRECT: " << report.status();
  }
  ASSERT_TRUE(report.ok()) << report.status();
  auto loaded = LoadBusCalibration(env, out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->paths.size(), 2u);
  EXPECT_EQ(loaded->paths[1].path, BusPath::kNvmeToHost);
  EXPECT_EQ(loaded->paths[1].host_id, "");
  EXPECT_TRUE(env->GetChildren(dir)->empty()) << "the scratch file must be gone";
  EXPECT_TRUE(env->DeleteDir(dir).ok());
  EXPECT_TRUE(env->DeleteFile(out).ok());
}

// The CPU reference device stands in for a GPU: it exercises the host<->device probe code.
// (The command itself never calibrates against it.)
TEST(CalibrateCommandTest, MeasuresHostDevicePathsWhenADeviceIsPresent) {
  gpu::DeviceOptions o;
  o.arena_bytes = 1 * kMiB;
  auto device = gpu::CreateCpuDevice(o);
  ASSERT_TRUE(device.ok()) << device.status();
  const std::string out = TempPath("calibrate_device.json");
  CalibrateContext ctx;
  ctx.device = device->get();
  auto report = RunCalibrate(TinyArgs(out), ctx);
  ASSERT_TRUE(report.ok()) << report.status();
  auto loaded = LoadBusCalibration(Env::Default(), out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<BusPath> paths;
  for (const PathCalibration& p : loaded->paths) paths.push_back(p.path);
  EXPECT_EQ(paths, (std::vector<BusPath>{BusPath::kLocalMemcpy, BusPath::kHostToDevice,
                                         BusPath::kDeviceToHost}));
  EXPECT_EQ(Find(*report, BusPath::kHostToDevice)->where, (*device)->name());

  // A device whose arena cannot hold the largest probe is an error, not a guess.
  CalibrateArgs big = TinyArgs(TempPath("calibrate_device_big.json"));
  big.max_bytes = 4 * kMiB;
  auto refused = RunCalibrate(big, ctx);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_FALSE(Env::Default()->FileExists(big.out_path)) << "nothing is written on error";
  EXPECT_TRUE(Env::Default()->DeleteFile(out).ok());
}

TEST(CalibrateCommandTest, WithoutAGpuTheDeviceIsAbsentWithAReason) {
  CalibrationDevice d = OpenCalibrationDevice(1 * kMiB);
  if (d.device != nullptr) GTEST_SKIP() << "this machine has a GPU: " << d.device->name();
  const bool says_why =
      d.absent_reason.rfind("no GPU (", 0) == 0 || d.absent_reason.rfind("GPU unusable: ", 0) == 0;
  EXPECT_TRUE(says_why) << d.absent_reason;
}

TEST(CalibrateCommandTest, UnreachableCacheHostFailsBeforeMeasuringAndWritesNothing) {
  const std::string out = TempPath("calibrate_unreachable.json");
  CalibrateArgs args = TinyArgs(out);
  args.cache_hosts = {"127.0.0.1:1"};
  args.cache_host_admins = {"127.0.0.1:2"};
  args.rpc_timeout_ms = 2000;
  std::vector<std::string> progress;
  CalibrateContext ctx;
  ctx.progress = [&](const std::string& line) { progress.push_back(line); };
  auto report = RunCalibrate(args, ctx);
  ASSERT_FALSE(report.ok());
#ifdef KVF_HAVE_UCX
  EXPECT_NE(report.status().message().find("--cache-host 127.0.0.1:1"), std::string_view::npos)
      << report.status();
#else
  EXPECT_EQ(report.status().code(), StatusCode::kFailedPrecondition) << report.status();
  EXPECT_NE(report.status().message().find("UCX"), std::string_view::npos) << report.status();
#endif
  EXPECT_TRUE(progress.empty()) << progress.front();
  EXPECT_FALSE(Env::Default()->FileExists(out));
}

TEST(CalibrateCommandTest, AnUnwritableOutPathIsAnErrorNamingIt) {
  CalibrateArgs args = TinyArgs(TempPath("no/such/dir/calibration.json"));
  auto report = RunCalibrate(args, CalibrateContext{});
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("--out " + args.out_path), std::string_view::npos)
      << report.status();
}

// The one-line summary the demo prints per path names a concurrency gain where there is one.
TEST(CalibrateCommandTest, APathLineNamesItsConcurrencyGain) {
  PathCalibration p;
  p.path = BusPath::kRemoteHostToLocalHost;
  p.host_id = "cache-1";
  p.parameters = {12.5, 2e9};
  const std::string plain = FormatPathCalibrationLine(p);
  EXPECT_EQ(plain.find("concurrency gain"), std::string::npos) << plain;
  p.parameters.concurrency_gain = 1.5;
  const std::string line = FormatPathCalibrationLine(p);
  EXPECT_NE(line.find("noise floor   0.0%; concurrency gain 1.50\n"), std::string::npos) << line;
  EXPECT_EQ(line.back(), '\n');
}

}  // namespace
}  // namespace kvfabric::cli
