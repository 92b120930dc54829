#include "core/cost_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kvfabric {
namespace {

// Feature scales: the solver sees bytes in MiB and tokens in kilo-tokens, so the normal
// equations' entries stay within a few orders of magnitude of each other.
constexpr double kBytesScale = 1.0 / (1 << 20);
constexpr double kTokenScale = 1.0 / 1024;
// Relative pivot (after equilibration to a unit diagonal) below which the system is singular.
constexpr double kSingularPivot = 1e-9;

std::array<double, 2> PathFeatures(uint64_t bytes) {
  return {1.0, static_cast<double>(bytes) * kBytesScale};
}

// c0, c1, c2 and c3's features (core/bus_cost_model.h); the three-term model takes the first
// three.
std::array<double, 4> RecomputeFeatures4(uint64_t n, uint64_t p) {
  const double nd = static_cast<double>(n) * kTokenScale;
  const double pd = static_cast<double>(p) * kTokenScale;
  return {1.0, nd, nd * (pd + nd / 2), pd};
}

std::array<double, 3> RecomputeFeatures3(uint64_t n, uint64_t p) {
  const std::array<double, 4> f = RecomputeFeatures4(n, p);
  return {f[0], f[1], f[2]};
}

double Weight(FitWeighting weighting, double t) {
  return weighting == FitWeighting::kAbsolute ? 1.0 : 1.0 / (t * t);
}

bool GoodTime(double t) { return std::isfinite(t) && t > 0; }

PathParameters PathFromCoefficients(const std::array<double, 2>& c) {
  // c[1] is microseconds per MiB.
  return {c[0], 1e6 / (c[1] * kBytesScale)};
}

RecomputeParameters RecomputeFromCoefficients(const std::array<double, 4>& c) {
  RecomputeParameters r;
  r.c0_us = c[0];
  r.c1_us_per_token = c[1] * kTokenScale;
  r.c2_us_per_token2 = c[2] * kTokenScale * kTokenScale;
  r.c3_us_per_prefix_token = c[3] * kTokenScale;
  return r;
}

RecomputeParameters RecomputeFromCoefficients(const std::array<double, 3>& c) {
  return RecomputeFromCoefficients(std::array<double, 4>{c[0], c[1], c[2], 0});
}

// The four-term fit where the data separate c3 (prefills after prefixes of several lengths),
// else the three-term one with c3 = 0; the error is the three-term fit's.
StatusOr<RecomputeParameters> SolveRecompute(const cost_fit_internal::NormalEquations<4>& eq4,
                                             const cost_fit_internal::NormalEquations<3>& eq3) {
  if (auto four = eq4.SolveNonNegative(0); four.ok()) return RecomputeFromCoefficients(*four);
  KVF_ASSIGN_OR_RETURN(const auto three, eq3.SolveNonNegative(0));
  return RecomputeFromCoefficients(three);
}

}  // namespace

