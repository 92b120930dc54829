#include "server/placement/placement_metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/bus_cost_model.h"
#include "core/prediction_error.h"
#include "core/testing/test_seed.h"
#include "server/cache_host/cache_host_metrics.h"

namespace kvfabric::placement {
namespace {

using cache_host::MetricsServer;
using cache_host::RenderText;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::string_view kPrefix = "kvfabric_placement_";

PredictionErrorHistogram::Snapshot Errors(std::initializer_list<double> errors) {
  PredictionErrorHistogram h;
  for (double e : errors) h.RecordError(e);
  return h.Get();
}

CalibratedCostModel::PathReport PathEntry(BusPath path, std::string host, double alpha_us,
                                          double beta, PredictionErrorHistogram::Snapshot error) {
  CalibratedCostModel::PathReport p;
  p.path = path;
  p.host_id = std::move(host);
  p.parameters = {alpha_us, beta};
  p.error = error;
  p.effective_observations = static_cast<double>(error.count);
  return p;
}

PlacementSnapshot SampleSnapshot() {
  PlacementSnapshot s;
  s.uptime_us = 90'500'000;
  s.live_hosts = 5;
  s.draining_hosts = 2;
  s.directory.entries = 1000;
  s.directory.replicas = 1700;
  s.directory.hosts = 5;
  s.directory.namespaces = 3;
  s.directory.events_applied = 4000;
  s.directory.events_ignored_incarnation = 12;
  s.directory.events_ignored_malformed = 1;
  s.directory.events_without_replica = 6;
  s.directory.entries_evicted = 77;
  s.directory.replicas_refused = 2;
  s.directory.stale_replicas_removed = 9;
  s.directory.stale_reports_unmatched = 4;
  s.directory.replicas_dropped_with_host = 300;
  s.directory.replicas_dropped_by_snapshot = 8;
  s.registrations = 7;
  s.heartbeats = 120;
  s.heartbeats_not_found = 3;
  s.deregistrations = 1;
  s.members_left = 1;
  s.lease_expiries = 2;
  s.incarnations_replaced = 1;
  s.reports = 50;
  s.reports_duplicate = 4;
  s.reports_gap = 2;
  s.reports_not_found = 5;
  s.report_events_ignored = 40;
  s.snapshots_completed = 6;
  s.locates = 33;
  s.plans = 21;
  s.plans_by_kind[static_cast<int>(PlanKind::kRecomputeAll)] = 3;
  s.plans_by_kind[static_cast<int>(PlanKind::kFetchAll)] = 10;
  s.plans_by_kind[static_cast<int>(PlanKind::kSplit)] = 6;
  s.plans_by_kind[static_cast<int>(PlanKind::kMixed)] = 2;
  s.plans_admitted = 4;
  s.plans_finished = 15;
  s.plans_expired = 2;
  s.plan_history = 21;
  s.observations_unknown_plan = 1;
  s.observations_unscored = 11;
  s.observations_beside_fetch = 4;
  s.fallback_runs = 3;
  s.retrials = 4;
  s.retrials_restored = 1;
  s.retrials_still_slow = 2;
  s.retrial_hosts = 1;
  s.stale_reports = 13;
  s.places = 8;
  s.place_hot_keys = 5;
  // Four plans: -4%, 1%, 2.5%, 50%.
  s.plan_error = Errors({-0.04, 0.01, 0.025, 0.5});
  s.plan_error.unscored = 1;
  s.paths = {
      PathEntry(BusPath::kRemoteHostToLocalHost, "", 25, 10e9, Errors({})),
      PathEntry(BusPath::kRemoteHostToLocalHost, "host-a", 12.5, 11.5e9, Errors({0.02, -0.1})),
      PathEntry(BusPath::kNvmeToHost, "host-a", 100, 3e9, Errors({})),
  };
  s.paths[1].healthy = PathParameters{12.5, 23e9};
  s.paths[1].provenance.restores = 2;
  CalibratedCostModel::RecomputeReport model;
  model.model_id = "llama-3-8b";
  model.parameters = {2000, 10, 0.001};
  model.error = Errors({0.05});
  model.effective_observations = 1;
  s.models = {model};
  return s;
}

std::set<std::string> Lines(const std::string& text) {
  std::set<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.insert(line);
  return lines;
}

const prometheus::MetricFamily* FindFamily(const std::vector<prometheus::MetricFamily>& families,
                                           const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string Label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label) {
    if (l.name == name) return l.value;
  }
  return "<none>";
}

TEST(PlacementMetricsTest, RendersSnapshotCountsAsExactLines) {
  const std::set<std::string> lines = Lines(RenderText(PlacementFamilies(SampleSnapshot())));
  for (const char* expected : {
           "kvfabric_placement_uptime_seconds 90.5",
           "kvfabric_placement_hosts{state=\"serving\"} 3",
           "kvfabric_placement_hosts{state=\"draining\"} 2",
           "kvfabric_placement_registrations_total 7",
           "kvfabric_placement_heartbeats_total{result=\"ok\"} 120",
           "kvfabric_placement_heartbeats_total{result=\"not_found\"} 3",
           "kvfabric_placement_lease_expiries_total 2",
           "kvfabric_placement_members_left_total 1",
           "kvfabric_placement_reports_total{result=\"applied\"} 41",  // 50 - 4 - 5
           "kvfabric_placement_reports_total{result=\"duplicate\"} 4",
           "kvfabric_placement_reports_total{result=\"not_found\"} 5",
           "kvfabric_placement_report_gaps_total 2",
           "kvfabric_placement_report_events_ignored_total 40",
           "kvfabric_placement_directory_entries 1000",
           "kvfabric_placement_directory_replicas 1700",
           "kvfabric_placement_directory_evictions_total 77",
           "kvfabric_placement_directory_events_total{result=\"ignored_incarnation\"} 12",
           "kvfabric_placement_directory_replicas_dropped_total{reason=\"host\"} 300",
           "kvfabric_placement_directory_replicas_dropped_total{reason=\"stale\"} 9",
           "kvfabric_placement_plans_total{kind=\"recompute_all\"} 3",
           "kvfabric_placement_plans_total{kind=\"fetch_all\"} 10",
           "kvfabric_placement_plans_total{kind=\"split\"} 6",
           "kvfabric_placement_plans_total{kind=\"mixed\"} 2",
           "kvfabric_placement_plans_in_flight 4",
           "kvfabric_placement_plans_finished_total 15",
           "kvfabric_placement_plans_expired_total 2",
           "kvfabric_placement_plan_error_ratio_count 4",
           "kvfabric_placement_plan_error_ratio_bucket{le=\"-0.03\"} 1",
           "kvfabric_placement_plan_error_ratio_bucket{le=\"0.01\"} 2",
           "kvfabric_placement_plan_error_ratio_bucket{le=\"0.03\"} 3",
           "kvfabric_placement_plan_error_ratio_bucket{le=\"0.5\"} 4",
           "kvfabric_placement_plan_error_ratio_bucket{le=\"+Inf\"} 4",
           "kvfabric_placement_plan_error_stat_ratio{stat=\"max\"} 0.5",
           "kvfabric_placement_plan_error_unscored_total 1",
           "kvfabric_placement_stale_reports_total 13",
           "kvfabric_placement_fallback_runs_total 3",
           "kvfabric_placement_retrials_total 4",
           "kvfabric_placement_retrials_judged_total{outcome=\"restored\"} 1",
           "kvfabric_placement_retrials_judged_total{outcome=\"still_slow\"} 2",
           "kvfabric_placement_retrial_hosts 1",
           "kvfabric_placement_path_slowed{path=\"remote_host_to_local_host\",host=\"host-a\"} 1",
           "kvfabric_placement_path_slowed{path=\"nvme_to_host\",host=\"host-a\"} 0",
           "kvfabric_placement_path_restores_total{path=\"remote_host_to_local_host\","
           "host=\"host-a\"} 2",
           "kvfabric_placement_places_total 8",
           "kvfabric_placement_place_hot_keys_total 5",
           "kvfabric_placement_locates_total 33",
           "kvfabric_placement_path_entries 3",
           "kvfabric_placement_path_alpha_seconds{path=\"remote_host_to_local_host\",host=\"\"} "
           "2.5e-05",
           "kvfabric_placement_path_beta_bytes_per_second{path=\"remote_host_to_local_host\","
           "host=\"host-a\"} 11500000000",
           "kvfabric_placement_path_error_ratio{path=\"remote_host_to_local_host\","
           "host=\"host-a\",stat=\"max\"} 0.1",
           "kvfabric_placement_path_observations_total{path=\"remote_host_to_local_host\","
           "host=\"host-a\"} 2",
           "kvfabric_placement_path_observations_total{path=\"nvme_to_host\",host=\"host-a\"} 0",
           "kvfabric_placement_observations_beside_fetch_total 4",
           "kvfabric_placement_models 1",
           "kvfabric_placement_model_error_ratio{model=\"llama-3-8b\",stat=\"max\"} 0.05",
           "kvfabric_placement_model_c0_seconds{model=\"llama-3-8b\"} 0.002",
           "kvfabric_placement_model_c1_seconds_per_token{model=\"llama-3-8b\"} 1e-05",
       }) {
    EXPECT_THAT(lines, Contains(expected));
  }
  // A pair without scored observations has parameters but no error series (it would read 0).
  for (const std::string& line : lines) {
    EXPECT_THAT(line, Not(HasSubstr("path_error_ratio{path=\"nvme_to_host\"")));
    EXPECT_THAT(line, Not(HasSubstr("path_error_ratio{path=\"remote_host_to_local_host\","
                                    "host=\"\"")));
  }
}

TEST(PlacementMetricsTest, EveryFamilyIsPrefixedTypedHelpedAndTotalExactlyForCounters) {
  auto metrics = std::make_shared<PlacementMetrics>([] { return SampleSnapshot(); });
  const std::vector<prometheus::MetricFamily> families = metrics->Collect();
  ASSERT_GE(families.size(), 40u);
  const std::string text = RenderText(families);
  std::set<std::string> names;
  for (const auto& f : families) {
    EXPECT_TRUE(names.insert(f.name).second) << "duplicate family " << f.name;
    EXPECT_EQ(f.name.rfind(kPrefix, 0), 0u) << f.name;
    EXPECT_GE(f.help.size(), 10u) << f.name;
    EXPECT_THAT(text, HasSubstr("# HELP " + f.name + " ")) << f.name;
    EXPECT_NE(f.type, prometheus::MetricType::Untyped) << f.name;
    EXPECT_FALSE(f.metric.empty()) << f.name;
    const bool ends_total = f.name.size() > 6 && f.name.substr(f.name.size() - 6) == "_total";
    EXPECT_EQ(ends_total, f.type == prometheus::MetricType::Counter) << f.name;
  }
  for (const char* family :
       {"plans_total", "plan_error_ratio", "path_error_ratio", "hosts", "directory_entries",
        "directory_replicas", "directory_evictions_total", "lease_expiries_total",
        "registrations_total", "heartbeats_total", "reports_total", "stale_reports_total",
        "fallback_runs_total", "places_total", "place_hot_keys_total", "uptime_seconds"}) {
    EXPECT_THAT(names, Contains(std::string(kPrefix) + family));
  }
  EXPECT_THAT(text, HasSubstr("# TYPE kvfabric_placement_plan_error_ratio histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE kvfabric_placement_plans_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE kvfabric_placement_hosts gauge"));
}

TEST(PlacementMetricsTest, PlanErrorHistogramIsCumulativeOverTheErrorBounds) {
  const std::uint64_t seed = TestSeed("PlacementMetricsTest.PlanErrorHistogramIsCumulative");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> error(-0.9, 3.0);
  PredictionErrorHistogram h;
  std::vector<double> recorded;
  const int n = 1 + static_cast<int>(rng() % 500);
  for (int i = 0; i < n; ++i) {
    recorded.push_back(error(rng));
    h.RecordError(recorded.back());
  }
  PlacementSnapshot s;
  s.plan_error = h.Get();
  const auto families = PlacementFamilies(s);
  const auto* family = FindFamily(families, "kvfabric_placement_plan_error_ratio");
  ASSERT_NE(family, nullptr);
  ASSERT_EQ(family->metric.size(), 1u);
  const auto& hist = family->metric[0].histogram;
  EXPECT_EQ(hist.sample_count, static_cast<std::uint64_t>(n)) << "seed " << seed;
  double sum = 0;
  for (double e : recorded) sum += e;
  EXPECT_NEAR(hist.sample_sum, sum, 1e-9 * n) << "seed " << seed;
  ASSERT_EQ(hist.bucket.size(), static_cast<std::size_t>(PredictionErrorHistogram::kBuckets));
  for (std::size_t i = 0; i < hist.bucket.size(); ++i) {
    const double le = i + 1 < hist.bucket.size() ? PredictionErrorHistogram::kUpperBounds[i]
                                                 : std::numeric_limits<double>::infinity();
    EXPECT_EQ(hist.bucket[i].upper_bound, le) << i;
    // Against the recorded errors themselves, with `le` (inclusive) semantics.
    const auto at_most = static_cast<std::uint64_t>(
        std::count_if(recorded.begin(), recorded.end(), [&](double e) { return e <= le; }));
    EXPECT_EQ(hist.bucket[i].cumulative_count, at_most) << "le " << le << ", seed " << seed;
  }
}

TEST(PlacementMetricsTest, EmptySnapshotHasNoErrorFiguresButAnEmptyHistogram) {
  const auto families = PlacementFamilies(PlacementSnapshot{});
  EXPECT_EQ(FindFamily(families, "kvfabric_placement_plan_error_stat_ratio"), nullptr);
  EXPECT_EQ(FindFamily(families, "kvfabric_placement_path_error_ratio"), nullptr);
  EXPECT_EQ(FindFamily(families, "kvfabric_placement_path_alpha_seconds"), nullptr);
  const auto* hist = FindFamily(families, "kvfabric_placement_plan_error_ratio");
  ASSERT_NE(hist, nullptr);
  EXPECT_EQ(hist->metric[0].histogram.sample_count, 0u);
  const std::set<std::string> lines = Lines(RenderText(families));
  EXPECT_THAT(lines, Contains("kvfabric_placement_path_entries 0"));
  EXPECT_THAT(lines, Contains("kvfabric_placement_plans_total{kind=\"split\"} 0"));
  for (const std::string& line : lines) EXPECT_THAT(line, Not(HasSubstr("kind=\"unspecified\"")));
}

TEST(PlacementMetricsTest, PlansOfUnspecifiedKindGetASeriesOnlyWhenThereAreSome) {
  PlacementSnapshot s;
  s.plans_by_kind[static_cast<int>(PlanKind::kUnspecified)] = 2;
  const std::set<std::string> lines = Lines(RenderText(PlacementFamilies(s)));
  EXPECT_THAT(lines, Contains("kvfabric_placement_plans_total{kind=\"unspecified\"} 2"));
}

TEST(PlacementMetricsTest, MemberLivenessAndPathTrafficPerSeries) {
  PlacementSnapshot s;
  s.wall_unix_us = 100'000'000;
  MemberLiveness a;
  a.host_id = "cache-a";
  a.last_heartbeat_unix_us = 97'500'000;
  a.lease_remaining_us = 7'500'000;
  MemberLiveness b;  // learned from another replica: no heartbeat here, no lease known
  b.host_id = "cache-b";
  s.members = {a, b};
  s.traffic[static_cast<std::size_t>(BusPath::kNvmeToHost)] = {3, 3u << 20, 1500.0};
  const std::set<std::string> lines = Lines(RenderText(PlacementFamilies(s)));
  EXPECT_THAT(lines,
              Contains("kvfabric_placement_member_heartbeat_age_seconds{host=\"cache-a\"} 2.5"));
  EXPECT_THAT(lines,
              Contains("kvfabric_placement_member_lease_remaining_seconds{host=\"cache-a\"} 7.5"));
  for (const std::string& line : lines) EXPECT_EQ(line.find("cache-b"), std::string::npos) << line;
  EXPECT_THAT(lines, Contains("kvfabric_placement_path_traffic_bytes_total{path=\"nvme_to_host\"} "
                              "3145728"));
  EXPECT_THAT(lines,
              Contains("kvfabric_placement_path_traffic_transfers_total{path=\"nvme_to_host\"} 3"));
  EXPECT_THAT(lines,
              Contains("kvfabric_placement_path_traffic_seconds_total{path=\"nvme_to_host\"} "
                       "0.0015"));
}

TEST(PlacementMetricsTest, CountersReadAtDifferentMomentsNeverGoNegative) {
  PlacementSnapshot s;
  s.live_hosts = 1;
  s.draining_hosts = 2;
  s.reports = 3;
  s.reports_duplicate = 2;
  s.reports_not_found = 2;
  const std::set<std::string> lines = Lines(RenderText(PlacementFamilies(s)));
  EXPECT_THAT(lines, Contains("kvfabric_placement_hosts{state=\"serving\"} 0"));
  EXPECT_THAT(lines, Contains("kvfabric_placement_reports_total{result=\"applied\"} 0"));
}

TEST(PlacementMetricsTest, PathSeriesAreCappedDefaultsFirstThenMostObserved) {
  const std::uint64_t seed = TestSeed("PlacementMetricsTest.PathSeriesAreCapped");
  std::mt19937_64 rng(seed);
  PlacementSnapshot s;
  const int kHosts = 150 + static_cast<int>(rng() % 150);
  const BusPath kPaths[] = {BusPath::kRemoteHostToLocalHost, BusPath::kNvmeToHost};
  for (BusPath path : kPaths) s.paths.push_back(PathEntry(path, "", 10, 1e9, Errors({})));
  for (int i = 0; i < kHosts; ++i) {
    for (BusPath path : kPaths) {
      // Few distinct counts, so that ties (broken by host, then path) are common.
      auto entry = PathEntry(path, "host-" + std::to_string(i), 10, 1e9, Errors({}));
      entry.error.count = rng() % 4;
      s.paths.push_back(entry);
    }
  }
  std::shuffle(s.paths.begin(), s.paths.end(), rng);

  // Reference: defaults, then count descending, host ascending, path ascending.
  std::vector<CalibratedCostModel::PathReport> sorted = s.paths;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(!a.host_id.empty(), -static_cast<double>(a.error.count), a.host_id,
                           static_cast<int>(a.path)) <
           std::make_tuple(!b.host_id.empty(), -static_cast<double>(b.error.count), b.host_id,
                           static_cast<int>(b.path));
  });
  std::set<std::pair<std::string, std::string>> expected;
  for (std::size_t i = 0; i < std::min(sorted.size(), kMaxPathSeries); ++i) {
    expected.insert({std::string(BusPathName(sorted[i].path)), sorted[i].host_id});
  }

  const auto families = PlacementFamilies(s);
  for (const char* name :
       {"kvfabric_placement_path_alpha_seconds", "kvfabric_placement_path_beta_bytes_per_second",
        "kvfabric_placement_path_observations_total",
        "kvfabric_placement_path_effective_observations"}) {
    const auto* family = FindFamily(families, name);
    ASSERT_NE(family, nullptr) << name;
    EXPECT_EQ(family->metric.size(), kMaxPathSeries) << name << ", seed " << seed;
    std::set<std::pair<std::string, std::string>> shown;
    for (const auto& m : family->metric) shown.insert({Label(m, "path"), Label(m, "host")});
    EXPECT_EQ(shown, expected) << name << ", seed " << seed;
  }
  // The defaults stand for every host without its own entry: always shown.
  for (BusPath path : kPaths) {
    EXPECT_THAT(expected, Contains(std::make_pair(std::string(BusPathName(path)), std::string())));
  }
  const auto* entries = FindFamily(families, "kvfabric_placement_path_entries");
  ASSERT_NE(entries, nullptr);
  EXPECT_EQ(entries->metric[0].gauge.value, 2.0 * (kHosts + 1));
}

