#include "core/recompute_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "core/bus_probe.h"
#include "core/cost_fit.h"

namespace kvfabric {

std::vector<RecomputeShape> DefaultRecomputeShapes() {
  std::vector<RecomputeShape> shapes;
  for (const RecomputeSample& s : RecomputeReferenceShapes()) {
    shapes.push_back({s.tokens, s.prefix_tokens});
  }
  return shapes;
}

std::vector<RecomputeShape> RecomputeShapesUpTo(uint64_t max_context_tokens) {
  std::vector<RecomputeShape> shapes;
  uint64_t grid_max_n = 0;
  for (const RecomputeShape& s : DefaultRecomputeShapes()) {
    grid_max_n = std::max(grid_max_n, s.tokens);
    if (s.tokens + s.prefix_tokens <= max_context_tokens) shapes.push_back(s);
  }
  const auto round = [](uint64_t x) { return x / 16 * 16; };
  for (const RecomputeShape s :
       {RecomputeShape{round(max_context_tokens / 4), 0},
        RecomputeShape{round(max_context_tokens / 8), round(max_context_tokens / 4)}}) {
    // Only prefills longer than the grid's add anything.
    if (s.tokens > grid_max_n) shapes.push_back(s);
  }
  return shapes;
}

StatusOr<RecomputeProbeReport> ProbeRecompute(const PrefillProbe& probe,
                                              const RecomputeProbeOptions& options) {
  const std::vector<RecomputeShape> shapes =
      options.shapes.empty() ? DefaultRecomputeShapes() : options.shapes;
  if (options.repeats < 1 || options.repeats > 100) {
    return Status::InvalidArgument("recompute probe: repeats " + std::to_string(options.repeats) +
                                   " must be in [1, 100]");
  }
  size_t largest = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (shapes[i].tokens == 0) {
      return Status::InvalidArgument("recompute probe: shape " + std::to_string(i) +
                                     " has 0 tokens");
    }
    const auto cost = [](const RecomputeShape& s) {
      return static_cast<double>(s.tokens) * static_cast<double>(s.prefix_tokens + s.tokens);
    };
    if (cost(shapes[i]) > cost(shapes[largest])) largest = i;
  }
  auto call = [&](const RecomputeShape& s) -> StatusOr<double> {
    StatusOr<double> us = probe(s.tokens, s.prefix_tokens);
    if (!us.ok()) {
      return us.status().WithContext("recompute probe n=" + std::to_string(s.tokens) +
                                     " p=" + std::to_string(s.prefix_tokens));
    }
    if (!std::isfinite(*us) || !(*us > 0)) {
      return Status::Internal("recompute probe n=" + std::to_string(s.tokens) +
                              ": the probe returned a time that is not finite and > 0");
    }
    return us;
  };
  KVF_RETURN_IF_ERROR(call(shapes[largest]).status());  // warm-up: pages, caches, BLAS threads
  std::vector<std::vector<double>> a(shapes.size()), b(shapes.size());
  for (int r = 0; r < options.repeats; ++r) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      const size_t i = (k + static_cast<size_t>(r)) % shapes.size();
      for (int side = 0; side < 2; ++side) {
        const bool run_a = (side == 0) == (r % 2 == 0);
        KVF_ASSIGN_OR_RETURN(const double us, call(shapes[i]));
        (run_a ? a : b)[i].push_back(us);
      }
    }
  }
  std::vector<RecomputeSample> medians_a, both;
  for (size_t i = 0; i < shapes.size(); ++i) {
    medians_a.push_back({shapes[i].tokens, shapes[i].prefix_tokens, MedianOf(a[i])});
  }
  RecomputeProbeReport report;
  StatusOr<RecomputeParameters> fit_a = FitRecomputeParameters(medians_a);
  if (!fit_a.ok()) return fit_a.status().WithContext("recompute probe: fit on run A");
  report.run_a = *fit_a;
  std::vector<double> errors;
  std::vector<std::vector<double>> groups;
  both = medians_a;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ShapeError e;
    e.shape = shapes[i];
    e.observed_us = MedianOf(b[i]);
    e.predicted_us = RecomputeMicros(report.run_a, static_cast<double>(shapes[i].tokens),
                                     static_cast<double>(shapes[i].prefix_tokens));
    e.error = e.observed_us / e.predicted_us - 1;
    errors.push_back(std::fabs(e.error));
    report.run_b.push_back(e);
    both.push_back({shapes[i].tokens, shapes[i].prefix_tokens, e.observed_us});
    std::vector<double> g = a[i];
    g.insert(g.end(), b[i].begin(), b[i].end());
    groups.push_back(std::move(g));
    if (options.progress) {
      options.progress("prefill n=" + std::to_string(shapes[i].tokens) +
                       " p=" + std::to_string(shapes[i].prefix_tokens) + ": run A median " +
                       FormatMicros(MedianOf(a[i])) + ", run B " + FormatMicros(e.observed_us));
    }
  }
  report.median_abs_error = MedianOf(errors);
  report.worst_abs_error = *std::max_element(errors.begin(), errors.end());
  report.noise_floor_ratio = NoiseFloorRatio(groups);
  StatusOr<RecomputeParameters> final_fit = FitRecomputeParameters(both);
  if (!final_fit.ok()) return final_fit.status().WithContext("recompute probe: fit on runs A+B");
  report.parameters = *final_fit;
  report.samples = 2 * shapes.size() * static_cast<uint64_t>(options.repeats);
  return report;
}

