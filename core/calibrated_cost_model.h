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
// observations, every further observation replaces that entry's parameters with the fit: line
// and size curve (bus_cost_model.h, SIZE CURVE) while the observed sizes separate alpha and beta,
// else the line in force with its curve refitted against it (a source that always moves about
// the same bytes per load still learns what that size takes). The error is always scored against
// the parameters in force *before* the observation is added, i.e. out of sample.
//
// Provenance: every entry remembers where its parameters came from (ParameterSource), how many
// times the online refit replaced them and when they last changed, for `explain` and metrics.
// Recompute entries refit sooner than paths (Options::min_recompute_observations_for_refit,
// default 3: an engine makes few prefill calls, and three distinct (n, p) shapes determine c0,
// c1, c2); a fit the shapes cannot separate leaves the parameters in force.
//
// Change points: the online fit forgets slowly (a window of 1000 observations), which is right
// for noise and wrong for a path that suddenly got slower (a congested link, a daemon throttled,
// a drive failing over). When Options::change_point_run consecutive observations of an entry
// all miss by more than change_point_ratio in the same direction (or its last
// change_point_severe_run miss by more than change_point_severe_ratio: far beyond noise), the
// entry's parameters are scaled by the median observed/predicted ratio of that run (of the severe
// tail, for the shorter rule) (alpha times it, beta divided by
// it; c0, c1, c2 times it), its fit restarts from them (as a prior) and
// ParameterProvenance::change_points counts it. Defaults: 8 observations, 50%.
//
// Retrials: a path rescaled slower gets less traffic (placement plans around it), and a path
// that gets none never shows that it recovered. So a slowdown keeps the figures from before it
// (the first of a run of slowdowns; HealthyBefore, PathReport::healthy) if transfers confirmed
// them (Options::healthy_after transfers at most 1 + change_point_ratio times what they
// predicted since they were set: a
// change point on figures nothing confirmed is a correction, such as a calibration's idle-link
// figure under load, not a slowdown to undo), and placement
// occasionally plans a load on them (placement_node.h, RETRIALS). Its transfers come back
// through ObserveRetrial: one near what the remembered figures predict restores them (scaled by
// its miss beyond change_point_ratio, and then still remembered; the fit restarts from them;
// ParameterProvenance::restores counts it); a slower one is an ordinary observation. A
// change point toward faster that brings the figures back within change_point_ratio of the
// remembered ones, or figures set, loaded or reloaded, forget them.
//
// Split overlap: a split plan prefills a front of the chain while it fetches the rest of the
// cached prefix, and is predicted as max(A, B) + s × min(A, B) + rest (RecomputeParameters::
// split_serial_fraction s). Each finished split plan (ObserveSplit: its predicted A, B, rest
// and its measured total T) adds x = min(A, B), y = T - rest - max(A, B) to a least-squares fit
// through the origin, weighted by 1/T² and forgotten like the other fits; once it rests on
// min_recompute_observations_for_refit plans, s = clamp(Σxy / Σx², 0, 1). y also carries the
// sides' own errors, so s absorbs whatever makes split plans slower than their sides predict.
// The prefill refit and change points leave s alone.
//
// An engine may state its prefill constants (StateRecompute, from ClientOptions::prefill at
// Open): they replace placeholder defaults or an earlier statement, never a calibration file's
// figures or an online fit.
//
// Memory: one fixed-size entry per (path, host) and per model id observed or loaded; nothing
// grows with the number of observations.
//
// Thread safety: every method may be called from any thread; one mutex guards the state
// (calls are per plan or per observation batch, never per block).
#ifndef KVFABRIC_CORE_CALIBRATED_COST_MODEL_H_
#define KVFABRIC_CORE_CALIBRATED_COST_MODEL_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
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

// Where an entry's parameters came from, weakest first.
enum class ParameterSource : int {
  kDefault = 0,      // placeholders (PlacementOptions' defaults)
  kCalibration = 1,  // a calibration file (`kvfabric calibrate`) or SetPath/SetRecompute
  kStated = 2,       // stated by an engine at Open (recompute only)
  kOnlineFit = 3,    // refitted from observed transfers or prefills
};
// "default", "calibration", "stated", "online fit".
std::string_view ParameterSourceName(ParameterSource source);

// An entry's provenance.
struct ParameterProvenance {
  ParameterSource source = ParameterSource::kDefault;
  // Times the online refit replaced the parameters.
  uint64_t refits = 0;
  // Times a change point rescaled them (see the file comment).
  uint64_t change_points = 0;
  // When the parameters last changed (wall clock, microseconds since the epoch).
  int64_t updated_unix_us = 0;
  // Times a retrial restored the figures from before a slowdown (file comment, Retrials).
  uint64_t restores = 0;
};

