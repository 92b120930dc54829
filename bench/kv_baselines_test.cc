#include "bench/kv_baselines.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvfabric::bench {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

// One server of each kind for the whole binary: memcached checks for SIGTERM
// once a second, so a server per test would cost a second each.
class SharedServers : public ::testing::Environment {
 public:
  // The shared server of `kind`, started on first use; nullptr (with a test
  // failure) if it cannot start.
  static BaselineServer* Get(BaselineKind kind) {
    std::unique_ptr<BaselineServer>& slot = servers_[static_cast<int>(kind)];
    if (slot == nullptr) {
      BaselineServerOptions options;
      options.memcached_memory_mib = 64;
      options.memcached_threads = 2;
      auto server = BaselineServer::Start(kind, options);
      EXPECT_TRUE(server.ok()) << server.status();
      if (server.ok()) slot = std::move(server).value();
    }
    return slot.get();
  }

  void TearDown() override {
    for (auto& s : servers_) s.reset();
  }

 private:
  static inline std::unique_ptr<BaselineServer> servers_[2];
};

[[maybe_unused]] ::testing::Environment* const kSharedServers =
    ::testing::AddGlobalTestEnvironment(new SharedServers);

class KvBaselinesTest : public ::testing::TestWithParam<BaselineKind> {
 protected:
  void SetUp() override {
    const auto binary = FindBaselineBinary(GetParam());
    if (!binary.ok()) GTEST_SKIP() << binary.status().message();
    server_ = SharedServers::Get(GetParam());
    ASSERT_NE(server_, nullptr);
    // Tests share the server: each starts from an empty one.
    auto client = Connect();
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->FlushAll().ok());
  }

  std::unique_ptr<BaselineClient> Connect() {
    auto client = BaselineClient::Connect(GetParam(), "127.0.0.1", server_->port());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  BaselineServer* server_ = nullptr;
};

TEST_P(KvBaselinesTest, ValuesOfOneByteToTwoMiBRoundTripExactly) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::size_t sizes[] = {1, 15, 256 * kKiB, 2 * kMiB};
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    std::vector<std::byte> value(sizes[i]);
    FillBaselineValue(i, value);
    ASSERT_TRUE(client->Set(BaselineKey(i), value).ok()) << sizes[i];
  }
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    std::vector<std::byte> expected(sizes[i]);
    FillBaselineValue(i, expected);
    // One spare byte: a value longer than written would show as a wrong length.
    std::vector<std::byte> got(sizes[i] + 1, std::byte{0xee});
    auto n = client->Get(BaselineKey(i), got);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_EQ(*n, sizes[i]);
    got.resize(*n);
    EXPECT_TRUE(got == expected) << "value of " << sizes[i] << " bytes changed in transit";
    EXPECT_TRUE(StampedEndsMatch(i, got));
    EXPECT_FALSE(StampedEndsMatch(i + 1, got)) << sizes[i];
  }
}

TEST_P(KvBaselinesTest, OverwriteReplacesValue) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string a(100, 'a');
  const std::string b(7, 'b');
  ASSERT_TRUE(client->Set("k", std::as_bytes(std::span(a))).ok());
  ASSERT_TRUE(client->Set("k", std::as_bytes(std::span(b))).ok());
  std::vector<std::byte> got(200);
  auto n = client->Get("k", got);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, b.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data()), *n), b);
}

TEST_P(KvBaselinesTest, GetOfMissingKeyIsNotFound) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::byte> got(16);
  auto n = client->Get("never-set", got);
  EXPECT_TRUE(n.status().IsNotFound()) << n.status();
  // The connection is still usable.
  EXPECT_TRUE(client->Ping().ok());
}

TEST_P(KvBaselinesTest, ValueLargerThanDstIsResourceExhaustedAndConnectionSurvives) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::byte> value(300 * kKiB);
  FillBaselineValue(3, value);
  ASSERT_TRUE(client->Set("big", value).ok());
  std::vector<std::byte> small(1000);
  auto n = client->Get("big", small);
  EXPECT_EQ(n.status().code(), StatusCode::kResourceExhausted) << n.status();
  std::vector<std::byte> got(value.size());
  n = client->Get("big", got);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(got == value);
}

TEST_P(KvBaselinesTest, FlushAllDropsKeys) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::string v = "x";
  ASSERT_TRUE(client->Set("f", std::as_bytes(std::span(v))).ok());
  ASSERT_TRUE(client->FlushAll().ok());
  std::vector<std::byte> got(8);
  EXPECT_TRUE(client->Get("f", got).status().IsNotFound());
}

TEST_P(KvBaselinesTest, RunBaselinePutsThenGetsEveryKey) {
  constexpr std::uint64_t kValue = 256 * kKiB;
  constexpr std::uint64_t kTotal = 8 * kMiB;
  auto put = RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), kValue, kTotal, 2);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->ops, kTotal / kValue);
  EXPECT_GT(put->gbps, 0);
  EXPECT_LE(put->p50_us, put->p99_us);

  auto get = RunBaseline(GetParam(), BaselineOp::kGet, server_->port(), kValue, kTotal, 2);
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_EQ(get->ops, kTotal / kValue);
  EXPECT_LE(get->p50_us, get->p99_us);

  // Into a ring of three and a half values per thread: every value is still
  // checked where it landed, and the ring wraps around.
  auto ring = RunBaseline(GetParam(), BaselineOp::kGet, server_->port(), kValue, kTotal, 2,
                          7 * kValue / 2);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->ops, kTotal / kValue);
}