StatusOr<SplitOverlapReport> ProbeSplitOverlap(const PrefillProbe& prefill, const FetchProbe& fetch,
                                               const SplitOverlapOptions& options) {
  if (options.tokens == 0 || options.repeats < 1 || options.repeats > 100 ||
      options.max_fetches < 1) {
    return Status::InvalidArgument(
        "split overlap probe: tokens must be >= 1, repeats in [1, 100], max_fetches >= 1");
  }
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  };
  auto prefill_once = [&]() -> StatusOr<double> {
    const auto t0 = Clock::now();
    Status s = prefill(options.tokens, options.prefix_tokens).status();
    if (!s.ok()) return s.WithContext("split overlap probe: prefill");
    return since(t0);
  };
  auto fetch_side = [&](uint32_t k) -> StatusOr<double> {
    const auto t0 = Clock::now();
    for (uint32_t i = 0; i < k; ++i) {
      Status s = fetch();
      if (!s.ok()) return s.WithContext("split overlap probe: fetch");
    }
    return since(t0);
  };
  // Warm-up, and K: a fetch side about as long as the prefill.
  KVF_RETURN_IF_ERROR(prefill_once().status());
  KVF_ASSIGN_OR_RETURN(const double a0, prefill_once());
  KVF_RETURN_IF_ERROR(fetch_side(1).status());
  KVF_ASSIGN_OR_RETURN(const double f1, fetch_side(3));
  const double per_fetch = std::max(f1 / 3, 1.0);
  const auto k =
      static_cast<uint32_t>(std::clamp<double>(std::round(a0 / per_fetch), 1, options.max_fetches));
  std::vector<double> a, b, t;
  for (int r = 0; r < options.repeats; ++r) {
    KVF_ASSIGN_OR_RETURN(const double ar, prefill_once());
    a.push_back(ar);
    KVF_ASSIGN_OR_RETURN(const double br, fetch_side(k));
    b.push_back(br);
    // Both sides, started together: the prefill on a thread of its own.
    StatusOr<double> front = 0.0;
    std::atomic<bool> go{false};
    const auto t0 = Clock::now();
    std::thread th([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      front = prefill_once();
    });
    go.store(true, std::memory_order_release);
    StatusOr<double> side = fetch_side(k);
    th.join();
    const double together = since(t0);
    KVF_RETURN_IF_ERROR(front.status());
    KVF_RETURN_IF_ERROR(side.status());
    t.push_back(together);
  }
  SplitOverlapReport rep;
  rep.prefill_us = MedianOf(a);
  rep.fetch_us = MedianOf(b);
  rep.together_us = MedianOf(t);
  rep.fetches = k;
  const double longer = std::max(rep.prefill_us, rep.fetch_us);
  const double shorter = std::min(rep.prefill_us, rep.fetch_us);
  rep.serial_fraction = std::clamp((rep.together_us - longer) / shorter, 0.0, 1.0);
  return rep;
}

std::string FormatSplitOverlap(const SplitOverlapReport& r) {
  char b[256];
  std::snprintf(b, sizeof(b), "s = %.2f: prefill alone %s, fetch alone %u x %s = %s, together %s",
                r.serial_fraction, FormatMicros(r.prefill_us).c_str(), r.fetches,
                FormatMicros(r.fetch_us / std::max<uint32_t>(r.fetches, 1)).c_str(),
                FormatMicros(r.fetch_us).c_str(), FormatMicros(r.together_us).c_str());
  return b;
}

RecomputeCalibration ToRecomputeCalibration(std::string model_id,
                                            const RecomputeProbeReport& report) {
  RecomputeCalibration c;
  c.model_id = std::move(model_id);
  c.parameters = report.parameters;
  c.samples = report.samples;
  c.median_error_ratio = report.median_abs_error;
  c.worst_error_ratio = report.worst_abs_error;
  c.noise_floor_ratio = report.noise_floor_ratio;
  return c;
}

}  // namespace kvfabric
