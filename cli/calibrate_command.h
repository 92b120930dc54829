// `kvfabric calibrate`: measures the bus paths of this machine, fits the bus cost model
// t_fetch(path, bytes) = alpha_us + bytes / beta_bytes_per_s * 1e6 per path, judges the fit out
// of sample, and writes the calibration file the services load (core/bus_calibration.h).
//
// Paths (the method is core/bus_probe.h's: a size ladder, runs A and B, fit on A, judge on B,
// final fit on A + B):
//   local_memcpy               always: one memcpy between cold host buffers
//   nvme_to_host               with --nvme-dir: O_DIRECT reads of a scratch file made there, by
//                              --nvme-readers readers at once (the daemons sharing the device;
//                              each reader's rate is what one daemon gets beside the others)
//   host_to_device, device_to_host
//                              only with a GPU (a CUDA device in a CUDA build); otherwise listed
//                              as "not measured: no GPU ..." and absent from the file, never
//                              guessed
//   remote_host_to_local_host  per --cache-host: one data-plane kFetch of blocks totalling the
//                              probe size (blocks of at most 64 MiB, all in one request), the
//                              client's own read with no gRPC call in it; the blocks are put
//                              once, before the runs
//   local_host_to_remote_host  per --cache-host: Reserve + kPut + Commit, timed together; the
//                              blocks are deleted after each probe (untimed)
// With --prefill-probe and a --cache-host, the split overlap too: how much the prefill and reads
// from the first daemon slow each other (core/recompute_probe.h, ProbeSplitOverlap), written as
// the model's split_serial_fraction.
// Cache-host paths are recorded under the daemon's host_id (its Health server_id); local paths
// under host_id "" (the default for every host). The probe blocks live in the namespace
// "kvfabric.calibrate" under a shape of 4 KiB per layer, and are deleted when done.
//
// The command fails (and writes nothing) if any requested path cannot be measured or fitted: a
// file silently missing a path would make the services fall back to built-in figures. Whether
// the accuracy target (worst out-of-sample |error| <= 3% from 256 KiB up) is met is reported per
// path; missing it is not an error.
//
// Thread safety: call from main only. The run is single-threaded apart from the transport's
// progress thread.
#ifndef KVFABRIC_CLI_CALIBRATE_COMMAND_H_
#define KVFABRIC_CLI_CALIBRATE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/bus_calibration.h"
#include "core/bus_probe.h"
#include "core/env.h"
#include "core/recompute_probe.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/device.h"
#include "security/grpc_security.h"

namespace kvfabric::cli {

// Daemons read at once by the client-ingest probe (CalibrateArgs::cache_hosts).
inline constexpr std::size_t kMaxIngestProbeDaemons = 4;
// Reads from one daemon at once by the concurrency-gain probe of its remote_host_to_local_host
// path (core/bus_probe.h, ProbeConcurrencyGain), each of the largest probe size whose that many
// fit in the staging region, with as many repeats as the other probes.
inline constexpr int kConcurrencyProbeStreams = 4;

struct CalibrateArgs {
  // How the gRPC connections are secured (--tls-ca, --tls-cert, --tls-key,
  // --tls-token-file, --insecure; security/grpc_security.h).
  GrpcSecurityOptions security;
  // --out: where the calibration file goes (written atomically). Required.
  std::string out_path;
  // --cache-host: gRPC address HOST:PORT of a cache-host daemon; repeatable. The data-plane
  // address comes from the daemon's grants.
  std::vector<std::string> cache_hosts;
  // With two or more, the client's ingest (client_ingest, host_id "") is measured too: every
  // probe size read from the first kMaxIngestProbeDaemons daemons at once (the staging region
  // then holds that many times --max-bytes).
  // --cache-host-admin: each --cache-host's admin listener (its --admin-address), in the same
  // order, one per --cache-host: the write probe deletes the blocks it puts, which is an
  // administrative RPC.
  std::vector<std::string> cache_host_admins;
  // --nvme-dir: a directory on the NVMe device to read from; empty skips the NVMe path.
  std::string nvme_dir;
  // --nvme-readers: readers of that device at once, the daemons that share it (1..16; default
  // 1): the fitted nvme_to_host is what one of them gets while the others read too
  // (NvmeReadProbeOptions::readers).
  std::uint32_t nvme_readers = 1;
  // --min-bytes / --max-bytes: the probe size ladder (core/bus_probe.h). Defaults 64 KiB and
  // 256 MiB: the block sizes engines move, and large enough for bandwidth to dominate.
  std::uint64_t min_bytes = std::uint64_t{64} << 10;
  std::uint64_t max_bytes = std::uint64_t{256} << 20;
  // --repeats: timed transfers per size and run; each size's figure is their median. Default 5.
  int repeats = 5;
  // --json: print one JSON object instead of the table.
  bool json = false;
  // --cache-scrub-bytes: bytes read before every timed memcpy so its buffers start cold.
  // Default 256 MiB; 0 measures warm-cache copies.
  std::uint64_t cache_scrub_bytes = std::uint64_t{256} << 20;
  // gRPC deadline of each control call to a cache host. Default 10 s.
  int rpc_timeout_ms = 10000;
  // Recorded in the file as "machine"; empty means this host's name.
  std::string machine;
  // --data-transport: what the daemons' data planes speak, "ucx" (default) or
  // "tcp" (kvfabric-cached --data-transport=tcp).
  std::string data_transport = "ucx";
  // --prefill-probe synthetic: also fit the recompute model (core/recompute_probe.h) of the
  // synthetic transformer (client/synthetic_transformer.h) for the model below and write it to
  // the file, for clusters whose engine does not state its own. Empty (default): no probe.
  std::string prefill_probe;
  // The model the prefill probe runs (--model-id, --model-layers, --model-kv-heads,
  // --model-head-dim, --tokens-per-block, --dtype).
  std::string model_id = "synthetic";
  std::uint32_t model_layers = 32;
  std::uint32_t model_kv_heads = 8;
  std::uint32_t model_head_dim = 128;
  std::uint32_t tokens_per_block = 16;
  std::string dtype = "fp16";
};

// The calibration of an embedded cluster (`kvfabric demo`, bench/cluster_planner_bench): each
// daemon's read and write paths (grpc and admin addresses in the same order), NVMe reads under
// `dir` (where the tiers live), memcpy; probes of 256 KiB .. max_bytes, 3 repeats, a 16 MiB
// cache scrub; the file goes to dir/calibration.json.
CalibrateArgs EmbeddedClusterCalibrateArgs(const std::vector<std::string>& grpc_addresses,
                                           const std::vector<std::string>& admin_addresses,
                                           const std::string& dir, std::uint64_t max_bytes,
                                           const std::string& data_transport);
// One line per calibrated path: fit, worst out-of-sample error and noise floor.
std::string FormatPathCalibrationLine(const PathCalibration& p);

// Adds the `calibrate` subcommand and its flags to `app`, parsing into `*args`.
// REQUIRES: `args` outlives parsing.
CLI::App* AddCalibrateSubcommand(CLI::App& app, CalibrateArgs* args);

// Checks `args` without measuring anything and returns the probe sizes. InvalidArgument naming
// the flag: --out missing, bad sizes or repeats (PlanProbeSizes), an empty or repeated
// --cache-host, rpc_timeout_ms <= 0.
StatusOr<std::vector<std::uint64_t>> ValidateCalibrateArgs(const CalibrateArgs& args);

// One path's outcome.
struct PathOutcome {
  BusPath path = BusPath::kUnspecified;
  // The daemon's host_id for cache-host paths; "" for local ones.
  std::string host_id;
  // Where it was measured: "local", the NVMe directory, the device's name, the gRPC address.
  std::string where;
  bool measured = false;
  // Why not, when !measured, e.g. "no GPU (this build has no CUDA backend)".
  std::string not_measured_reason;
  PathFit fit;  // valid when measured
  // remote_host_to_local_host: what kConcurrencyProbeStreams reads at once carried; its gain
  // is the file's concurrency_gain. Absent where it was not measured (not_measured_gain says
  // why).
  std::optional<ConcurrencyGainReport> concurrency;
  std::string not_measured_gain;
};

struct CalibrationReport {
  std::vector<std::uint64_t> sizes;
  int repeats = 0;
  std::uint64_t judge_from_bytes = 0;
  double target_error_ratio = 0;
  std::vector<PathOutcome> paths;
  // What was written to out_path.
  BusCalibration calibration;
  std::string out_path;

