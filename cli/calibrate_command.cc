#include "cli/calibrate_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "cli/calibrate_internal.h"
#include "client/synthetic_transformer.h"
#include "core/config/unit_flags.h"
#include "core/units.h"

#ifdef KVF_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace kvfabric::cli {
namespace {

using calibrate_internal::MicrosSince;
using calibrate_internal::SteadyClock;
#ifdef KVF_HAVE_UCX
using calibrate_internal::CacheHostProbe;
using calibrate_internal::CacheHostTarget;
using calibrate_internal::ClientFabric;
using calibrate_internal::IngestProbe;
#endif  // KVF_HAVE_UCX

std::string PathLabel(BusPath path, const std::string& host_id) {
  std::string label(BusPathArrowName(path));
  return host_id.empty() ? label : label + " " + host_id;
}

// ---------------------------------------------------------------- device copies

// Host -> device or device -> host: one copy between a pinned buffer and the arena's start,
// timed until an event recorded after it completes.
class DeviceCopyProbe final : public PathProbe {
 public:
  static StatusOr<std::unique_ptr<PathProbe>> Create(gpu::Device* device, bool to_device,
                                                     std::uint64_t max_bytes) {
    if (device->arena_bytes() < max_bytes) {
      return Status::FailedPrecondition(
          "device " + device->name() + ": arena of " + FormatBytes(device->arena_bytes()) +
          " cannot hold the largest probe, --max-bytes " + FormatBytes(max_bytes));
    }
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::PinnedHostBuffer> pinned,
                         device->AllocatePinnedHost(max_bytes));
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> event, device->CreateEvent());
    return std::unique_ptr<PathProbe>(
        new DeviceCopyProbe(device, to_device, std::move(pinned), std::move(event)));
  }

  StatusOr<double> Measure(std::uint64_t bytes) override {
    const std::span<std::byte> host = pinned_->bytes().subspan(0, bytes);
    const gpu::DeviceRange range{0, bytes};
    const auto start = SteadyClock::now();
    Status s = to_device_ ? device_->CopyHostToDevice(host, range)
                          : device_->CopyDeviceToHost(range, host);
    if (s.ok()) {
      s = device_->Record(*event_,
                          to_device_ ? gpu::Queue::kHostToDevice : gpu::Queue::kDeviceToHost);
    }
    if (s.ok()) s = event_->Wait(start + std::chrono::seconds(60));
    const double us = MicrosSince(start);
    if (!s.ok()) return s.WithContext("device " + device_->name());
    return us;
  }

 private:
  DeviceCopyProbe(gpu::Device* device, bool to_device,
                  std::unique_ptr<gpu::PinnedHostBuffer> pinned, std::unique_ptr<gpu::Event> event)
      : device_(device),
        to_device_(to_device),
        pinned_(std::move(pinned)),
        event_(std::move(event)) {}

  gpu::Device* const device_;
  const bool to_device_;
  std::unique_ptr<gpu::PinnedHostBuffer> pinned_;
  std::unique_ptr<gpu::Event> event_;
};

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// Measures one path and appends its outcome.
class Calibrator {
 public:
  Calibrator(const std::vector<std::uint64_t>& sizes, int repeats,
             const std::function<void(const std::string&)>& progress, CalibrationReport* report)
      : sizes_(sizes), repeats_(repeats), progress_(progress), report_(report) {}

  void Progress(const std::string& line) const {
    if (progress_) progress_(line);
  }

  Status Measure(PathProbe& probe, BusPath path, const std::string& host_id,
                 const std::string& where) {
    Progress("measuring " + PathLabel(path, host_id) + ": " + std::to_string(sizes_.size()) +
             " sizes " + FormatBytes(sizes_.front()) + ".." + FormatBytes(sizes_.back()) + " x " +
             std::to_string(repeats_) + " repeats x 2 runs, " +
             FormatBytes(ProbeBytesPerPath(sizes_, repeats_)) + " in all");
    ProbeRunOptions o;
    o.repeats = repeats_;
    o.label = PathLabel(path, host_id);
    o.progress = progress_;
    // A fit whose time does not grow with size is noise, not the path:
    // measured again, up to three times (core/bus_probe.h).
    StatusOr<PathFit> fit = MeasureAndFit(probe, sizes_, o, JudgeOptions(), 3);
    if (!fit.ok()) return fit.status().WithContext(o.label);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s: alpha %.2f us, beta %s; out of sample: median %.2f%%, worst %.2f%% (%s)",
                  o.label.c_str(), fit->final_parameters.alpha_us,
                  FormatRate(fit->final_parameters.beta_bytes_per_s).c_str(),
                  100 * fit->median_abs_error, 100 * fit->worst_abs_error,
                  fit->target_met ? "target met" : "target NOT met");
    Progress(line);
    PathOutcome out;
    out.path = path;
    out.host_id = host_id;
    out.where = where;
    out.measured = true;
    out.fit = std::move(*fit);
    report_->paths.push_back(std::move(out));
    return Status::OK();
  }

  void NotMeasured(BusPath path, const std::string& where, const std::string& reason) {
    PathOutcome out;
    out.path = path;
    out.where = where;
    out.not_measured_reason = reason;
    Progress(std::string(BusPathArrowName(path)) + ": not measured: " + reason);
    report_->paths.push_back(std::move(out));
  }

 private:
  const std::vector<std::uint64_t>& sizes_;
  const int repeats_;
  const std::function<void(const std::string&)>& progress_;
  CalibrationReport* const report_;
};

