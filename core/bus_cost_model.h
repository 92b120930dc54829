// The bus cost model: how long a transfer over one directed path takes, and how long it takes to
// recompute (prefill) a run of tokens instead (ARCHITECTURE.md section 4).
//
//   t_fetch(path, bytes)  = (alpha_us + bytes / beta_bytes_per_s * 1e6) × k(bytes)         [us]
//   t_recompute(n, p)     = c0_us + c1_us_per_token * n + c2_us_per_token2 * n * (p + n/2)
//                           + c3_us_per_prefix_token * p                                     [us]
//     n = tokens recomputed, p = tokens before them (the prefix they attend to).
//     c3: what one call pays per prefix token however few tokens it prefills (reading the
//     prefix's K and V, which a call of a few tokens cannot amortise; 0 where unmeasured).
//     k(bytes) = the path's size curve (SIZE CURVE below; 1 unless fitted).
//
// Units, everywhere in this model: time in microseconds (double, names end in _us), sizes in
// bytes, bandwidth in bytes per second (names end in _bytes_per_s), tokens as counts. These are
// the units of kvfabric.v1.PathParameters and RecomputeParameters (proto/kvfabric/v1/
// placement.proto), so conversion to and from the wire is field by field.
//
// Every prediction can print itself with the numbers filled in (ExplainFetch, ExplainRecompute),
// e.g. "t_fetch(nvme→host, 4 MiB) = 85.0 µs + 4194304 B / 1.95 GB/s = 2.24 ms".
//
// Fitting lives in core/cost_fit.h, the per-path error histogram in core/prediction_error.h, the
// thread-safe container with online refit in core/calibrated_cost_model.h and the calibration
// file in core/bus_calibration.h.
//
// Thread safety: everything here is a value type or a pure function.
#ifndef KVFABRIC_CORE_BUS_COST_MODEL_H_
#define KVFABRIC_CORE_BUS_COST_MODEL_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvfabric {

// A directed path bytes take. Values 1..6 equal kvfabric.v1.BusPath; they are written to
// calibration files and never renumbered.
enum class BusPath : int {
  kUnspecified = 0,
  // Remote daemon's host memory -> the client's host memory, over the transport.
  kRemoteHostToLocalHost = 1,
  // The client's host memory -> a remote daemon's host memory (write-back).
  kLocalHostToRemoteHost = 2,
  // Host memory -> device memory (PCIe H2D).
  kHostToDevice = 3,
  // Device memory -> host memory (PCIe D2H).
  kDeviceToHost = 4,
  // A daemon's NVMe tier -> its host memory (staging read).
  kNvmeToHost = 5,
  // A daemon's host memory -> its NVMe tier (demotion write).
  kHostToNvme = 6,
  // Host memory -> host memory on one machine (memcpy; a daemon on the client's node, and the
  // baseline every other path is compared with).
  kLocalMemcpy = 7,
  // Every daemon -> this client, all streams of one load together: the client's NIC or memory
  // bus that the per-daemon streams share (server/placement/planner.h, FETCH MODEL). Its
  // host_id is a client's id in a calibration file, "" (every client) when learned online.
  kClientIngest = 8,
};

inline constexpr int kMaxBusPath = 8;

// "remote→local", "nvme→host", ...: the spelling in explanations and logs.
std::string_view BusPathArrowName(BusPath path);
// "remote_host_to_local_host", "nvme_to_host", ...: the spelling in calibration files and
// metric labels.
std::string_view BusPathName(BusPath path);
// Inverse of BusPathName; nullopt for an unknown name (and for "unspecified").
std::optional<BusPath> BusPathFromName(std::string_view name);
// True for 1..kMaxBusPath.
bool IsValidBusPath(int value);