  // The prefill probe's outcome, when CalibrateContext::prefill was given.
  std::optional<RecomputeProbeReport> prefill;
  std::string prefill_model_id;
  // With a prefill and a cache host: how much the prefill and a fetch slow each other
  // (core/recompute_probe.h, ProbeSplitOverlap); its s is the recompute entry's
  // split_serial_fraction. The fetch side reads from every daemon at once (up to
  // kMaxIngestProbeDaemons), as a plan's fetch does, or from the one daemon there is;
  // split_overlap_from says which ("2 daemons at once", or the daemon's host id).
  std::optional<SplitOverlapReport> split_overlap;
  std::string split_overlap_from;

  // Measured paths, and those of them that met the target.
  int measured_paths() const;
  int targets_met() const;
};

// What a run takes from its surroundings (tests substitute them).
struct CalibrateContext {
  // Files and the wall clock. Default: Env::Default().
  Env* env = nullptr;
  // The device whose host<->device paths are measured; null: none, reported with
  // `no_device_reason`. Borrowed. REQUIRES: its arena holds at least max_bytes.
  gpu::Device* device = nullptr;
  std::string no_device_reason = "no GPU";
  // Progress lines (one per size and run, and per phase). Default: none.
  std::function<void(const std::string&)> progress;
  // An engine's prefill to fit the recompute model from (core/recompute_probe.h), for model
  // `prefill_model_id`; unset: the file gets no recompute entry.
  PrefillProbe prefill;
  std::string prefill_model_id;
  RecomputeProbeOptions prefill_options;
  // With `prefill` and at least one cache host, the split overlap is measured too.
  SplitOverlapOptions split_overlap_options;
};

// Runs the calibration and writes args.out_path. Errors: ValidateCalibrateArgs'; Unavailable
// (with the address) for a cache host that does not answer; FailedPrecondition when a daemon's
// pool cannot hold the probe blocks or a fit is impossible; the probe's error, naming the path
// and size, otherwise. Nothing is written on error.
StatusOr<CalibrationReport> RunCalibrate(const CalibrateArgs& args,
                                         const CalibrateContext& context);

// The table `kvfabric calibrate` prints, and its --json form (one object, newline-terminated).
std::string FormatCalibrationText(const CalibrationReport& report);
std::string FormatCalibrationJson(const CalibrationReport& report);

// The machine's GPU for calibration, with an arena of `arena_bytes`; null with the reason
// ("no GPU (...)") when there is none or this build has no CUDA backend.
struct CalibrationDevice {
  std::unique_ptr<gpu::Device> device;
  std::string absent_reason;
};
CalibrationDevice OpenCalibrationDevice(std::uint64_t arena_bytes);

// main's entry: opens the GPU if any, runs with progress on stderr, prints the report on stdout.
Status RunCalibrateCommand(const CalibrateArgs& args);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_CALIBRATE_COMMAND_H_
