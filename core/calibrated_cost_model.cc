#include "core/calibrated_cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/mutex.h"

namespace kvfabric {
namespace {

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

int64_t NowUnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ParameterProvenance Fresh(ParameterSource source) {
  ParameterProvenance p;
  p.source = source;
  p.updated_unix_us = NowUnixMicros();
  return p;
}

Status CheckRecompute(std::string_view model_id, const RecomputeParameters& r) {
  if (model_id.empty()) return Status::InvalidArgument("model_id: must be non-empty");
  if (!FiniteNonNegative(r.c0_us) || !FiniteNonNegative(r.c1_us_per_token) ||
      !FiniteNonNegative(r.c2_us_per_token2) || !FiniteNonNegative(r.c3_us_per_prefix_token)) {
    return Status::InvalidArgument("recompute parameters of \"" + std::string(model_id) +
                                   "\": c0, c1, c2, c3 must be finite and >= 0");
  }
  if (!(r.split_serial_fraction >= 0 && r.split_serial_fraction <= 1)) {
    return Status::InvalidArgument("recompute parameters of \"" + std::string(model_id) +
                                   "\": split_serial_fraction must be in [0, 1], got " +
                                   std::to_string(r.split_serial_fraction));
  }
  return Status::OK();
}

// ObserveShared's gain: the mean of its first kGainWindow samples, then each sample moves it
// 1/kGainWindow of the way. A gain a calibration file states counts as a full window, so one
// transfer does not undo a measurement.
constexpr double kGainWindow = 16;
// The fraction of a shared transfer's time that was its own at concurrency gain `gain`:
// min(1, gain x bytes / (bytes + shared)), at least 1 / kMaxSharedShare.
double OwnShare(double gain, double bytes, double all) {
  return std::max(std::min(1.0, gain * bytes / all), 1.0 / kMaxSharedShare);
}

double GainPriorSamples(const PathParameters& p) {
  return p.concurrency_gain != 1 ? kGainWindow : 0;
}

std::string PathLabel(BusPath path, std::string_view host_id) {
  std::string s(BusPathName(path));
  if (!host_id.empty()) s += " host \"" + std::string(host_id) + "\"";
  return s;
}

}  // namespace

std::string_view ParameterSourceName(ParameterSource source) {
  switch (source) {
    case ParameterSource::kDefault:
      return "default";
    case ParameterSource::kCalibration:
      return "calibration";
    case ParameterSource::kStated:
      return "stated";
    case ParameterSource::kOnlineFit:
      return "online fit";
  }
  return "unknown";
}

Status CalibratedCostModel::SetPath(BusPath path, std::string_view host_id, const PathParameters& p,
                                    ParameterSource source) {
  if (!IsValidBusPath(static_cast<int>(path))) return Status::InvalidArgument("unknown path");
  if (!FiniteNonNegative(p.alpha_us) || !std::isfinite(p.beta_bytes_per_s) ||
      !(p.beta_bytes_per_s > 0)) {
    return Status::InvalidArgument(PathLabel(path, host_id) +
                                   ": alpha_us must be finite and >= 0 and beta_bytes_per_s "
                                   "finite and > 0");
  }
  if (!SizeFactorsValid(p)) {
    return Status::InvalidArgument(PathLabel(path, host_id) +
                                   ": every size factor must be finite and in [0.25, 4]");
  }
  if (!ConcurrencyGainValid(p)) {
    return Status::InvalidArgument(PathLabel(path, host_id) +
                                   ": concurrency_gain must be in [1, 16]");
  }
  MutexLock lock(&mu_);
  PathEntry& e = paths_[PathKey(static_cast<int>(path), std::string(host_id))];
  e.parameters = p;
  e.fit = NewPathFit(e.parameters, source);
  e.provenance = Fresh(source);
  e.gain_samples = GainPriorSamples(p);
  e.healthy.reset();
  e.confirmed = 0;
  e.misses = MissRun();
  return Status::OK();
}

Status CalibratedCostModel::SetRecompute(std::string_view model_id, const RecomputeParameters& r,
                                         ParameterSource source) {
  KVF_RETURN_IF_ERROR(CheckRecompute(model_id, r));
  MutexLock lock(&mu_);
  RecomputeEntry& e = models_[std::string(model_id)];
  e.parameters = r;
  e.fit = NewRecomputeFit(e.parameters, source);
  e.provenance = Fresh(source);
  return Status::OK();
}

StatusOr<bool> CalibratedCostModel::StateRecompute(std::string_view model_id,
                                                   const RecomputeParameters& r) {
  KVF_RETURN_IF_ERROR(CheckRecompute(model_id, r));
  MutexLock lock(&mu_);
  auto it = models_.find(model_id);
  if (it != models_.end() && it->second.provenance.source != ParameterSource::kDefault &&
      it->second.provenance.source != ParameterSource::kStated) {
    return false;
  }
  if (it == models_.end()) it = models_.emplace(std::string(model_id), RecomputeEntry()).first;
  RecomputeEntry& e = it->second;
  if (e.provenance.source == ParameterSource::kStated && e.parameters.c0_us == r.c0_us &&
      e.parameters.c1_us_per_token == r.c1_us_per_token &&
      e.parameters.c2_us_per_token2 == r.c2_us_per_token2 &&
      e.parameters.c3_us_per_prefix_token == r.c3_us_per_prefix_token &&
      e.parameters.split_serial_fraction == r.split_serial_fraction) {
    return false;  // restated unchanged: keep the fit and the errors gathered so far
  }
  e.parameters = r;
  e.fit = NewRecomputeFit(e.parameters, ParameterSource::kStated);
  e.provenance = Fresh(ParameterSource::kStated);
  return true;
}

StatusOr<CalibratedCostModel::ReloadCounts> CalibratedCostModel::Reload(
    const BusCalibration& calibration) {
  KVF_RETURN_IF_ERROR(BusCalibrationFromJson(BusCalibrationToJson(calibration)).status());
  ReloadCounts counts;
  MutexLock lock(&mu_);
  for (const PathCalibration& p : calibration.paths) {
    PathEntry& e = paths_[PathKey(static_cast<int>(p.path), p.host_id)];
    // A file without a gain did not measure one: the gain learned so far stays.
    const double learned_gain = e.parameters.concurrency_gain;
    const double learned_samples = e.gain_samples;
    e = PathEntry();
    e.parameters = p.parameters;
    e.fit = NewPathFit(e.parameters, ParameterSource::kCalibration);
    e.provenance = Fresh(ParameterSource::kCalibration);
    e.noise_floor_ratio = p.noise_floor_ratio;
    e.gain_samples = GainPriorSamples(e.parameters);
    if (p.parameters.concurrency_gain == 1 && learned_samples > 0) {
      e.parameters.concurrency_gain = learned_gain;
      e.gain_samples = learned_samples;
    }
    ++counts.paths;
  }
  for (const RecomputeCalibration& r : calibration.recompute) {
    RecomputeEntry& e = models_[r.model_id];
    e = RecomputeEntry();
    e.parameters = r.parameters;
    e.fit = NewRecomputeFit(e.parameters, ParameterSource::kCalibration);
    e.provenance = Fresh(ParameterSource::kCalibration);
    e.noise_floor_ratio = r.noise_floor_ratio;
    ++counts.models;
  }
  counts.kept = paths_.size() + models_.size() - counts.paths - counts.models;
  return counts;
}

StatusOr<ParameterProvenance> CalibratedCostModel::PathProvenance(BusPath path,
                                                                  std::string_view host_id) const {
  MutexLock lock(&mu_);
  const PathEntry* e = FindPathLocked(path, host_id);
  if (e == nullptr) {
    return Status::NotFound("no calibration for path " + PathLabel(path, host_id));
  }
  return e->provenance;
}

StatusOr<ParameterProvenance> CalibratedCostModel::RecomputeProvenance(
    std::string_view model_id) const {
  MutexLock lock(&mu_);
  const auto it = models_.find(model_id);
  if (it == models_.end()) {
    return Status::NotFound("no recompute calibration for model \"" + std::string(model_id) + "\"");
  }
  return it->second.provenance;
}

Status CalibratedCostModel::Load(const BusCalibration& calibration) {
  // Validate by round-tripping through the file parser's rules.
  KVF_RETURN_IF_ERROR(BusCalibrationFromJson(BusCalibrationToJson(calibration)).status());
  MutexLock lock(&mu_);
  paths_.clear();
  models_.clear();
  for (const PathCalibration& p : calibration.paths) {
    PathEntry& e = paths_[PathKey(static_cast<int>(p.path), p.host_id)];
    e.parameters = p.parameters;
    e.fit = NewPathFit(e.parameters, ParameterSource::kCalibration);
    e.provenance = Fresh(ParameterSource::kCalibration);
    e.noise_floor_ratio = p.noise_floor_ratio;
    e.gain_samples = GainPriorSamples(e.parameters);
  }
  for (const RecomputeCalibration& r : calibration.recompute) {
    RecomputeEntry& e = models_[r.model_id];
    e.parameters = r.parameters;
    e.fit = NewRecomputeFit(e.parameters, ParameterSource::kCalibration);
    e.provenance = Fresh(ParameterSource::kCalibration);
    e.noise_floor_ratio = r.noise_floor_ratio;
  }
  return Status::OK();
}

BusCalibration CalibratedCostModel::ToCalibration() const {
  BusCalibration c;
  MutexLock lock(&mu_);
  for (const auto& [key, e] : paths_) {
    PathCalibration p;
    p.path = static_cast<BusPath>(key.first);
    p.host_id = key.second;
    p.parameters = e.parameters;
    const auto snap = e.error.Get();
    p.samples = snap.count;
    p.median_error_ratio = std::fabs(snap.median);
    p.worst_error_ratio = snap.worst_abs;
    c.paths.push_back(std::move(p));
  }
  for (const auto& [id, e] : models_) {
    c.recompute.push_back({id, e.parameters, e.error.Get().count});
  }
  return c;
}

bool CalibratedCostModel::MissRun::Add(double ratio, double gap_us, const Options& options,
                                       double* median) {
  const uint32_t run = std::min<uint32_t>(options.change_point_run, 32);
  if (run == 0 || !std::isfinite(ratio) || !(ratio > 0)) return false;
  const int dir = ratio > 1 + options.change_point_ratio         ? +1
                  : ratio < 1 / (1 + options.change_point_ratio) ? -1
                                                                 : 0;
  if (dir == 0 || dir != direction) {
    length = 0;
    severe_tail = 0;
    direction = dir;
    if (dir == 0) return false;
  }
  const bool severe = options.change_point_severe_run > 0 &&
                      gap_us >= options.change_point_severe_min_us &&
                      (ratio > 1 + options.change_point_severe_ratio ||
                       ratio < 1 / (1 + options.change_point_severe_ratio));
  severe_tail = severe ? severe_tail + 1 : 0;
  ratios[length++] = ratio;
  // The severe rule looks at its own tail of the run only: the misses far beyond noise.
  const uint32_t severe_run = std::min<uint32_t>(options.change_point_severe_run, run);
  const bool severe_done = severe_run > 0 && severe_tail >= severe_run;
  if (length < run && !severe_done) return false;
  const uint32_t from = severe_done && length < run ? length - severe_tail : 0;
  std::array<double, 32> sorted = ratios;
  std::sort(sorted.begin() + from, sorted.begin() + length);
  *median = sorted[from + (length - from) / 2];
  length = 0;
  severe_tail = 0;
  direction = 0;
  return true;
}

OnlinePathFit CalibratedCostModel::NewPathFit(const PathParameters& p,
                                              ParameterSource source) const {
  OnlinePathFit fit(options_.online);
  if (source != ParameterSource::kDefault) fit.SeedPrior(p, options_.prior_weight);
  return fit;
}

OnlineRecomputeFit CalibratedCostModel::NewRecomputeFit(const RecomputeParameters& r,
                                                        ParameterSource source) const {
  OnlineRecomputeFit fit(options_.online);
  if (source != ParameterSource::kDefault) fit.SeedPrior(r, options_.prior_weight);
  return fit;
}

const CalibratedCostModel::PathEntry* CalibratedCostModel::FindPathLocked(
    BusPath path, std::string_view host_id) const {
  auto it = paths_.find(PathKey(static_cast<int>(path), std::string(host_id)));
  if (it != paths_.end()) return &it->second;
  it = paths_.find(PathKey(static_cast<int>(path), std::string()));
  return it == paths_.end() ? nullptr : &it->second;
}

StatusOr<PathParameters> CalibratedCostModel::Path(BusPath path, std::string_view host_id) const {
  MutexLock lock(&mu_);
  const PathEntry* e = FindPathLocked(path, host_id);
  if (e == nullptr) {
    return Status::NotFound("no calibration for path " + PathLabel(path, host_id) +
                            " and no default for the path");
  }
  return e->parameters;
}

StatusOr<RecomputeParameters> CalibratedCostModel::Recompute(std::string_view model_id) const {
  MutexLock lock(&mu_);
  const auto it = models_.find(model_id);
  if (it == models_.end()) {
    return Status::NotFound("no recompute calibration for model \"" + std::string(model_id) + "\"");
  }
  return it->second.parameters;
}

Status CalibratedCostModel::ObserveTransfer(BusPath path, std::string_view host_id, uint64_t bytes,
                                            double observed_us) {
  MutexLock lock(&mu_);
  Status why;
  PathEntry* own =
      ObservedPathLocked(path, host_id, "transfer observation", bytes, observed_us, &why);
  if (own == nullptr) return why;
  ObserveTransferLocked(*own, bytes, observed_us);
  return Status::OK();
}

void CalibratedCostModel::ObserveTransferLocked(PathEntry& e, uint64_t bytes, double observed_us) {
  const double predicted = FetchMicros(e.parameters, static_cast<double>(bytes));
  e.error.Record(observed_us, predicted);
  ConfirmLocked(e, observed_us / predicted);
  double scale = 1;
  if (e.misses.Add(observed_us / predicted, std::fabs(observed_us - predicted), options_, &scale)) {
    // A change point: the path is not what it was; start again from the scaled figures. A
    // slowdown of figures transfers confirmed remembers them (the first of a run of
    // slowdowns), for retrials; a speed-up learned from traffic forgets them once it is back
    // within change_point_ratio of them (a partial one is still a slowdown).
    if (scale > 1 && !e.healthy && e.confirmed >= options_.healthy_after) e.healthy = e.parameters;
    e.confirmed = 0;
    e.parameters.alpha_us *= scale;
    e.parameters.beta_bytes_per_s /= scale;
    if (scale < 1 && e.healthy &&
        FetchMicros(e.parameters, static_cast<double>(bytes)) <=
            (1 + options_.change_point_ratio) *
                FetchMicros(*e.healthy, static_cast<double>(bytes))) {
      e.healthy.reset();
    }
    e.fit = NewPathFit(e.parameters, ParameterSource::kOnlineFit);
    e.provenance.source = ParameterSource::kOnlineFit;
    ++e.provenance.change_points;
    e.provenance.updated_unix_us = NowUnixMicros();
    return;
  }
  e.fit.Observe(bytes, observed_us);
  if (options_.online_refit &&
      e.fit.effective_observations() >= options_.min_observations_for_refit) {
    // The line and its size curve; while the sizes seen cannot separate alpha from beta, the
    // line in force keeps and only its curve is refitted against it (SIZE CURVE: the curve's
    // statistics fit any line).
    auto fitted = e.fit.Fit();
    const double gain = e.parameters.concurrency_gain;  // not the line's: ObserveShared's
    e.parameters = fitted.ok() ? *fitted : e.fit.WithCurve(e.parameters);
    e.parameters.concurrency_gain = gain;
    e.provenance.source = ParameterSource::kOnlineFit;
    ++e.provenance.refits;
    e.provenance.updated_unix_us = NowUnixMicros();
  }
}

void CalibratedCostModel::ConfirmLocked(PathEntry& e, double ratio) const {
  // Not over-optimistic is what a retrial needs of the figures: a transfer faster than they
  // predict confirms them as much as one on time.
  if (ratio <= 1 + options_.change_point_ratio) {
    e.confirmed = std::min<uint32_t>(e.confirmed + 1, options_.healthy_after);
  }
}

Status CalibratedCostModel::ObserveBesidePrefill(BusPath path, std::string_view host_id,
                                                 uint64_t bytes, double observed_us) {
  MutexLock lock(&mu_);
  Status why;
  PathEntry* e =
      ObservedPathLocked(path, host_id, "beside-prefill observation", bytes, observed_us, &why);
  if (e == nullptr) return why;
  ConfirmLocked(*e, observed_us / FetchMicros(e->parameters, static_cast<double>(bytes)));
  return Status::OK();
}

std::optional<PathParameters> CalibratedCostModel::HealthyBefore(BusPath path,
                                                                 std::string_view host_id) const {
  MutexLock lock(&mu_);
  const auto it = paths_.find(PathKey(static_cast<int>(path), std::string(host_id)));
  if (it == paths_.end()) return std::nullopt;
  return it->second.healthy;
}

StatusOr<RetrialJudgement> CalibratedCostModel::ObserveRetrial(
    BusPath path, std::string_view host_id, uint64_t bytes, uint64_t shared_bytes,
    double observed_us, bool beside_prefill) {
  MutexLock lock(&mu_);
  Status why;
  PathEntry* e = ObservedPathLocked(path, host_id, "retrial observation", bytes, observed_us, &why);
  if (e == nullptr) return why;
  RetrialJudgement judgement;
  judgement.observed_us = observed_us;
  if (e->healthy) {
    // Its share at the gain in force, without learning the gain from it: the slowed line would
    // read a recovered path's shared transfer as a gain of 16.
    const double b = static_cast<double>(bytes);
    const double all = b + static_cast<double>(shared_bytes);
    const double us = observed_us * OwnShare(e->parameters.concurrency_gain, b, all);
    const double healthy_us = FetchMicros(*e->healthy, b);
    const double slowed_us = FetchMicros(e->parameters, b);
    // Recovered: within change_point_ratio of the healthy figures, or nearer them than the
    // slowed ones by ratio (below their geometric mean) and not a severe miss of them (within
    // 1 + change_point_severe_ratio: slowed figures learned from cut streams can be far slower
    // than the link, and their geometric mean with the healthy ones then admits a capped
    // transfer).
    const double ratio = us / healthy_us;
    if (ratio <= 1 + options_.change_point_ratio ||
        (us * us <= healthy_us * slowed_us && ratio <= 1 + options_.change_point_severe_ratio)) {
      // Scored against the figures in force (they missed); then the figures from before the
      // slowdown come back, scaled by this transfer's miss where it is beyond
      // change_point_ratio (partly recovered, or a small transfer late by a thread wake-up:
      // later traffic refits it, and the healthy figures stay remembered for the next
      // retrial), and the fit restarts from them.
      if (!beside_prefill) e->error.Record(us, slowed_us);
      const double k = ratio > 1 + options_.change_point_ratio ? ratio : 1;
      e->parameters = *e->healthy;
      e->parameters.alpha_us *= k;
      e->parameters.beta_bytes_per_s /= k;
      if (k == 1) e->healthy.reset();
      e->confirmed = 1;
      e->misses = MissRun();
      e->fit = NewPathFit(e->parameters, ParameterSource::kOnlineFit);
      if (!beside_prefill) e->fit.Observe(bytes, us);
      e->provenance.source = ParameterSource::kOnlineFit;
      ++e->provenance.restores;
      e->provenance.updated_unix_us = NowUnixMicros();
      return RetrialJudgement{RetrialOutcome::kRestored, us, healthy_us, slowed_us};
    }
    judgement = RetrialJudgement{RetrialOutcome::kStillSlow, us, healthy_us, slowed_us};
  }
  // Still slow (or never slowed): an ordinary observation, unless a prefill ran beside it.
  if (beside_prefill) return judgement;
  const double own = shared_bytes > 0 ? SharedOwnLocked(*e, bytes, shared_bytes, observed_us) : 1;
  ObserveTransferLocked(*e, bytes, observed_us * own);
  return judgement;
}

CalibratedCostModel::PathEntry* CalibratedCostModel::ObservedPathLocked(
    BusPath path, std::string_view host_id, std::string_view what, uint64_t bytes,
    double observed_us, Status* why) {
  if (bytes == 0 || !std::isfinite(observed_us) || !(observed_us > 0)) {
    *why = Status::InvalidArgument(std::string(what) + " on " + PathLabel(path, host_id) +
                                   ": bytes must be > 0 and observed_us finite and > 0");
    return nullptr;
  }
  const PathEntry* found = FindPathLocked(path, host_id);
  if (found == nullptr) {
    *why = Status::NotFound(std::string(what) + " on " + PathLabel(path, host_id) +
                            ": no calibration for the path");
    return nullptr;
  }
  const PathKey key(static_cast<int>(path), std::string(host_id));
  auto it = paths_.find(key);
  if (it == paths_.end()) {
    // Specialise the default for this host; its own error and fit start empty.
    PathEntry e;
    e.parameters = found->parameters;
    e.fit = NewPathFit(e.parameters, found->provenance.source);
    e.provenance = found->provenance;
    e.provenance.refits = 0;
    e.noise_floor_ratio = found->noise_floor_ratio;
    e.gain_samples = found->gain_samples;
    it = paths_.emplace(key, std::move(e)).first;
  }
  return &it->second;
}

StatusOr<double> CalibratedCostModel::ObserveShared(BusPath path, std::string_view host_id,
                                                    uint64_t bytes, uint64_t shared_bytes,
                                                    double observed_us) {
  MutexLock lock(&mu_);
  Status why;
  PathEntry* e =
      ObservedPathLocked(path, host_id, "shared transfer observation", bytes, observed_us, &why);
  if (e == nullptr) return why;
  return SharedOwnLocked(*e, bytes, shared_bytes, observed_us);
}

double CalibratedCostModel::SharedOwnLocked(PathEntry& e, uint64_t bytes, uint64_t shared_bytes,
                                            double observed_us) {
  const double b = static_cast<double>(bytes);
  const double all = b + static_cast<double>(shared_bytes);
  double& gain = e.parameters.concurrency_gain;
  if (shared_bytes > 0) {
    const double sample =
        std::clamp(FetchMicros(e.parameters, all) / observed_us, 1.0, kMaxConcurrencyGain);
    gain += (sample - gain) * std::max(1.0 / (e.gain_samples + 1), 1.0 / kGainWindow);
    e.gain_samples += 1;
  }
  return OwnShare(gain, b, all);
}

Status CalibratedCostModel::ObserveRecompute(std::string_view model_id, uint64_t tokens,
                                             uint64_t prefix_tokens, double observed_us) {
  if (tokens == 0 || !std::isfinite(observed_us) || !(observed_us > 0)) {
    return Status::InvalidArgument("recompute observation for \"" + std::string(model_id) +
                                   "\": tokens must be > 0 and observed_us finite and > 0");
  }
  MutexLock lock(&mu_);
  const auto it = models_.find(model_id);
  if (it == models_.end()) {
    return Status::NotFound("recompute observation: no calibration for model \"" +
                            std::string(model_id) + "\"");
  }
  RecomputeEntry& e = it->second;
  const double predicted = RecomputeMicros(e.parameters, static_cast<double>(tokens),
                                           static_cast<double>(prefix_tokens));
  e.error.Record(observed_us, predicted);
  double scale = 1;
  // The severe rule is the paths' (a capped link); a model's prefill does not turn 4x slower
  // between two calls, and an engine's stated constants far from its real prefill are the
  // online refit's to correct (gap 0: never severe).
  if (e.misses.Add(observed_us / predicted, 0.0, options_, &scale)) {
    e.parameters.c0_us *= scale;
    e.parameters.c1_us_per_token *= scale;
    e.parameters.c2_us_per_token2 *= scale;
    e.parameters.c3_us_per_prefix_token *= scale;
    e.fit = NewRecomputeFit(e.parameters, ParameterSource::kOnlineFit);
    e.provenance.source = ParameterSource::kOnlineFit;
    ++e.provenance.change_points;
    e.provenance.updated_unix_us = NowUnixMicros();
    return Status::OK();
  }
  e.fit.Observe(tokens, prefix_tokens, observed_us);
  if (options_.online_refit &&
      // Within 1%: decayed, the third observation counts 2.997.
      e.fit.effective_observations() >= 0.99 * options_.min_recompute_observations_for_refit) {
    auto fitted = e.fit.Fit();
    if (fitted.ok()) {
      // The prefill fit knows nothing of splits: s stays as ObserveSplit left it.
      fitted->split_serial_fraction = e.parameters.split_serial_fraction;
      e.parameters = *fitted;
      e.provenance.source = ParameterSource::kOnlineFit;
      ++e.provenance.refits;
      e.provenance.updated_unix_us = NowUnixMicros();
    }
  }
  return Status::OK();
}

Status CalibratedCostModel::ObserveSplit(std::string_view model_id, double front_us,
                                         double fetch_us, double rest_us,
                                         double observed_total_us) {
  for (double v : {front_us, fetch_us, rest_us}) {
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument("split observation for \"" + std::string(model_id) +
                                     "\": predicted sides must be finite and >= 0");
    }
  }
  if (!std::isfinite(observed_total_us) || !(observed_total_us > 0)) {
    return Status::InvalidArgument("split observation for \"" + std::string(model_id) +
                                   "\": observed_total_us must be finite and > 0");
  }
  const double shorter = std::min(front_us, fetch_us);
  if (!(shorter > 0)) {
    return Status::InvalidArgument("split observation for \"" + std::string(model_id) +
                                   "\": both sides must be > 0");
  }
  MutexLock lock(&mu_);
  const auto it = models_.find(model_id);
  if (it == models_.end()) {
    return Status::NotFound("split observation: no calibration for model \"" +
                            std::string(model_id) + "\"");
  }
  RecomputeEntry& e = it->second;
  const double predicted = SplitSidesMicros(e.parameters, front_us, fetch_us) + rest_us;
  e.split_error.Record(observed_total_us, predicted);
  // Least squares through the origin of y = s × x, each plan weighted by 1/observed² (relative
  // error, like the other fits), with the same forgetting.
  const double x = shorter;
  const double y = observed_total_us - rest_us - std::max(front_us, fetch_us);
  const double w = 1 / (observed_total_us * observed_total_us);
  const double decay = options_.online.decay;
  e.split.sxx = decay * e.split.sxx + w * x * x;
  e.split.sxy = decay * e.split.sxy + w * x * y;
  e.split.count = decay * e.split.count + 1;
  if (options_.online_refit && options_.learn_split_overlap &&
      e.split.count >= 0.99 * options_.min_recompute_observations_for_refit && e.split.sxx > 0) {
    e.parameters.split_serial_fraction = std::clamp(e.split.sxy / e.split.sxx, 0.0, 1.0);
    e.provenance.source = ParameterSource::kOnlineFit;
    ++e.provenance.refits;
    e.provenance.updated_unix_us = NowUnixMicros();
  }
  return Status::OK();
}