namespace cost_fit_internal {

template <int K>
void NormalEquations<K>::Add(const std::array<double, K>& f, double t, double w) {
  for (int i = 0; i < K; ++i) {
    for (int j = 0; j < K; ++j) a_[i][j] += w * f[i] * f[j];
    b_[i] += w * f[i] * t;
  }
  tt_ += w * t * t;
  weight_sum_ += w;
}

template <int K>
void NormalEquations<K>::Decay(double factor) {
  for (int i = 0; i < K; ++i) {
    for (int j = 0; j < K; ++j) a_[i][j] *= factor;
    b_[i] *= factor;
  }
  tt_ *= factor;
  weight_sum_ *= factor;
}

namespace {

// Solves the sub-system of (a, b) on the parameters in `mask`. Returns the index of the first
// parameter that cannot be separated (singular), or -1 with `x` filled (zeros outside `mask`).
template <int K>
int SolveSubset(const std::array<std::array<double, K>, K>& a, const std::array<double, K>& b,
                unsigned mask, std::array<double, K>* x) {
  int idx[K];
  int m = 0;
  for (int i = 0; i < K; ++i) {
    if (mask & (1u << i)) idx[m++] = i;
  }
  double s[K];  // equilibration: A' = D^-1/2 A D^-1/2
  for (int i = 0; i < m; ++i) {
    const double d = a[idx[i]][idx[i]];
    if (!(d > 0) || !std::isfinite(d)) return idx[i];
    s[i] = 1.0 / std::sqrt(d);
  }
  double mat[K][K + 1];
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) mat[i][j] = a[idx[i]][idx[j]] * s[i] * s[j];
    mat[i][m] = b[idx[i]] * s[i];
  }
  for (int col = 0; col < m; ++col) {
    int best = col;
    for (int r = col + 1; r < m; ++r) {
      if (std::fabs(mat[r][col]) > std::fabs(mat[best][col])) best = r;
    }
    if (std::fabs(mat[best][col]) < kSingularPivot) return idx[col];
    if (best != col) {
      for (int j = 0; j <= m; ++j) std::swap(mat[best][j], mat[col][j]);
    }
    for (int r = col + 1; r < m; ++r) {
      const double f = mat[r][col] / mat[col][col];
      for (int j = col; j <= m; ++j) mat[r][j] -= f * mat[col][j];
    }
  }
  double y[K];
  for (int i = m - 1; i >= 0; --i) {
    double acc = mat[i][m];
    for (int j = i + 1; j < m; ++j) acc -= mat[i][j] * y[j];
    y[i] = acc / mat[i][i];
  }
  x->fill(0);
  for (int i = 0; i < m; ++i) (*x)[idx[i]] = y[i] * s[i];  // rows were swapped, columns never
  return -1;
}

}  // namespace

template <int K>
StatusOr<std::array<double, K>> NormalEquations<K>::SolveNonNegative(unsigned must_be_free) const {
  const unsigned all = (1u << K) - 1;
  std::array<double, K> x{};
  const int singular = SolveSubset<K>(a_, b_, all, &x);
  if (singular >= 0) {
    return Status::FailedPrecondition("the data cannot separate parameter " +
                                      std::to_string(singular) + " from the others");
  }
  bool feasible = true;
  for (double v : x) feasible = feasible && v >= 0;
  if (feasible) return x;
  // Enumerate supports; keep the feasible one with the smallest residual.
  double best_rss = std::numeric_limits<double>::infinity();
  std::array<double, K> best{};
  bool found = false;
  for (unsigned mask = 1; mask < all; ++mask) {
    if ((mask & must_be_free) != must_be_free) continue;
    std::array<double, K> c{};
    if (SolveSubset<K>(a_, b_, mask, &c) >= 0) continue;
    bool ok = true;
    for (double v : c) ok = ok && v >= 0;
    if (!ok) continue;
    double rss = tt_;
    for (int i = 0; i < K; ++i) {
      rss -= 2 * c[i] * b_[i];
      for (int j = 0; j < K; ++j) rss += c[i] * a_[i][j] * c[j];
    }
    if (rss < best_rss) {
      best_rss = rss;
      best = c;
      found = true;
    }
  }
  if (!found) {
    return Status::FailedPrecondition(
        "no fit with non-negative parameters keeps every required "
        "parameter free");
  }
  return best;
}

template <int K>
StatusOr<std::array<double, K>> NormalEquations<K>::Solve() const {
  std::array<double, K> x{};
  const int singular = SolveSubset<K>(a_, b_, (1u << K) - 1, &x);
  if (singular >= 0) {
    return Status::FailedPrecondition("the data cannot separate parameter " +
                                      std::to_string(singular) + " from the others");
  }
  return x;
}

template class NormalEquations<2>;
template class NormalEquations<3>;
template class NormalEquations<4>;

}  // namespace cost_fit_internal

void SizeCurveFit::Add(uint64_t bytes, double observed_us, double w) {
  const double b = static_cast<double>(bytes) * kBytesScale;
  const SizeClassWeights h = SizeClassWeightsFor(static_cast<double>(bytes));
  for (int i = 0; i < 2; ++i) {
    if (!(h.weights[i] > 0)) continue;
    const double hw = h.weights[i] * w;
    Knot& k = knots_[h.first + i];
    k.wt += hw * observed_us;
    k.wbt += hw * b * observed_us;
    k.w += hw;
    k.wb += hw * b;
    k.wbb += hw * b * b;
    k.count += h.weights[i];
  }
}

