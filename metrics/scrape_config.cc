#include "metrics/scrape_config.h"

namespace kvfabric::metrics {
namespace {

// A YAML single-quoted scalar: quotes doubled.
std::string Quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string HostPortOfUrl(const std::string& url) {
  std::size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  const std::size_t end = url.find('/', start);
  return url.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

std::string PrometheusScrapeConfig(const std::vector<ScrapeJob>& jobs,
                                   const ScrapeConfigOptions& options) {
  const std::string interval = std::to_string(options.interval_s) + "s";
  std::string out =
      "global:\n  scrape_interval: " + interval + "\n  evaluation_interval: " + interval + "\n";
  if (!options.rule_files.empty()) {
    out += "rule_files:\n";
    for (const std::string& f : options.rule_files) out += "  - " + Quoted(f) + "\n";
  }
  out += "scrape_configs:\n";
  for (const ScrapeJob& j : jobs) {
    if (j.targets.empty()) continue;
    out += "  - job_name: " + Quoted(j.job) + "\n    static_configs:\n      - targets: [";
    for (std::size_t i = 0; i < j.targets.size(); ++i) {
      out += (i ? ", " : "") + Quoted(j.targets[i]);
    }
    out += "]\n";
  }
  return out;
}

}  // namespace kvfabric::metrics