TEST(PlacementMetricsTest, ModelSeriesAreCappedToTheMostObserved) {
  PlacementSnapshot s;
  const std::size_t kModels = kMaxModelSeries + 10;
  for (std::size_t i = 0; i < kModels; ++i) {
    CalibratedCostModel::RecomputeReport m;
    m.model_id = "model-" + std::to_string(1000 + i);
    m.parameters = {1000, 1, 0};
    // The first ten have no observations; among equals the lower id wins.
    m.error.count = i < 10 ? 0 : 1;
    s.models.push_back(m);
  }
  const auto families = PlacementFamilies(s);
  const auto* c0 = FindFamily(families, "kvfabric_placement_model_c0_seconds");
  ASSERT_NE(c0, nullptr);
  ASSERT_EQ(c0->metric.size(), kMaxModelSeries);
  std::set<std::string> shown;
  for (const auto& m : c0->metric) shown.insert(Label(m, "model"));
  EXPECT_FALSE(shown.contains("model-1000"));
  EXPECT_FALSE(shown.contains("model-1009"));
  EXPECT_TRUE(shown.contains("model-1010"));
  EXPECT_TRUE(shown.contains("model-" + std::to_string(1000 + kModels - 1)));
  const auto* models = FindFamily(families, "kvfabric_placement_models");
  ASSERT_NE(models, nullptr);
  EXPECT_EQ(models->metric[0].gauge.value, static_cast<double>(kModels));
}

