// PredictionErrorHistogram: how wrong the cost model has been on one path, in bounded memory.
//
// The error of one prediction is the ratio observed / predicted - 1 (0.03 = took 3% longer than
// predicted, -0.5 = took half the time). Errors fall in fixed buckets whose upper bounds
// (inclusive, Prometheus `le` semantics) are
//   -0.5 -0.2 -0.1 -0.05 -0.03 -0.02 -0.01 -0.005 0.005 0.01 0.02 0.03 0.05 0.1 0.2 0.5 1 2 +inf
// i.e. 0.5%–1% wide around zero, where the ≤3% calibration target lives, and coarse in the
// tails. Besides the buckets it keeps the count, the sum, the smallest and largest error and the
// worst |error| exactly. The median is estimated from the buckets by linear interpolation inside
// the bucket that holds it (so it is exact to within that bucket's width: 0.5% near zero).
//
// The metrics layer exports Snapshot() as a histogram (bucket counts made cumulative) plus
// gauges for worst and median.
//
// Thread safety: not synchronised; the owner (CalibratedCostModel) holds a mutex.
#ifndef KVFABRIC_CORE_PREDICTION_ERROR_H_
#define KVFABRIC_CORE_PREDICTION_ERROR_H_

#include <array>
#include <cstdint>
#include <span>

namespace kvfabric {

class PredictionErrorHistogram {
 public:
  static constexpr int kBuckets = 19;
  // Upper bounds of the first kBuckets - 1 buckets; the last bucket is (2, +inf).
  static constexpr std::array<double, kBuckets - 1> kUpperBounds = {
      -0.5, -0.2, -0.1, -0.05, -0.03, -0.02, -0.01, -0.005, 0.005,
      0.01, 0.02, 0.03, 0.05,  0.1,   0.2,   0.5,   1.0,    2.0};

  struct Snapshot {
    // Per-bucket (not cumulative) counts, bucket i covering (kUpperBounds[i-1], kUpperBounds[i]].
    std::array<uint64_t, kBuckets> counts{};
    uint64_t count = 0;
    // Sum of the errors (for a Prometheus _sum).
    double sum = 0;
    // Worst |observed/predicted - 1|; 0 with no samples.
    double worst_abs = 0;
    // Estimated median error (signed); 0 with no samples.
    double median = 0;
    // Predictions that could not be scored (predicted <= 0, or a non-finite value).
    uint64_t unscored = 0;
  };

  // Records one prediction. A non-finite or non-positive `predicted_us`, or a non-finite
  // `observed_us`, counts as unscored.
  void Record(double observed_us, double predicted_us);
  // Records an error ratio directly.
  void RecordError(double error);

  Snapshot Get() const;

 private:
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t unscored_ = 0;
  double sum_ = 0;
  double min_ = 0;
  double max_ = 0;
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_PREDICTION_ERROR_H_
