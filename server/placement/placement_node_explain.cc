// PlacementNode: what a plan saw and why (DescribePlanInputs, Explain).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "core/units.h"
#include "server/placement/placement_node.h"

namespace kvfabric::placement {
namespace {

constexpr char kPlanFormula[] =
    "t_fetch(path, bytes) = alpha_us + bytes / beta_bytes_per_s * 1e6\n"
    "t_recompute(n, p) = c0 + c1 * n + c2 * n * (p + n / 2)\n"
    "recompute-all = t_recompute(T + S, 0)\n"
    "fetch-all = F(0, m) + t_recompute(T - P_m + S, P_m)\n"
    "split(k) = max(A, B) + s * min(A, B) + t_recompute(T - P_m + S, P_m), A = t_recompute(P_k, "
    "0), B = F(k, m)\n"
    "fetch-prefix(j) = F(0, j) + t_recompute(T - P_j + S, P_j)\n"
    "F(a, b) = alpha_h2d + wait_h2d + max(max over sources s of T(s), alpha_ingest + wait_ingest "
    "+ B / beta_ingest, B / beta_h2d), B = bytes fetched, T(s) = queue wait(s) + sum over the "
    "runs of s of (daemon alphas + bytes / bottleneck beta)";

std::string SplitFractionText(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", s);
  return b;
}

}  // namespace

void PlacementNode::DescribePlanInputs(const PlanRequest& request, const PlannerInput& in,
                                       PlanRecord* record) {
  // Provenance is stamped with the system clock (core/calibrated_cost_model.cc), not env_'s.
  const double now_us = static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count());
  std::string& t = record->inputs;
  t = "inputs (as the plan was made):\n";
  auto error = [](const PredictionErrorHistogram::Snapshot& e) {
    if (e.count == 0) return std::string("not scored yet");
    char b[128];
    std::snprintf(b, sizeof(b), "out-of-sample error median %+.1f%%, worst %.1f%% over %llu",
                  100 * e.median, 100 * e.worst_abs, static_cast<unsigned long long>(e.count));
    return std::string(b);
  };
  auto provenance = [&](const ParameterProvenance& p) {
    char b[160];
    std::snprintf(
        b, sizeof(b), "%s, %llu refits, %llu change points, set %.1f s before",
        std::string(ParameterSourceName(p.source)).c_str(),
        static_cast<unsigned long long>(p.refits), static_cast<unsigned long long>(p.change_points),
        p.updated_unix_us > 0 ? (now_us - static_cast<double>(p.updated_unix_us)) / 1e6 : 0.0);
    return std::string(b);
  };
  auto path = [&](BusPath bus, const std::string& host, const PathParameters& used,
                  const std::string& resource, std::uint64_t at_bytes, double size_factor) {
    const std::string label = std::string(BusPathArrowName(bus)) + (host.empty() ? "" : " " + host);
    const std::uint64_t queued = path_load_.QueuedBytes(bus, resource, in.now_us);
    t += "  " + label + ": alpha " + FormatMicros(used.alpha_us) + ", beta " +
         FormatRate(used.beta_bytes_per_s) + ", queued " + FormatBytes(queued);
    if (used.concurrency_gain > 1) {
      char b[96];
      std::snprintf(b, sizeof(b), ", concurrency gain %.2f (several at once up to %s)",
                    used.concurrency_gain,
                    FormatRate(used.concurrency_gain * used.beta_bytes_per_s).c_str());
      t += b;
    }
    if (size_factor != 1) {
      // `used` is the line × k at the expected bytes (ResolveSizeCurves).
      char b[96];
      std::snprintf(b, sizeof(b), " (size curve × %.3f at %s)", size_factor,
                    FormatBytes(at_bytes).c_str());
      t += b;
    }
    const std::string key = std::string(BusPathName(bus)) + (host.empty() ? "" : "[" + host + "]");
    record->input_terms.push_back({"alpha:" + key, used.alpha_us, "us"});
    record->input_terms.push_back({"beta:" + key, used.beta_bytes_per_s, "bytes/s"});
    record->input_terms.push_back({"size_factor:" + key, size_factor, "ratio"});
    record->input_terms.push_back({"size_at:" + key, static_cast<double>(at_bytes), "bytes"});
    record->input_terms.push_back({"queued:" + key, static_cast<double>(queued), "bytes"});
    record->input_terms.push_back({"concurrency_gain:" + key, used.concurrency_gain, "ratio"});
    StatusOr<CalibratedCostModel::PathReport> r = cost_model_.PathReportFor(bus, host);
    if (r.ok()) {
      t += " (" + provenance(r->provenance) + (r->host_id.empty() ? ", the path's default" : "") +
           "; " + error(r->error) + ")";
      record->input_terms.push_back({"error_worst:" + key, r->error.worst_abs, "ratio"});
      record->input_terms.push_back(
          {"fit_age:" + key,
           r->provenance.updated_unix_us > 0
               ? (now_us - static_cast<double>(r->provenance.updated_unix_us)) / 1e6
               : 0.0,
           "s"});
    }
    t += "\n";
  };
  for (const PlannerHost& h : in.hosts) {
    path(h.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost, h.host_id, h.transfer,
         h.host_id, h.expected_bytes, h.transfer_size_factor);
    path(BusPath::kNvmeToHost, h.host_id, h.nvme, h.host_id, h.expected_nvme_bytes,
         h.nvme_size_factor);
  }
  path(BusPath::kHostToDevice, "", in.host_to_device, in.client_id, in.expected_bytes,
       in.host_to_device_size_factor);
  path(BusPath::kClientIngest, "", in.client_ingest, in.client_id, in.expected_bytes,
       in.client_ingest_size_factor);
  t += "  recompute " + (request.model_id.empty() ? std::string("(no model)") : request.model_id) +
       ": c0 " + FormatMicros(in.recompute.c0_us) + ", c1 " +
       FormatMicros(in.recompute.c1_us_per_token) + "/token, c2 " +
       FormatMicros(in.recompute.c2_us_per_token2) + "/token^2, c3 " +
       FormatMicros(in.recompute.c3_us_per_prefix_token) + "/prefix token, split overlap s " +
       SplitFractionText(in.recompute.split_serial_fraction);
  if (request.recompute) {
    t += " (given with the request)";
  } else if (auto r = cost_model_.RecomputeReportFor(request.model_id); r.ok()) {
    t += " (" + provenance(r->provenance) + "; " + error(r->error) + ")";
    record->input_terms.push_back({"recompute_error_worst", r->error.worst_abs, "ratio"});
    record->input_terms.push_back(
        {"recompute_refits", static_cast<double>(r->provenance.refits), "refits"});
  } else if (request.engine_prefill) {
    t += " (stated by the engine; the model is not learned: max_models reached)";
  } else {
    t += " (placement's default)";
  }
  t += "\n";
}