TEST_P(KvBaselinesTest, RunBaselinePutFromARingStoresEveryKeysWholeValue) {
  // Two threads, each sending from a ring of two and a half values, so
  // both rings wrap: every key must still hold its own value, byte for byte.
  constexpr std::uint64_t kValue = 64 * kKiB;
  constexpr std::uint64_t kTotal = 10 * kValue;
  auto put =
      RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), kValue, kTotal, 2, 5 * kValue / 2);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->ops, kTotal / kValue);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::byte> want(kValue), got(kValue);
  for (std::uint64_t i = 0; i < kTotal / kValue; ++i) {
    FillBaselineValue(i, want);
    auto n = client->Get(BaselineKey(i), got);
    ASSERT_TRUE(n.ok()) << "key " << i << ": " << n.status();
    ASSERT_EQ(*n, kValue) << "key " << i;
    EXPECT_TRUE(got == want) << "key " << i;
  }
}

TEST_P(KvBaselinesTest, RunBaselineGetDetectsWrongValue) {
  constexpr std::uint64_t kValue = 4 * kKiB;
  ASSERT_TRUE(
      RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), kValue, 4 * kValue, 1).ok());
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::byte> other(kValue);
  FillBaselineValue(7, other);  // key 2 now holds key 7's value
  ASSERT_TRUE(client->Set(BaselineKey(2), other).ok());
  auto get = RunBaseline(GetParam(), BaselineOp::kGet, server_->port(), kValue, 4 * kValue, 2);
  EXPECT_TRUE(get.status().IsDataLoss()) << get.status();
}

TEST_P(KvBaselinesTest, RunBaselineGetOfMissingKeysIsNotFound) {
  auto get = RunBaseline(GetParam(), BaselineOp::kGet, server_->port(), 1024, 4096, 2);
  EXPECT_TRUE(get.status().IsNotFound()) << get.status();
}

TEST_P(KvBaselinesTest, RunBaselineUsesNoMoreThreadsThanKeys) {
  auto put = RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), 1000, 3000, 8);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->ops, 3u);
}

TEST_P(KvBaselinesTest, RunBaselineRejectsBadSizes) {
  EXPECT_TRUE(RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), 0, 10, 1)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), 11, 10, 1)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(RunBaseline(GetParam(), BaselineOp::kPut, server_->port(), 10, 10, 0)
                  .status()
                  .IsInvalidArgument());
}

TEST_P(KvBaselinesTest, ServerStopsWithItsObject) {
  auto own = BaselineServer::Start(GetParam());
  ASSERT_TRUE(own.ok()) << own.status();
  const pid_t pid = (*own)->pid();
  const std::string dir = (*own)->dir();
  EXPECT_EQ(::kill(pid, 0), 0);
  own->reset();
  // Reaped, so the pid no longer names a process of ours.
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_NE(::access(dir.c_str(), F_OK), 0) << dir << " was not removed";
}

INSTANTIATE_TEST_SUITE_P(Servers, KvBaselinesTest,
                         ::testing::Values(BaselineKind::kRedis, BaselineKind::kMemcached),
                         [](const auto& info) {
                           return std::string(BaselineKindName(info.param));
                         });

TEST(MemcachedClientTest, RefusesKeysMemcachedCannotHold) {
  if (!FindBaselineBinary(BaselineKind::kMemcached).ok()) GTEST_SKIP() << "memcached missing";
  BaselineServer* server = SharedServers::Get(BaselineKind::kMemcached);
  ASSERT_NE(server, nullptr);
  auto client = MemcachedClient::Connect("127.0.0.1", server->port());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::byte v[1] = {std::byte{1}};
  EXPECT_TRUE((*client)->Set("has space", v).IsInvalidArgument());
  EXPECT_TRUE((*client)->Set("line\nbreak", v).IsInvalidArgument());
  EXPECT_TRUE((*client)->Set(std::string(251, 'k'), v).IsInvalidArgument());
  EXPECT_TRUE((*client)->Set("", v).IsInvalidArgument());
  EXPECT_TRUE((*client)->Set(std::string(250, 'k'), v).ok());
}

TEST(BaselineServerTest, RejectsMemcachedMemoryBelowItemLimit) {
  BaselineServerOptions options;
  options.memcached_memory_mib = 8;
  auto server = BaselineServer::Start(BaselineKind::kMemcached, options);
  EXPECT_TRUE(server.status().IsInvalidArgument()) << server.status();
}

TEST(BaselineValueTest, StampMakesAnyBufferTheIndexValue) {
  for (std::size_t size : {1, 7, 8, 9, 15, 16, 17, 4096}) {
    std::vector<std::byte> stamped(size);
    FillBaselineValue(5, stamped);
    StampBaselineValue(9, stamped);
    std::vector<std::byte> fresh(size);
    FillBaselineValue(9, fresh);
    EXPECT_TRUE(stamped == fresh) << size;
    EXPECT_TRUE(StampedEndsMatch(9, stamped)) << size;
    EXPECT_FALSE(StampedEndsMatch(5, stamped)) << size;
  }
}

}  // namespace
}  // namespace kvfabric::bench