#ifdef KVF_HAVE_UCX
// The concurrency gain of `target`'s remote_host_to_local_host path, fitted as `out`: reads of
// the largest probe size of which kConcurrencyProbeStreams fit in the staging region.
Status MeasureConcurrencyGain(CacheHostTarget* target, std::span<const std::uint64_t> sizes,
                              std::uint64_t staging_bytes, int repeats,
                              const Calibrator& calibrator, PathOutcome* out) {
  constexpr int k = kConcurrencyProbeStreams;
  std::uint64_t bytes = 0;
  for (std::uint64_t s : sizes) {
    if (s <= staging_bytes / k) bytes = std::max(bytes, s);
  }
  if (bytes == 0) {
    out->not_measured_gain = "no probe size of which " + std::to_string(k) + " fit in " +
                             FormatBytes(staging_bytes) + " of staging";
    return Status::OK();
  }
  calibrator.Progress(PathLabel(out->path, out->host_id) + ": concurrency gain, " +
                      std::to_string(k) + " reads of " + FormatBytes(bytes) + " at once x " +
                      std::to_string(repeats) + " repeats");
  IngestProbe together(std::vector<CacheHostTarget*>(k, target), bytes, "concurrency gain probe",
                       /*transfers_only=*/true);
  KVF_ASSIGN_OR_RETURN(ConcurrencyGainReport gain,
                       ProbeConcurrencyGain(
                           out->fit.final_parameters, bytes, k, repeats,
                           [target, bytes] { return target->TimedGet(bytes, 0); },
                           [&together, bytes] { return together.Measure(bytes * k); }));
  calibrator.Progress(PathLabel(out->path, out->host_id) + ": " + FormatConcurrencyGain(gain));
  out->concurrency = gain;
  return Status::OK();
}
#endif  // KVF_HAVE_UCX

std::string Percent(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", 100 * ratio);
  return buf;
}

}  // namespace

int CalibrationReport::measured_paths() const {
  return static_cast<int>(
      std::count_if(paths.begin(), paths.end(), [](const PathOutcome& p) { return p.measured; }));
}

int CalibrationReport::targets_met() const {
  return static_cast<int>(std::count_if(paths.begin(), paths.end(), [](const PathOutcome& p) {
    return p.measured && p.fit.target_met;
  }));
}

CalibrateArgs EmbeddedClusterCalibrateArgs(const std::vector<std::string>& grpc_addresses,
                                           const std::vector<std::string>& admin_addresses,
                                           const std::string& dir, std::uint64_t max_bytes,
                                           const std::string& data_transport) {
  CalibrateArgs a;
  a.out_path = dir + "/calibration.json";
  a.cache_hosts = grpc_addresses;
  a.cache_host_admins = admin_addresses;
  a.min_bytes = std::uint64_t{256} << 10;
  a.max_bytes = max_bytes;
  a.repeats = 3;
  a.cache_scrub_bytes = std::uint64_t{16} << 20;
  a.nvme_dir = dir;
  // The embedded daemons' NVMe tiers are folders on the one device under `dir`: each gets what
  // the device delivers while the others read too.
  a.nvme_readers = static_cast<std::uint32_t>(
      std::clamp<std::size_t>(grpc_addresses.size(), 1, kMaxNvmeProbeReaders));
  a.data_transport = data_transport;
  a.security.insecure = true;  // the embedded cluster's default: plaintext on 127.0.0.1
  return a;
}

