#include "metrics/scrape_config.h"

#include <gtest/gtest.h>

namespace kvfabric::metrics {
namespace {

TEST(ScrapeConfigTest, HostPortOfUrl) {
  EXPECT_EQ(HostPortOfUrl("http://127.0.0.1:9440/metrics"), "127.0.0.1:9440");
  EXPECT_EQ(HostPortOfUrl("http://[::1]:9440/metrics"), "[::1]:9440");
  EXPECT_EQ(HostPortOfUrl("127.0.0.1:9440"), "127.0.0.1:9440");
}

TEST(ScrapeConfigTest, JobsTargetsAndRuleFiles) {
  ScrapeConfigOptions o;
  o.interval_s = 5;
  o.rule_files = {"/etc/prometheus/kvfabric-rules.yml", "/tmp/it's.yml"};
  const std::string yaml =
      PrometheusScrapeConfig({{"kvfabric-placement", {"127.0.0.1:1"}},
                              {"kvfabric-cached", {"127.0.0.1:2", "127.0.0.1:3"}},
                              {"kvfabric-client", {}}},
                             o);
  EXPECT_EQ(yaml,
            "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
            "rule_files:\n  - '/etc/prometheus/kvfabric-rules.yml'\n  - '/tmp/it''s.yml'\n"
            "scrape_configs:\n"
            "  - job_name: 'kvfabric-placement'\n    static_configs:\n"
            "      - targets: ['127.0.0.1:1']\n"
            "  - job_name: 'kvfabric-cached'\n    static_configs:\n"
            "      - targets: ['127.0.0.1:2', '127.0.0.1:3']\n");
}

}  // namespace
}  // namespace kvfabric::metrics