void SizeCurveFit::Decay(double factor) {
  for (Knot& k : knots_) {
    k.wt *= factor;
    k.wbt *= factor;
    k.w *= factor;
    k.wb *= factor;
    k.wbb *= factor;
    k.count *= factor;
  }
}

void SizeCurveFit::SeedPrior(const std::array<double, kSizeClasses>& factors, double observations) {
  for (int j = 0; j < kSizeClasses; ++j) {
    prior_[j] =
        std::isfinite(factors[j]) ? std::clamp(factors[j], kMinSizeFactor, kMaxSizeFactor) : 1.0;
  }
  prior_observations_ = std::isfinite(observations) && observations > 0 ? observations : 0;
}

std::array<double, kSizeClasses> SizeCurveFit::Factors(const PathParameters& line) const {
  std::array<double, kSizeClasses> out = prior_;
  const double a = line.alpha_us;
  const double g = 1e6 / (line.beta_bytes_per_s * kBytesScale);  // µs per MiB
  if (!std::isfinite(a) || !std::isfinite(g) || !(g > 0)) return out;
  for (int j = 0; j < kSizeClasses; ++j) {
    const Knot& k = knots_[j];
    if (!(k.count > 1e-9)) continue;
    const double num = a * k.wt + g * k.wbt;                            // sum h w L t
    const double den = a * a * k.w + 2 * a * g * k.wb + g * g * k.wbb;  // sum h w L^2
    if (!(den > 0) || !std::isfinite(num) || !std::isfinite(den)) continue;
    const double prior = prior_observations_ * den / k.count;
    const double factor = (num + prior * prior_[j]) / (den + prior);
    if (std::isfinite(factor)) out[j] = std::clamp(factor, kMinSizeFactor, kMaxSizeFactor);
  }
  return out;
}

StatusOr<PathParameters> FitPathParameters(std::span<const TransferSample> samples,
                                           const FitOptions& options) {
  std::vector<uint64_t> sizes;
  sizes.reserve(samples.size());
  cost_fit_internal::NormalEquations<2> eq;
  for (size_t i = 0; i < samples.size(); ++i) {
    const TransferSample& s = samples[i];
    if (s.bytes == 0) {
      return Status::InvalidArgument("samples[" + std::to_string(i) + "].bytes: must be > 0");
    }
    if (!GoodTime(s.observed_us)) {
      return Status::InvalidArgument("samples[" + std::to_string(i) +
                                     "].observed_us: must be finite and > 0, got " +
                                     std::to_string(s.observed_us));
    }
    sizes.push_back(s.bytes);
    eq.Add(PathFeatures(s.bytes), s.observed_us, Weight(options.weighting, s.observed_us));
  }
  std::sort(sizes.begin(), sizes.end());
  const size_t distinct = std::unique(sizes.begin(), sizes.end()) - sizes.begin();
  if (distinct < 2) {
    return Status::FailedPrecondition(
        "path fit needs transfers of at least 2 distinct sizes to separate alpha (fixed cost) "
        "from beta (bandwidth); got " +
        std::to_string(distinct) + " distinct size(s) in " + std::to_string(samples.size()) +
        " sample(s)");
  }
  // The slope must be positive before alpha is constrained: a constrained fit through the origin
  // would otherwise invent a bandwidth for data whose time shrinks with size.
  auto unconstrained = eq.Solve();
  if (unconstrained.ok() && !((*unconstrained)[1] > 0)) {
    return Status::FailedPrecondition(
        "path fit: measured time does not grow with transfer size (fitted " +
        std::to_string((*unconstrained)[1]) + " µs/MiB); the probes are not measuring the path");
  }
  auto solved = eq.SolveNonNegative(/*must_be_free=*/0b10);
  if (!solved.ok()) {
    return Status::FailedPrecondition(
        "path fit: the transfer sizes cannot separate alpha from beta, or time does not grow "
        "with size (" +
        std::string(solved.status().message()) + ")");
  }
  if (!((*solved)[1] > 0)) {
    return Status::FailedPrecondition("path fit: time does not grow with size (beta infinite)");
  }
  PathParameters line = PathFromCoefficients(*solved);
  if (options.fit_size_curve) {
    SizeCurveFit curve;
    curve.SeedPrior(line.size_factors, options.size_curve_prior_observations);
    for (const TransferSample& s : samples) {
      curve.Add(s.bytes, s.observed_us, Weight(options.weighting, s.observed_us));
    }
    line.size_factors = curve.Factors(line);
    // Knots beyond the measured sizes hold the nearest measured knot's factor, not 1: the line
    // extrapolates with the error it had at the end of the range.
    int first = 0;
    while (first < kSizeClasses && !curve.Observed(first)) ++first;
    int last = kSizeClasses - 1;
    while (last > first && !curve.Observed(last)) --last;
    if (first < kSizeClasses) {
      for (int j = 0; j < first; ++j) line.size_factors[j] = line.size_factors[first];
      for (int j = last + 1; j < kSizeClasses; ++j) line.size_factors[j] = line.size_factors[last];
    }
  }
  return line;
}