std::string FormatPathCalibrationLine(const PathCalibration& p) {
  char line[256];
  std::snprintf(line, sizeof(line),
                "  %-28s %-8s t = %7.1f us + bytes / %5.2f GB/s   worst out-of-sample %5.1f%%, "
                "noise floor %5.1f%%\n",
                std::string(BusPathName(p.path)).c_str(),
                p.host_id.empty() ? "local" : p.host_id.c_str(), p.parameters.alpha_us,
                p.parameters.beta_bytes_per_s / 1e9, 100 * p.worst_error_ratio,
                100 * p.noise_floor_ratio);
  std::string out = line;
  if (p.parameters.concurrency_gain != 1) {
    char g[64];
    std::snprintf(g, sizeof(g), "; concurrency gain %.2f\n", p.parameters.concurrency_gain);
    out.pop_back();
    out += g;
  }
  if (!HasFlatSizeCurve(p.parameters)) {
    // The size curve (bus_cost_model.h), knot by knot: only kept where it beat the line.
    out.pop_back();
    out += "; size curve";
    for (int j = 0; j < kSizeClasses; ++j) {
      char k[48];
      std::snprintf(k, sizeof(k), " %s x%.2f", FormatBytes(SizeClassBytes(j)).c_str(),
                    p.parameters.size_factors[j]);
      out += k;
    }
    out += "\n";
  }
  return out;
}

CLI::App* AddCalibrateSubcommand(CLI::App& app, CalibrateArgs* args) {
  CLI::App* sub = app.add_subcommand(
      "calibrate", "measure the bus paths, fit the cost model, write the calibration file");
  sub->add_option("--out", args->out_path, "calibration file to write (JSON)")->required();
  sub->add_option("--cache-host", args->cache_hosts,
                  "gRPC address HOST:PORT of a cache-host daemon to measure; repeatable")
      ->take_all();
  sub->add_option("--cache-host-admin", args->cache_host_admins,
                  "the admin listener (--admin-address) of each --cache-host, in the same order: "
                  "the probe deletes the blocks it writes there")
      ->take_all();
  sub->add_option("--nvme-dir", args->nvme_dir,
                  "directory on the NVMe device: O_DIRECT reads of a scratch file made there");
  sub->add_option("--nvme-readers", args->nvme_readers,
                  "readers of that device at once: the daemons that share it (each gets the "
                  "fitted rate while the others read too); 1..16, default 1")
      ->check(CLI::Range(1u, kMaxNvmeProbeReaders));
  AddBytesOption(*sub, "--min-bytes", &args->min_bytes, "smallest probe (a multiple of 4 KiB)");
  AddBytesOption(*sub, "--max-bytes", &args->max_bytes,
                 "largest probe; sizes go up by 4x from --min-bytes");
  sub->add_option("--repeats", args->repeats, "timed transfers per size and run (median taken)")
      ->default_val(args->repeats);
  AddBytesOption(*sub, "--cache-scrub-bytes", &args->cache_scrub_bytes,
                 "bytes read before each timed memcpy to make it cold; 0 = warm copies");
  sub->add_option("--data-transport", args->data_transport,
                  "the daemons' data transport: ucx (default) | tcp (kernel sockets)");
  sub->add_flag("--json", args->json, "machine-readable output");
  sub->add_option("--prefill-probe", args->prefill_probe,
                  "also fit the recompute model: \"synthetic\" probes kvfabric's synthetic "
                  "transformer for the model below (for engines that do not state their own)")
      ->check(CLI::IsMember({"", "synthetic"}));
  sub->add_option("--model-id", args->model_id, "the probed model's id (default synthetic)");
  sub->add_option("--model-layers", args->model_layers, "its layers (default 32)");
  sub->add_option("--model-kv-heads", args->model_kv_heads, "its KV heads (default 8)");
  sub->add_option("--model-head-dim", args->model_head_dim, "its head dim (default 128)");
  sub->add_option("--tokens-per-block", args->tokens_per_block, "tokens per block (default 16)");
  sub->add_option("--dtype", args->dtype, "fp16 | bf16 | fp32 (default fp16)");
  return sub;
}

