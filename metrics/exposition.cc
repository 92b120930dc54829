#include "metrics/exposition.h"

#include <prometheus/text_serializer.h>

#include <utility>

#ifndef KVF_VERSION
#error "KVF_VERSION must be defined by the build (from the VERSION file)"
#endif

namespace kvfabric::metrics {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

void AppendFamily(std::vector<MetricFamily>& out, std::string_view prefix, MetricType type,
                  std::string_view name, std::string_view help, std::vector<MetricSample> samples) {
  if (samples.empty()) return;
  MetricFamily family;
  family.name = std::string(prefix) + std::string(name);
  family.help = std::string(help);
  family.type = type;
  family.metric.reserve(samples.size());
  for (MetricSample& sample : samples) {
    ClientMetric metric;
    metric.label = std::move(sample.labels);
    if (type == MetricType::Counter) {
      metric.counter.value = sample.value;
    } else {
      metric.gauge.value = sample.value;
    }
    family.metric.push_back(std::move(metric));
  }
  out.push_back(std::move(family));
}

std::string RenderText(const std::vector<MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

std::string_view BuildVersion() { return KVF_VERSION; }

MetricFamily BuildInfoFamily(std::string_view process) {
  auto part = [](bool built) { return std::string(built ? "1" : "0"); };
#if defined(KVF_HAVE_CUDA)
  constexpr bool kCuda = true;
#else
  constexpr bool kCuda = false;
#endif
#if defined(KVF_HAVE_UCX)
  constexpr bool kUcx = true;
#else
  constexpr bool kUcx = false;
#endif
#if defined(KVF_HAVE_VERBS)
  constexpr bool kVerbs = true;
#else
  constexpr bool kVerbs = false;
#endif
#if defined(KVF_HAVE_URING)
  constexpr bool kUring = true;
#else
  constexpr bool kUring = false;
#endif
#if defined(KVF_HAVE_LEVEL_ZERO)
  constexpr bool kLevelZero = true;
#else
  constexpr bool kLevelZero = false;
#endif
  std::vector<MetricFamily> out;
  AppendFamily(out, "kvfabric_", MetricType::Gauge, "build_info",
               "1, labelled with the process, kvfabric's version and which optional parts this "
               "build carries (1 built, 0 not).",
               {MetricSample{1,
                             {{"process", std::string(process)},
                              {"version", std::string(BuildVersion())},
                              {"cuda", part(kCuda)},
                              {"ucx", part(kUcx)},
                              {"verbs", part(kVerbs)},
                              {"io_uring", part(kUring)},
                              {"level_zero", part(kLevelZero)}}}});
  return std::move(out.front());
}

namespace {

class BuildInfo final : public prometheus::Collectable {
 public:
  explicit BuildInfo(std::string process) : process_(std::move(process)) {}
  std::vector<MetricFamily> Collect() const override { return {BuildInfoFamily(process_)}; }

 private:
  const std::string process_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> NewBuildInfo(std::string process) {
  return std::make_shared<BuildInfo>(std::move(process));
}

const std::vector<double>& LatencySecondsBuckets() {
  static const std::vector<double> kBuckets = {
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1,    2.5,    5,    10,
  };
  return kBuckets;
}

}  // namespace kvfabric::metrics