StatusOr<RecomputeParameters> FitRecomputeParameters(std::span<const RecomputeSample> samples,
                                                     const FitOptions& options) {
  std::vector<std::pair<uint64_t, uint64_t>> shapes;
  std::vector<uint64_t> ns;
  shapes.reserve(samples.size());
  cost_fit_internal::NormalEquations<3> eq3;
  cost_fit_internal::NormalEquations<4> eq4;
  for (size_t i = 0; i < samples.size(); ++i) {
    const RecomputeSample& s = samples[i];
    if (s.tokens == 0) {
      return Status::InvalidArgument("samples[" + std::to_string(i) + "].tokens: must be > 0");
    }
    if (!GoodTime(s.observed_us)) {
      return Status::InvalidArgument("samples[" + std::to_string(i) +
                                     "].observed_us: must be finite and > 0, got " +
                                     std::to_string(s.observed_us));
    }
    shapes.emplace_back(s.tokens, s.prefix_tokens);
    ns.push_back(s.tokens);
    const double w = Weight(options.weighting, s.observed_us);
    eq3.Add(RecomputeFeatures3(s.tokens, s.prefix_tokens), s.observed_us, w);
    eq4.Add(RecomputeFeatures4(s.tokens, s.prefix_tokens), s.observed_us, w);
  }
  std::sort(shapes.begin(), shapes.end());
  const size_t distinct = std::unique(shapes.begin(), shapes.end()) - shapes.begin();
  if (distinct < 3) {
    return Status::FailedPrecondition(
        "recompute fit needs prefills of at least 3 distinct (n, p) shapes to separate c0, c1 "
        "and c2; got " +
        std::to_string(distinct) + " in " + std::to_string(samples.size()) + " sample(s)");
  }
  std::sort(ns.begin(), ns.end());
  if (std::unique(ns.begin(), ns.end()) - ns.begin() < 2) {
    return Status::FailedPrecondition(
        "recompute fit: every sample has n = " + std::to_string(ns[0]) +
        " tokens, so c0 (per call) and c1 (per token) cannot be separated; vary n");
  }
  auto solved = SolveRecompute(eq4, eq3);
  if (!solved.ok()) {
    return Status::FailedPrecondition(
        "recompute fit: the (n, p) shapes cannot separate c0, c1 and c2; vary both n and p (" +
        std::string(solved.status().message()) + ")");
  }
  return solved;
}

std::vector<RecomputeSample> RecomputeReferenceShapes() {
  std::vector<RecomputeSample> shapes;
  for (uint64_t p : {0, 1024, 4096}) {
    for (uint64_t n : {16, 64, 256, 1024}) shapes.push_back({n, p, 0});
  }
  return shapes;
}

void OnlinePathFit::SeedPrior(const PathParameters& prior, double weight) {
  if (SizeFactorsValid(prior)) {
    curve_.SeedPrior(prior.size_factors, options_.size_curve_prior_observations);
  }
  if (!(weight > 0) || !std::isfinite(prior.alpha_us) || prior.alpha_us < 0 ||
      !std::isfinite(prior.beta_bytes_per_s) || !(prior.beta_bytes_per_s > 0)) {
    return;
  }
  constexpr int kSizes = 6;  // 64 KiB .. 64 MiB by 4x
  for (int i = 0; i < kSizes; ++i) {
    const uint64_t bytes = (uint64_t{64} << 10) << (2 * i);
    const double t = LineMicros(prior, static_cast<double>(bytes));
    if (!GoodTime(t)) continue;
    // One row per term (see OnlineRecomputeFit::SeedPrior).
    const std::array<double, 2> f = PathFeatures(bytes);
    const double terms[2] = {prior.alpha_us, t - prior.alpha_us};
    for (int k = 0; k < 2; ++k) {
      std::array<double, 2> row{};
      row[k] = f[k];
      eq_.Add(row, terms[k], weight / kSizes * Weight(options_.weighting, t));
    }
  }
}