// SIZE CURVE. A line alpha + bytes / beta cannot follow a path whose bandwidth changes with the
// transfer's size beyond what alpha explains: a memcpy of 256 KiB that stays in cache, an NVMe
// drive whose large reads run slower than 1 MiB ones, a daemon whose large gets move many blocks
// at once (docs/benchmarks.md, calibration runs of 2026-12-02). Each path therefore carries a
// factor per size class, applied to the line:
//   t_fetch(path, bytes) = (alpha_us + bytes / beta * 1e6) × k(bytes)
// k is given at kSizeClasses knots, 64 KiB × 4^j (64 KiB, 256 KiB, 1 MiB, ... 1 GiB), and
// interpolated linearly in log2(bytes) between them; below the first knot it is the first's,
// above the last the last's. Every factor is 1 by default (the line alone), and each lies in
// [kMinSizeFactor, kMaxSizeFactor]. Between two knots the curve's slope is a per-size-class
// beta; the fits (core/cost_fit.h) set the factors from the line's residuals per class.
inline constexpr int kSizeClasses = 8;
inline constexpr double kMinSizeFactor = 0.25;
inline constexpr double kMaxSizeFactor = 4.0;
// The size of knot j (0 <= j < kSizeClasses): 64 KiB << 2j.
constexpr uint64_t SizeClassBytes(int j) { return uint64_t{65536} << (2 * j); }

// Fitted parameters of one path.
struct PathParameters {
  // Fixed cost per transfer, in microseconds (>= 0).
  double alpha_us = 0;
  // Sustained bandwidth, in bytes per second (> 0).
  double beta_bytes_per_s = 1;
  // The size curve's factor at each knot (SIZE CURVE above); all 1 = the line alone.
  std::array<double, kSizeClasses> size_factors = {1, 1, 1, 1, 1, 1, 1, 1};
  // How much more the path carries for several transfers at once than for one, in
  // [1, kMaxConcurrencyGain]: together they move at most concurrency_gain × beta, each at most
  // beta (a single transfer is held to beta by its own window and round trips; on the 2-vCPU
  // VM, 8 loads at once through one client moved 14.5 GB/s where one moved 12). 1: the path is
  // shared as it is, n transfers at beta / n each. Learned from transfers that moved beside
  // other loads (CalibratedCostModel::ObserveShared); the placement's path load shares by it.
  double concurrency_gain = 1;
};

inline constexpr double kMaxConcurrencyGain = 16;
// The smallest share of a path's time a transfer beside other loads is counted at: as if at most
// 64 loads shared it (CalibratedCostModel::ObserveShared fits at it; the client's straggler cut
// counts elapsed time at it).
inline constexpr double kMaxSharedShare = 64;

// Whether every size factor is 1.
bool HasFlatSizeCurve(const PathParameters& p);
// Whether every size factor is finite and within [kMinSizeFactor, kMaxSizeFactor].
bool SizeFactorsValid(const PathParameters& p);
// Whether concurrency_gain is finite and within [1, kMaxConcurrencyGain].
bool ConcurrencyGainValid(const PathParameters& p);
// The interpolation weights of `bytes` on the knots: at most two non-zero, summing to 1
// (SIZE CURVE); `first` is the lower knot, weights[0] its weight and weights[1] the next's.
struct SizeClassWeights {
  int first = 0;
  double weights[2] = {1, 0};
};
SizeClassWeights SizeClassWeightsFor(double bytes);
// k(bytes).
double SizeFactor(const PathParameters& p, double bytes);
// The line through the curve at `bytes`: alpha × k(bytes), beta / k(bytes), a flat curve. It
// predicts the same time as `p` at `bytes` and scales proportionally around it; the planner
// prices a source's stream with it at the size that stream is expected to move (its per-byte
// terms must stay linear).
PathParameters AtSize(const PathParameters& p, double bytes);

