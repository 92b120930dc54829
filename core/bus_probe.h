// Measuring the bus paths for `kvfabric calibrate` and fitting the bus cost model
// (core/bus_cost_model.h) to what was measured, judged out of sample.
//
// Method:
//   sizes  ProbeSizeLadder: min, 4 min, 16 min, ... up to max (max itself is added when the
//          ladder steps over it): 64 KiB, 256 KiB, 1 MiB, ..., 256 MiB at the defaults.
//   runs   RunTwoProbeRuns: one untimed warm-up transfer of the largest size (page faults,
//          connection and registration set-up), then `repeats` rounds; each round measures every
//          size once for run A and once for run B, back to back (A first in even rounds, B first
//          in odd ones), starting at a different size each round. The runs are interleaved, not
//          one after the other, because this class of machine drifts: measured sequentially,
//          run B of memcpy came out 10-25% slower than run A seconds earlier at most sizes, and
//          that drift, not the model, was most of the out-of-sample error. Interleaved, the two
//          runs agree within a few percent per size, and they are still disjoint samples (fit
//          on A's transfers, judge on B's). A size's figure in a run is the median of its
//          repeats, so one preempted transfer does not move it.
//   fit    FitAndJudge: FitPathParameters (relative weighting, core/cost_fit.h) on run A's
//          medians.
//   judge  every size of run B at or above JudgeOptions::judge_from_bytes (256 KiB; clamped to
//          the largest size so a tiny ladder still judges one) against the run-A fit:
//          error = observed_B / predicted_A - 1 (core/prediction_error.h's definition). The
//          median and the worst |error| over those sizes are the out-of-sample figures; the
//          target (worst <= 3%) is met or not, and is reported either way.
//   final  FitPathParameters on the medians of A and B together: the parameters the calibration
//          file holds, with the out-of-sample figures of the A fit (ToPathCalibration).
//
// Local probes (no daemon needed): CreateMemcpyProbe (host memory -> host memory, cold caches)
// and CreateNvmeReadProbe (O_DIRECT reads of a scratch file). Probes that need a daemon or a
// device live with the command (cli/calibrate_command.cc, cli/calibrate_cache_host.cc) and
// implement PathProbe.
//
// Timing uses std::chrono::steady_clock directly, not Env::NowMicros: a 64 KiB copy takes a
// few microseconds, and Env's clock has a resolution of one.
//
// Thread safety: the free functions are pure (RunTwoProbeRuns calls the probe from the calling
// thread only); a PathProbe is used from one thread at a time.
#ifndef KVFABRIC_CORE_BUS_PROBE_H_
#define KVFABRIC_CORE_BUS_PROBE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/bus_calibration.h"
#include "core/bus_cost_model.h"
#include "core/cost_fit.h"
#include "core/env.h"
#include "core/statusor.h"

