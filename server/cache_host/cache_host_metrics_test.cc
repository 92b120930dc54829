#include "server/cache_host/cache_host_metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>
#include <sstream>

#include "core/testing/test_seed.h"

namespace kvfabric::cache_host {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::string_view kPrefix = "kvfabric_cache_host_";

CacheHostSnapshot SampleSnapshot() {
  CacheHostSnapshot s;
  s.state = ServingState::kServing;
  s.uptime_us = 90'500'000;
  s.policy = "cost-aware";
  s.memory_locked = true;
  s.page_bytes = 2 << 20;
  s.pages.pages = 64;
  s.pages.free = 12;
  s.pages.reserved = 3;
  s.pages.committed = 47;
  s.pages.staging = 2;
  s.pages.leased = 5;
  s.table.hits = 100;
  s.table.misses = 7;
  s.table.nvme_only = 9;
  s.table.active_reservations = 4;
  s.table.active_leases = 6;
  s.table.reservations_expired = 1;
  s.table.leases_expired = 2;
  s.table.commits = 55;
  s.table.already_exists = 8;
  s.table.crc_failures = 3;
  s.evictions_by_action[static_cast<int>(EvictionAction::kDropHostCopy)] = 11;
  s.evictions_by_action[static_cast<int>(EvictionAction::kDemote)] = 12;
  s.evictions_by_action[static_cast<int>(EvictionAction::kEvict)] = 13;
  s.nvme_enabled = true;
  s.nvme_capacity_bytes = 1ull << 40;
  s.nvme.live_bytes = 123456;
  s.nvme.bytes_written = 999424;
  s.nvme.group_syncs = 17;
  s.nvme.crc_failures = 1;
  s.recovery.recovered = 40;
  s.recovery.dropped_torn = 2;
  s.recovery.dropped_corrupt = 1;
  s.recovery_orphans = 4;
  s.data_plane_endpoints = 3;
  s.transfers_refused = 5;
  s.data_plane.connections_refused = 6;
  s.data_plane.closed_idle = 7;
  s.data_plane.closed_overloaded = 8;
  s.data_plane.closed_transfer_timeout = 9;
  s.compact_keep_budget_bytes = 32 << 20;
  s.table.compact_kept_bytes = 6 << 20;
  s.table.compact_kept_blocks = 3;
  s.compact_kept_by_action[static_cast<int>(EvictionAction::kEvict)] = 21;
  s.compact_kept_by_action[static_cast<int>(EvictionAction::kDemote)] = 22;
  s.compact_copies_evicted[static_cast<int>(CompactOutcome::kCopyOverBudget)] = 23;
  s.compact_copies_evicted[static_cast<int>(CompactOutcome::kCopyLastResort)] = 24;
  NamespaceUsage a;
  a.tenant = "alpha";
  a.host_bytes = 4 << 20;
  a.nvme_bytes = 1000;
  a.quota_bytes = 8 << 20;
  a.hits = 9;
  NamespaceUsage b;
  b.tenant = "beta";
  b.host_bytes = 2 << 20;
  s.namespaces = {a, b};
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

const prometheus::ClientMetric* FindMetric(const prometheus::MetricFamily& family,
                                           const std::string& label, const std::string& value) {
  for (const auto& m : family.metric) {
    for (const auto& l : m.label) {
      if (l.name == label && l.value == value) return &m;
    }
  }
  return nullptr;
}

TEST(CacheHostMetricsTest, RendersSnapshotCountsAsExactLines) {
  const std::set<std::string> lines = Lines(RenderText(SnapshotFamilies(SampleSnapshot())));
  for (const char* expected : {
           "kvfabric_cache_host_pool_pages{state=\"free\"} 12",
           "kvfabric_cache_host_pool_pages{state=\"reserved\"} 3",
           "kvfabric_cache_host_pool_pages{state=\"committed\"} 47",
           "kvfabric_cache_host_pool_pages{state=\"staging\"} 2",
           "kvfabric_cache_host_pool_leased_pages 5",
           "kvfabric_cache_host_pool_page_bytes 2097152",
           "kvfabric_cache_host_tier_bytes{tier=\"host\"} 98566144",  // 47 x 2 MiB
           "kvfabric_cache_host_tier_bytes{tier=\"nvme\"} 123456",
           "kvfabric_cache_host_tier_capacity_bytes{tier=\"host\"} 134217728",
           "kvfabric_cache_host_tier_capacity_bytes{tier=\"nvme\"} 1099511627776",
           "kvfabric_cache_host_lease_lookups_total{result=\"hit\"} 100",
           "kvfabric_cache_host_lease_lookups_total{result=\"miss\"} 7",
           "kvfabric_cache_host_lease_lookups_total{result=\"nvme\"} 9",
           "kvfabric_cache_host_leases_active{kind=\"write\"} 4",
           "kvfabric_cache_host_leases_active{kind=\"read\"} 6",
           "kvfabric_cache_host_leases_expired_total{kind=\"write\"} 1",
           "kvfabric_cache_host_leases_expired_total{kind=\"read\"} 2",
           "kvfabric_cache_host_commits_total 55",
           "kvfabric_cache_host_commit_conflicts_total 8",
           "kvfabric_cache_host_evictions_total{reason=\"drop-host-copy\"} 11",
           "kvfabric_cache_host_evictions_total{reason=\"demote\"} 12",
           "kvfabric_cache_host_evictions_total{reason=\"evict\"} 13",
           "kvfabric_cache_host_compact_keep_budget_bytes 33554432",
           "kvfabric_cache_host_compact_kept_bytes 6291456",
           "kvfabric_cache_host_compact_kept_blocks 3",
           "kvfabric_cache_host_compact_kept_evictions_total{action=\"drop-host-copy\"} 0",
           "kvfabric_cache_host_compact_kept_evictions_total{action=\"demote\"} 22",
           "kvfabric_cache_host_compact_kept_evictions_total{action=\"evict\"} 21",
           "kvfabric_cache_host_compact_evicted_total{reason=\"over_budget\"} 23",
           "kvfabric_cache_host_compact_evicted_total{reason=\"last_resort\"} 24",
           "kvfabric_cache_host_crc_failures_total{where=\"commit\"} 3",
           "kvfabric_cache_host_crc_failures_total{where=\"nvme_read\"} 1",
           "kvfabric_cache_host_recovered_blocks 40",
           "kvfabric_cache_host_recovery_dropped_blocks{reason=\"torn\"} 2",
           "kvfabric_cache_host_recovery_dropped_blocks{reason=\"corrupt\"} 1",
           "kvfabric_cache_host_recovery_dropped_blocks{reason=\"duplicate\"} 0",
           "kvfabric_cache_host_recovery_dropped_blocks{reason=\"orphan\"} 4",
           "kvfabric_cache_host_nvme_bytes_written_total 999424",
           "kvfabric_cache_host_nvme_group_syncs_total 17",
           "kvfabric_cache_host_serving{state=\"serving\"} 1",
           "kvfabric_cache_host_serving{state=\"draining\"} 0",
           "kvfabric_cache_host_uptime_seconds 90.5",
           "kvfabric_cache_host_memory_locked 1",
           "kvfabric_cache_host_data_plane_endpoints 3",
           "kvfabric_cache_host_transfers_refused_total 5",
           "kvfabric_cache_host_data_connections_refused_total 6",
           "kvfabric_cache_host_data_connections_closed_total{reason=\"idle\"} 7",
           "kvfabric_cache_host_data_connections_closed_total{reason=\"overloaded\"} 8",
           "kvfabric_cache_host_data_connections_closed_total{reason=\"transfer_timeout\"} 9",
           "kvfabric_cache_host_eviction_policy_info{policy=\"cost-aware\"} 1",
           "kvfabric_cache_host_namespaces 2",
           "kvfabric_cache_host_namespace_bytes{namespace=\"alpha\",tier=\"host\"} 4194304",
           "kvfabric_cache_host_namespace_bytes{namespace=\"alpha\",tier=\"nvme\"} 1000",
           "kvfabric_cache_host_namespace_bytes{namespace=\"beta\",tier=\"host\"} 2097152",
           "kvfabric_cache_host_namespace_quota_bytes{namespace=\"alpha\"} 8388608",
           "kvfabric_cache_host_namespace_lookups_total{namespace=\"alpha\",result=\"hit\"} 9",
           "kvfabric_cache_host_namespace_other_bytes{tier=\"host\"} 0",
       }) {
    EXPECT_THAT(lines, Contains(expected));
  }
  // No quota, no quota series.
  for (const std::string& line : lines) {
    EXPECT_THAT(line, Not(HasSubstr("namespace_quota_bytes{namespace=\"beta\"")));
  }
}

TEST(CacheHostMetricsTest, LeavesOutFamiliesWithoutSamples) {
  CacheHostSnapshot s = SampleSnapshot();
  for (NamespaceUsage& u : s.namespaces) u.quota_bytes = 0;
  const std::string text = RenderText(SnapshotFamilies(s));
  EXPECT_THAT(text, Not(HasSubstr("namespace_quota_bytes")));
  EXPECT_THAT(text, HasSubstr("# HELP kvfabric_cache_host_namespace_bytes "));
}

TEST(CacheHostMetricsTest, EveryFamilyIsPrefixedTypedAndHelped) {
  auto metrics = std::make_shared<CacheHostMetrics>([] { return SampleSnapshot(); });
  const std::vector<prometheus::MetricFamily> families = metrics->Collect();
  std::set<std::string> names;
  for (const auto& f : families) {
    EXPECT_TRUE(names.insert(f.name).second) << "duplicate family " << f.name;
    EXPECT_EQ(f.name.rfind(kPrefix, 0), 0u) << f.name;
    EXPECT_GE(f.help.size(), 10u) << f.name;
    EXPECT_NE(f.type, prometheus::MetricType::Untyped) << f.name;
    const bool ends_total = f.name.size() > 6 && f.name.substr(f.name.size() - 6) == "_total";
    EXPECT_EQ(ends_total, f.type == prometheus::MetricType::Counter) << f.name;
  }
  // Transfer families come from the live registry, after the snapshot.
  EXPECT_THAT(names, Contains("kvfabric_cache_host_transfer_seconds"));
  EXPECT_THAT(names, Contains("kvfabric_cache_host_transfer_size_bytes"));
  EXPECT_THAT(names, Contains("kvfabric_cache_host_transfer_bytes_total"));
  EXPECT_THAT(names, Contains("kvfabric_cache_host_transfer_failures_total"));
  EXPECT_THAT(names, Contains("kvfabric_cache_host_pool_pages"));

  const std::string text = RenderText(families);
  EXPECT_THAT(text, HasSubstr("# HELP kvfabric_cache_host_pool_pages Host pool pages by state"));
  EXPECT_THAT(text, HasSubstr("# TYPE kvfabric_cache_host_transfer_seconds histogram"));
}

TEST(CacheHostMetricsTest, ServingIsOneHotOverTheStates) {
  for (ServingState state : {ServingState::kStarting, ServingState::kServing,
                             ServingState::kDraining, ServingState::kStopped}) {
    CacheHostSnapshot s;
    s.state = state;
    const auto families = SnapshotFamilies(s);
    const auto* serving = FindFamily(families, "kvfabric_cache_host_serving");
    ASSERT_NE(serving, nullptr);
    ASSERT_EQ(serving->metric.size(), 4u);
    double sum = 0;
    for (const auto& m : serving->metric) sum += m.gauge.value;
    EXPECT_EQ(sum, 1.0);
  }
}

TEST(CacheHostMetricsTest, WithoutSourceCollectsOnlyTransferFamilies) {
  CacheHostMetrics metrics(nullptr);
  const auto families = metrics.Collect();
  ASSERT_EQ(families.size(), 4u);
  for (const auto& f : families) EXPECT_THAT(f.name, HasSubstr("transfer"));
}

TEST(CacheHostMetricsTest, ObservedTransfersFillHistogramsAndCounters) {
  CacheHostMetrics metrics(nullptr);
  metrics.ObserveTransfer(/*write=*/true, 1 << 20, 1500, Status::OK());
  metrics.ObserveTransfer(/*write=*/true, 3 << 20, 2500, Status::OK());
  metrics.ObserveTransfer(/*write=*/false, 4096, 80, Status::OK());
  metrics.ObserveTransfer(/*write=*/true, 1 << 20, 900, Status::Unavailable("peer went away"));

  const auto families = metrics.Collect();
  const auto* seconds = FindFamily(families, "kvfabric_cache_host_transfer_seconds");
  ASSERT_NE(seconds, nullptr);
  const auto* put = FindMetric(*seconds, "direction", "put");
  const auto* get = FindMetric(*seconds, "direction", "get");
  ASSERT_NE(put, nullptr);
  ASSERT_NE(get, nullptr);
  // The failed transfer is not in the histogram.
  EXPECT_EQ(put->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(put->histogram.sample_sum, 0.004);
  EXPECT_EQ(get->histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(get->histogram.sample_sum, 80e-6);
  // 80 us lands in the 100 us bucket, not the 50 us one.
  ASSERT_EQ(get->histogram.bucket.size(), TransferSecondsBuckets().size() + 1);
  EXPECT_EQ(get->histogram.bucket[0].cumulative_count, 0u);
  EXPECT_EQ(get->histogram.bucket[1].cumulative_count, 1u);

  const auto* size = FindFamily(families, "kvfabric_cache_host_transfer_size_bytes");
  ASSERT_NE(size, nullptr);
  const auto* put_size = FindMetric(*size, "direction", "put");
  ASSERT_NE(put_size, nullptr);
  EXPECT_EQ(put_size->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(put_size->histogram.sample_sum, 4 << 20);

  const std::set<std::string> lines = Lines(RenderText(families));
  EXPECT_THAT(lines,
              Contains("kvfabric_cache_host_transfer_bytes_total{direction=\"put\"} 4194304"));
  EXPECT_THAT(lines, Contains("kvfabric_cache_host_transfer_bytes_total{direction=\"get\"} 4096"));
  EXPECT_THAT(lines, Contains("kvfabric_cache_host_transfer_failures_total{direction=\"put\"} 1"));
  EXPECT_THAT(lines, Contains("kvfabric_cache_host_transfer_failures_total{direction=\"get\"} 0"));
  EXPECT_THAT(lines, Contains("kvfabric_cache_host_transfer_seconds_count{direction=\"put\"} 2"));
  EXPECT_THAT(lines,
              Contains("kvfabric_cache_host_transfer_size_bytes_count{direction=\"get\"} 1"));
}

TEST(CacheHostMetricsTest, BucketsSpanTheDocumentedRanges) {
  const auto& secs = TransferSecondsBuckets();
  EXPECT_DOUBLE_EQ(secs.front(), 50e-6);
  EXPECT_DOUBLE_EQ(secs.back(), 10.0);
  EXPECT_TRUE(std::is_sorted(secs.begin(), secs.end()));
  const auto& sizes = TransferSizeBuckets();
  EXPECT_EQ(sizes.front(), 4096.0);
  EXPECT_EQ(sizes.back(), 256.0 * 1024 * 1024);
  EXPECT_EQ(sizes.size(), 9u);
}

TEST(CacheHostMetricsTest, ObserverForStopsForwardingOnceMetricsAreGone) {
  auto metrics = std::make_shared<CacheHostMetrics>(nullptr);
  TransferObserver observer = CacheHostMetrics::ObserverFor(metrics);
  observer(false, 8192, 100, Status::OK());
  const auto families = metrics->Collect();
  const auto* bytes = FindFamily(families, "kvfabric_cache_host_transfer_bytes_total");
  ASSERT_NE(bytes, nullptr);
  EXPECT_EQ(FindMetric(*bytes, "direction", "get")->counter.value, 8192);
  metrics.reset();
  observer(false, 8192, 100, Status::OK());  // must not crash
}

TEST(CacheHostMetricsTest, NamespaceSeriesAreCappedToTheLargestAndTheRestSummed) {
  const std::uint64_t seed = TestSeed("CacheHostMetricsTest.NamespaceSeriesAreCapped");
  std::mt19937_64 rng(seed);
  CacheHostSnapshot s;
  const int kNamespaces = 300 + static_cast<int>(rng() % 200);
  for (int i = 0; i < kNamespaces; ++i) {
    NamespaceUsage u;
    u.tenant = "tenant-" + std::to_string(i);
    // Few distinct sizes, so that ties (broken by name) are common.
    u.host_bytes = (rng() % 8) << 20;
    u.reserved_bytes = (rng() % 2) << 20;
    u.nvme_bytes = rng() % 3 * 1000;
    s.namespaces.push_back(u);
  }
  // Reference: the 256 largest by (size desc, name asc).
  std::vector<NamespaceUsage> sorted = s.namespaces;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    const std::uint64_t sa = a.host_bytes + a.reserved_bytes + a.nvme_bytes;
    const std::uint64_t sb = b.host_bytes + b.reserved_bytes + b.nvme_bytes;
    return sa != sb ? sa > sb : a.tenant < b.tenant;
  });
  std::set<std::string> expected_shown;
  std::uint64_t other_host = 0, other_nvme = 0;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (i < kMaxNamespaceSeries) {
      expected_shown.insert(sorted[i].tenant);
    } else {
      other_host += sorted[i].host_bytes;
      other_nvme += sorted[i].nvme_bytes;
    }
  }

  const auto families = SnapshotFamilies(s);
  const auto* bytes = FindFamily(families, "kvfabric_cache_host_namespace_bytes");
  ASSERT_NE(bytes, nullptr);
  EXPECT_EQ(bytes->metric.size(), 2 * kMaxNamespaceSeries);
  std::set<std::string> shown;
  for (const auto& m : bytes->metric) {
    for (const auto& l : m.label) {
      if (l.name == "namespace") shown.insert(l.value);
    }
  }
  EXPECT_EQ(shown, expected_shown) << "seed " << seed;

  const auto* other = FindFamily(families, "kvfabric_cache_host_namespace_other_bytes");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(FindMetric(*other, "tier", "host")->gauge.value, static_cast<double>(other_host));
  EXPECT_EQ(FindMetric(*other, "tier", "nvme")->gauge.value, static_cast<double>(other_nvme));
  const auto* count = FindFamily(families, "kvfabric_cache_host_namespaces");
  ASSERT_NE(count, nullptr);
  EXPECT_EQ(count->metric[0].gauge.value, kNamespaces);
}

TEST(CacheHostMetricsTest, TenantNamesThatAreNotUtf8AreEscaped) {
  CacheHostSnapshot s;
  NamespaceUsage u;
  u.tenant = std::string("caf\xC3\xA9-\xFF\xC3", 8);  // valid é, then two bad bytes
  s.namespaces = {u};
  const auto families = SnapshotFamilies(s);
  const auto* bytes = FindFamily(families, "kvfabric_cache_host_namespace_bytes");
  ASSERT_NE(bytes, nullptr);
  ASSERT_FALSE(bytes->metric.empty());
  EXPECT_EQ(bytes->metric[0].label[0].value, "caf\xC3\xA9-\\xFF\\xC3");
}

// ---- MetricsServer ----

// A plain HTTP/1.0 GET on 127.0.0.1:port; returns the whole response, or ""
// if it could not connect.
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

TEST(MetricsServerTest, ServesCollectedFamiliesOverHttp) {
  auto metrics = std::make_shared<CacheHostMetrics>([] { return SampleSnapshot(); });
  metrics->ObserveTransfer(true, 65536, 300, Status::OK());
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string(port) + "/metrics");

  const std::string response = HttpGet(port, "/metrics");
  EXPECT_THAT(response, HasSubstr(" 200 "));
  EXPECT_THAT(response, HasSubstr("kvfabric_cache_host_pool_pages{state=\"free\"} 12"));
  EXPECT_THAT(response,
              HasSubstr("kvfabric_cache_host_transfer_seconds_count{direction=\"put\"} 1"));
}

// Issue 17: /metrics listed every tenant name as a label. Per-namespace
// series are opt-in: none by default, the N largest when asked.
TEST(CacheHostMetricsTest, PerNamespaceSeriesAreOptIn) {
  const auto count = [](std::size_t series) {
    CacheHostMetrics metrics([] { return SampleSnapshot(); }, series);
    const auto families = metrics.Collect();
    const auto* bytes = FindFamily(families, "kvfabric_cache_host_namespace_bytes");
    return bytes == nullptr ? std::size_t{0} : bytes->metric.size();
  };
  EXPECT_EQ(count(0), 0u);
  EXPECT_EQ(count(1), 2u);  // one namespace, host and nvme
  CacheHostMetrics none([] { return SampleSnapshot(); });
  const auto families = none.Collect();
  const auto* other = FindFamily(families, "kvfabric_cache_host_namespace_other_bytes");
  ASSERT_NE(other, nullptr);
  EXPECT_GT(other->metric[0].gauge.value, 0) << "the totals still add up";
}

// Issue 17: /metrics was unavailable while 4 connections sent their headers
// slowly (2 serving threads, no timeout). The server multiplexes its
// connections, and each may live request_timeout_ms at most.
TEST(MetricsServerTest, SlowClientsDoNotMakeMetricsUnavailable) {
  auto metrics = std::make_shared<CacheHostMetrics>([] { return SampleSnapshot(); });
  MetricsServerOptions options;
  options.max_connections = 8;
  options.request_timeout_ms = 500;
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics}, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<int> slow;
  for (int i = 0; i < 6; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>((*server)->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string partial = "GET /metrics HTTP/1.1\r\nHo";  // and then nothing
    ASSERT_EQ(::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(partial.size()));
    slow.push_back(fd);
  }
  EXPECT_THAT(HttpGet((*server)->port(), "/metrics"), HasSubstr(" 200 "));
  for (int fd : slow) ::close(fd);
}

// More connections than max_connections are closed at once and counted; a
// request over max_request_bytes is answered 431; other paths 404, other
// methods 405, HEAD the headers only.
TEST(MetricsServerTest, BoundsConnectionsAndRequestSizeAndAnswersOtherRequestsPlainly) {
  auto metrics = std::make_shared<CacheHostMetrics>([] { return SampleSnapshot(); });
  MetricsServerOptions options;
  options.max_connections = 4;
  options.request_timeout_ms = 5000;
  options.max_request_bytes = 1024;
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics}, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  auto connect_one = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  };
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect_one());
  // The fifth is closed by the server without an answer.
  const int fifth = connect_one();
  char c;
  EXPECT_LE(::recv(fifth, &c, 1, 0), 0);
  ::close(fifth);
  EXPECT_GE((*server)->connections_refused(), 1u);
  for (int fd : idle) ::close(fd);
  // Once those are gone, it serves again (the loop notices the closes).
  std::string page;
  for (int i = 0; i < 50 && page.find(" 200 ") == std::string::npos; ++i) {
    page = HttpGet(port, "/metrics");
    if (page.find(" 200 ") == std::string::npos) usleep(20000);
  }
  EXPECT_THAT(page, HasSubstr(" 200 "));
  EXPECT_THAT(page, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(HttpGet(port, "/other"), HasSubstr(" 404 "));
  EXPECT_THAT(HttpGet(port, "/metrics?x=1"), HasSubstr(" 200 "));

  auto raw = [&](const std::string& request) {
    const int fd = connect_one();
    EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::string out;
    char buf[65536];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, n);
    ::close(fd);
    return out;
  };
  EXPECT_THAT(raw("POST /metrics HTTP/1.1\r\n\r\n"), HasSubstr(" 405 "));
  const std::string head = raw("HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, HasSubstr(" 200 "));
  EXPECT_THAT(head, Not(HasSubstr("kvfabric_cache_host_pool_pages")));
  EXPECT_THAT(raw("GET /metrics HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n"),
              HasSubstr(" 431 "));
  EXPECT_THAT(raw("nonsense\r\n\r\n"), HasSubstr(" 400 "));
}