StatusOr<std::vector<std::uint64_t>> ValidateCalibrateArgs(const CalibrateArgs& args) {
  if (args.out_path.empty()) {
    return Status::InvalidArgument("--out: required (the calibration file to write)");
  }
  std::set<std::string> seen;
  for (const std::string& host : args.cache_hosts) {
    if (host.empty()) return Status::InvalidArgument("--cache-host: empty address");
    if (!seen.insert(host).second) {
      return Status::InvalidArgument("--cache-host " + host + ": given twice");
    }
  }
  if (args.cache_host_admins.size() != args.cache_hosts.size()) {
    return Status::InvalidArgument(
        "--cache-host-admin: " + std::to_string(args.cache_host_admins.size()) + " given for " +
        std::to_string(args.cache_hosts.size()) +
        " --cache-host; give each daemon's --admin-address, in the same order (the probe "
        "deletes the blocks it writes, an administrative RPC)");
  }
  if (args.data_transport != "ucx" && args.data_transport != "tcp") {
    return Status::InvalidArgument("--data-transport=\"" + args.data_transport +
                                   "\": must be ucx or tcp, as the daemons were started with");
  }
  if (args.rpc_timeout_ms <= 0) {
    return Status::InvalidArgument("rpc_timeout_ms " + std::to_string(args.rpc_timeout_ms) +
                                   ": must be > 0");
  }
  return PlanProbeSizes(args.min_bytes, args.max_bytes, args.repeats);
}

StatusOr<CalibrationReport> RunCalibrate(const CalibrateArgs& args,
                                         const CalibrateContext& context) {
  KVF_ASSIGN_OR_RETURN(std::vector<std::uint64_t> sizes, ValidateCalibrateArgs(args));
  Env* env = context.env != nullptr ? context.env : Env::Default();
  // Found now rather than after minutes of measuring.
  if (const std::string dir = DirName(args.out_path); !env->FileExists(dir)) {
    return Status::InvalidArgument("--out " + args.out_path + ": directory " + dir +
                                   " does not exist");
  }
  CalibrationReport report;
  report.sizes = sizes;
  report.repeats = args.repeats;
  report.judge_from_bytes = std::min(JudgeOptions{}.judge_from_bytes, sizes.back());
  report.target_error_ratio = JudgeOptions{}.target_error_ratio;
  report.out_path = args.out_path;
  Calibrator calibrator(sizes, args.repeats, context.progress, &report);

#ifdef KVF_HAVE_UCX
  // Every daemon is checked before anything is measured: a typo in the last --cache-host
  // should not cost the minutes the others take.
  std::vector<std::unique_ptr<CacheHostTarget>> sessions;
  std::map<std::string, std::string> host_ids;  // host_id -> address
  for (std::size_t h = 0; h < args.cache_hosts.size(); ++h) {
    const std::string& address = args.cache_hosts[h];
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<CacheHostTarget> session,
                         CacheHostTarget::Open(address, args.cache_host_admins[h], sizes,
                                               args.rpc_timeout_ms, args.security));
    auto [it, fresh] = host_ids.emplace(session->host_id(), address);
    if (!fresh) {
      return Status::InvalidArgument("--cache-host " + address + " and " + it->second +
                                     " are the same daemon (host_id " + it->first + ")");
    }
    calibrator.Progress("cache host " + address + ": host_id " + session->host_id());
    sessions.push_back(std::move(session));
  }
#else
  if (!args.cache_hosts.empty()) {
    return Status::FailedPrecondition(
        "--cache-host: this build has no UCX transport, so cache-host paths cannot be measured "
        "(build with libucx-dev)");
  }
#endif

  {
    MemcpyProbeOptions o;
    o.max_bytes = sizes.back();
    o.cache_scrub_bytes = args.cache_scrub_bytes;
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<PathProbe> probe, CreateMemcpyProbe(o));
    KVF_RETURN_IF_ERROR(calibrator.Measure(*probe, BusPath::kLocalMemcpy, "", "local"));
  }

  if (args.nvme_dir.empty()) {
    calibrator.NotMeasured(BusPath::kNvmeToHost, "-", "no --nvme-dir");
  } else {
    NvmeReadProbeOptions o;
    o.dir = args.nvme_dir;
    o.max_bytes = sizes.back();
    o.readers = args.nvme_readers;
    calibrator.Progress("nvme→host: writing a " + FormatBytes(4 * o.max_bytes * o.readers) +
                        " scratch file in " + o.dir);
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<PathProbe> probe, CreateNvmeReadProbe(env, o));
    const std::string where =
        args.nvme_dir + (o.readers > 1 ? " (" + std::to_string(o.readers) + " readers)" : "");
    KVF_RETURN_IF_ERROR(calibrator.Measure(*probe, BusPath::kNvmeToHost, "", where));
  }

  for (bool to_device : {true, false}) {
    const BusPath path = to_device ? BusPath::kHostToDevice : BusPath::kDeviceToHost;
    if (context.device == nullptr) {
      calibrator.NotMeasured(path, "-", context.no_device_reason);
      continue;
    }
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<PathProbe> probe,
                         DeviceCopyProbe::Create(context.device, to_device, sizes.back()));
    KVF_RETURN_IF_ERROR(calibrator.Measure(*probe, path, "", context.device->name()));
  }