std::vector<CalibratedCostModel::PathReport> CalibratedCostModel::PathReports() const {
  std::vector<PathReport> out;
  MutexLock lock(&mu_);
  for (const auto& [key, e] : paths_) {
    out.push_back({static_cast<BusPath>(key.first), key.second, e.parameters, e.error.Get(),
                   e.fit.effective_observations(), e.provenance, e.noise_floor_ratio, e.healthy});
  }
  return out;
}

bool CalibratedCostModel::HasOwnPath(BusPath path, std::string_view host_id) const {
  MutexLock lock(&mu_);
  return paths_.find(PathKey(static_cast<int>(path), std::string(host_id))) != paths_.end();
}

StatusOr<CalibratedCostModel::PathReport> CalibratedCostModel::PathReportFor(
    BusPath path, std::string_view host_id) const {
  MutexLock lock(&mu_);
  auto it = paths_.find(PathKey(static_cast<int>(path), std::string(host_id)));
  if (it == paths_.end()) it = paths_.find(PathKey(static_cast<int>(path), std::string()));
  if (it == paths_.end()) {
    return Status::NotFound("no calibration for path " + PathLabel(path, host_id));
  }
  const PathEntry& e = it->second;
  return PathReport{path,
                    it->first.second,
                    e.parameters,
                    e.error.Get(),
                    e.fit.effective_observations(),
                    e.provenance,
                    e.noise_floor_ratio,
                    e.healthy};
}

StatusOr<CalibratedCostModel::RecomputeReport> CalibratedCostModel::RecomputeReportFor(
    std::string_view model_id) const {
  MutexLock lock(&mu_);
  const auto it = models_.find(model_id);
  if (it == models_.end()) {
    return Status::NotFound("no recompute calibration for model \"" + std::string(model_id) + "\"");
  }
  const RecomputeEntry& e = it->second;
  return RecomputeReport{
      it->first,    e.parameters,        e.error.Get(),       e.fit.effective_observations(),
      e.provenance, e.noise_floor_ratio, e.split_error.Get(), e.split.count};
}

size_t CalibratedCostModel::model_count() const {
  MutexLock lock(&mu_);
  return models_.size();
}

std::vector<CalibratedCostModel::RecomputeReport> CalibratedCostModel::RecomputeReports() const {
  std::vector<RecomputeReport> out;
  MutexLock lock(&mu_);
  for (const auto& [id, e] : models_) {
    out.push_back({id, e.parameters, e.error.Get(), e.fit.effective_observations(), e.provenance,
                   e.noise_floor_ratio, e.split_error.Get(), e.split.count});
  }
  return out;
}

}  // namespace kvfabric
