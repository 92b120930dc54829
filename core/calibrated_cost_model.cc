#include "core/calibrated_cost_model.h"

#include <cmath>

#include "core/mutex.h"

namespace kvfabric {
namespace {

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

std::string PathLabel(BusPath path, std::string_view host_id) {
  std::string s(BusPathName(path));
  if (!host_id.empty()) s += " host \"" + std::string(host_id) + "\"";
  return s;
}

}  // namespace

Status CalibratedCostModel::SetPath(BusPath path, std::string_view host_id,
                                    const PathParameters& p) {
  if (!IsValidBusPath(static_cast<int>(path))) return Status::InvalidArgument("unknown path");
  if (!FiniteNonNegative(p.alpha_us) || !std::isfinite(p.beta_bytes_per_s) ||
      !(p.beta_bytes_per_s > 0)) {
    return Status::InvalidArgument(PathLabel(path, host_id) +
                                   ": alpha_us must be finite and >= 0 and beta_bytes_per_s "
                                   "finite and > 0");
  }
  MutexLock lock(&mu_);
  PathEntry& e = paths_[PathKey(static_cast<int>(path), std::string(host_id))];
  e.parameters = p;
  e.fit = OnlinePathFit(options_.online);
  return Status::OK();
}

Status CalibratedCostModel::SetRecompute(std::string_view model_id, const RecomputeParameters& r) {
  if (model_id.empty()) return Status::InvalidArgument("model_id: must be non-empty");
  if (!FiniteNonNegative(r.c0_us) || !FiniteNonNegative(r.c1_us_per_token) ||
      !FiniteNonNegative(r.c2_us_per_token2)) {
    return Status::InvalidArgument("recompute parameters of \"" + std::string(model_id) +
                                   "\": c0, c1, c2 must be finite and >= 0");
  }
  MutexLock lock(&mu_);
  RecomputeEntry& e = models_[std::string(model_id)];
  e.parameters = r;
  e.fit = OnlineRecomputeFit(options_.online);
  return Status::OK();
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
    e.fit = OnlinePathFit(options_.online);
  }
  for (const RecomputeCalibration& r : calibration.recompute) {
    RecomputeEntry& e = models_[r.model_id];
    e.parameters = r.parameters;
    e.fit = OnlineRecomputeFit(options_.online);
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
  if (bytes == 0 || !std::isfinite(observed_us) || !(observed_us > 0)) {
    return Status::InvalidArgument("transfer observation on " + PathLabel(path, host_id) +
                                   ": bytes must be > 0 and observed_us finite and > 0");
  }
  MutexLock lock(&mu_);
  const PathEntry* found = FindPathLocked(path, host_id);
  if (found == nullptr) {
    return Status::NotFound("transfer observation on " + PathLabel(path, host_id) +
                            ": no calibration for the path");
  }
  const PathKey key(static_cast<int>(path), std::string(host_id));
  auto it = paths_.find(key);
  if (it == paths_.end()) {
    // Specialise the default for this host; its own error and fit start empty.
    PathEntry e;
    e.parameters = found->parameters;
    e.fit = OnlinePathFit(options_.online);
    it = paths_.emplace(key, std::move(e)).first;
  }
  PathEntry& e = it->second;
  e.error.Record(observed_us, FetchMicros(e.parameters, static_cast<double>(bytes)));
  e.fit.Observe(bytes, observed_us);
  if (options_.online_refit &&
      e.fit.effective_observations() >= options_.min_observations_for_refit) {
    auto fitted = e.fit.Fit();
    if (fitted.ok()) e.parameters = *fitted;  // else: keep the parameters in force
  }
  return Status::OK();
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
  e.error.Record(observed_us, RecomputeMicros(e.parameters, static_cast<double>(tokens),
                                              static_cast<double>(prefix_tokens)));
  e.fit.Observe(tokens, prefix_tokens, observed_us);
  if (options_.online_refit &&
      e.fit.effective_observations() >= options_.min_observations_for_refit) {
    auto fitted = e.fit.Fit();
    if (fitted.ok()) e.parameters = *fitted;
  }
  return Status::OK();
}

std::vector<CalibratedCostModel::PathReport> CalibratedCostModel::PathReports() const {
  std::vector<PathReport> out;
  MutexLock lock(&mu_);
  for (const auto& [key, e] : paths_) {
    out.push_back({static_cast<BusPath>(key.first), key.second, e.parameters, e.error.Get(),
                   e.fit.effective_observations()});
  }
  return out;
}

std::vector<CalibratedCostModel::RecomputeReport> CalibratedCostModel::RecomputeReports() const {
  std::vector<RecomputeReport> out;
  MutexLock lock(&mu_);
  for (const auto& [id, e] : models_) {
    out.push_back({id, e.parameters, e.error.Get(), e.fit.effective_observations()});
  }
  return out;
}

}  // namespace kvfabric