StatusOr<PlanExplanation> PlacementNode::Explain(std::uint64_t plan_id) const {
  MutexLock lock(&mu_);
  const PlanRecord* plan = FindPlanLocked(plan_id);
  if (plan == nullptr) {
    return Status::NotFound("plan " + std::to_string(plan_id) +
                            " is unknown or aged out of the history (the last " +
                            std::to_string(plans_.size()) + " plans are kept; plan_history " +
                            std::to_string(options_.plan_history) + ")");
  }
  PlanExplanation out;
  out.plan_id = plan->plan_id;
  out.ns = plan->ns;
  out.kind = plan->kind;
  out.formula = kPlanFormula;
  out.text = plan->inputs.empty() ? plan->explanation : plan->inputs + plan->explanation;
  out.decided_unix_us = plan->decided_unix_us;
  out.predicted_total_us = plan->predicted_total_us;
  out.observed_total_us = plan->observed_total_us;
  out.later_plans_delay_us = plan->later_plans_delay_us;
  auto& t = out.terms;
  t.push_back({"chain_blocks", static_cast<double>(plan->chain_blocks), "blocks"});
  t.push_back({"m", static_cast<double>(plan->cached_prefix_blocks), "blocks"});
  t.push_back({"S", static_cast<double>(plan->suffix_tokens), "tokens"});
  t.push_back({"alpha_h2d", plan->host_to_device.alpha_us, "us"});
  t.push_back({"beta_h2d", plan->host_to_device.beta_bytes_per_s, "bytes/s"});
  t.push_back({"alpha_ingest", plan->client_ingest.alpha_us, "us"});
  t.push_back({"beta_ingest", plan->client_ingest.beta_bytes_per_s, "bytes/s"});
  t.push_back({"c0", plan->recompute.c0_us, "us"});
  t.push_back({"c1", plan->recompute.c1_us_per_token, "us/token"});
  t.push_back({"c2", plan->recompute.c2_us_per_token2, "us/token^2"});
  t.push_back({"c3", plan->recompute.c3_us_per_prefix_token, "us/prefix token"});
  t.push_back({"s", plan->recompute.split_serial_fraction, "ratio"});
  t.insert(t.end(), plan->input_terms.begin(), plan->input_terms.end());
  for (const PlanAlternative& a : plan->alternatives) {
    std::string name = "t_" + std::string(PlanKindName(a.kind));
    std::replace(name.begin(), name.end(), '-', '_');
    t.push_back({name, a.predicted_us, "us"});
  }
  t.push_back({"t_predicted", plan->predicted_total_us, "us"});
  if (plan->observed_total_us) t.push_back({"t_observed", *plan->observed_total_us, "us"});
  if (plan->later_plans_delay_us) {
    t.push_back({"t_later_plans_delay", *plan->later_plans_delay_us, "us"});
  }
  return out;
}

}  // namespace kvfabric::placement