#ifdef KVF_HAVE_UCX
  if (!sessions.empty()) {
    // The client's ingest is probed over up to kMaxIngestProbeDaemons daemons at once, each
    // read landing in its own slice of the staging region.
    const std::size_t ingest_daemons = std::min(sessions.size(), kMaxIngestProbeDaemons);
    const std::uint64_t staging_bytes = sizes.back() * std::max<std::size_t>(1, ingest_daemons);
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<ClientFabric> fabric,
                         ClientFabric::Create(staging_bytes, args.data_transport));
    for (std::unique_ptr<CacheHostTarget>& session : sessions) {
      calibrator.Progress("cache host " + session->host_id() + ": putting the read probes");
      KVF_RETURN_IF_ERROR(session->PrepareGets(fabric.get(), sizes));
      for (bool get : {true, false}) {
        const BusPath path =
            get ? BusPath::kRemoteHostToLocalHost : BusPath::kLocalHostToRemoteHost;
        CacheHostProbe probe(session.get(), get);
        KVF_RETURN_IF_ERROR(
            calibrator.Measure(probe, path, session->host_id(), session->address()));
      }
    }
    // After every write probe: the gain probe's reads land in the staging region's later
    // slices, which the write probes send from (and whose CRCs they keep).
    for (std::unique_ptr<CacheHostTarget>& session : sessions) {
      for (PathOutcome& p : report.paths) {
        if (p.path != BusPath::kRemoteHostToLocalHost || p.host_id != session->host_id()) continue;
        KVF_RETURN_IF_ERROR(MeasureConcurrencyGain(session.get(), sizes, staging_bytes,
                                                   args.repeats, calibrator, &p));
      }
    }
    // Kept for the split-overlap probe below: a real fetch reads from every daemon at once.
    std::unique_ptr<IngestProbe> ingest_probe;
    if (ingest_daemons >= 2) {
      // What all daemons' streams deliver into this client together (the planner's shared
      // ingest term, planner.h FETCH MODEL): each probe size read from every daemon at once,
      // so the fitted sizes are the totals.
      std::vector<std::uint64_t> totals;
      std::vector<CacheHostTarget*> targets;
      for (std::uint64_t bytes : sizes) totals.push_back(bytes * ingest_daemons);
      for (std::size_t i = 0; i < ingest_daemons; ++i) targets.push_back(sessions[i].get());
      ingest_probe = std::make_unique<IngestProbe>(std::move(targets), sizes.back());
      Calibrator ingest(totals, args.repeats, context.progress, &report);
      KVF_RETURN_IF_ERROR(ingest.Measure(*ingest_probe, BusPath::kClientIngest, "",
                                         std::to_string(ingest_daemons) + " daemons at once"));
    }
    if (context.prefill) {
      // Whether the engine's prefill and a fetch share a resource (core/recompute_probe.h,
      // ProbeSplitOverlap): reads of the largest probe size beside the prefill, from every
      // daemon at once where there are two or more (as a plan's fetch reads: the daemons'
      // copies and the client's ingest compete with the prefill for the CPUs and the memory
      // bus), else from the one daemon.
      const std::uint64_t bytes = sizes.back();
      FetchProbe fetch;
      std::string from;
      if (ingest_probe) {
        IngestProbe* probe = ingest_probe.get();
        const std::uint64_t total = bytes * ingest_daemons;
        fetch = [probe, total] { return probe->Measure(total).status(); };
        from = std::to_string(ingest_daemons) + " daemons at once";
      } else {
        CacheHostTarget* target = sessions.front().get();
        fetch = [target, bytes] { return target->TimedGet(bytes).status(); };
        from = sessions.front()->host_id();
      }
      calibrator.Progress("prefill of " + context.prefill_model_id +
                          ": split overlap beside reads from " + from);
      KVF_ASSIGN_OR_RETURN(report.split_overlap, ProbeSplitOverlap(context.prefill, fetch,
                                                                   context.split_overlap_options));
      report.split_overlap_from = from;
      calibrator.Progress("prefill of " + context.prefill_model_id + ": " +
                          FormatSplitOverlap(*report.split_overlap));
    }
    ingest_probe.reset();  // its workers read through the sessions
    sessions.clear();      // deletes the read probes while the fabric is still up
  }