// What ObserveRetrial made of a transfer.
enum class RetrialOutcome : int {
  kNotDegraded = 0,  // the path was not slowed (any more): an ordinary observation
  kRestored = 1,     // within change_point_ratio of the figures from before the slowdown
  kStillSlow = 2,    // slower than that: an ordinary observation
};
struct RetrialJudgement {
  RetrialOutcome outcome = RetrialOutcome::kNotDegraded;
  // The transfer's time at its share of the path, and what the figures from before the
  // slowdown and the slowed ones predict for its bytes (µs; 0 when not slowed).
  double observed_us = 0;
  double healthy_us = 0;
  double slowed_us = 0;
};

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
    // The same for a model's recompute fit. Default 3 (see the file comment).
    double min_recompute_observations_for_refit = 3;
    // Weight, in observations, of the prior an online fit starts from when its entry's
    // parameters come from a calibration or an engine's statement (OnlinePathFit::SeedPrior).
    // Default 0.1 (a tenth of one observation): it settles the directions the first few
    // observations cannot separate without arguing with them. Measured (bus_cost_model_test):
    // a statement 5x off in c2, then exact prefills of six shapes: worst error 7% after six,
    // 2% after 36; with a weight of 2 it was 39% and 15%. Placeholder defaults seed no prior;
    // 0 turns priors off.
    double prior_weight = 0.1;
    // Refit split_serial_fraction from finished split plans (ObserveSplit still scores them).
    // Default true; false keeps the calibrated, stated or default s (an A/B of the term).
    bool learn_split_overlap = true;
    // Change points (file comment). change_point_run 0 turns detection off; at most 32.
    uint32_t change_point_run = 8;
    double change_point_ratio = 0.5;
    // Transfers only: a miss far beyond any noise floor measured here (observed/predicted above 1 +
    // this or below 1 / (1 + this); default 3: 4x) needs a shorter run: change_point_severe_run of
    // them in a row (default 2; 0 turns the rule off; at most change_point_run). A link capped to a
    // twentieth of its rate otherwise went on being planned as before for 8 loads, each waiting
    // out the cap (cluster_planner_bench phase 2); the per-request spread of identical plans on
    // this VM is 0.45x..1.26x (p10..p90), so two 4x misses in a row are not noise.
    uint32_t change_point_severe_run = 2;
    double change_point_severe_ratio = 3.0;
    // A miss counts toward the severe rule only where observed and predicted differ by at least
    // this many µs (default 20000): on a small transfer a thread wake-up on a busy host (~200 µs
    // here, spread 2-4x) or a new session's first page faults is a 4x miss, and rescaling alpha
    // and beta by it made every larger fetch look slow (the vLLM connector test loaded 480 of
    // its 736 cached tokens with 5 ms); a capped link's stream misses by hundreds of ms.
    double change_point_severe_min_us = 20000;
    // Transfers no slower than (1 + change_point_ratio) x an entry's figures (since they were last
    // set or rescaled) a slowdown needs to keep them as the figures to retry (file comment,
    // Retrials).
    // Default 2 (one could be luck). Measured (cluster_planner_bench): the calibration's idle
    // probes put the remote->local path at 2.9 GB/s; under two loads at once and a prefill
    // beside it, the first transfers ran at 0.4-0.7 GB/s and rescaled it at once, and retrials of
    // 2.9 GB/s then never recovered, each one a plan priced 4-7x too fast. Split plans' fetch
    // sides confirm too (ObserveBesidePrefill): before they did, a path whose loads were mostly
    // splits was capped before its figures were confirmed, and never retried.
    uint32_t healthy_after = 2;
  };

  // What the metrics layer exports per path.
  struct PathReport {
    BusPath path = BusPath::kUnspecified;
    std::string host_id;
    PathParameters parameters;
    PredictionErrorHistogram::Snapshot error;
    double effective_observations = 0;
    ParameterProvenance provenance;
    // The calibration's noise floor for this entry (PathCalibration::noise_floor_ratio); 0 if
    // it came from no calibration file.
    double noise_floor_ratio = 0;
    // The figures from before a slowdown, while a retrial has not restored them (file comment).
    std::optional<PathParameters> healthy;
  };
  struct RecomputeReport {
    std::string model_id;
    RecomputeParameters parameters;
    PredictionErrorHistogram::Snapshot error;
    double effective_observations = 0;
    ParameterProvenance provenance;
    double noise_floor_ratio = 0;  // RecomputeCalibration::noise_floor_ratio
    // Finished split plans scored against their prediction (ObserveSplit), and how many the
    // fit of split_serial_fraction rests on (decayed).
    PredictionErrorHistogram::Snapshot split_error;
    double split_effective_observations = 0;
  };

  CalibratedCostModel() : CalibratedCostModel(Options{}) {}
  explicit CalibratedCostModel(const Options& options) : options_(options) {}
  CalibratedCostModel(const CalibratedCostModel&) = delete;
  CalibratedCostModel& operator=(const CalibratedCostModel&) = delete;

  // Sets (replaces) parameters. REQUIRES: beta > 0, every value finite and >= 0 (InvalidArgument
  // otherwise).
  Status SetPath(BusPath path, std::string_view host_id, const PathParameters& parameters,
                 ParameterSource source = ParameterSource::kCalibration);
  Status SetRecompute(std::string_view model_id, const RecomputeParameters& parameters,
                      ParameterSource source = ParameterSource::kCalibration);
  // An engine's statement of its prefill constants: applied (true) when the model has no entry
  // or one from defaults or an earlier statement; otherwise left alone (false). InvalidArgument
  // as SetRecompute.
  StatusOr<bool> StateRecompute(std::string_view model_id, const RecomputeParameters& parameters);
  // Replaces every entry with the file's (validated) contents; errors and online fits restart.
  Status Load(const BusCalibration& calibration);
  // A calibration file read again (SIGHUP, the admin RPC): the file's entries replace the ones
  // they name (their errors and online fits restart, source kCalibration), except that a path
  // entry without a concurrency_gain keeps the gain learned so far (the file did not measure
  // one); entries the file does not name keep their parameters, fits and errors. Validated
  // first: an invalid file changes nothing.
  struct ReloadCounts {
    size_t paths = 0;
    size_t models = 0;
    size_t kept = 0;  // entries the file did not name
  };
  StatusOr<ReloadCounts> Reload(const BusCalibration& calibration);
  // Whether (path, host_id) has an entry of its own (not only the path's default).
  bool HasOwnPath(BusPath path, std::string_view host_id) const;
  // The report of the entry Path()/Recompute() would use (its host_id says whether it is the
  // host's own or the path's default); NotFound as they.
  StatusOr<PathReport> PathReportFor(BusPath path, std::string_view host_id) const;
  StatusOr<RecomputeReport> RecomputeReportFor(std::string_view model_id) const;
  // Provenance of the entry Path()/Recompute() would use; NotFound as they.
  StatusOr<ParameterProvenance> PathProvenance(BusPath path, std::string_view host_id) const;
  StatusOr<ParameterProvenance> RecomputeProvenance(std::string_view model_id) const;
  // The parameters in force, as a calibration file (error figures from the histograms).
  BusCalibration ToCalibration() const;

  // NotFound naming the path (and host) if neither an exact nor a default entry exists.
  StatusOr<PathParameters> Path(BusPath path, std::string_view host_id) const;
  StatusOr<RecomputeParameters> Recompute(std::string_view model_id) const;

  // Scores and (per Options) refits. NotFound as Path/Recompute; InvalidArgument for bytes or
  // tokens == 0 or a time that is not finite and > 0.
  Status ObserveTransfer(BusPath path, std::string_view host_id, uint64_t bytes,
                         double observed_us);
  // A transfer of `bytes` that took `observed_us` while other loads moved `shared_bytes` over
  // the same path. Learns the path's concurrency_gain from it: the line predicts
  // t1 = alpha + (bytes + shared) / beta for all of them at beta (gain 1), and t1 / observed,
  // within [1, kMaxConcurrencyGain], is a sample of the gain (the mean of the first 16
  // samples, then each moves it 1/16 of the way; a gain set or loaded from a calibration file
  // counts as 16 samples). Returns the fraction of observed_us that was
  // this transfer's own, to pass to ObserveTransfer: min(1, gain × bytes / (bytes + shared)),
  // at least 1/kMaxSharedShare (with n equal transfers at once, each ends after n / gain of its
  // time alone). Errors as ObserveTransfer.
  StatusOr<double> ObserveShared(BusPath path, std::string_view host_id, uint64_t bytes,
                                 uint64_t shared_bytes, double observed_us);
  // A transfer of a load planned on the figures from before (path, host_id)'s slowdown (file
  // comment, Retrials), `shared_bytes` as ObserveShared. kRestored: it took at most (1 +
  // change_point_ratio) x what those figures predict, or ran nearer, by ratio, to them than to
  // the slowed ones (below their geometric mean) within (1 + change_point_severe_ratio) x them;
  // they are back in force, scaled by its miss where that is beyond change_point_ratio (and
  // then still remembered: HealthyBefore).
  // Otherwise it is observed as ObserveShared and ObserveTransfer would, except one that ran
  // `beside_prefill` (a split's fetch side: slowed by the prefill, it judges but is neither
  // scored nor fitted). Errors as ObserveTransfer.
  StatusOr<RetrialJudgement> ObserveRetrial(BusPath path, std::string_view host_id, uint64_t bytes,
                                            uint64_t shared_bytes, double observed_us,
                                            bool beside_prefill = false);
  // A split's fetch side (slowed by the prefill beside it): never scored or fitted, but no slower
  // than (1 + change_point_ratio) x the figures in force it confirms them
  // (Options::healthy_after).
  // Errors as ObserveTransfer.
  Status ObserveBesidePrefill(BusPath path, std::string_view host_id, uint64_t bytes,
                              double observed_us);
  // The figures (path, host_id)'s own entry had before a slowdown that no retrial has undone
  // yet; nullopt if it was not slowed (or has no entry of its own).
  std::optional<PathParameters> HealthyBefore(BusPath path, std::string_view host_id) const;
  Status ObserveRecompute(std::string_view model_id, uint64_t tokens, uint64_t prefix_tokens,
                          double observed_us);
  // A finished split plan of `model_id`: its predicted sides (PlanAlternative front_us,
  // fetch_us, rest_us) and its measured total. Scores the split prediction and refits
  // split_serial_fraction (file comment). InvalidArgument for values that are not finite, a
  // side <= 0 or a total <= 0; NotFound as Recompute.
  Status ObserveSplit(std::string_view model_id, double front_us, double fetch_us, double rest_us,
                      double observed_total_us);

  // Models with an entry.
  size_t model_count() const;
  std::vector<PathReport> PathReports() const;
  std::vector<RecomputeReport> RecomputeReports() const;

 private:
  // The current run of same-direction misses beyond change_point_ratio.
  struct MissRun {
    std::array<double, 32> ratios{};  // observed / predicted
    uint32_t length = 0;
    uint32_t severe_tail = 0;  // the run's last misses beyond change_point_severe_ratio
    int direction = 0;         // +1 slower than predicted, -1 faster
    // Adds one observation's ratio, `gap_us` = |observed - predicted|; true when the run
    // reached `run` (and resets it).
    bool Add(double ratio, double gap_us, const Options& options, double* median);
  };
  struct PathEntry {
    PathParameters parameters;
    PredictionErrorHistogram error;
    OnlinePathFit fit;
    ParameterProvenance provenance;
    MissRun misses;
    double noise_floor_ratio = 0;
    double gain_samples = 0;  // ObserveShared calls that moved parameters.concurrency_gain
    std::optional<PathParameters> healthy;  // before a slowdown (file comment, Retrials)
    uint32_t confirmed = 0;  // transfers within change_point_ratio since the figures were set
  };
  struct RecomputeEntry {
    RecomputeParameters parameters;
    PredictionErrorHistogram error;
    OnlineRecomputeFit fit;
    ParameterProvenance provenance;
    MissRun misses;
    double noise_floor_ratio = 0;
    // split_serial_fraction's fit: decayed weighted sums (ObserveSplit).
    struct {
      double sxx = 0;
      double sxy = 0;
      double count = 0;
    } split;
    PredictionErrorHistogram split_error;
  };
  using PathKey = std::pair<int, std::string>;

  const PathEntry* FindPathLocked(BusPath path, std::string_view host_id) const KVF_REQUIRES(mu_);
  // For an observation of `bytes` in `observed_us` (`what`, for errors): the entry of exactly
  // (path, host_id), specialised from the path's default when there is none yet; null with
  // *why set for bytes == 0, a time that is not finite and > 0, or no entry to start from.
  PathEntry* ObservedPathLocked(BusPath path, std::string_view host_id, std::string_view what,
                                uint64_t bytes, double observed_us, Status* why) KVF_REQUIRES(mu_);
  // Counts a transfer no slower than (1 + change_point_ratio) x the figures (observed /
  // predicted = ratio) toward confirming them (PathEntry::confirmed).
  void ConfirmLocked(PathEntry& e, double ratio) const KVF_REQUIRES(mu_);
  // Scores, and refits or detects a change point (ObserveTransfer, on its entry).
  void ObserveTransferLocked(PathEntry& e, uint64_t bytes, double observed_us) KVF_REQUIRES(mu_);
  // Learns the gain from a shared transfer; returns its own fraction (ObserveShared).
  double SharedOwnLocked(PathEntry& e, uint64_t bytes, uint64_t shared_bytes, double observed_us)
      KVF_REQUIRES(mu_);
  // A fresh online fit for parameters from `source` (with the prior, see Options::prior_weight).
  OnlinePathFit NewPathFit(const PathParameters& p, ParameterSource source) const;
  OnlineRecomputeFit NewRecomputeFit(const RecomputeParameters& r, ParameterSource source) const;

  const Options options_;
  mutable Mutex mu_;
  std::map<PathKey, PathEntry, std::less<>> paths_ KVF_GUARDED_BY(mu_);
  std::map<std::string, RecomputeEntry, std::less<>> models_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_CALIBRATED_COST_MODEL_H_