// glibc carves a thread's static TLS out of its stack. civetweb (the server
// this replaced) ran on 100 KiB stacks, so in a process with 60 KiB of TLS
// (OpenBLAS, linked by `kvfabric demo` and many engines) the first scrape
// overflowed the stack and killed the process. This test binary carries
// 96 KiB of static TLS of its own.
thread_local char big_tls[96 << 10];

TEST(MetricsServerTest, ServesInAProcessWithLargeThreadLocalStorage) {
  big_tls[0] = 1;
  auto metrics = std::make_shared<CacheHostMetrics>([] {
    big_tls[sizeof big_tls - 1] = 1;  // the serving thread has the TLS too
    return SampleSnapshot();
  });
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(HttpGet((*server)->port(), "/metrics"),
                HasSubstr("kvfabric_cache_host_pool_pages"));
  }
}

TEST(MetricsServerTest, SkipsCollectablesThatAreGone) {
  auto metrics = std::make_shared<CacheHostMetrics>([] { return SampleSnapshot(); });
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  metrics.reset();
  const std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr(" 200 "));
  EXPECT_THAT(response, Not(HasSubstr("kvfabric_cache_host_pool_pages")));
}

TEST(MetricsServerTest, SecondServerOnTheSamePortIsUnavailableNotAnException) {
  auto first = MetricsServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::Start(address, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(address));
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics-address"));
  // The first one still serves.
  EXPECT_THAT(HttpGet((*first)->port(), "/metrics"), HasSubstr(" 200 "));
}

TEST(MetricsServerTest, RefusesAddressesOfAnotherShape) {
  for (const char* address :
       {"", "9464", "127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:65536", "127.0.0.1:94x",
        "127.0.0.1:9464s", "::1:9464", "[::1]", "[]:9464", "127.0.0.1:1,127.0.0.1:2"}) {
    auto server = MetricsServer::Start(address, {});
    ASSERT_FALSE(server.ok()) << address;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(server.status().message(), HasSubstr("--metrics-address")) << address;
  }
}

TEST(MetricsServerTest, WildcardHostIsReachedThroughLoopbackInTheUrl) {
  auto server = MetricsServer::Start("0.0.0.0:0", {});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string((*server)->port()) + "/metrics");
}

}  // namespace
}  // namespace kvfabric::cache_host
