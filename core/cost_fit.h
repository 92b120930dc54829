// Fitting the bus cost model (core/bus_cost_model.h) to measurements.
//
// Batch fits (FitPathParameters, FitRecomputeParameters) are ordinary least squares over probe
// measurements; online fits (OnlinePathFit, OnlineRecomputeFit) refit continuously from
// observed transfers and prefills in constant memory.
//
// Method. Both models are linear in their parameters:
//   t = alpha + (1/beta) * bytes                     features (1, bytes)
//   t = c0 + c1 * n + c2 * n * (p + n/2)             features (1, n, n * (p + n/2))
// The fit accumulates the weighted normal equations A = sum w f f^T, b = sum w f t (features
// pre-scaled to MiB and kilo-tokens so A's entries stay within a few orders of magnitude),
// equilibrates A to a unit diagonal and solves it by Gaussian elimination with partial pivoting
// (K <= 3, so the normal equations' squared condition number is harmless at the accuracies that
// matter here, and the same code serves the online fits, which only have sufficient statistics).
// A relative pivot below 1e-9 means the data cannot separate the parameters: the fit is refused
// with FailedPrecondition rather than returning a guess.
//
// Non-negativity: every parameter is physically >= 0 (and 1/beta > 0). With noisy data an
// unconstrained fit can return, say, alpha = -3 us. The fit is therefore non-negative least
// squares, solved exactly for K <= 3 by enumerating the subsets of free parameters: the NNLS
// optimum is the unconstrained optimum on its support, so the feasible subset fit with the
// smallest residual is it. 1/beta must stay free (a path whose time does not grow with size is
// refused).
//
// Weighting: kRelative (default) minimises sum ((t_i - model_i) / t_i)^2, i.e. relative error,
// which is what the ≤3% target is stated in and what keeps 64 KiB probes from being drowned by
// 256 MiB ones; kAbsolute minimises sum (t_i - model_i)^2 (plain OLS).
//
// Online fits use exponentially decayed sufficient statistics: before each observation A, b and
// the weight total are multiplied by `decay` (default 0.999, an effective window of
// 1 / (1 - decay) = 1000 observations). The state is a fixed number of doubles whatever the
// number of observations (MemoryBytes() is constant), old behaviour is forgotten at a known rate,
// and a refit costs O(1). A reservoir would keep old and new behaviour equally weighted, which is
// the wrong bias for a path whose bandwidth changes.
//
// Priors: an online fit may be seeded with parameters it starts from (SeedPrior): `weight`
// effective observations of the parameters' own predictions, spread over a reference grid
// (RecomputeReferenceShapes; path sizes 64 KiB .. 64 MiB by 4x). Real observations then pull
// the fit away from it, and the prior decays with them. Without it, the first few prefills of
// an engine (similar shapes, noisy) decide c0, c1 and c2 on their own; the demo measured a
// worst out-of-sample error of 85% that way. A prior does not count toward
// effective_observations() (which gates the refit).
//
// Thread safety: functions are pure; an Online*Fit object is not synchronised (its owner,
// CalibratedCostModel, holds a mutex).
#ifndef KVFABRIC_CORE_COST_FIT_H_
#define KVFABRIC_CORE_COST_FIT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/bus_cost_model.h"
#include "core/statusor.h"