// Fitted recompute (prefill) cost of one model.
struct RecomputeParameters {
  // Fixed cost per prefill call, in microseconds (>= 0).
  double c0_us = 0;
  // Linear (MLP, projections) cost, in microseconds per token (>= 0).
  double c1_us_per_token = 0;
  // Quadratic (attention) cost, in microseconds per token squared (>= 0).
  double c2_us_per_token2 = 0;
  // How much of a split plan's shorter side fails to overlap its longer one, in [0, 1]: a split
  // prefills blocks [0, k) while it fetches [k, m), and takes max(A, B) + s × min(A, B) (A, B the
  // two sides). 0 when the prefill and the fetch use separate resources (a GPU prefill beside a
  // NIC or DMA fetch); near 1 when they share the same cores (a CPU prefill beside a kernel-TCP
  // fetch on a small host). Placement fits it from finished split plans
  // (CalibratedCostModel::ObserveSplit); an engine may state it.
  double split_serial_fraction = 0;
  // Per call, per token of the prefix, in microseconds (>= 0): reading the prefix's K and V
  // once per prefill call, whatever n is. An engine's attention over a cached prefix reads
  // every prefix key and value at least once per call (a GPU's FlashAttention once per query
  // tile, memory-bound when n is small; the CPU stand-in widens them to fp32 once per chunk),
  // so a call of 16 tokens after 4096 costs more than c2 × 16 × 4096 alone: without this term
  // the 2-vCPU VM's prefill probe missed that shape by +28-29% while every other shape was
  // within 15% (docs/placement.md). 0 (default): not modelled, the three-term model. Last, so
  // that {c0, c1, c2, s} initialisers keep their meaning.
  double c3_us_per_prefix_token = 0;
};

// A split plan's two overlapped sides (recompute front `a`, fetch `b`), in microseconds:
// max(a, b) + s × min(a, b).
inline double SplitSidesMicros(const RecomputeParameters& r, double a, double b) {
  return (a > b ? a : b) + r.split_serial_fraction * (a < b ? a : b);
}

// The line alone: alpha + bytes / beta, in microseconds, without the size curve.
inline double LineMicros(const PathParameters& p, double bytes) {
  return p.alpha_us + bytes / p.beta_bytes_per_s * 1e6;
}

// t_fetch in microseconds, the size curve applied. REQUIRES: p.beta_bytes_per_s > 0.
inline double FetchMicros(const PathParameters& p, double bytes) {
  return LineMicros(p, bytes) * SizeFactor(p, bytes);
}

// t_recompute(n, prefix) in microseconds; 0 when n == 0 (nothing to prefill costs nothing, not
// c0).
inline double RecomputeMicros(const RecomputeParameters& r, double n, double prefix) {
  if (n <= 0) return 0;
  return r.c0_us + r.c1_us_per_token * n + r.c2_us_per_token2 * n * (prefix + n / 2) +
         r.c3_us_per_prefix_token * prefix;
}

// Every constant of `r` finite and >= 0, and split_serial_fraction in [0, 1].
inline bool RecomputeParametersValid(const RecomputeParameters& r) {
  for (double v : {r.c0_us, r.c1_us_per_token, r.c2_us_per_token2, r.c3_us_per_prefix_token}) {
    if (!std::isfinite(v) || v < 0) return false;
  }
  return r.split_serial_fraction >= 0 && r.split_serial_fraction <= 1;
}

// "t_fetch(nvme→host, 4 MiB) = 85.0 µs + 4194304 B / 1.95 GB/s = 2.24 ms", with
// " × 1.07 (size curve at 4 MiB)" before the result when k(bytes) is not 1.
std::string ExplainFetch(BusPath path, const PathParameters& p, uint64_t bytes);
// "t_recompute(n=4096, p=1024) = 2.00 ms + 4096 × 10.0 µs + 4096 × (1024 + 2048) × 1.00 ns =
//  55.5 ms", with " + 1024 × 700 ns" (p × c3) before the result when c3 is not 0;
// "t_recompute(n=0, p=1024) = 0 µs (nothing to prefill)" for n = 0.
std::string ExplainRecompute(const RecomputeParameters& r, uint64_t n, uint64_t prefix);
// The model with its constants: "t = 2438.0 us + 97.430 us * n + 0.09490 us * n * (p + n/2) +
// 0.702 us * p" (the last term only when c3 is not 0).
std::string FormatRecomputeModel(const RecomputeParameters& r);

// Durations for people, three significant digits: "850 ns", "85.0 µs", "2.24 ms", "1.50 s",
// "95.0 s". Negative values get a leading '-'; non-finite print as "inf"/"nan".
std::string FormatMicros(double us);
// Decimal bandwidth, three significant digits: "950 MB/s", "1.95 GB/s", "12.5 GB/s".
std::string FormatRate(double bytes_per_s);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_BUS_COST_MODEL_H_
