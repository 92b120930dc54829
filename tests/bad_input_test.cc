// Every gRPC method of a real kvfabric-cached and kvfabric-placement, and the
// daemon's data plane, fed a table of malformed and hostile requests:
// oversized and empty keys and namespaces, counts past the limits, sizes
// that overflow, offsets that wrap, unknown enum values, requests over the
// gRPC size limit, garbage and truncated frames, a frame that announces
// 4 GiB, thousands of idle connections and a sender that trickles a byte at
// a time.
//
// Asserted for each: the answer (its status code, and the limit or field
// named in its message), or that the connection was closed; then that the
// daemon's resident memory stayed bounded, a well-behaved client's blocks
// stored before still read back byte for byte, and it is still served.
// Printed: the daemon's RSS and descriptors before and after.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/test_seed.h"
#include "core/testing/wait_for.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "proto/transfer_wire.h"
#include "tests/cache_host_test_client.h"
#include "tests/daemon_probe.h"
#include "tests/server_process.h"
#include "transport/tcp/tcp_wire.h"

namespace kvfabric {
namespace {

using std::chrono_literals::operator""s;

// How much the daemon's RSS may grow under bad input: what gRPC and the data
// plane may hold (their memory quotas and limits). Measured from the RSS
// before, which holds the pool (64 MiB) and the process's own footprint: under ASan
// that footprint is 242 MiB (shadow memory) and its quarantine of freed
// blocks grows with the flood (42-83 MiB; 17 MiB without ASan), so an
// absolute bound of pool + 256 MiB failed there with the daemon within its
// limits.
constexpr std::uint64_t kRssGrowthBoundBytes = 256ull << 20;

struct Case {
  const char* name;
  std::function<grpc::Status()> call;
  grpc::StatusCode code;
  const char* names;  // a substring of the message: the limit or field
};

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    char tmpl[] = "/tmp/kvf_bad_input_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto p = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement", dir_,
        {"--insecure", "--grpc-address=127.0.0.1:0", "--metrics-address=off", "--log-level=error"});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_ = std::move(*p);
    auto d = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cached", dir_,
        {"--host-id=bad-input", "--insecure", "--grpc-address=127.0.0.1:0",
         "--transport-address=127.0.0.1:0", "--data-transport=tcp", "--metrics-address=off",
         "--lock-memory=off", "--log-level=error", "--host-pool-bytes=64MiB",
         "--host-page-bytes=2MiB", "--data-idle-timeout=2s", "--max-data-handshakes=256",
         "--max-data-connections-per-host=512", "--placement-address=" + placement_->grpc()});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    pid_ = static_cast<pid_t>(std::stol(daemon_->Get("pid")));
    auto good = testing::CacheHostTestClient::Create(seed_, testing::kKernelTcp);
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    good_ = std::move(*good);
    ASSERT_TRUE(good_->Attach(daemon_->grpc(), daemon_->transport()).ok());
    ASSERT_TRUE(good_->PutBatch(0, 8, "good").ok());
    cache_ = v1::CacheHost::NewStub(
        grpc::CreateChannel(daemon_->grpc(), grpc::InsecureChannelCredentials()));
    place_ = v1::Placement::NewStub(
        grpc::CreateChannel(placement_->grpc(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    good_.reset();
    daemon_.reset();
    placement_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + 10s);
    return c;
  }

  std::uint64_t seed_ = 0;
  std::string dir_;
  pid_t pid_ = 0;
  std::unique_ptr<testing::ServerProcess> placement_;
  std::unique_ptr<testing::ServerProcess> daemon_;
  std::unique_ptr<testing::CacheHostTestClient> good_;
  std::unique_ptr<v1::CacheHost::Stub> cache_;
  std::unique_ptr<v1::Placement::Stub> place_;
};

std::string Key(char c, std::size_t n = 32) { return std::string(n, c); }