#endif
  if (args.cache_hosts.empty()) {
    calibrator.NotMeasured(BusPath::kRemoteHostToLocalHost, "-", "no --cache-host");
    calibrator.NotMeasured(BusPath::kLocalHostToRemoteHost, "-", "no --cache-host");
  }
  if (args.cache_hosts.size() < 2) {
    calibrator.NotMeasured(BusPath::kClientIngest, "-", "fewer than two --cache-host");
  }

  BusCalibration& calibration = report.calibration;
  calibration.created_unix_us = env->WallMicros();
  calibration.machine = args.machine.empty() ? HostName() : args.machine;
  for (const PathOutcome& p : report.paths) {
    if (!p.measured) continue;
    calibration.paths.push_back(ToPathCalibration(p.path, p.host_id, p.fit));
    if (p.concurrency) calibration.paths.back().parameters.concurrency_gain = p.concurrency->gain;
  }
  if (context.prefill) {
    calibrator.Progress("prefill of " + context.prefill_model_id + ": probing");
    RecomputeProbeOptions po = context.prefill_options;
    if (!po.progress) po.progress = context.progress;
    KVF_ASSIGN_OR_RETURN(RecomputeProbeReport probe, ProbeRecompute(context.prefill, po));
    if (report.split_overlap) {
      probe.parameters.split_serial_fraction = report.split_overlap->serial_fraction;
    }
    calibration.recompute.push_back(ToRecomputeCalibration(context.prefill_model_id, probe));
    report.prefill = std::move(probe);
    report.prefill_model_id = context.prefill_model_id;
  }
  Status saved = SaveBusCalibration(env, calibration, args.out_path);
  if (!saved.ok()) return saved.WithContext("--out " + args.out_path);
  return report;
}

std::string FormatCalibrationText(const CalibrationReport& r) {
  std::string out = "kvfabric calibrate: " + std::to_string(r.sizes.size()) + " sizes " +
                    FormatBytes(r.sizes.front()) + ".." + FormatBytes(r.sizes.back()) + ", " +
                    std::to_string(r.repeats) +
                    " repeats per size and run; fitted on run A, judged on run B over " +
                    FormatBytes(r.judge_from_bytes) + ".." + FormatBytes(r.sizes.back()) +
                    " (target: worst |error| <= " + Percent(r.target_error_ratio) + "%)\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-26s %-16s %10s %10s %13s %12s %11s %8s  %s\n", "path",
                "host", "alpha_us", "beta GB/s", "median err %", "worst err %", "line worst",
                "noise %", "target met");
  out += line;
  for (const PathOutcome& p : r.paths) {
    const std::string host = p.host_id.empty() ? "-" : p.host_id;
    if (!p.measured) {
      std::snprintf(line, sizeof(line), "%-26s %-16s not measured: %s\n",
                    std::string(BusPathName(p.path)).c_str(), host.c_str(),
                    p.not_measured_reason.c_str());
    } else {
      std::snprintf(
          line, sizeof(line), "%-26s %-16s %10.2f %10.3f %13s %12s %11s %8s  %s\n",
          std::string(BusPathName(p.path)).c_str(), host.c_str(), p.fit.final_parameters.alpha_us,
          p.fit.final_parameters.beta_bytes_per_s / 1e9, Percent(p.fit.median_abs_error).c_str(),
          Percent(p.fit.worst_abs_error).c_str(),
          (Percent(p.fit.line_worst_abs_error) + (p.fit.size_curve_kept ? "" : "*")).c_str(),
          Percent(p.fit.noise_floor_ratio).c_str(),
          p.fit.target_met ? "yes (within max(target, noise))" : "no");
    }
    out += line;
  }
  for (const PathOutcome& p : r.paths) {
    if (p.concurrency) {
      out += "concurrency gain " + std::string(BusPathName(p.path)) + " " + p.host_id + ": " +
             FormatConcurrencyGain(*p.concurrency) + "\n";
    } else if (!p.not_measured_gain.empty()) {
      out += "concurrency gain " + std::string(BusPathName(p.path)) + " " + p.host_id +
             ": not measured: " + p.not_measured_gain + "\n";
    }
  }
  if (r.prefill) {
    const RecomputeParameters& c = r.prefill->parameters;
    std::snprintf(line, sizeof(line),
                  "prefill %s: %s; median err %s%%, worst %s%%, noise %s%% (%llu calls)\n",
                  r.prefill_model_id.c_str(), FormatRecomputeModel(c).c_str(),
                  Percent(r.prefill->median_abs_error).c_str(),
                  Percent(r.prefill->worst_abs_error).c_str(),
                  Percent(r.prefill->noise_floor_ratio).c_str(),
                  static_cast<unsigned long long>(r.prefill->samples));
    out += line;
  }
  if (r.split_overlap) {
    out += "split overlap " + r.prefill_model_id + ": " + FormatSplitOverlap(*r.split_overlap) +
           " (fetch side: reads from " + r.split_overlap_from + ")\n";
  }
  out +=
      "line worst: run A's line alone judged on run B; * = its size curve did no better there, "
      "so the file holds the line alone\n";
  out += "wrote " + r.out_path + ": " + std::to_string(r.calibration.paths.size()) +
         " paths; target met on " + std::to_string(r.targets_met()) + " of " +
         std::to_string(r.measured_paths()) + " measured paths\n";
  return out;
}