namespace kvfabric {

// One measured transfer.
struct TransferSample {
  uint64_t bytes = 0;
  double observed_us = 0;
};

// One measured prefill: `tokens` recomputed after `prefix_tokens`.
struct RecomputeSample {
  uint64_t tokens = 0;
  uint64_t prefix_tokens = 0;
  double observed_us = 0;
};

enum class FitWeighting : int {
  // Minimise squared relative error (weights 1/t^2). Default.
  kRelative = 1,
  // Minimise squared absolute error (plain OLS).
  kAbsolute = 2,
};

struct FitOptions {
  // See the file comment. Default kRelative.
  FitWeighting weighting = FitWeighting::kRelative;
  // Fit the path's size curve (bus_cost_model.h, SIZE CURVE) after its line. Default true;
  // false returns a flat curve (the line alone, as before the curve existed).
  bool fit_size_curve = true;
  // How many observations' worth of "factor 1" each knot starts from (SizeCurveFit). Default
  // 0.1: one sample at a knot (a calibration fits the median of its repeats per size) moves it
  // 91% of the way to what it measured.
  double size_curve_prior_observations = 0.1;
};

// The size curve's statistics: per knot, decayed sums from which the knot's factor against any
// line follows in closed form. An observation (bytes, t) adds to the two knots around bytes
// with its interpolation weights h (SizeClassWeightsFor). Knot j's factor minimises
//   sum over its observations of h w (t - k L(bytes))^2,   L = alpha + bytes / beta (the line)
// (w = 1/t^2 for relative weighting, 1 for absolute), so
//   k = sum h w L t / sum h w L^2,   with L linear in (alpha, 1/beta):
// five sums per knot (of h w t, h w B t, h w, h w B, h w B^2) give k for whichever line is in
// force, so a refitted line never leaves the curve fitted against an older one. Each knot also
// holds `prior` observations of its prior factor (1 unless seeded), each worth the mean of its
// own observations' h w L^2, so a knot with few observations moves only part of the way, and
// one with none keeps the prior. Factors
// are clamped to [kMinSizeFactor, kMaxSizeFactor]. Constant memory; not synchronised.
class SizeCurveFit {
 public:
  // Adds one transfer with the weighting's w (1/t^2 relative, 1 absolute).
  void Add(uint64_t bytes, double observed_us, double w);
  void Decay(double factor);
  // Sets the factors a knot starts from, and how many observations' worth they count.
  void SeedPrior(const std::array<double, kSizeClasses>& factors, double observations);
  // The factors against `line` (its own curve ignored).
  std::array<double, kSizeClasses> Factors(const PathParameters& line) const;
  // Whether knot j has observations (beyond a vanishing decayed remainder).
  bool Observed(int j) const { return knots_[j].count > 1e-9; }

 private:
  struct Knot {
    double wt = 0, wbt = 0, w = 0, wb = 0, wbb = 0;  // sums of h w t, h w B t, h w, h w B, h w B^2
    double count = 0;                                // sum of h (decayed)
  };
  std::array<Knot, kSizeClasses> knots_{};
  std::array<double, kSizeClasses> prior_ = {1, 1, 1, 1, 1, 1, 1, 1};
  double prior_observations_ = 0;
};

// Fits alpha and beta, then (FitOptions::fit_size_curve) the size curve against that line; a
// knot outside the samples' sizes takes the factor of the nearest knot they reach (the line's
// error at the largest size measured is the best guess beyond it). FailedPrecondition if the
// samples hold fewer than 2 distinct sizes (the message says how many there were), if their sizes
// cannot separate alpha from beta, or if the fitted time does not grow with size. InvalidArgument
// for a sample with bytes == 0 or a time that is not finite and > 0 (the message names its index).
StatusOr<PathParameters> FitPathParameters(std::span<const TransferSample> samples,
                                           const FitOptions& options = {});

// The (n, p) grid that separates c0, c1 and c2: n in {16, 64, 256, 1024} x p in {0, 1024,
// 4096} (observed_us 0). The recompute probe measures it; recompute priors are spread over it.
std::vector<RecomputeSample> RecomputeReferenceShapes();

// Fits c0, c1, c2 and c3 (the per-call cost per prefix token), or c0, c1, c2 with c3 = 0 where
// the shapes cannot separate c3 (e.g. every sample has p = 0, or one n per prefix length).
// FailedPrecondition if the samples hold fewer than 3 distinct (n, p) shapes or their shapes
// cannot separate the three terms (e.g. every sample has the same n); the message says which.
// InvalidArgument for a sample with tokens == 0 or a bad time.
StatusOr<RecomputeParameters> FitRecomputeParameters(std::span<const RecomputeSample> samples,
                                                     const FitOptions& options = {});

namespace cost_fit_internal {

// Weighted normal equations of a K-parameter linear model, with exponential forgetting.
template <int K>
class NormalEquations {
 public:
  // Adds one row: features f, target t, weight w.
  void Add(const std::array<double, K>& f, double t, double w);
  // Multiplies every statistic by `factor` (0 < factor <= 1).
  void Decay(double factor);
  // The non-negative least-squares solution with the parameters in `must_be_free` (a bit mask)
  // never pinned to zero. FailedPrecondition (message: which parameter index cannot be
  // separated) if the full system is singular, or if no feasible solution keeps `must_be_free`.
  StatusOr<std::array<double, K>> SolveNonNegative(unsigned must_be_free) const;
  // The unconstrained least-squares solution; FailedPrecondition if singular.
  StatusOr<std::array<double, K>> Solve() const;
  double weight_sum() const { return weight_sum_; }

