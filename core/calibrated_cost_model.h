// CalibratedCostModel: the bus cost model a service runs on. It holds the parameters of every
// (path, host) and every model's recompute parameters, scores each observed transfer or prefill
// against the prediction in force (PredictionErrorHistogram per path), and refits online from
// the observations (OnlinePathFit / OnlineRecomputeFit, core/cost_fit.h).
//
// Lookup: Path(path, host_id) returns the entry for exactly (path, host_id) if there is one, or
// else the path's default entry (host_id ""), so a calibration file can give one NVMe figure for
// every daemon and the online refit can specialise it per daemon.
//
// Online refit: an observation for (path, host) with no exact entry creates one, seeded from the
// default; once its online fit rests on at least Options::min_observations_for_refit effective
// observations and can separate alpha and beta, every further observation replaces that entry's
// parameters with the fit. The error is always scored against the parameters in force *before*
// the observation is added, i.e. out of sample.
//
// Memory: one fixed-size entry per (path, host) and per model id observed or loaded; nothing
// grows with the number of observations.
//
// Thread safety: every method may be called from any thread; one mutex guards the state
// (calls are per plan or per observation batch, never per block).
#ifndef KVFABRIC_CORE_CALIBRATED_COST_MODEL_H_
#define KVFABRIC_CORE_CALIBRATED_COST_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/bus_calibration.h"
#include "core/bus_cost_model.h"
#include "core/cost_fit.h"
#include "core/mutex.h"
#include "core/prediction_error.h"
#include "core/statusor.h"

namespace kvfabric {

class CalibratedCostModel {
 public:
  struct Options {
    // Refit parameters from observations. Default true. False keeps the calibrated parameters
    // fixed and only scores them (for judging a calibration out of sample).
    bool online_refit = true;
    // Forgetting and weighting of the online fits. Default: decay 0.999, relative weighting.
    OnlineFitOptions online;
    // Effective observations an online fit needs before it replaces the parameters. Default 16:
    // fewer lets one noisy transfer swing the model.
    double min_observations_for_refit = 16;
  };

  // What the metrics layer exports per path.
  struct PathReport {
    BusPath path = BusPath::kUnspecified;
    std::string host_id;
    PathParameters parameters;
    PredictionErrorHistogram::Snapshot error;
    double effective_observations = 0;
  };
  struct RecomputeReport {
    std::string model_id;
    RecomputeParameters parameters;
    PredictionErrorHistogram::Snapshot error;
    double effective_observations = 0;
  };

  CalibratedCostModel() : CalibratedCostModel(Options{}) {}
  explicit CalibratedCostModel(const Options& options) : options_(options) {}
  CalibratedCostModel(const CalibratedCostModel&) = delete;
  CalibratedCostModel& operator=(const CalibratedCostModel&) = delete;

  // Sets (replaces) parameters. REQUIRES: beta > 0, every value finite and >= 0 (InvalidArgument
  // otherwise).
  Status SetPath(BusPath path, std::string_view host_id, const PathParameters& parameters);
  Status SetRecompute(std::string_view model_id, const RecomputeParameters& parameters);
  // Replaces every entry with the file's (validated) contents; errors and online fits restart.
  Status Load(const BusCalibration& calibration);
  // The parameters in force, as a calibration file (error figures from the histograms).
  BusCalibration ToCalibration() const;

  // NotFound naming the path (and host) if neither an exact nor a default entry exists.
  StatusOr<PathParameters> Path(BusPath path, std::string_view host_id) const;
  StatusOr<RecomputeParameters> Recompute(std::string_view model_id) const;

  // Scores and (per Options) refits. NotFound as Path/Recompute; InvalidArgument for bytes or
  // tokens == 0 or a time that is not finite and > 0.
  Status ObserveTransfer(BusPath path, std::string_view host_id, uint64_t bytes,
                         double observed_us);
  Status ObserveRecompute(std::string_view model_id, uint64_t tokens, uint64_t prefix_tokens,
                          double observed_us);

  std::vector<PathReport> PathReports() const;
  std::vector<RecomputeReport> RecomputeReports() const;

 private:
  struct PathEntry {
    PathParameters parameters;
    PredictionErrorHistogram error;
    OnlinePathFit fit;
  };
  struct RecomputeEntry {
    RecomputeParameters parameters;
    PredictionErrorHistogram error;
    OnlineRecomputeFit fit;
  };
  using PathKey = std::pair<int, std::string>;

  const PathEntry* FindPathLocked(BusPath path, std::string_view host_id) const KVF_REQUIRES(mu_);

  const Options options_;
  mutable Mutex mu_;
  std::map<PathKey, PathEntry, std::less<>> paths_ KVF_GUARDED_BY(mu_);
  std::map<std::string, RecomputeEntry, std::less<>> models_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_CALIBRATED_COST_MODEL_H_