std::string FormatCalibrationJson(const CalibrationReport& r) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["out"] = r.out_path;
  j["machine"] = r.calibration.machine;
  j["sizes_bytes"] = r.sizes;
  j["repeats"] = r.repeats;
  j["judged_from_bytes"] = r.judge_from_bytes;
  j["target_error_ratio"] = r.target_error_ratio;
  j["measured_paths"] = r.measured_paths();
  j["targets_met"] = r.targets_met();
  Json paths = Json::array();
  for (const PathOutcome& p : r.paths) {
    Json e;
    e["path"] = std::string(BusPathName(p.path));
    e["host_id"] = p.host_id;
    e["where"] = p.where;
    e["measured"] = p.measured;
    if (!p.measured) {
      e["reason"] = p.not_measured_reason;
      paths.push_back(std::move(e));
      continue;
    }
    const PathFit& f = p.fit;
    e["alpha_us"] = f.final_parameters.alpha_us;
    e["beta_bytes_per_s"] = f.final_parameters.beta_bytes_per_s;
    e["median_error_ratio"] = f.median_abs_error;
    e["worst_error_ratio"] = f.worst_abs_error;
    e["line_median_error_ratio"] = f.line_median_abs_error;
    e["line_worst_error_ratio"] = f.line_worst_abs_error;
    e["size_curve_kept"] = f.size_curve_kept;
    e["size_factors"] = f.final_parameters.size_factors;
    e["noise_floor_ratio"] = f.noise_floor_ratio;
    e["target_met"] = f.target_met;
    e["samples"] = f.samples;
    e["run_a"] = {{"alpha_us", f.run_a.alpha_us}, {"beta_bytes_per_s", f.run_a.beta_bytes_per_s}};
    Json sizes = Json::array();
    for (const SizeError& s : f.run_b) {
      sizes.push_back({{"bytes", s.bytes},
                       {"observed_b_us", s.observed_us},
                       {"predicted_us", s.predicted_us},
                       {"error_ratio", s.error},
                       {"judged", s.judged}});
    }
    e["run_b"] = std::move(sizes);
    if (p.concurrency) {
      const ConcurrencyGainReport& g = *p.concurrency;
      e["concurrency"] = {{"streams", g.streams},
                          {"bytes", g.bytes},
                          {"repeats", g.repeats},
                          {"alone_us", g.alone_us},
                          {"together_us", g.together_us},
                          {"line_us", g.line_us},
                          {"gain", g.gain}};
    }
    paths.push_back(std::move(e));
  }
  j["paths"] = std::move(paths);
  if (r.prefill) {
    const RecomputeParameters& c = r.prefill->parameters;
    j["prefill"] = {{"model_id", r.prefill_model_id},
                    {"c0_us", c.c0_us},
                    {"c1_us_per_token", c.c1_us_per_token},
                    {"c2_us_per_token2", c.c2_us_per_token2},
                    {"c3_us_per_prefix_token", c.c3_us_per_prefix_token},
                    {"median_error_ratio", r.prefill->median_abs_error},
                    {"worst_error_ratio", r.prefill->worst_abs_error},
                    {"noise_floor_ratio", r.prefill->noise_floor_ratio},
                    {"samples", r.prefill->samples}};
    if (r.split_overlap) {
      j["prefill"]["split_serial_fraction"] = r.split_overlap->serial_fraction;
      j["prefill"]["split_overlap"] = {{"prefill_us", r.split_overlap->prefill_us},
                                       {"fetch_us", r.split_overlap->fetch_us},
                                       {"fetches", r.split_overlap->fetches},
                                       {"together_us", r.split_overlap->together_us}};
    }
  }
  return j.dump() + "\n";
}