TEST(PlacementMetricsTest, CollectCallsTheSourceAtEveryScrape) {
  std::uint64_t plans = 0;
  PlacementMetrics metrics([&plans] {
    PlacementSnapshot s;
    s.plans_by_kind[static_cast<int>(PlanKind::kFetchAll)] = ++plans;
    return s;
  });
  EXPECT_THAT(Lines(RenderText(metrics.Collect())),
              Contains("kvfabric_placement_plans_total{kind=\"fetch_all\"} 1"));
  EXPECT_THAT(Lines(RenderText(metrics.Collect())),
              Contains("kvfabric_placement_plans_total{kind=\"fetch_all\"} 2"));
}

TEST(PlacementMetricsTest, WithoutSourceCollectsNothing) {
  PlacementMetrics metrics(nullptr);
  EXPECT_TRUE(metrics.Collect().empty());
}

// A plain HTTP/1.0 GET on 127.0.0.1:port; returns the whole response, or "" if it could not
// connect.
std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{};
  tv.tv_sec = 30;  // a guard against hanging, not a timing assertion
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
    }
  }
  ::close(fd);
  return response;
}

TEST(PlacementMetricsTest, IsServedByTheCacheHostMetricsServer) {
  auto metrics = std::make_shared<PlacementMetrics>([] { return SampleSnapshot(); });
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr(" 200 "));
  EXPECT_THAT(response, HasSubstr("kvfabric_placement_plans_total{kind=\"split\"} 6"));
  EXPECT_THAT(response, HasSubstr("# HELP kvfabric_placement_lease_expiries_total "));
}

}  // namespace
}  // namespace kvfabric::placement