 private:
  std::array<std::array<double, K>, K> a_{};
  std::array<double, K> b_{};
  double tt_ = 0;
  double weight_sum_ = 0;
};

}  // namespace cost_fit_internal

struct OnlineFitOptions {
  // Factor applied to the old statistics before each observation; the effective window is
  // 1 / (1 - decay) observations. Default 0.999 (1000 observations): long enough to average
  // noise, short enough to follow a path whose bandwidth changes within minutes of traffic.
  // REQUIRES: 0 < decay < 1.
  double decay = 0.999;
  // Weighting of each observation. Default kRelative.
  FitWeighting weighting = FitWeighting::kRelative;
  // As FitOptions. The online default moves a knot half way on its first observation.
  bool fit_size_curve = true;
  double size_curve_prior_observations = 1.0;
};

// Path parameters refitted from a stream of observed transfers in constant memory.
class OnlinePathFit {
 public:
  explicit OnlinePathFit(const OnlineFitOptions& options = {}) : options_(options) {
    curve_.SeedPrior({1, 1, 1, 1, 1, 1, 1, 1}, options_.size_curve_prior_observations);
  }

  // Adds one observation; a non-finite or non-positive time, or bytes == 0, is ignored (returns
  // false).
  bool Observe(uint64_t bytes, double observed_us);
  // See the file comment. Ignored for weight <= 0 or parameters that are not finite. The
  // prior's size curve becomes the curve's starting point (SizeCurveFit::SeedPrior) whatever
  // `weight`.
  void SeedPrior(const PathParameters& prior, double weight);
  // The current fit, line and size curve; FailedPrecondition while the observations cannot
  // separate alpha and beta (e.g. all transfers about the same size).
  StatusOr<PathParameters> Fit() const;
  // `line` with the size curve fitted against it (flat when OnlineFitOptions::fit_size_curve is
  // false): what a caller keeps when Fit() cannot separate the line yet.
  PathParameters WithCurve(const PathParameters& line) const;
  // Sum of the decayed weights' count: how many observations the fit effectively rests on.
  double effective_observations() const { return effective_count_; }
  // Bytes this object occupies; independent of how many observations it has seen.
  static constexpr size_t MemoryBytes() { return sizeof(OnlinePathFit); }

 private:
  OnlineFitOptions options_;
  cost_fit_internal::NormalEquations<2> eq_;
  SizeCurveFit curve_;
  double effective_count_ = 0;
};

// Recompute parameters refitted from a stream of observed prefills in constant memory.
class OnlineRecomputeFit {
 public:
  explicit OnlineRecomputeFit(const OnlineFitOptions& options = {}) : options_(options) {}

  // As OnlinePathFit::Observe; tokens == 0 is ignored.
  bool Observe(uint64_t tokens, uint64_t prefix_tokens, double observed_us);
  // See the file comment.
  void SeedPrior(const RecomputeParameters& prior, double weight);
  StatusOr<RecomputeParameters> Fit() const;
  double effective_observations() const { return effective_count_; }
  static constexpr size_t MemoryBytes() { return sizeof(OnlineRecomputeFit); }

 private:
  OnlineFitOptions options_;
  // c0..c3, and c0..c2 for when the observations cannot separate c3 yet (FitRecomputeParameters).
  cost_fit_internal::NormalEquations<4> eq4_;
  cost_fit_internal::NormalEquations<3> eq3_;
  double effective_count_ = 0;
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_COST_FIT_H_