namespace {

// --prefill-probe synthetic: the synthetic transformer of the model the
// flags name, probed over the default grid.
class SyntheticPrefill {
 public:
  static StatusOr<std::unique_ptr<SyntheticPrefill>> Create(const CalibrateArgs& a) {
    auto p = std::unique_ptr<SyntheticPrefill>(new SyntheticPrefill);
    ModelFingerprint m;
    m.model_id = a.model_id;
    m.layer_count = a.model_layers;
    m.kv_heads = a.model_kv_heads;
    m.head_dim = a.model_head_dim;
    m.tokens_per_block = a.tokens_per_block;
    KVF_ASSIGN_OR_RETURN(m.dtype, ParseKvDtype(a.dtype));
    KVF_RETURN_IF_ERROR(m.Validate().WithContext("--prefill-probe model (--model-layers, ...)"));
    std::uint64_t max_n = 0, max_p = 0;
    for (const RecomputeShape& s : DefaultRecomputeShapes()) {
      max_n = std::max(max_n, s.tokens);
      max_p = std::max(max_p, s.prefix_tokens);
      p->shapes_.push_back(s);
    }
    client::SyntheticTransformerOptions o;
    o.model = m;
    o.depth = 1;
    o.max_context_tokens = max_n + max_p;
    KVF_ASSIGN_OR_RETURN(p->engine_, client::SyntheticTransformer::Create(o));
    KVF_ASSIGN_OR_RETURN(p->probe_,
                         client::SyntheticPrefillProbe::Create(p->engine_.get(), max_n, max_p));
    return p;
  }
  const std::vector<RecomputeShape>& shapes() const { return shapes_; }
  StatusOr<double> Run(std::uint64_t n, std::uint64_t prefix) { return probe_->Run(n, prefix); }

 private:
  SyntheticPrefill() = default;
  std::unique_ptr<client::SyntheticTransformer> engine_;
  std::unique_ptr<client::SyntheticPrefillProbe> probe_;
  std::vector<RecomputeShape> shapes_;
};

}  // namespace

CalibrationDevice OpenCalibrationDevice(std::uint64_t arena_bytes) {
  CalibrationDevice out;
#ifdef KVF_HAVE_CUDA
  gpu::DeviceOptions o;
  o.arena_bytes = arena_bytes;
  StatusOr<std::unique_ptr<gpu::Device>> device = gpu::CreateCudaDevice(o);
  if (device.ok()) {
    out.device = std::move(*device);
  } else if (device.status().code() == StatusCode::kFailedPrecondition) {
    out.absent_reason = "no GPU (" + std::string(device.status().message()) + ")";
  } else {
    out.absent_reason = "GPU unusable: " + device.status().ToString();
  }
#else
  (void)arena_bytes;
  out.absent_reason = "no GPU (this build has no CUDA backend)";
#endif
  return out;
}

Status RunCalibrateCommand(const CalibrateArgs& args) {
  KVF_RETURN_IF_ERROR(ValidateCalibrateArgs(args).status());
  CalibrationDevice device = OpenCalibrationDevice(args.max_bytes);
  CalibrateContext context;
  context.device = device.device.get();
  if (device.device == nullptr) context.no_device_reason = device.absent_reason;
  context.progress = [](const std::string& line) {
    std::fprintf(stderr, "kvfabric calibrate: %s\n", line.c_str());
  };
  std::unique_ptr<SyntheticPrefill> prefill;
  if (args.prefill_probe == "synthetic") {
    KVF_ASSIGN_OR_RETURN(prefill, SyntheticPrefill::Create(args));
    context.prefill = [p = prefill.get()](std::uint64_t n, std::uint64_t prefix) {
      return p->Run(n, prefix);
    };
    context.prefill_model_id = args.model_id;
    context.prefill_options.shapes = prefill->shapes();
  }
  KVF_ASSIGN_OR_RETURN(CalibrationReport report, RunCalibrate(args, context));
  const std::string out = args.json ? FormatCalibrationJson(report) : FormatCalibrationText(report);
  std::fputs(out.c_str(), stdout);
  return Status::OK();
}

}  // namespace kvfabric::cli
