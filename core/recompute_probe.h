// Measuring an engine's prefill and fitting the recompute model
//   t_recompute(n, p) = c0 + c1 n + c2 n (p + n/2)        (core/bus_cost_model.h)
// judged out of sample, the way core/bus_probe.h judges a bus path.
//
// Method:
//   shapes  (n, p) pairs: by default n in {16, 64, 256, 1024} x p in {0, 1024, 4096}, which
//           separate the three terms (c0 from the n = 16 calls, c1 from n at p = 0, c2 from p).
//   runs    one untimed warm-up call of the largest shape, then `repeats` rounds; each round
//           calls every shape once for run A and once for run B, back to back (A first in even
//           rounds), starting at a different shape each round. A shape's figure in a run is the
//           median of its repeats.
//   fit     FitRecomputeParameters (relative weighting) on run A's medians.
//   judge   every shape of run B against the run-A fit: error = observed / predicted - 1; the
//           median and worst |error| are the out-of-sample figures. The noise floor is
//           NoiseFloorRatio over each shape's repeats (runs A and B together).
//   final   FitRecomputeParameters on the medians of A and B together.
// The callback is the engine's prefill (or a stand-in such as client/synthetic_transformer.h);
// `kvfabric demo` and `kvfabric calibrate --recompute-probe` use it.
//
// Split overlap (ProbeSplitOverlap): a split plan prefills a front of the chain while it fetches
// the rest, predicted as max(A, B) + s × min(A, B) (RecomputeParameters::split_serial_fraction).
// Whether the two sides share a resource (a CPU prefill beside the copies and CRC checks of a
// fetch on the same cores) is measured, not assumed: a prefill alone (A), a fetch side of K
// transfers alone (B, K chosen so that B is about A, where s is best determined), and both
// started together (T), in interleaved rounds; s = clamp((T - max(A, B)) / min(A, B), 0, 1) on
// the medians.
//
// Thread safety: ProbeRecompute calls the probe from the calling thread only; ProbeSplitOverlap
// calls the prefill on a thread of its own while the caller's thread fetches (never both
// callbacks from two threads at once with the same callback).
#ifndef KVFABRIC_CORE_RECOMPUTE_PROBE_H_
#define KVFABRIC_CORE_RECOMPUTE_PROBE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/bus_calibration.h"
#include "core/bus_cost_model.h"
#include "core/statusor.h"

namespace kvfabric {

struct RecomputeShape {
  uint64_t tokens = 0;         // n, >= 1
  uint64_t prefix_tokens = 0;  // p
};

// Runs one prefill of `tokens` after `prefix_tokens` and returns its time in microseconds
// (finite, > 0).
using PrefillProbe = std::function<StatusOr<double>(uint64_t tokens, uint64_t prefix_tokens)>;

struct RecomputeProbeOptions {
  // Empty: the default grid (file comment).
  std::vector<RecomputeShape> shapes;
  // Timed calls per shape and run. Default 3. In [1, 100].
  int repeats = 3;
  // One line per shape and run; may be empty.
  std::function<void(const std::string&)> progress;
};

struct ShapeError {
  RecomputeShape shape;
  double observed_us = 0;
  double predicted_us = 0;
  double error = 0;  // observed / predicted - 1
};

struct RecomputeProbeReport {
  RecomputeParameters run_a;       // fitted on run A
  RecomputeParameters parameters;  // fitted on runs A and B
  std::vector<ShapeError> run_b;
  double median_abs_error = 0;
  double worst_abs_error = 0;
  double noise_floor_ratio = 0;
  uint64_t samples = 0;  // timed calls behind `parameters`
};

// One transfer of a fetch side (e.g. a data-plane read of a cache host's probe blocks); its
// wall time is what counts, so it may do untimed work too (a CRC check of what it read).
using FetchProbe = std::function<Status()>;

struct SplitOverlapOptions {
  // The prefill measured: a split's front starts at the chain's start (p = 0). Default 1024.
  uint64_t tokens = 1024;
  uint64_t prefix_tokens = 0;
  // Rounds of (A, B, together), interleaved. Default 3, in [1, 100].
  int repeats = 3;
  // The most transfers a fetch side may take (its K). Default 1000.
  uint32_t max_fetches = 1000;
};

struct SplitOverlapReport {
  double prefill_us = 0;       // A: median of the prefills alone
  double fetch_us = 0;         // B: median of the fetch sides alone (K transfers one after another)
  double together_us = 0;      // T: median wall time of both started together
  uint32_t fetches = 0;        // K
  double serial_fraction = 0;  // s
};

// InvalidArgument for options out of range; the callbacks' first error with context.
StatusOr<SplitOverlapReport> ProbeSplitOverlap(const PrefillProbe& prefill, const FetchProbe& fetch,
                                               const SplitOverlapOptions& options);

// "s = 0.84: prefill alone 210 ms, fetch alone 12 x 17.3 ms = 208 ms, together 386 ms".
std::string FormatSplitOverlap(const SplitOverlapReport& r);

// The default grid: n in {16, 64, 256, 1024} after p in {0, 1024, 4096}.
std::vector<RecomputeShape> DefaultRecomputeShapes();

// The default grid's shapes that fit in `max_context_tokens` (n + p), plus two shapes near the
// engine's own scale when it is larger than the grid's: (max/4, 0) and (max/8, max/4), rounded
// down to multiples of 16. The linear-plus-attention form does not follow a CPU prefill from
// n = 16 to n in the thousands (per-token and per-pair costs fall as the matrices grow): fitted
// on the default grid only, the synthetic transformer's calls of 2,000-7,000 tokens ran at
// 0.77-0.82x the prediction; with these two shapes, 0.88-0.95x (docs/benchmarks.md).
std::vector<RecomputeShape> RecomputeShapesUpTo(uint64_t max_context_tokens);

// InvalidArgument for repeats out of range, an empty or n = 0 shape; the probe's first error
// with the shape as context; FailedPrecondition when the shapes cannot separate c0, c1, c2.
StatusOr<RecomputeProbeReport> ProbeRecompute(const PrefillProbe& probe,
                                              const RecomputeProbeOptions& options);

// The calibration file entry: final parameters and the out-of-sample figures.
RecomputeCalibration ToRecomputeCalibration(std::string model_id,
                                            const RecomputeProbeReport& report);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_RECOMPUTE_PROBE_H_