namespace kvfabric {

// Every probe size is a multiple of this (the O_DIRECT alignment, Env::kDefaultDirectIoAlignment).
inline constexpr uint64_t kProbeGranuleBytes = 4096;
// Largest probe: one Reserve or Lease carries at most 4 GiB (Limits.max_batch_payload_bytes).
inline constexpr uint64_t kMaxProbeBytes = uint64_t{4} << 30;
// Most bytes the two runs may move over one path (64 KiB..256 MiB x 5 repeats x 2 runs moves
// 3.3 GiB): bounds how long a calibration holds a daemon's pool and a link busy.
inline constexpr uint64_t kMaxProbeBytesPerPath = uint64_t{16} << 30;
// The accuracy target of the cost model (|observed / predicted - 1| <= 3%).
inline constexpr double kCalibrationTargetErrorRatio = 0.03;

// The probe sizes (see the file comment). InvalidArgument, naming --min-bytes / --max-bytes,
// when min_bytes is below kProbeGranuleBytes, either is not a multiple of it, max_bytes exceeds
// kMaxProbeBytes, or max_bytes <= min_bytes (a fit needs two sizes).
StatusOr<std::vector<uint64_t>> ProbeSizeLadder(uint64_t min_bytes, uint64_t max_bytes);

// Bytes RunTwoProbeRuns moves over one path: (2 * repeats) * sum(sizes) + max(sizes).
uint64_t ProbeBytesPerPath(std::span<const uint64_t> sizes, int repeats);

// The ladder, plus: repeats in [1, 1000] (InvalidArgument naming --repeats) and at most
// kMaxProbeBytesPerPath per path (InvalidArgument with the arithmetic, naming --max-bytes and
// --repeats).
StatusOr<std::vector<uint64_t>> PlanProbeSizes(uint64_t min_bytes, uint64_t max_bytes, int repeats);

// `bytes` cut into `blocks` equal blocks of `block_bytes` (a multiple of `granule`, at most
// `max_block_bytes`), with as few blocks as that allows: 256 MiB under a 64 MiB limit is 4 x
// 64 MiB. InvalidArgument if bytes is 0 or not a multiple of granule, or granule exceeds
// max_block_bytes.
struct BlockSplit {
  uint64_t block_bytes = 0;
  uint64_t blocks = 0;
};
StatusOr<BlockSplit> SplitIntoBlocks(uint64_t bytes, uint64_t max_block_bytes, uint64_t granule);

// The median (the mean of the middle two for an even count). REQUIRES: !values.empty().
double MedianOf(std::vector<double> values);

// The noise floor of a measurement: how far identical, interleaved repeats of it spread. Each
// group holds the repeats of one measured point (one size of a path, both runs; one prefill
// shape); every repeat is divided by its group's median, and the floor is
// max(1 - p10, p90 - 1) over all those ratios (10th and 90th percentile, nearest rank). A
// model cannot be judged finer than this: out-of-sample errors at or below it are the machine's
// noise, not the model's. 0 for no repeats or groups of one.
double NoiseFloorRatio(std::span<const std::vector<double>> groups);

// One path under measurement.
class PathProbe {
 public:
  virtual ~PathProbe() = default;
  // Moves `bytes` over the path once and returns how long that took, in microseconds (finite,
  // > 0). REQUIRES: bytes is one of the sizes the probe was created for (<= its max_bytes).
  virtual StatusOr<double> Measure(uint64_t bytes) = 0;
};

// One size of one run.
struct SizeTiming {
  uint64_t bytes = 0;
  std::vector<double> repeats_us;
  double median_us = 0;
};
using ProbeRun = std::vector<SizeTiming>;

struct ProbeRunOptions {
  // Timed transfers per size and run. Default 5. REQUIRES: >= 1.
  int repeats = 5;
  // Names the path in progress lines, e.g. "remote→local cache-0".
  std::string label;
  // Receives one line per size and run ("<label> run A 16 MiB: median 1.23 ms of 5"); may be
  // empty.
  std::function<void(const std::string&)> progress;
};

struct TwoProbeRuns {
  ProbeRun a;
  ProbeRun b;
};

// The warm-up and the two runs (see the file comment). Returns the probe's first error, with
// the label and size as context. REQUIRES: sizes non-empty and ascending.
StatusOr<TwoProbeRuns> RunTwoProbeRuns(PathProbe& probe, std::span<const uint64_t> sizes,
                                       const ProbeRunOptions& options);

struct JudgeOptions {
  // Smallest size judged. Default 256 KiB: below it the fixed cost and timer noise dominate.
  uint64_t judge_from_bytes = uint64_t{256} << 10;
  // Worst |error| that meets the target. Default kCalibrationTargetErrorRatio (3%).
  double target_error_ratio = kCalibrationTargetErrorRatio;
  FitOptions fit;
};

// Run B's figure for one size against the run-A fit.
struct SizeError {
  uint64_t bytes = 0;
  double observed_us = 0;
  double predicted_us = 0;
  // observed_us / predicted_us - 1.
  double error = 0;
  // Whether the size counts toward the median and worst (>= the judged range's start).
  bool judged = false;
};

struct PathFit {
  PathParameters run_a;  // fitted on run A
  std::vector<SizeError> run_b;
  uint64_t judged_min_bytes = 0;
  uint64_t judged_max_bytes = 0;
  double median_abs_error = 0;
  double worst_abs_error = 0;
  // The same errors of run A's line without its size curve (bus_cost_model.h, SIZE CURVE): what
  // the curve bought. Equal to the above when the curve was not kept.
  double line_median_abs_error = 0;
  double line_worst_abs_error = 0;
  // Whether run A's size curve predicted run B at least as well as its line, in median and
  // worst error. If not, the curve is dropped: run_a, the errors above and final_parameters
  // are the line's alone (a curve that does not repeat between runs fitted noise).
  bool size_curve_kept = false;
  // The repeats' spread over the judged sizes (NoiseFloorRatio, runs A and B together).
  double noise_floor_ratio = 0;
  // worst_abs_error <= max(target_error_ratio, noise_floor_ratio): as good as the target, or as
  // the machine's noise allows.
  bool target_met = false;
  double target_error_ratio = kCalibrationTargetErrorRatio;
  PathParameters final_parameters;  // fitted on runs A and B
  uint64_t samples = 0;             // timed transfers behind the final fit
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
};

// Fits on A, judges on B, refits on A + B. InvalidArgument if the runs are empty or do not
// cover the same sizes in the same order; FitPathParameters' errors (FailedPrecondition when the
// times do not grow with size) with "run A" / "runs A+B" as context.
StatusOr<PathFit> FitAndJudge(const ProbeRun& a, const ProbeRun& b, const JudgeOptions& options);

// RunTwoProbeRuns then FitAndJudge; when the fit fails because the measured
// time does not grow with size (FailedPrecondition: noise larger than the
// transfers, e.g. small probes on a busy two-core machine), measures both
// runs again, up to `attempts` in all, saying so through options.progress.
// The probe's own errors, and the last fit error, are returned as they are.
// `attempts_used` (may be null) gets how many attempts were made.
// REQUIRES: attempts >= 1, and RunTwoProbeRuns' preconditions.
StatusOr<PathFit> MeasureAndFit(PathProbe& probe, std::span<const uint64_t> sizes,
                                const ProbeRunOptions& options, const JudgeOptions& judge,
                                int attempts, int* attempts_used = nullptr);

// The calibration file entry for `fit`: the final parameters, with the out-of-sample median and
// worst error ratios of the run-A fit.
PathCalibration ToPathCalibration(BusPath path, std::string host_id, const PathFit& fit);

// ---- Concurrency gain ----
//
// What a path carries for several transfers at once over one (PathParameters::
// concurrency_gain). `together` moves `streams` transfers of `bytes` at once and returns the
// wall time from the first start to the last end; `alone` moves one and returns its time. Both
// are run `repeats` times, interleaved (alone, together, alone, ...) so drift hits both, and
// the gain is t1 / median(together) within [1, kMaxConcurrencyGain], t1 being the fitted
// line's time for all streams x bytes at beta: the sample CalibratedCostModel::ObserveShared
// takes from a stream that moved beside others, measured here on purpose.
struct ConcurrencyGainReport {
  int streams = 0;
  uint64_t bytes = 0;  // per transfer
  int repeats = 0;
  double alone_us = 0;     // median of one transfer alone
  double together_us = 0;  // median of `streams` at once
  double line_us = 0;      // the fitted line's time for streams x bytes (gain 1)
  double gain = 1;
};
// InvalidArgument for streams < 2, repeats < 1 or bytes == 0; the probes' errors as they are.
StatusOr<ConcurrencyGainReport> ProbeConcurrencyGain(
    const PathParameters& fitted, uint64_t bytes, int streams, int repeats,
    const std::function<StatusOr<double>()>& alone,
    const std::function<StatusOr<double>()>& together);
// "4 at once of 64 MiB: 41.0 ms (one alone 12.1 ms; the line at gain 1: 48.2 ms): gain 1.18".
std::string FormatConcurrencyGain(const ConcurrencyGainReport& r);

// ---- Local probes ----

struct MemcpyProbeOptions {
  // Largest size measured; the source and destination buffers are this large. REQUIRES: > 0.
  uint64_t max_bytes = 0;
  // Bytes read (untimed) before every copy so that neither buffer is in the CPU caches, as a
  // block copied from a pool is not. Default 256 MiB, larger than the last-level cache of the
  // CPUs kvfabric runs on; 0 measures warm-cache copies.
  uint64_t cache_scrub_bytes = uint64_t{256} << 20;
};

// Host memory -> host memory (BusPath::kLocalMemcpy), one StreamingCopy (core/stream_copy.h) on
// the calling thread: the copy the data path makes of cold blocks (the UCX transport's copies
// through a shared-memory mapping, the client's staging -> history copy). Streamed, cold copies
// run at one bandwidth from 1 MiB up (15-17 GB/s here), where std::memcpy's varied from 9.3 to
// 11.8 GB/s with size, more than a linear model can follow within 3%.
// ResourceExhausted if the buffers cannot be allocated.
StatusOr<std::unique_ptr<PathProbe>> CreateMemcpyProbe(const MemcpyProbeOptions& options);

struct NvmeReadProbeOptions {
  // Directory on the NVMe device; a scratch file is created there (O_EXCL, a random name) and
  // deleted when the probe is destroyed.
  std::string dir;
  // Largest size measured. REQUIRES: a multiple of kProbeGranuleBytes.
  uint64_t max_bytes = 0;
  // Scratch file size; 0 (default) means 4 x max_bytes. Consecutive reads go to different
  // offsets of it, so a read finds neither the page cache (O_DIRECT bypasses it) nor, mostly,
  // the drive's own cache warm. The file is written once with non-zero bytes (so a
  // deduplicating or thin-provisioned device cannot answer reads of zeros without reading).
  uint64_t scratch_bytes = 0;
  // Readers of the device at once, 1..kMaxNvmeProbeReaders (default 1): the daemons that share
  // it (several daemons on one node's drive, or the embedded cluster's daemons on one disk).
  // Each reader reads `bytes` from a region of its own (the file holds readers x scratch_bytes,
  // each reader has a buffer of max_bytes), all starting together; the time measured is until
  // the last one ends, so the fitted beta is what one daemon's NVMe delivers while the others
  // read too (on this VM's disk: 1.4 GB/s alone, 0.71 GB/s each for two).
  uint32_t readers = 1;
};
inline constexpr uint32_t kMaxNvmeProbeReaders = 16;

// The NVMe tier's read path (BusPath::kNvmeToHost): one O_DIRECT pread of `bytes` into an
// aligned buffer per reader (NvmeReadProbeOptions::readers, on threads of their own beside the
// caller's). Cold caches cannot be forced without root (drop_caches); O_DIRECT and a file
// larger than any read stand in for it. InvalidArgument if the file system refuses O_DIRECT
// (e.g. tmpfs) or readers is out of range, ResourceExhausted when the disk is full; errors name
// the directory.
StatusOr<std::unique_ptr<PathProbe>> CreateNvmeReadProbe(Env* env,
                                                         const NvmeReadProbeOptions& options);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_BUS_PROBE_H_