void OnlineRecomputeFit::SeedPrior(const RecomputeParameters& prior, double weight) {
  if (!(weight > 0) || !RecomputeParametersValid(prior)) return;
  // Each term of the prior's prediction pinned on its own row (a ridge toward the prior in the
  // metric of relative error at the reference shapes), not the whole prediction on one row:
  // a prior wrong in c2 alone must not drag c1 along where the observed shapes cannot
  // separate c1 from c2 (measured: six prefills against a whole-prediction prior of weight 2
  // left c1 at half its value).
  const std::vector<RecomputeSample> shapes = RecomputeReferenceShapes();
  for (const RecomputeSample& s : shapes) {
    const double n = static_cast<double>(s.tokens);
    const double p = static_cast<double>(s.prefix_tokens);
    const double t = RecomputeMicros(prior, n, p);
    if (!GoodTime(t)) continue;
    const std::array<double, 4> f = RecomputeFeatures4(s.tokens, s.prefix_tokens);
    const double terms[4] = {prior.c0_us, prior.c1_us_per_token * n,
                             prior.c2_us_per_token2 * n * (p + n / 2),
                             prior.c3_us_per_prefix_token * p};
    const double w = weight / static_cast<double>(shapes.size()) * Weight(options_.weighting, t);
    for (int k = 0; k < 4; ++k) {
      std::array<double, 4> row{};
      row[k] = f[k];
      eq4_.Add(row, terms[k], w);
      if (k < 3) {
        std::array<double, 3> row3{};
        row3[k] = f[k];
        eq3_.Add(row3, terms[k], w);
      }
    }
  }
}

bool OnlinePathFit::Observe(uint64_t bytes, double observed_us) {
  if (bytes == 0 || !GoodTime(observed_us)) return false;
  eq_.Decay(options_.decay);
  effective_count_ = effective_count_ * options_.decay + 1;
  eq_.Add(PathFeatures(bytes), observed_us, Weight(options_.weighting, observed_us));
  curve_.Decay(options_.decay);
  curve_.Add(bytes, observed_us, Weight(options_.weighting, observed_us));
  return true;
}

StatusOr<PathParameters> OnlinePathFit::Fit() const {
  auto solved = eq_.SolveNonNegative(0b10);
  if (!solved.ok() || !((*solved)[1] > 0)) {
    return Status::FailedPrecondition(
        "online path fit: the observed transfers do not separate alpha and beta yet (need "
        "transfers of clearly different sizes)");
  }
  return WithCurve(PathFromCoefficients(*solved));
}

PathParameters OnlinePathFit::WithCurve(const PathParameters& line) const {
  PathParameters out = line;
  out.size_factors = {1, 1, 1, 1, 1, 1, 1, 1};
  if (options_.fit_size_curve) out.size_factors = curve_.Factors(out);
  return out;
}

bool OnlineRecomputeFit::Observe(uint64_t tokens, uint64_t prefix_tokens, double observed_us) {
  if (tokens == 0 || !GoodTime(observed_us)) return false;
  eq3_.Decay(options_.decay);
  eq4_.Decay(options_.decay);
  effective_count_ = effective_count_ * options_.decay + 1;
  const double w = Weight(options_.weighting, observed_us);
  eq3_.Add(RecomputeFeatures3(tokens, prefix_tokens), observed_us, w);
  eq4_.Add(RecomputeFeatures4(tokens, prefix_tokens), observed_us, w);
  return true;
}

StatusOr<RecomputeParameters> OnlineRecomputeFit::Fit() const {
  auto solved = SolveRecompute(eq4_, eq3_);
  if (!solved.ok()) {
    return Status::FailedPrecondition(
        "online recompute fit: the observed prefills do not separate c0, c1 and c2 yet (need "
        "varied n and p)");
  }
  return solved;
}

}  // namespace kvfabric
