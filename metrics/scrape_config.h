// A Prometheus scrape configuration (prometheus.yml) for running kvfabric
// processes: what `kvfabric demo --keep-running` prints so that an operator
// can point a Prometheus at the demo cluster, and what the observability
// test starts a real Prometheus with (so the printed text is the tested one).
//
// The job names are those deploy/prometheus/prometheus.yml uses and the
// recording rules, alerts and Grafana dashboard select on:
// kvfabric-placement, kvfabric-cached, kvfabric-client.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_METRICS_SCRAPE_CONFIG_H_
#define KVFABRIC_METRICS_SCRAPE_CONFIG_H_

#include <string>
#include <vector>

namespace kvfabric::metrics {

struct ScrapeJob {
  std::string job;                   // e.g. "kvfabric-cached"
  std::vector<std::string> targets;  // HOST:PORT of each /metrics endpoint
};

struct ScrapeConfigOptions {
  // Seconds between scrapes and between rule evaluations. Default 15 (as
  // deploy/prometheus/prometheus.yml); a short-lived demo or test uses 1-5.
  int interval_s = 15;
  // Rule files to load (absolute paths), e.g. deploy/prometheus/*.yml.
  std::vector<std::string> rule_files;
};

// "127.0.0.1:9440" from "http://127.0.0.1:9440/metrics"; the text unchanged
// if it has no scheme.
std::string HostPortOfUrl(const std::string& url);

// The YAML text: global intervals, rule_files, one static job per entry of
// `jobs` (jobs without targets are left out), targets quoted.
std::string PrometheusScrapeConfig(const std::vector<ScrapeJob>& jobs,
                                   const ScrapeConfigOptions& options);

}  // namespace kvfabric::metrics

#endif  // KVFABRIC_METRICS_SCRAPE_CONFIG_H_
