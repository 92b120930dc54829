#include "core/prediction_error.h"

#include <algorithm>
#include <cmath>

namespace kvfabric {

void PredictionErrorHistogram::Record(double observed_us, double predicted_us) {
  if (!std::isfinite(observed_us) || !std::isfinite(predicted_us) || !(predicted_us > 0)) {
    ++unscored_;
    return;
  }
  RecordError(observed_us / predicted_us - 1);
}

void PredictionErrorHistogram::RecordError(double error) {
  if (!std::isfinite(error)) {
    ++unscored_;
    return;
  }
  const auto it = std::lower_bound(kUpperBounds.begin(), kUpperBounds.end(), error);
  ++counts_[it - kUpperBounds.begin()];
  if (count_ == 0) {
    min_ = max_ = error;
  } else {
    min_ = std::min(min_, error);
    max_ = std::max(max_, error);
  }
  ++count_;
  sum_ += error;
}

PredictionErrorHistogram::Snapshot PredictionErrorHistogram::Get() const {
  Snapshot s;
  s.counts = counts_;
  s.count = count_;
  s.sum = sum_;
  s.unscored = unscored_;
  if (count_ == 0) return s;
  s.worst_abs = std::max(std::fabs(min_), std::fabs(max_));
  // The median's rank (0-based, fractional for even counts) and the bucket that holds it.
  const double rank = (static_cast<double>(count_) - 1) / 2;
  uint64_t below = 0;
  for (int i = 0; i < kBuckets; ++i) {
    if (counts_[i] == 0) continue;
    if (rank < static_cast<double>(below + counts_[i])) {
      // Bucket edges, clipped to the values actually seen.
      double lo = i == 0 ? min_ : std::max(min_, kUpperBounds[i - 1]);
      double hi = i == kBuckets - 1 ? max_ : std::min(max_, kUpperBounds[i]);
      const double frac =
          (rank - static_cast<double>(below) + 0.5) / static_cast<double>(counts_[i]);
      s.median = lo + (hi - lo) * std::clamp(frac, 0.0, 1.0);
      break;
    }
    below += counts_[i];
  }
  return s;
}

}  // namespace kvfabric
