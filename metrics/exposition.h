// Building and rendering Prometheus metric families, shared by every
// kvfabric process that exports metrics (kvfabric-cached, kvfabric-placement,
// libkvfabric). The names and meanings are catalogued in docs/metrics.md;
// tests/metrics_catalogue_test.cc fails when a process exports a family the
// catalogue lacks or the catalogue names one no process exports.
//
// Conventions (docs/metrics.md): prefix kvfabric_, base units (_bytes,
// _seconds), counters end in _total, and label values come from bounded sets
// (never a block key, context id or request id).
//
// Thread safety: pure functions.
#ifndef KVFABRIC_METRICS_EXPOSITION_H_
#define KVFABRIC_METRICS_EXPOSITION_H_

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvfabric::metrics {

// One sample of a metric family being built: its value and labels.
struct MetricSample {
  double value = 0;
  std::vector<prometheus::ClientMetric::Label> labels;
};

// Appends the family `prefix` + `name` (gauge or counter) with `samples` to
// `out`; nothing when there are no samples (a HELP line over nothing is noise
// to a reader).
void AppendFamily(std::vector<prometheus::MetricFamily>& out, std::string_view prefix,
                  prometheus::MetricType type, std::string_view name, std::string_view help,
                  std::vector<MetricSample> samples);

// The Prometheus text exposition format (version 0.0.4) of `families`, as
// served at /metrics.
std::string RenderText(const std::vector<prometheus::MetricFamily>& families);

// kvfabric_build_info: a gauge of 1 labelled with the process ("cached",
// "placement", "client"), kvfabric's version and, for each optional part,
// whether this build carries it ("1"/"0": cuda, ucx, verbs, io_uring,
// level_zero). A dashboard joins on it to show what runs where.
prometheus::MetricFamily BuildInfoFamily(std::string_view process);

// A collectable serving BuildInfoFamily(process) alone, for a /metrics
// server's list.
std::shared_ptr<prometheus::Collectable> NewBuildInfo(std::string process);

// The version this build was made from (the VERSION file).
std::string_view BuildVersion();

// Upper bounds for latency histograms of kvfabric (transfers, RPCs, loads):
// 50 us to 10 s in 1-2.5-5 steps (17 buckets plus +Inf).
const std::vector<double>& LatencySecondsBuckets();

}  // namespace kvfabric::metrics

#endif  // KVFABRIC_METRICS_EXPOSITION_H_