// write(2) without SIGPIPE: the daemon may close first.
bool SendAll(int fd, const void* data, std::size_t n) {
  return send(fd, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

v1::ModelFingerprint GoodFingerprint() { return testing::CacheHostTestClient::Fingerprint(); }

TEST_F(BadInputTest, EveryMethodRefusesMalformedRequestsNamingTheLimit) {
  const std::uint64_t rss_before = testing::RssBytes(pid_);
  const int fds_before = testing::OpenFds(pid_);
  const std::string long_ns(300, 'n');
  const std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();
  auto lookup = [&](const std::string& ns, std::vector<std::string> keys) {
    return [&, ns, keys] {
      v1::LookupRequest r;
      r.set_namespace_(ns);
      for (const std::string& k : keys) r.add_keys(k);
      v1::LookupResponse out;
      return cache_->Lookup(Ctx().get(), r, &out);
    };
  };
  auto reserve = [&](std::function<void(v1::ReserveRequest*)> edit) {
    return [&, edit] {
      v1::ReserveRequest r;
      r.set_namespace_("attacker");
      *r.mutable_fingerprint() = GoodFingerprint();
      v1::BlockDescriptor* b = r.add_blocks();
      b->set_key(Key('r'));
      b->set_payload_bytes(testing::kTestBlockBytes);
      edit(&r);
      v1::ReserveResponse out;
      grpc::Status s = cache_->Reserve(Ctx().get(), r, &out);
      // A bad descriptor is answered in its entry; report that as the status.
      if (s.ok() && out.results_size() == 1 && out.results(0).status().code() != 0) {
        return grpc::Status(static_cast<grpc::StatusCode>(out.results(0).status().code()),
                            out.results(0).status().message());
      }
      return s;
    };
  };
  std::vector<std::string> too_many;
  for (int i = 0; i < 5000; ++i) too_many.push_back(Key(static_cast<char>('a' + i % 26)));
  const std::vector<Case> cases = {
      {"Lookup namespace 300 bytes", lookup(long_ns, {Key('k')}),
       grpc::StatusCode::INVALID_ARGUMENT, "max_namespace_bytes"},
      {"Lookup no keys", lookup("attacker", {}), grpc::StatusCode::INVALID_ARGUMENT, "keys"},
      {"Lookup 5000 keys", lookup("attacker", too_many), grpc::StatusCode::INVALID_ARGUMENT,
       "max_keys_per_batch"},
      {"Lookup empty key", lookup("attacker", {""}), grpc::StatusCode::INVALID_ARGUMENT, "key"},
      {"Lookup 64 KiB key", lookup("attacker", {Key('k', 64 << 10)}),
       grpc::StatusCode::INVALID_ARGUMENT, "key"},
      {"Lookup over the request size limit", lookup("attacker", {Key('k', 2 << 20)}),
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
      {"Reserve payload 2^64-1",
       reserve([&](v1::ReserveRequest* r) { r->mutable_blocks(0)->set_payload_bytes(kMax64); }),
       grpc::StatusCode::INVALID_ARGUMENT, "max_block_bytes"},
      {"Reserve payload 0",
       reserve([](v1::ReserveRequest* r) { r->mutable_blocks(0)->set_payload_bytes(0); }),
       grpc::StatusCode::INVALID_ARGUMENT, "payload"},
      {"Reserve unknown dtype", reserve([](v1::ReserveRequest* r) {
         r->mutable_fingerprint()->set_dtype(static_cast<v1::DType>(99));
       }),
       grpc::StatusCode::INVALID_ARGUMENT, "dtype"},
      {"Reserve layer_count 0",
       reserve([](v1::ReserveRequest* r) { r->mutable_fingerprint()->set_layer_count(0); }),
       grpc::StatusCode::INVALID_ARGUMENT, "layer_count"},
      {"Reserve ttl 2^32-1 ms", reserve([](v1::ReserveRequest* r) { r->set_ttl_ms(~0u); }),
       grpc::StatusCode::INVALID_ARGUMENT, "max_ttl_ms"},
      {"Reserve no blocks", reserve([](v1::ReserveRequest* r) { r->clear_blocks(); }),
       grpc::StatusCode::INVALID_ARGUMENT, "blocks"},
      {"Lease 5000 keys",
       [&] {
         v1::LeaseRequest r;
         r.set_namespace_("attacker");
         for (const std::string& k : too_many) r.add_keys(k);
         v1::LeaseResponse out;
         return cache_->Lease(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "max_keys_per_batch"},
      {"Lease ttl 2^32-1 ms",
       [&] {
         v1::LeaseRequest r;
         r.set_namespace_("attacker");
         r.add_keys(Key('p'));
         r.set_ttl_ms(~0u);
         v1::LeaseResponse out;
         return cache_->Lease(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "max_ttl_ms"},
      {"Commit unknown lease",
       [&] {
         v1::CommitRequest r;
         r.set_namespace_("attacker");
         r.add_entries()->set_key(Key('c'));
         r.set_lease_id(0x1234);
         r.set_access_token(std::string(16, 'x'));
         v1::CommitResponse out;
         return cache_->Commit(Ctx().get(), r, &out);
       },
       grpc::StatusCode::NOT_FOUND, "lease"},
      {"Renew 2 lease ids with 1 token",
       [&] {
         v1::RenewRequest r;
         r.set_namespace_("attacker");
         r.add_lease_ids(1);
         r.add_lease_ids(2);
         r.add_access_tokens(std::string(16, 't'));
         v1::RenewResponse out;
         return cache_->Renew(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "access_tokens"},
      {"ListEvictions limit 10^9",
       [&] {
         v1::ListEvictionsRequest r;
         r.set_namespace_("attacker");
         r.set_limit(1000000000);
         v1::ListEvictionsResponse out;
         return cache_->ListEvictions(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "kMaxListedDecisions"},
      {"ExplainEviction empty key",
       [&] {
         v1::ExplainEvictionRequest r;
         r.set_namespace_("attacker");
         v1::ExplainEvictionResponse out;
         return cache_->ExplainEviction(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "key"},
      {"Placement Locate 70000 keys",
       [&] {
         v1::LocateRequest r;
         for (int i = 0; i < 70000; ++i) r.add_keys(Key(static_cast<char>('a' + i % 26)));
         v1::LocateResponse out;
         return place_->Locate(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "max_chain_blocks"},
      {"Placement Locate namespace 300 bytes",
       [&] {
         v1::LocateRequest r;
         r.set_namespace_(long_ns);
         r.add_keys(Key('l'));
         v1::LocateResponse out;
         return place_->Locate(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "max_namespace_bytes"},
      {"Placement Plan without a fingerprint",
       [&] {
         v1::PlanRequest r;
         r.add_keys(Key('q'));
         v1::PlanResponse out;
         return place_->Plan(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "fingerprint"},
      {"Placement Place 1000 replicas",
       [&] {
         v1::PlaceRequest r;
         r.add_keys(Key('q'));
         r.set_payload_bytes(1 << 20);
         r.set_replicas(1000);
         v1::PlaceResponse out;
         return place_->Place(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "replicas"},
      {"Placement Explain plan 0",
       [&] {
         v1::ExplainRequest r;
         r.set_plan_id(0);
         v1::ExplainResponse out;
         return place_->Explain(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "plan_id"},
      {"Placement ListPlans limit 10^9",
       [&] {
         v1::ListPlansRequest r;
         r.set_limit(1000000000);
         v1::ListPlansResponse out;
         return place_->ListPlans(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "kMaxListedDecisions"},
      {"Placement Register without a host id",
       [&] {
         v1::RegisterRequest r;
         v1::RegisterResponse out;
         return place_->Register(Ctx().get(), r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "host_id"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const grpc::Status s = c.call();
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.names), std::string::npos)
        << c.name << ": \"" << s.error_message() << "\" does not name " << c.names;
  }

  // The well-behaved client's blocks are untouched and it is still served.
  EXPECT_TRUE(good_->GetBatch({0, 1, 2, 3, 4, 5, 6, 7}, "good").ok());
  EXPECT_TRUE(good_->PutBatch(8, 2, "good").ok());
  const std::uint64_t rss_after = testing::RssBytes(pid_);
  std::printf("daemon RSS %.1f MiB before, %.1f MiB after %zu bad requests; fds %d -> %d\n",
              rss_before / 1048576.0, rss_after / 1048576.0, cases.size(), fds_before,
              testing::OpenFds(pid_));
  EXPECT_LT(rss_after, rss_before + kRssGrowthBoundBytes);
}

TEST_F(BadInputTest, DataPlaneClosesGarbageTruncatedHugeIdleAndTricklingConnections) {
  const std::uint64_t rss_before = testing::RssBytes(pid_);
  const int fds_before = testing::OpenFds(pid_);
  const std::string address = daemon_->transport();
  auto closed = [](int fd) {
    char b;
    const ssize_t r = recv(fd, &b, 1, MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  };
  auto hello = [](int fd) {
    const auto h = tcp::wire::EncodeHello(0x4242);
    return SendAll(fd, h.data(), h.size());
  };
  auto frame = [](int fd, const tcp::wire::FrameHeader& h, const std::string& body) {
    std::array<std::byte, tcp::wire::kFrameHeaderBytes> out{};
    tcp::wire::EncodeFrameHeader(h, out);
    std::string bytes(reinterpret_cast<const char*>(out.data()), out.size());
    bytes += body;
    return SendAll(fd, bytes.data(), bytes.size());
  };
  std::vector<int> fds;
  // Garbage instead of the transport's hello.
  const int garbage = testing::Dial(address);
  ASSERT_GE(garbage, 0);
  ASSERT_TRUE(SendAll(garbage, "GET / HTTP/1.1\r\n\r\n", 18));
  fds.push_back(garbage);
  // A hello, then a frame header cut in half.
  const int truncated = testing::Dial(address);
  ASSERT_GE(truncated, 0);
  ASSERT_TRUE(hello(truncated));
  ASSERT_TRUE(SendAll(truncated, "\x01\x00\x30\x00", 4));
  fds.push_back(truncated);
  // A hello, then a SEND frame announcing 4 GiB of payload that never comes.
  const int huge = testing::Dial(address);
  ASSERT_GE(huge, 0);
  ASSERT_TRUE(hello(huge));
  tcp::wire::FrameHeader big;
  big.type = tcp::wire::FrameType::kSend;
  big.length = std::uint64_t{4} << 30;
  ASSERT_TRUE(frame(huge, big, ""));
  fds.push_back(huge);
  // A hello, then a data-plane message of random bytes.
  const int noise = testing::Dial(address);
  ASSERT_GE(noise, 0);
  ASSERT_TRUE(hello(noise));
  tcp::wire::FrameHeader send;
  send.type = tcp::wire::FrameType::kSend;
  send.message_header_bytes = 200;
  std::string junk(200, '\0');
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(seed_ >> (i % 56));
  ASSERT_TRUE(frame(noise, send, junk));
  fds.push_back(noise);
  // A sender that trickles its hello one byte per second.
  const int trickle = testing::Dial(address);
  ASSERT_GE(trickle, 0);
  fds.push_back(trickle);
  std::thread trickler([&] {
    const auto h = tcp::wire::EncodeHello(0x77);
    for (std::size_t i = 0; i < h.size() && !closed(trickle); ++i) {
      if (!SendAll(trickle, &h[i], 1)) break;
      std::this_thread::sleep_for(1s);
    }
  });
  // Thousands of idle connections: as many as the descriptor limit lets this
  // process open, up to 10,000.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 10240 + 64);
  setrlimit(RLIMIT_NOFILE, &nofile);
  std::vector<int> idle;
  for (int i = 0; i < 10000; ++i) {
    const int fd = testing::Dial(address);
    if (fd < 0) break;
    idle.push_back(fd);
  }
  std::printf("opened %zu idle connections (descriptor limit %llu)\n", idle.size(),
              static_cast<unsigned long long>(nofile.rlim_cur));
  const int daemon_fds_flooded = testing::OpenFds(pid_);

  // Each hostile connection is closed by the daemon; the idle ones too.
  EXPECT_TRUE(WaitFor(
      [&] {
        for (int fd : fds) {
          if (!closed(fd)) return false;
        }
        return true;
      },
      30s, "the daemon to close every hostile connection"));
  EXPECT_TRUE(WaitFor(
      [&] {
        std::size_t open = 0;
        for (int fd : idle) open += closed(fd) ? 0 : 1;
        return open == 0;
      },
      60s, "the daemon to close every idle connection"));
  trickler.join();
  for (int fd : fds) close(fd);
  for (int fd : idle) close(fd);

  // The good client's own connection went idle meanwhile (--data-idle-timeout
  // 2 s) and was closed too: it reconnects, as libkvfabric does.
  ASSERT_TRUE(good_->Attach(daemon_->grpc(), daemon_->transport()).ok());
  Status read = good_->GetBatch({0, 1, 2, 3, 4, 5, 6, 7}, "good");
  EXPECT_TRUE(read.ok()) << read.ToString();
  Status write = good_->PutBatch(8, 2, "good");
  EXPECT_TRUE(write.ok()) << write.ToString();
  const std::uint64_t rss_after = testing::RssBytes(pid_);
  std::printf("daemon RSS %.1f MiB before, %.1f MiB after; fds %d before, %d flooded, %d after\n",
              rss_before / 1048576.0, rss_after / 1048576.0, fds_before, daemon_fds_flooded,
              testing::OpenFds(pid_));
  EXPECT_LT(rss_after, rss_before + kRssGrowthBoundBytes);
  // The daemon held at most --max-data-handshakes of the sockets that never
  // said hello (the rest were shed at accept), plus the hostile ones.
  EXPECT_LT(daemon_fds_flooded, fds_before + 256 + 64);
}

}  // namespace
}  // namespace kvfabric
